//! A strict reader for IDX files (the MNIST family's format), gzipped or raw.
//!
//! Layout: two zero bytes, an element-type byte, a rank byte, `rank` big-endian
//! u32 dimensions, then the payload in row-major order. Anything else is refused
//! with an error that names the file and what was wrong.

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use crate::error::{Error, Result};

/// IDX element type of unsigned bytes, the only one the MNIST family uses.
pub const TYPE_U8: u8 = 0x08;

/// A decoded IDX array of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// Dimensions, outermost first (e.g. `[60000, 28, 28]`).
    pub dims: Vec<usize>,
    /// Row-major payload, `dims.iter().product()` bytes.
    pub data: Vec<u8>,
}

fn invalid(path: &Path, msg: impl Into<String>) -> Error {
    Error::Invalid {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

fn type_name(t: u8) -> &'static str {
    match t {
        0x08 => "unsigned byte",
        0x09 => "signed byte",
        0x0B => "i16",
        0x0C => "i32",
        0x0D => "f32",
        0x0E => "f64",
        _ => "unknown",
    }
}

/// Reads a whole file, decompressing it when it starts with the gzip magic.
pub fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    let io_err = |source: std::io::Error, hint: &str| Error::Io {
        path: path.to_path_buf(),
        source,
        hint: hint.to_string(),
    };
    let raw = std::fs::read(path).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            "check --data: it must be a folder holding the four MNIST-format files \
             (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-...)"
        } else {
            "check the file's permissions"
        };
        io_err(e, hint)
    })?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| {
                io_err(
                    e,
                    "the gzip stream is corrupt or truncated: download the file again",
                )
            })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Parses IDX bytes that came from `path` (used in messages only).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<IdxArray> {
    if bytes.is_empty() {
        return Err(invalid(
            path,
            "empty file (0 bytes); expected an IDX header",
        ));
    }
    if bytes.len() < 4 {
        return Err(invalid(
            path,
            format!(
                "{} bytes is too short for the 4-byte IDX magic",
                bytes.len()
            ),
        ));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(invalid(
            path,
            format!(
                "wrong magic {:02x} {:02x} {:02x} {:02x}: an IDX file starts with two zero bytes \
                 (is this an IDX file?)",
                bytes[0], bytes[1], bytes[2], bytes[3]
            ),
        ));
    }
    let (elem, rank) = (bytes[2], bytes[3] as usize);
    if elem != TYPE_U8 {
        return Err(invalid(
            path,
            format!(
                "element type 0x{elem:02x} ({}) is not supported; MNIST-format data is \
                 unsigned bytes (0x08)",
                type_name(elem)
            ),
        ));
    }
    if rank == 0 {
        return Err(invalid(
            path,
            "rank 0 in the IDX header; expected 1 (labels) or 3 (images)",
        ));
    }
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(invalid(
            path,
            format!(
                "truncated header: rank {rank} needs {header} bytes, the file has {}",
                bytes.len()
            ),
        ));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| invalid(path, format!("dimensions {dims:?} overflow")))?;
    let payload = bytes.len() - header;
    if payload < expected {
        return Err(invalid(
            path,
            format!(
                "truncated payload: dimensions {dims:?} need {expected} bytes, found {payload} \
                 (file cut short? download it again)"
            ),
        ));
    }
    if payload > expected {
        return Err(invalid(
            path,
            format!(
                "{} unexpected bytes after the payload of dimensions {dims:?} (wrong header?)",
                payload - expected
            ),
        ));
    }
    Ok(IdxArray {
        dims,
        data: bytes[header..].to_vec(),
    })
}

/// Reads and parses an IDX file (gzip or raw).
pub fn read(path: &Path) -> Result<IdxArray> {
    parse(path, &read_bytes(path)?)
}

/// Finds `stem` or `stem.gz` in `dir`, preferring the raw file.
pub fn locate(dir: &Path, stem: &str) -> Result<PathBuf> {
    let raw = dir.join(stem);
    if raw.is_file() {
        return Ok(raw);
    }
    let gz = dir.join(format!("{stem}.gz"));
    if gz.is_file() {
        return Ok(gz);
    }
    Err(Error::Io {
        path: gz,
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such file (nor without .gz)",
        ),
        hint: format!(
            "--data {} must hold the MNIST-format files ({stem}[.gz] is missing)",
            dir.display()
        ),
    })
}

/// Encodes an unsigned-byte IDX array (used by tests and tools to write fixtures).
pub fn encode(dims: &[usize], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, TYPE_U8, dims.len() as u8];
    for &d in dims {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(bytes: &[u8]) -> String {
        match parse(Path::new("x.idx"), bytes) {
            Ok(a) => format!("unexpectedly parsed {:?}", a.dims),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn round_trips() -> Result<()> {
        let a = parse(Path::new("x"), &encode(&[2, 3], &[1, 2, 3, 4, 5, 6]))?;
        assert_eq!(a.dims, vec![2, 3]);
        assert_eq!(a.data, vec![1, 2, 3, 4, 5, 6]);
        Ok(())
    }

    #[test]
    fn refuses_empty_file() {
        assert!(err_of(&[]).contains("empty file"));
    }

    #[test]
    fn refuses_wrong_magic() {
        let m = err_of(b"PK\x03\x04rest");
        assert!(m.contains("wrong magic") && m.starts_with("x.idx"), "{m}");
    }

    #[test]
    fn refuses_wrong_element_type() {
        let mut b = encode(&[1], &[0, 0, 0, 0]);
        b[2] = 0x0D;
        let m = err_of(&b);
        assert!(m.contains("0x0d (f32)"), "{m}");
    }

    #[test]
    fn refuses_truncated_header_and_payload() {
        assert!(err_of(&[0, 0, 8, 3, 0, 0]).contains("truncated header"));
        let b = encode(&[4, 2], &[1, 2, 3]);
        let m = err_of(&b);
        assert!(m.contains("need 8 bytes, found 3"), "{m}");
    }

    #[test]
    fn refuses_trailing_bytes() {
        assert!(err_of(&encode(&[2], &[1, 2, 3])).contains("1 unexpected bytes"));
    }

    #[test]
    fn reads_gzip_and_reports_corrupt_gzip() -> Result<()> {
        use flate2::{write::GzEncoder, Compression};
        use std::io::Write;
        let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        let io = |e: std::io::Error| Error::Config(e.to_string());
        enc.write_all(&encode(&[3], &[7, 8, 9])).map_err(io)?;
        let gz = enc.finish().map_err(io)?;
        let good = dir.path().join("a.gz");
        std::fs::write(&good, &gz).map_err(io)?;
        assert_eq!(read(&good)?.data, vec![7, 8, 9]);

        let bad = dir.path().join("b.gz");
        std::fs::write(&bad, &gz[..gz.len() / 2]).map_err(io)?;
        let m = read(&bad).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(m.contains("b.gz") && m.contains("gzip stream"), "{m}");
        Ok(())
    }

    #[test]
    fn missing_file_names_the_path_and_the_fix() {
        let m = read(Path::new("/nonexistent/train-images-idx3-ubyte.gz"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            m.contains("/nonexistent/train-images") && m.contains("--data"),
            "{m}"
        );
    }
}
