//! A strict reader for IDX files (the MNIST family's format), gzipped or raw.
//!
//! Layout: two zero bytes, an element-type byte, a rank byte, `rank` big-endian
//! u32 dimensions, then the payload in row-major order. Anything else is refused
//! with an error that names the file and what was wrong.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

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

/// Where the bytes come from, for messages: a raw file or a gzip stream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Raw,
    Gzip,
}

fn read_err(path: &Path, stream: Stream) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
        hint: match stream {
            Stream::Gzip => "the gzip stream is corrupt or truncated: download the file again",
            Stream::Raw => "check the file's permissions",
        }
        .to_string(),
    }
}

/// Fills `buf` as far as the stream goes; returns the bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Parses IDX bytes that came from `path` (used in messages only).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<IdxArray> {
    parse_stream(path, bytes, Some(bytes.len() as u64), Stream::Raw)
}

/// Parses IDX bytes held in memory, raw or gzipped, with the bounds of [`read`].
pub fn decode(path: &Path, bytes: &[u8]) -> Result<IdxArray> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        parse_stream(path, MultiGzDecoder::new(bytes), None, Stream::Gzip)
    } else {
        parse(path, bytes)
    }
}

/// Reads and parses an IDX file, raw or gzipped (one or several gzip members,
/// as `cat a.gz b.gz` makes). It streams: the header is read first and
/// checked, a raw file's size is checked against it before anything is
/// allocated, and a gzip stream is decompressed only as far as the payload
/// the header declares (plus one byte, to notice trailing data), so a small
/// file that inflates to gigabytes costs no more memory than its header says.
pub fn read(path: &Path) -> Result<IdxArray> {
    // A regular file only: a FIFO or device has no end.
    let (file, _) = redline_core::files::open_input(path, u64::MAX).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            "check --data: it must be a folder holding the four MNIST-format files \
             (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-...)"
        } else {
            "check the file's permissions"
        };
        Error::Io {
            path: path.to_path_buf(),
            source: e,
            hint: hint.to_string(),
        }
    })?;
    let size = file.metadata().map(|m| m.len()).ok();
    let mut r = BufReader::new(file);
    let head = r.fill_buf().map_err(read_err(path, Stream::Raw))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        parse_stream(path, MultiGzDecoder::new(r), None, Stream::Gzip)
    } else {
        parse_stream(path, r, size, Stream::Raw)
    }
}

/// Refuses a header whose first four bytes are not an unsigned-byte IDX
/// magic; returns the rank.
fn check_magic(path: &Path, magic: [u8; 4]) -> Result<usize> {
    if magic[0] != 0 || magic[1] != 0 {
        return Err(invalid(
            path,
            format!(
                "wrong magic {:02x} {:02x} {:02x} {:02x}: an IDX file starts with two zero bytes \
                 (is this an IDX file?)",
                magic[0], magic[1], magic[2], magic[3]
            ),
        ));
    }
    let (elem, rank) = (magic[2], magic[3] as usize);
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
    Ok(rank)
}

/// The IDX parser over a stream of `total` bytes (when known).
fn parse_stream(
    path: &Path,
    mut r: impl Read,
    total: Option<u64>,
    stream: Stream,
) -> Result<IdxArray> {
    let io = read_err(path, stream);
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut r, &mut magic).map_err(&io)?;
    if n == 0 {
        return Err(invalid(
            path,
            "empty file (0 bytes); expected an IDX header",
        ));
    }
    if n < 4 {
        return Err(invalid(
            path,
            format!("{n} bytes is too short for the 4-byte IDX magic"),
        ));
    }
    let rank = check_magic(path, magic)?;
    let header = 4 + 4 * rank;
    let mut dim_bytes = vec![0u8; 4 * rank];
    let n = read_up_to(&mut r, &mut dim_bytes).map_err(&io)?;
    if n < dim_bytes.len() {
        return Err(invalid(
            path,
            format!(
                "truncated header: rank {rank} needs {header} bytes, the file has {}",
                4 + n
            ),
        ));
    }
    let dims: Vec<usize> = dim_bytes
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| invalid(path, format!("dimensions {dims:?} overflow")))?;
    let truncated = |found: u64| {
        invalid(
            path,
            format!(
                "truncated payload: dimensions {dims:?} need {expected} bytes, found {found} \
                 (file cut short? download it again)"
            ),
        )
    };
    if let Some(total) = total {
        // A raw file's size says everything before any allocation.
        let payload = total.saturating_sub(header as u64);
        if payload < expected as u64 {
            return Err(truncated(payload));
        }
        if payload > expected as u64 {
            return Err(invalid(
                path,
                format!(
                    "{} unexpected bytes after the payload of dimensions {dims:?} (wrong header?)",
                    payload - expected as u64
                ),
            ));
        }
    }
    // Grown as bytes arrive: a header alone cannot make it allocate much.
    let mut data = Vec::with_capacity(expected.min(1 << 26));
    r.take(expected as u64 + 1)
        .read_to_end(&mut data)
        .map_err(&io)?;
    if data.len() < expected {
        return Err(truncated(data.len() as u64));
    }
    if data.len() > expected {
        return Err(invalid(
            path,
            format!(
                "the data goes on after the {expected}-byte payload of dimensions {dims:?} \
                 (wrong header, or another file appended?); reading stopped there"
            ),
        ));
    }
    Ok(IdxArray { dims, data })
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

    fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
        use flate2::{write::GzEncoder, Compression};
        use std::io::Write;
        let io = |e: std::io::Error| Error::Config(e.to_string());
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(bytes).map_err(io)?;
        enc.finish().map_err(io)
    }

    #[test]
    fn reads_multi_member_gzip() -> Result<()> {
        // `cat a.gz b.gz`: one IDX file split over two gzip members.
        let whole = encode(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let mut two = gzip(&whole[..9])?;
        two.extend(gzip(&whole[9..])?);
        let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
        let p = dir.path().join("two.gz");
        std::fs::write(&p, two).map_err(|e| Error::Config(e.to_string()))?;
        assert_eq!(read(&p)?.data, vec![1, 2, 3, 4, 5, 6]);
        Ok(())
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_size_its_header_declares() -> Result<()> {
        // 3 declared bytes, then 256 MiB of zeros (about 250 KB compressed).
        use flate2::{write::GzEncoder, Compression};
        use std::io::Write;
        let io = |e: std::io::Error| Error::Config(e.to_string());
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        enc.write_all(&encode(&[3], &[7, 8, 9])).map_err(io)?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..256 {
            enc.write_all(&zeros).map_err(io)?;
        }
        let gz = enc.finish().map_err(io)?;
        assert!(gz.len() < 1 << 20);
        let dir = tempfile::tempdir().map_err(io)?;
        let p = dir.path().join("bomb.gz");
        std::fs::write(&p, gz).map_err(io)?;
        let m = read(&p).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(m.contains("goes on after the 3-byte payload"), "{m}");
        // A header that declares more than the stream holds is truncated, not allocated.
        let p = dir.path().join("claims.gz");
        std::fs::write(&p, gzip(&encode(&[60000, 28, 28], &[1, 2, 3]))?).map_err(io)?;
        let m = read(&p).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(m.contains("need 47040000 bytes, found 3"), "{m}");
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
