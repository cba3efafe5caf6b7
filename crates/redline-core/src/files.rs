//! Files a user names, read and written safely.
//!
//! * Inputs must be regular files (after following links) and no larger than
//!   a limit fitting their format: `/dev/zero`, `/dev/urandom`, a FIFO or a
//!   socket is refused by what it is before anything is read from it (a FIFO
//!   is never opened, so nothing blocks on it).
//! * Outputs are written only to regular files: a device node, a FIFO or a
//!   folder at the path is refused by name, never replaced. Whole files go
//!   through a temporary file in the same folder, `fsync`, a rename and an
//!   `fsync` of the folder, and the temporary file is removed on any failure,
//!   so a full disk never leaves half a file or a stray `.tmp` behind.
//! * Names taken from files (a model file's `name`) become one safe path
//!   component before they are joined to a folder.
//!
//! Errors are [`std::io::Error`]s whose message says what the path is; each
//! crate wraps them in its own error with the path and the flag.

use std::fs::{File, Metadata};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// What a file is, for messages: "a character device (like /dev/zero)".
pub fn kind_of(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a folder"
    } else if t.is_char_device() {
        "a character device (like /dev/zero or /dev/null)"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

fn not_regular(meta: &Metadata, role: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "is {}, not a regular file; {role} must be a regular file",
            kind_of(meta)
        ),
    )
}

/// Opens `path` for reading when it is a regular file (links followed) of at
/// most `limit` bytes; returns the file and its length.
pub fn open_input(path: &Path, limit: u64) -> io::Result<(File, u64)> {
    // Checked before opening: opening a FIFO for reading blocks until a
    // writer comes, and a device "file" has no end.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(&meta, "an input"));
    }
    let file = File::open(path)?;
    // Checked again on the open file: the path may have been swapped.
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(&meta, "an input"));
    }
    if meta.len() > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "is {} bytes; a file of this kind is at most {limit} bytes",
                meta.len()
            ),
        ));
    }
    Ok((file, meta.len()))
}

/// Reads a whole regular file of at most `limit` bytes (a file that grows
/// while it is read stops at the limit and is refused).
pub fn read_input(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let (file, len) = open_input(path, limit)?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("grew past {limit} bytes while it was read"),
        ));
    }
    Ok(bytes)
}

/// [`read_input`] as UTF-8 text.
pub fn read_input_text(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_input(path, limit)?).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("is not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// Where an output at `path` may be written: `path` itself when nothing is
/// there, the file a symbolic link leads to when that is a regular file
/// (the link is kept), and an error naming what is there otherwise.
pub fn output_target(path: &Path) -> io::Result<PathBuf> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(path.to_path_buf()),
        Err(e) => Err(e),
        Ok(m) if m.is_file() => Ok(path.to_path_buf()),
        Ok(m) if m.file_type().is_symlink() => match std::fs::metadata(path) {
            Ok(target) if target.is_file() => std::fs::canonicalize(path),
            Ok(target) => Err(not_regular(&target, "an output")),
            // A dangling link: writing would replace the link, not fill its target.
            Err(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "is a symbolic link to nothing; an output must be a regular file or a new path",
            )),
        },
        Ok(m) => Err(not_regular(&m, "an output")),
    }
}

/// Creates (truncating) a regular file to stream an output into, refusing
/// anything else at the path as [`output_target`] does.
pub fn create_output(path: &Path) -> io::Result<File> {
    File::create(output_target(path)?)
}

/// A record file that grows by whole lines (`metrics.jsonl`, `metrics.csv`,
/// `--metrics`): a line that cannot be written whole (a full disk) is cut off
/// again, so the file never ends in half a line.
#[derive(Debug)]
pub struct LineFile {
    file: File,
    len: u64,
}

impl LineFile {
    /// Creates (truncates) a regular file at `path`, refusing anything else
    /// there as [`create_output`] does.
    pub fn create(path: &Path) -> io::Result<Self> {
        Ok(Self {
            file: create_output(path)?,
            len: 0,
        })
    }

    /// Opens an existing regular file to append lines after what it holds.
    pub fn append_to(path: &Path) -> io::Result<Self> {
        use std::io::Seek;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(output_target(path)?)?;
        let len = file.seek(io::SeekFrom::End(0))?;
        Ok(Self { file, len })
    }

    /// Appends `line` and a newline in one write; on failure the file is cut
    /// back to where it was.
    pub fn append(&mut self, line: &str) -> io::Result<()> {
        use std::io::Seek;
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        if let Err(e) = self.file.write_all(&bytes) {
            // Best effort: the error that matters is the write's.
            let _ = self.file.set_len(self.len);
            let _ = self.file.seek(io::SeekFrom::Start(self.len));
            return Err(e);
        }
        self.len += bytes.len() as u64;
        Ok(())
    }
}

/// The temporary file a whole-file write of `path` goes through: hidden, in
/// the same folder (so the rename is atomic), named for this process.
fn temp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Writes `path` whole through `write`: a temporary file beside it, `fsync`,
/// a rename over the target and an `fsync` of the folder. A target that is
/// not a regular file is refused before anything is written; on any failure
/// the temporary file is removed and the target is as it was.
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
) -> io::Result<()> {
    let target = output_target(path)?;
    let tmp = temp_beside(&target);
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut w = io::BufWriter::new(&file);
        write(&mut w)?;
        w.flush()?;
        drop(w);
        file.sync_all()?;
        std::fs::rename(&tmp, &target)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable once the folder's entry is.
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir).and_then(|d| d.sync_all())?;
    }
    Ok(())
}

/// [`write_atomic_with`] for bytes in memory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// The longest component [`safe_component`] returns (file systems allow 255
/// bytes; room is left for suffixes such as a date and `-2`).
const MAX_COMPONENT: usize = 64;

/// `name` as one safe path component: ASCII letters, digits, `-`, `_` and
/// `.` kept, anything else (separators, `..`, control characters, spaces)
/// turned into `-`, no leading or trailing dot or dash, at most 64 bytes, never empty.
pub fn safe_component(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '-',
        })
        .take(MAX_COMPONENT)
        .collect();
    let trimmed = mapped.trim_matches(['.', '-']);
    if trimmed.is_empty() {
        "model".into()
    } else {
        trimmed.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_one_safe_component() {
        for (name, want) in [
            ("mlp", "mlp"),
            ("../../..", "model"),
            ("a/b", "a-b"),
            ("..", "model"),
            ("", "model"),
            (".hidden", "hidden"),
            ("res net 8", "res-net-8"),
            ("ünï", "n"),
            ("x\0y", "x-y"),
        ] {
            assert_eq!(safe_component(name), want, "{name:?}");
        }
        assert_eq!(safe_component(&"a".repeat(1000)).len(), MAX_COMPONENT);
    }

    #[test]
    fn special_files_are_refused_as_inputs_and_outputs() -> io::Result<()> {
        let t = tempfile::tempdir()?;
        let fifo = t.path().join("pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status()?;
        assert!(made.success());
        // Neither blocks on the FIFO nor reads /dev/zero forever.
        for p in [fifo.as_path(), Path::new("/dev/zero"), t.path()] {
            let e = read_input(p, 1 << 20).err().map(|e| e.to_string());
            assert!(e.is_some_and(|e| e.contains("not a regular file")), "{p:?}");
        }
        // A link to a device is refused as an output and left as it was.
        let link = t.path().join("out.bin");
        std::os::unix::fs::symlink("/dev/null", &link)?;
        let e = write_atomic(&link, b"x").err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("character device")));
        assert!(std::fs::symlink_metadata(&link)?.file_type().is_symlink());
        let e = write_atomic(&fifo, b"x").err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("FIFO")));
        assert!(create_output(&fifo).is_err());
        Ok(())
    }

    #[test]
    fn whole_writes_follow_links_to_files_and_leave_no_temporary() -> io::Result<()> {
        let t = tempfile::tempdir()?;
        let real = t.path().join("real.txt");
        std::fs::write(&real, "old")?;
        let link = t.path().join("link.txt");
        std::os::unix::fs::symlink(&real, &link)?;
        write_atomic(&link, b"new")?;
        assert_eq!(std::fs::read_to_string(&real)?, "new");
        assert!(std::fs::symlink_metadata(&link)?.file_type().is_symlink());
        // A failing writer leaves the target as it was and no temporary file.
        let failed = write_atomic_with(&real, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("disk full"))
        });
        assert!(failed.is_err());
        assert_eq!(std::fs::read_to_string(&real)?, "new");
        let names: Vec<_> = std::fs::read_dir(t.path())?
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        Ok(())
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_line_that_does_not_fit_is_cut_off_again() -> io::Result<()> {
        // /dev/full fails every write with ENOSPC: nothing may remain of it.
        let mut f = LineFile {
            file: std::fs::OpenOptions::new().write(true).open("/dev/full")?,
            len: 0,
        };
        let e = f.append("{\"kind\":\"step\"}").err().map(|e| e.kind());
        assert_eq!(e, Some(io::ErrorKind::StorageFull));
        assert_eq!(f.len, 0);
        let t = tempfile::tempdir()?;
        let p = t.path().join("m.jsonl");
        let mut f = LineFile::create(&p)?;
        f.append("a")?;
        drop(f);
        LineFile::append_to(&p)?.append("b")?;
        assert_eq!(std::fs::read_to_string(&p)?, "a\nb\n");
        Ok(())
    }

    #[test]
    fn inputs_larger_than_their_limit_are_refused() -> io::Result<()> {
        let t = tempfile::tempdir()?;
        let p = t.path().join("big");
        std::fs::write(&p, vec![b'a'; 100])?;
        assert_eq!(read_input(&p, 100)?.len(), 100);
        let e = read_input(&p, 99).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("is 100 bytes")));
        Ok(())
    }
}
