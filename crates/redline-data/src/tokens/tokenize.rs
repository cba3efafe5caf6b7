//! A text file tokenised by a Hugging Face `tokenizer.json` into a cached
//! token file, streamed: the text is memory-mapped and encoded a few
//! megabytes at a time on the compute threads, the ids appended to a
//! temporary file that is renamed into the cache when whole. Memory stays
//! bounded by the threads times the piece size, whatever the text's size.
//!
//! Pieces end after a newline that an ASCII letter, digit or punctuation
//! mark follows: GPT-2's byte-level pre-tokenizer never joins a newline
//! to such a character, so the ids equal those of encoding the whole text
//! at once (a test holds them equal). The cache is keyed by the text (its
//! absolute path, size and modification time) and the tokenizer file's
//! bytes: a changed text or tokenizer is tokenised again; the next run on
//! the same pair reads the cached ids.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::{Codec, IdWidth};
use crate::error::{Error, Result};

/// Bytes of text a piece holds (at least).
const PIECE: usize = 4 << 20;

/// Where tokenised text is cached: `$REDLINE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/redline`, else `~/.cache/redline`, each with `tokens/`.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("REDLINE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("redline")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/redline")))
        .unwrap_or_else(|| std::env::temp_dir().join("redline-cache"));
    base.join("tokens")
}

/// The tokenised text: its cached file, the ids' width, the vocabulary,
/// and whether it was made now (else read from the cache).
pub struct Tokenised {
    /// The cached token file.
    pub path: PathBuf,
    /// Bytes per id in it.
    pub width: IdWidth,
    /// The tokenizer's vocabulary (with its added tokens).
    pub vocab: usize,
    /// Made by this call (false: found in the cache).
    pub made: bool,
}

/// `text` tokenised by the tokenizer file `tokenizer` into `cache` (see
/// the module's documentation); `stop` interrupts it between pieces.
pub fn tokenise_cached(
    text: &Path,
    tokenizer: &Path,
    cache: &Path,
    stop: &AtomicBool,
) -> Result<Tokenised> {
    tokenise_in_pieces(text, tokenizer, cache, stop, PIECE)
}

/// [`tokenise_cached`] with pieces of at least `piece` bytes.
fn tokenise_in_pieces(
    text: &Path,
    tokenizer: &Path,
    cache: &Path,
    stop: &AtomicBool,
    piece: usize,
) -> Result<Tokenised> {
    let codec = Codec::tokenizer(tokenizer)?;
    let vocab = codec.vocab();
    let width = match vocab {
        0..=65536 => IdWidth::U16,
        _ => IdWidth::U32,
    };
    let io = |path: &Path, hint: &str| {
        let path = path.to_path_buf();
        let hint = hint.to_string();
        move |source| Error::Io { path, source, hint }
    };
    let key = cache_key(text, tokenizer)?;
    let stem = text
        .file_stem()
        .map_or("text".into(), |s| s.to_string_lossy().into_owned());
    let ext = match width {
        IdWidth::U32 => "u32",
        _ => "bin",
    };
    let path = cache.join(format!("{stem}-{key}.{ext}"));
    if path.is_file() {
        return Ok(Tokenised {
            path,
            width,
            vocab,
            made: false,
        });
    }
    std::fs::create_dir_all(cache).map_err(io(
        cache,
        "tokenised text is cached here; set REDLINE_CACHE_DIR to a folder you can write",
    ))?;
    let file = std::fs::File::open(text).map_err(io(text, "check the path given to --data"))?;
    let len = file
        .metadata()
        .map_err(io(text, "check the path given to --data"))?
        .len();
    // SAFETY: read-only map; the text changing underneath changes the ids
    // read, not the safety of reading these bytes (the length is fixed).
    let map = match len {
        0 => None,
        _ => {
            Some(unsafe { memmap2::Mmap::map(&file) }.map_err(io(text, "it could not be mapped"))?)
        }
    };
    let bytes: &[u8] = map.as_deref().unwrap_or_default();
    let tmp = cache.join(format!(".{stem}-{key}.{}.part", std::process::id()));
    let result = write_ids(bytes, text, &codec, width, &tmp, stop, piece);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &path).map_err(io(&path, "the cache folder must be writable"))?;
    Ok(Tokenised {
        path,
        width,
        vocab,
        made: true,
    })
}

/// The cache key of `text` under `tokenizer`: 16 hex digits of a hash of
/// the text's absolute path, size and modification time, and the
/// tokenizer's bytes.
fn cache_key(text: &Path, tokenizer: &Path) -> Result<String> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io {
            path,
            source,
            hint: "check the path".into(),
        }
    };
    let meta = std::fs::metadata(text).map_err(io(text))?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let mut h = Sha256::new();
    h.update(
        std::path::absolute(text)
            .map_err(io(text))?
            .as_os_str()
            .as_encoded_bytes(),
    );
    h.update(meta.len().to_le_bytes());
    h.update(modified.to_le_bytes());
    h.update(std::fs::read(tokenizer).map_err(io(tokenizer))?);
    Ok(h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Where the piece starting at `from` ends: after a newline followed by an
/// ASCII graphic character, at least `piece` bytes on (the text's end if
/// none).
fn piece_end(bytes: &[u8], from: usize, piece: usize) -> usize {
    let mut i = (from + piece.max(1)).min(bytes.len());
    while i < bytes.len() {
        if bytes[i - 1] == b'\n' && bytes[i].is_ascii_graphic() {
            return i;
        }
        i += 1;
    }
    bytes.len()
}

/// Encodes `bytes` piece by piece (a group of pieces at a time, in
/// parallel) and writes the ids to `out`.
fn write_ids(
    bytes: &[u8],
    text: &Path,
    codec: &Codec,
    width: IdWidth,
    out: &Path,
    stop: &AtomicBool,
    piece: usize,
) -> Result<()> {
    let io = |source| Error::Io {
        path: out.to_path_buf(),
        source,
        hint: "the cache folder must be writable, with room for the ids".into(),
    };
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).map_err(io)?);
    let group = rayon::current_num_threads().max(1);
    let mut at = 0;
    while at < bytes.len() {
        if stop.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        let mut pieces = Vec::with_capacity(group);
        while pieces.len() < group && at < bytes.len() {
            let end = piece_end(bytes, at, piece);
            pieces.push(at..end);
            at = end;
        }
        let ids = pieces
            .par_iter()
            .map(|r| {
                let piece = std::str::from_utf8(&bytes[r.clone()]).map_err(|e| Error::Invalid {
                    path: text.to_path_buf(),
                    msg: format!(
                        "is not UTF-8 at byte {}: a tokenizer takes text, so invalid bytes are \
                         refused, not replaced\nHINT: convert it to UTF-8 (iconv), or train on \
                         its bytes without --tokenizer",
                        r.start + e.valid_up_to()
                    ),
                })?;
                codec.encode(piece)
            })
            .collect::<Result<Vec<Vec<u32>>>>()?;
        for id in ids.iter().flatten() {
            match width {
                IdWidth::U32 => w.write_all(&id.to_le_bytes()),
                // The vocabulary fits 16 bits.
                _ => w.write_all(&(*id as u16).to_le_bytes()),
            }
            .map_err(io)?;
        }
    }
    w.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::tokens::TokenFile;

    fn tokenizer() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/golden/hf-gpt2-tiny/tokenizer.json")
    }

    /// The golden tokenizer with two more merges, newline-newline and
    /// newline-space (GPT-2's own vocabulary has such tokens), written
    /// into `dir`: ids that a piece boundary inside whitespace would
    /// change.
    fn joining_tokenizer(dir: &Path) -> PathBuf {
        let text = std::fs::read_to_string(tokenizer()).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let model = &mut v["model"];
        model["vocab"]["\u{10a}\u{10a}"] = 320.into();
        model["vocab"]["\u{10a}\u{120}"] = 321.into();
        let merges = model["merges"].as_array_mut().unwrap();
        merges.insert(0, serde_json::json!(["\u{10a}", "\u{10a}"]));
        merges.insert(1, serde_json::json!(["\u{10a}", "\u{120}"]));
        let out = dir.join("joining.json");
        std::fs::write(&out, v.to_string()).unwrap();
        out
    }

    /// Lines of code-like text with blank lines, indentation and non-ASCII
    /// characters.
    fn text() -> String {
        (0..3000)
            .map(|i| match i % 5 {
                0 => format!("def f{i}(x):\n"),
                1 => format!("    return x * {i}  # é→ {}\n", i % 7),
                2 => "\n\n".into(),
                3 => format!("  \tclass C{i}:\n"),
                _ => format!("print('{i}')\n"),
            })
            .collect()
    }

    #[test]
    fn pieces_give_the_whole_texts_ids_and_the_cache_is_reused() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("code.txt");
        std::fs::write(&path, text()).unwrap();
        let stop = AtomicBool::new(false);
        let cache = t.path().join("cache");
        let joining = joining_tokenizer(t.path());
        // Pieces of about 1 KB: dozens of boundaries.
        let got = tokenise_in_pieces(&path, &joining, &cache, &stop, 1024).unwrap();
        assert!(got.made && got.width == IdWidth::U16 && got.vocab == 322);
        let f = TokenFile::open(&got.path, got.width).unwrap();
        let ids: Vec<u32> = (0..f.len()).map(|i| f.id(i)).collect();
        let whole = Codec::tokenizer(&joining).unwrap().encode(&text()).unwrap();
        // The joined newlines are there to be split.
        assert!(whole.contains(&320) && whole.contains(&321));
        assert_eq!(ids.len(), whole.len());
        assert!(ids == whole, "the pieces' ids differ from the whole text's");
        let path_joined = got.path.clone();
        // The same pair again: read from the cache, nothing made; another
        // tokenizer makes another file.
        let again = tokenise_cached(&path, &joining, &cache, &stop).unwrap();
        assert!(!again.made && again.path == path_joined);
        let other = tokenise_cached(&path, &tokenizer(), &cache, &stop).unwrap();
        assert!(other.made && other.path != path_joined);
        // A changed text is tokenised afresh, under another name.
        std::fs::write(&path, "short text\n").unwrap();
        let changed = tokenise_cached(&path, &tokenizer(), &cache, &stop).unwrap();
        assert!(changed.made && changed.path != got.path);
        // No partial files are left in the cache.
        let names: Vec<String> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".part")), "{names:?}");
    }

    #[test]
    fn invalid_utf8_is_refused_at_its_byte_and_a_stop_leaves_nothing() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("bad.txt");
        let mut bytes = b"good line\n".repeat(300);
        bytes[1234] = 0xFF;
        std::fs::write(&path, &bytes).unwrap();
        let cache = t.path().join("cache");
        let stop = AtomicBool::new(false);
        let e = tokenise_in_pieces(&path, &tokenizer(), &cache, &stop, 100)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not UTF-8 at byte 1234"), "{e}");
        let stop = AtomicBool::new(true);
        std::fs::write(&path, b"fine\n".repeat(10)).unwrap();
        let e = tokenise_cached(&path, &tokenizer(), &cache, &stop);
        assert!(matches!(e, Err(Error::Interrupted)));
        assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);
    }
}
