//! `inputs.json`: a fingerprint of every file a run reads (its data, an
//! `--init` file), taken when the run starts, so that `--resume` can tell
//! data that changed after a kill. A file's fingerprint is its size, its
//! modification time and a CRC-32 of a bounded sample of its bytes (4 KiB
//! at the start, the middle and the end), so a file of any size is
//! fingerprinted in a few reads, and a file rewritten with the same size
//! but other contents is caught by its sample or its modification time.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::folder::write_atomic;

/// The file in the run folder.
pub const INPUTS: &str = "inputs.json";

/// Bytes read at each of the three places sampled: 12 KiB a file, so the
/// 4096 files of a large image folder cost at most 48 MiB of reads at
/// start (a changed byte outside the windows is caught by the mtime).
const SAMPLE: u64 = 4 << 10;

/// Files of a folder fingerprinted one by one; the rest are counted.
const MAX_FILES: usize = 4096;

/// One file's fingerprint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileFingerprint {
    /// The file, as found under the input's path.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its modification time, Unix seconds.
    pub modified_unix: f64,
    /// CRC-32 of its first, middle and last 4 KiB.
    pub sample_crc32: u32,
}

/// The fingerprint of one input (a file, or a folder's files in name order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputFingerprint {
    /// The flag that named it (`--data`, `--init`).
    pub flag: String,
    /// The path it named (absolute).
    pub path: PathBuf,
    /// Its files, the first [`MAX_FILES`] of a folder.
    pub files: Vec<FileFingerprint>,
    /// All its files, with those past [`MAX_FILES`].
    pub total_files: usize,
}

/// Fingerprints the input `path` named by `flag`.
pub fn fingerprint(flag: &str, path: &Path) -> Result<InputFingerprint> {
    let root = std::path::absolute(path).map_err(Error::io("reading", path))?;
    let mut paths = Vec::new();
    if root.is_dir() {
        walk(&root, &mut paths)?;
        paths.sort();
    } else {
        paths.push(root.clone());
    }
    fingerprint_files(flag, &root, paths)
}

/// Fingerprints an input named by a pattern (`train-{0000..0127}.tar`): the
/// files it expands to, in the order given.
pub fn fingerprint_files(flag: &str, path: &Path, paths: Vec<PathBuf>) -> Result<InputFingerprint> {
    let root = std::path::absolute(path).map_err(Error::io("reading", path))?;
    let total_files = paths.len();
    let files = paths
        .iter()
        .take(MAX_FILES)
        .map(|p| file_fingerprint(p))
        .collect::<Result<Vec<_>>>()?;
    Ok(InputFingerprint {
        flag: flag.to_string(),
        path: root,
        files,
        total_files,
    })
}

/// Every regular file under `dir` (links followed only to files).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).map_err(Error::io("listing", dir))? {
        let e = e.map_err(Error::io("listing", dir))?;
        let t = e.file_type().map_err(Error::io("listing", dir))?;
        if t.is_dir() {
            walk(&e.path(), out)?;
        } else if e.path().is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

fn file_fingerprint(path: &Path) -> Result<FileFingerprint> {
    let meta = std::fs::metadata(path).map_err(Error::io("reading", path))?;
    let bytes = meta.len();
    let modified_unix = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64());
    let mut f = std::fs::File::open(path).map_err(Error::io("reading", path))?;
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; SAMPLE as usize];
    for at in [
        0,
        bytes.saturating_sub(SAMPLE) / 2,
        bytes.saturating_sub(SAMPLE),
    ] {
        f.seek(SeekFrom::Start(at))
            .map_err(Error::io("reading", path))?;
        let n = (&mut f)
            .take(SAMPLE)
            .read(&mut buf)
            .map_err(Error::io("reading", path))?;
        crc.update(&buf[..n]);
    }
    Ok(FileFingerprint {
        path: path.to_path_buf(),
        bytes,
        modified_unix,
        sample_crc32: crc.finalize(),
    })
}

/// Writes the run's input fingerprints into its folder `dir`.
pub fn record(dir: &Path, inputs: &[InputFingerprint]) -> Result<()> {
    let text = serde_json::to_string_pretty(inputs).map_err(|source| Error::Json {
        what: "writing inputs.json",
        source,
    })?;
    write_atomic(&dir.join(INPUTS), &text)
}

/// The fingerprints the run folder `dir` recorded; `None` for a run from
/// before they were (or whose file is unreadable: nothing to compare).
pub fn recorded(dir: &Path) -> Option<Vec<InputFingerprint>> {
    let text = std::fs::read_to_string(dir.join(INPUTS)).ok()?;
    serde_json::from_str(&text).ok()
}

/// What differs between the inputs a run recorded and the same inputs now,
/// one sentence per input; empty when nothing does.
pub fn changes(recorded: &[InputFingerprint], now: &[InputFingerprint]) -> Vec<String> {
    let mut out = Vec::new();
    for was in recorded {
        let Some(is) = now.iter().find(|n| n.flag == was.flag) else {
            continue;
        };
        if let Some(why) = change(was, is) {
            out.push(format!("{} {}: {why}", was.flag, was.path.display()));
        }
    }
    out
}

fn change(was: &InputFingerprint, is: &InputFingerprint) -> Option<String> {
    if was.path != is.path {
        return Some(format!("now names {}", is.path.display()));
    }
    if was.total_files != is.total_files {
        return Some(format!(
            "held {} files, now {}",
            was.total_files, is.total_files
        ));
    }
    for (a, b) in was.files.iter().zip(&is.files) {
        let name = a.path.display();
        if a.path != b.path {
            return Some(format!(
                "{name} is gone ({} in its place)",
                b.path.display()
            ));
        }
        if a.bytes != b.bytes {
            return Some(format!("{name} was {} bytes, now {}", a.bytes, b.bytes));
        }
        if a.sample_crc32 != b.sample_crc32 {
            return Some(format!(
                "{name} has the same size but other contents (its sampled bytes differ)"
            ));
        }
        if a.modified_unix != b.modified_unix {
            return Some(format!(
                "{name} was modified since the run started (same size and sampled bytes)"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The same size with other contents is a change; an untouched file
    /// and folder are not.
    #[test]
    fn a_rewrite_of_the_same_size_is_caught() {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("d");
        std::fs::create_dir_all(data.join("sub")).unwrap();
        std::fs::write(data.join("a.csv"), "x,y\n1,2\n").unwrap();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(data.join("sub/b.bin"), &big).unwrap();
        let before = vec![fingerprint("--data", &data).unwrap()];
        assert_eq!(before[0].total_files, 2);
        record(t.path(), &before).unwrap();
        let read = recorded(t.path()).unwrap();
        assert_eq!(read, before);
        assert!(changes(&read, &[fingerprint("--data", &data).unwrap()]).is_empty());
        // One byte in the middle of the large file, same size.
        let mut edited = big.clone();
        edited[150_000] ^= 1;
        let mtime = std::fs::metadata(data.join("sub/b.bin"))
            .unwrap()
            .modified()
            .unwrap();
        std::fs::write(data.join("sub/b.bin"), &edited).unwrap();
        let f = std::fs::File::options()
            .write(true)
            .open(data.join("sub/b.bin"))
            .unwrap();
        f.set_modified(mtime).unwrap();
        let why = changes(&read, &[fingerprint("--data", &data).unwrap()]);
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(
            why[0].contains("b.bin has the same size but other contents"),
            "{why:?}"
        );
        std::fs::write(data.join("c.csv"), "").unwrap();
        let why = changes(&read, &[fingerprint("--data", &data).unwrap()]);
        assert!(why[0].contains("held 2 files, now 3"), "{why:?}");
    }
}
