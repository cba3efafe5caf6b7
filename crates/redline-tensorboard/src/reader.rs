//! [`read_scalars`]: reads an event file back, checking every record's CRCs.
//! Used by tests and by reports that summarise a run from its event file.

use std::fs;
use std::path::Path;

use crate::error::{Error, Result};
use crate::proto::decode_event;
use crate::record::{masked_crc32c, FOOTER_LEN, HEADER_LEN};

/// Reads every simple scalar in the event file at `path` as `(tag, step, value)`,
/// in file order.
///
/// Both CRCs of every record are checked; a mismatch, a file that ends inside a
/// record, or a record that is not an `Event` is an error naming the file and
/// the record's byte offset. Summary values that are not simple scalars
/// (histograms, images, tensors) are skipped.
pub fn read_scalars(path: &Path) -> Result<Vec<(String, i64, f64)>> {
    let bytes = fs::read(path).map_err(|source| Error::Io {
        op: "reading event file",
        path: path.to_path_buf(),
        source,
    })?;
    let mut scalars = Vec::new();
    for record in Records::new(path, &bytes) {
        let (offset, data) = record?;
        let event = decode_event(data).map_err(|reason| Error::Malformed {
            path: path.to_path_buf(),
            offset,
            reason,
        })?;
        let step = event.step;
        scalars.extend(
            event
                .scalars
                .into_iter()
                .map(|(tag, v)| (tag, step, f64::from(v))),
        );
    }
    Ok(scalars)
}

/// Iterates over the TFRecords in `bytes`, yielding `(offset, data)` or the
/// first framing error (after which it stops).
struct Records<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> Records<'a> {
    fn new(path: &'a Path, bytes: &'a [u8]) -> Self {
        Self {
            path,
            bytes,
            pos: 0,
            failed: false,
        }
    }

    /// Parses the record at `self.pos`, returning its data and the offset after it.
    fn record(&self) -> Result<(&'a [u8], usize)> {
        let offset = self.pos as u64;
        let rest = &self.bytes[self.pos..];
        let truncated = |needed: u64| Error::Truncated {
            path: self.path.to_path_buf(),
            offset,
            needed,
            available: rest.len() as u64,
        };
        let bad_crc = |part, stored, computed| Error::BadCrc {
            path: self.path.to_path_buf(),
            offset,
            part,
            stored,
            computed,
        };

        let (Some(len_bytes), Some(len_crc)) = (rest.get(..8), rest.get(8..HEADER_LEN)) else {
            return Err(truncated(HEADER_LEN as u64));
        };
        let stored = le_u32(len_crc);
        let computed = masked_crc32c(len_bytes);
        // The length is checked before it is trusted: a corrupt one could claim gigabytes.
        if stored != computed {
            return Err(bad_crc("length", stored, computed));
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(len_bytes);
        let len = u64::from_le_bytes(len);
        let needed = len.saturating_add((HEADER_LEN + FOOTER_LEN) as u64);
        let end = match usize::try_from(needed) {
            Ok(n) if n <= rest.len() => n,
            _ => return Err(truncated(needed)),
        };
        let data = &rest[HEADER_LEN..end - FOOTER_LEN];
        let stored = le_u32(&rest[end - FOOTER_LEN..end]);
        let computed = masked_crc32c(data);
        if stored != computed {
            return Err(bad_crc("data", stored, computed));
        }
        Ok((data, self.pos + end))
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(u64, &'a [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.bytes.len() {
            return None;
        }
        let offset = self.pos as u64;
        match self.record() {
            Ok((data, next)) => {
                self.pos = next;
                Some(Ok((offset, data)))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Little-endian u32 from a slice of at least 4 bytes (callers slice exactly 4).
fn le_u32(b: &[u8]) -> u32 {
    let mut buf = [0u8; 4];
    buf.copy_from_slice(&b[..4]);
    u32::from_le_bytes(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::EventWriter;
    use std::path::PathBuf;

    /// Writes a small file: the version record, then two scalar events.
    fn sample_file(dir: &Path) -> PathBuf {
        let mut w = EventWriter::create(dir).unwrap();
        w.add_scalar("loss", 1, 0.5, 100.0).unwrap();
        w.add_scalars(2, &[("loss", 0.25), ("lr", 1e-3)], 101.0)
            .unwrap();
        w.path().to_path_buf()
        // Dropped here: the drop flushes.
    }

    /// Byte offsets of the records in `bytes` (all valid).
    fn record_offsets(path: &Path, bytes: &[u8]) -> Vec<u64> {
        Records::new(path, bytes).map(|r| r.unwrap().0).collect()
    }

    #[test]
    fn write_read_roundtrip() {
        let tmp = tempfile::tempdir().unwrap();
        let path = sample_file(tmp.path());
        let got = read_scalars(&path).unwrap();
        let want = vec![
            ("loss".to_owned(), 1, 0.5),
            ("loss".to_owned(), 2, 0.25),
            ("lr".to_owned(), 2, f64::from(1e-3f32)),
        ];
        assert_eq!(got, want);

        let bytes = fs::read(&path).unwrap();
        let (_, first) = Records::new(&path, &bytes).next().unwrap().unwrap();
        let first = decode_event(first).unwrap();
        assert_eq!(first.file_version.as_deref(), Some("brain.Event:2"));
        assert!(first.scalars.is_empty());
    }

    #[test]
    fn explicit_flush_makes_records_visible() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(tmp.path()).unwrap();
        assert_eq!(read_scalars(w.path()).unwrap(), vec![]);
        w.add_scalar("acc", -3, 0.75, 5.0).unwrap();
        w.flush().unwrap();
        assert_eq!(
            read_scalars(w.path()).unwrap(),
            vec![("acc".to_owned(), -3, 0.75)]
        );
    }

    #[test]
    fn truncated_file_is_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = sample_file(tmp.path());
        let bytes = fs::read(&path).unwrap();
        let last = *record_offsets(&path, &bytes).last().unwrap();

        // Cut inside the last record's data.
        fs::write(&path, &bytes[..bytes.len() - 6]).unwrap();
        let err = read_scalars(&path).unwrap_err();
        assert!(
            matches!(err, Error::Truncated { offset, available, .. }
                if offset == last && available == bytes.len() as u64 - 6 - last),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains(&format!("record at byte {last}")), "{msg}");
        assert!(msg.contains("truncated"), "{msg}");

        // Cut inside the last record's header.
        fs::write(&path, &bytes[..last as usize + 5]).unwrap();
        let err = read_scalars(&path).unwrap_err();
        assert!(
            matches!(err, Error::Truncated { offset, needed: 12, available: 5, .. } if offset == last),
            "{err:?}"
        );
    }

    #[test]
    fn flipped_byte_is_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = sample_file(tmp.path());
        let bytes = fs::read(&path).unwrap();
        let second = record_offsets(&path, &bytes)[1];

        // A flipped data byte fails the data CRC.
        let mut corrupt = bytes.clone();
        corrupt[second as usize + HEADER_LEN + 2] ^= 0x01;
        fs::write(&path, &corrupt).unwrap();
        let err = read_scalars(&path).unwrap_err();
        assert!(
            matches!(err, Error::BadCrc { offset, part: "data", .. } if offset == second),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!("record at byte {second}: data CRC mismatch")),
            "{msg}"
        );

        // A flipped length byte fails the length CRC (before the length is used).
        let mut corrupt = bytes.clone();
        corrupt[second as usize + 7] ^= 0x80;
        fs::write(&path, &corrupt).unwrap();
        let err = read_scalars(&path).unwrap_err();
        assert!(
            matches!(err, Error::BadCrc { offset, part: "length", .. } if offset == second),
            "{err:?}"
        );
    }

    #[test]
    fn valid_framing_around_a_bad_event_is_malformed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.out.tfevents.bad");
        let mut bytes = Vec::new();
        crate::record::write_record(&mut bytes, &[0x12, 0x00]).unwrap();
        fs::write(&path, &bytes).unwrap();
        let err = read_scalars(&path).unwrap_err();
        assert!(matches!(err, Error::Malformed { offset: 0, .. }), "{err:?}");
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = read_scalars(Path::new("/nonexistent/events.out.tfevents.x")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/nonexistent/events.out.tfevents.x: reading event file"),
            "{err}"
        );
    }
}
