//! [`EventWriter`]: creates an event file in a log directory and appends
//! scalar summaries to it, buffered, in the format TensorBoard reads.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::proto::{encode_file_version_event, encode_scalars_event};
use crate::record::write_record;

/// The version string TensorBoard expects in the first record of an event file.
pub const FILE_VERSION: &str = "brain.Event:2";

/// How many numbered alternatives `create` tries when the plain file name is taken
/// (two writers started in the same second by one process in one directory).
const MAX_NAME_ATTEMPTS: u32 = 1000;

/// Appends scalar summaries to one TensorBoard event file.
///
/// Records are buffered; call [`flush`](Self::flush) to make them visible to a
/// running TensorBoard. Dropping the writer flushes too, ignoring errors.
#[derive(Debug)]
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `dir` if needed and a new event file in it named
    /// `events.out.tfevents.<unix secs>.<hostname>.<pid>.redline`, whose first
    /// record is the `file_version: "brain.Event:2"` event.
    ///
    /// An existing file is never overwritten: if the name is taken, a number
    /// is appended (`...redline.1`, `...redline.2`), which keeps the files in
    /// creation order when TensorBoard sorts them by name.
    pub fn create(dir: &Path) -> Result<EventWriter> {
        fs::create_dir_all(dir).map_err(|source| Error::Io {
            op: "creating log directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let now = unix_time_now();
        let base = format!(
            "events.out.tfevents.{}.{}.{}.redline",
            now as u64,
            hostname(),
            std::process::id()
        );
        let (file, path) = create_new_file(dir, &base)?;
        let mut writer = EventWriter {
            out: BufWriter::new(file),
            path,
        };
        writer.write_event(&encode_file_version_event(now, FILE_VERSION))?;
        // Flushed at once so a fresh run shows up in TensorBoard before its first scalar.
        writer.flush()?;
        Ok(writer)
    }

    /// The path of the event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one scalar `value` for `tag` at `step`. TensorBoard stores
    /// scalars as `f32`, so `value` is narrowed. `wall_time` is seconds since
    /// the Unix epoch.
    pub fn add_scalar(&mut self, tag: &str, step: i64, value: f64, wall_time: f64) -> Result<()> {
        self.add_scalars(step, &[(tag, value)], wall_time)
    }

    /// Appends several `(tag, value)` scalars at the same `step` as one event.
    pub fn add_scalars(
        &mut self,
        step: i64,
        scalars: &[(&str, f64)],
        wall_time: f64,
    ) -> Result<()> {
        self.write_event(&encode_scalars_event(wall_time, step, scalars))
    }

    /// Writes buffered records to the file.
    pub fn flush(&mut self) -> Result<()> {
        self.out
            .flush()
            .map_err(|source| self.io_error("flushing", source))
    }

    fn write_event(&mut self, event: &[u8]) -> Result<()> {
        write_record(&mut self.out, event).map_err(|source| self.io_error("writing", source))
    }

    fn io_error(&self, op: &'static str, source: io::Error) -> Error {
        Error::Io {
            op,
            path: self.path.clone(),
            source,
        }
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        // Nothing useful can be done with an error here; `flush` reports it to
        // callers that want to know.
        let _ = self.out.flush();
    }
}

/// Seconds since the Unix epoch; 0 if the clock is before it.
fn unix_time_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Opens `dir/base`, or `dir/base.N` for the first free N, failing rather than truncating.
fn create_new_file(dir: &Path, base: &str) -> Result<(File, PathBuf)> {
    let mut path = dir.join(base);
    for attempt in 1..=MAX_NAME_ATTEMPTS {
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                path = dir.join(format!("{base}.{attempt}"));
            }
            Err(source) => {
                return Err(Error::Io {
                    op: "creating event file",
                    path,
                    source,
                })
            }
        }
    }
    Err(Error::Io {
        op: "creating event file",
        path,
        source: io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{MAX_NAME_ATTEMPTS} event files with this name already exist; use a fresh log directory"),
        ),
    })
}

/// The machine's host name for the file name, from `/etc/hostname` or the
/// kernel, kept to characters safe in a file name; `"localhost"` if unknown.
fn hostname() -> String {
    ["/etc/hostname", "/proc/sys/kernel/hostname"]
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .map(|s| sanitize_hostname(&s))
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

fn sanitize_hostname(raw: &str) -> String {
    raw.trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_name_and_directory_creation() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("runs/a");
        let writer = EventWriter::create(&dir).unwrap();
        let name = writer
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let parts: Vec<&str> = name.split('.').collect();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        assert!(
            name.ends_with(&format!(".{}.redline", std::process::id())),
            "{name}"
        );
        assert!(parts[3].parse::<u64>().unwrap() > 1_600_000_000, "{name}");
        assert_eq!(writer.path().parent(), Some(dir.as_path()));
    }

    #[test]
    fn second_writer_in_same_second_does_not_clobber_the_first() {
        let tmp = tempfile::tempdir().unwrap();
        let a = EventWriter::create(tmp.path()).unwrap();
        let b = EventWriter::create(tmp.path()).unwrap();
        assert_ne!(a.path(), b.path());
    }

    #[test]
    fn hostname_is_file_name_safe() {
        assert_eq!(sanitize_hostname("  box-1.lab\n"), "box-1.lab");
        assert_eq!(sanitize_hostname("a/b c"), "abc");
        let h = hostname();
        assert!(!h.is_empty() && !h.contains('/'), "{h}");
    }
}
