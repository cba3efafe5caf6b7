//! Token data for language models (issue 50): a stream of token ids, and
//! windows of `block + 1` of them as samples.
//!
//! * [`TokenFile`]: the ids of one file, memory-mapped, never read whole: a
//!   text file as its UTF-8 bytes (a 256-id vocabulary, as nanoGPT's
//!   byte-level data), or nanoGPT's `train.bin` / `val.bin` (little-endian
//!   `uint16`). Checked once when opened: a `.bin` of odd length, and ids at
//!   or beyond the vocabulary (named with their offset), are errors.
//! * [`TokenWindows`]: the samples: input ids `x = t[s .. s + block]` and
//!   next-token targets `y = t[s + 1 .. s + block + 1]`. Training windows
//!   start at random offsets, as nanoGPT's `get_batch` draws them, each
//!   sample's from its own place in one seeded stream (so the same whatever
//!   order or batch gathers it, and a resumed run sees the same);
//!   evaluation windows are the split's consecutive blocks.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::dataset::{Dataset, TargetKind, TargetsMut};
use crate::error::{Error, Result};

mod codec;
mod tokenize;

pub use codec::{Codec, Streamer};
pub use tokenize::{cache_dir, tokenise_cached, Tokenised};

/// Bytes per id in a token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdWidth {
    /// One byte per id: text read as UTF-8 bytes (vocabulary 256).
    U8,
    /// nanoGPT's `.bin`: little-endian `uint16`.
    U16,
    /// Little-endian `uint32`: tokenised text of a vocabulary above 65536.
    U32,
}

impl IdWidth {
    fn bytes(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }
}

/// The token ids of one file, memory-mapped.
pub struct TokenFile {
    map: Option<memmap2::Mmap>,
    width: IdWidth,
    path: PathBuf,
    /// One more than the largest id (0 for an empty file).
    id_bound: u32,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .field("width", &self.width)
            .field("len", &self.len())
            .finish()
    }
}

fn invalid(path: &Path, msg: String) -> Error {
    Error::Invalid {
        path: path.to_path_buf(),
        msg,
    }
}

impl TokenFile {
    /// Maps `path` as ids of `width`: a `.bin` of odd length is refused.
    pub fn open(path: &Path, width: IdWidth) -> Result<Self> {
        let file = File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
            hint: "check the path given to --data".into(),
        })?;
        let len = file
            .metadata()
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
                hint: "check the path given to --data".into(),
            })?
            .len();
        if width == IdWidth::U32 && len % 4 != 0 {
            return Err(invalid(
                path,
                format!("is {len} bytes, not a whole number of uint32 token ids (4 bytes each)"),
            ));
        }
        if width == IdWidth::U16 && len % 2 == 1 {
            return Err(invalid(
                path,
                format!(
                    "is {len} bytes, an odd length: a nanoGPT .bin holds uint16 token ids, \
                     2 bytes each (a truncated copy?)\nHINT: write it again with \
                     `np.array(ids, dtype=np.uint16).tofile(path)`"
                ),
            ));
        }
        // An empty file cannot be mapped on every platform; it has no ids.
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the map is read-only; a file changed by another process
            // while mapped would change the ids read, not memory safety of
            // these byte reads (the length is fixed at map time).
            Some(
                unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
                    path: path.to_path_buf(),
                    source,
                    hint: "the file could not be memory-mapped".into(),
                })?,
            )
        };
        let mut out = Self {
            map,
            width,
            path: path.to_path_buf(),
            id_bound: 0,
        };
        out.id_bound = out.scan_bound();
        Ok(out)
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or_default()
    }

    /// Ids in the file.
    pub fn len(&self) -> usize {
        self.bytes().len() / self.width.bytes()
    }

    /// True when the file holds no ids.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes per id.
    pub fn width(&self) -> IdWidth {
        self.width
    }

    /// Id `i` (`i < len`).
    #[inline]
    fn id(&self, i: usize) -> u32 {
        let b = self.bytes();
        match self.width {
            IdWidth::U8 => u32::from(b[i]),
            IdWidth::U16 => u32::from(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])),
            IdWidth::U32 => {
                u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            }
        }
    }

    /// One more than the largest id: the smallest vocabulary the file fits.
    pub fn id_bound(&self) -> u32 {
        self.id_bound
    }

    /// The largest id + 1, in parallel over the mapped bytes.
    fn scan_bound(&self) -> u32 {
        const CHUNK: usize = 1 << 20;
        match self.width {
            IdWidth::U8 => self
                .bytes()
                .par_chunks(CHUNK)
                .map(|c| c.iter().copied().max().map_or(0, |m| u32::from(m) + 1))
                .max()
                .unwrap_or(0),
            IdWidth::U16 => self
                .bytes()
                .par_chunks(2 * CHUNK)
                .map(|c| {
                    c.chunks_exact(2)
                        .map(|p| u16::from_le_bytes([p[0], p[1]]))
                        .max()
                        .map_or(0, |m| u32::from(m) + 1)
                })
                .max()
                .unwrap_or(0),
            IdWidth::U32 => self
                .bytes()
                .par_chunks(4 * CHUNK)
                .map(|c| {
                    c.chunks_exact(4)
                        .map(|p| u32::from_le_bytes([p[0], p[1], p[2], p[3]]))
                        .max()
                        .map_or(0, |m| m.saturating_add(1))
                })
                .max()
                .unwrap_or(0),
        }
    }

    /// Refuses ids at or beyond `vocab`, naming the first and its offset.
    pub fn check_vocab(&self, vocab: usize) -> Result<()> {
        if (self.id_bound as usize) <= vocab {
            return Ok(());
        }
        let first = (0..self.len())
            .find(|&i| self.id(i) as usize >= vocab)
            .unwrap_or(0);
        let id = self.id(first);
        Err(invalid(
            &self.path,
            format!(
                "token id {id} at id offset {first} (byte {}) is outside the vocabulary of \
                 {vocab} (ids 0..{vocab}); the file's largest id is {}\nHINT: set the \
                 model's vocab_size to at least {}, or re-tokenise the data",
                first * self.width.bytes(),
                self.id_bound - 1,
                self.id_bound
            ),
        ))
    }
}

/// How a [`TokenWindows`] draws its windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Windows {
    /// Random starts (training): each sample's from `seed`, the epoch and
    /// its index.
    Random {
        /// The stream's seed.
        seed: u64,
    },
    /// The range's consecutive blocks (evaluation).
    Consecutive,
}

/// Windows of `block + 1` ids of a range of a [`TokenFile`] as samples:
/// inputs `(block,)` (ids as f32, exact below 2^24), targets the next
/// ids `(block,)`.
pub struct TokenWindows {
    tokens: Arc<TokenFile>,
    start: usize,
    end: usize,
    block: usize,
    vocab: usize,
    how: Windows,
    dims: [usize; 1],
    epoch: AtomicUsize,
}

impl std::fmt::Debug for TokenWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenWindows")
            .field("tokens", &self.tokens)
            .field("range", &(self.start..self.end))
            .field("block", &self.block)
            .field("vocab", &self.vocab)
            .field("how", &self.how)
            .finish()
    }
}

impl TokenWindows {
    /// The windows of `tokens[range]`, `block` inputs each, for a model of
    /// `vocab` ids (every id of the file checked against it). Refused when
    /// the range holds fewer than `block + 1` ids.
    pub fn new(
        tokens: Arc<TokenFile>,
        range: std::ops::Range<usize>,
        block: usize,
        vocab: usize,
        how: Windows,
    ) -> Result<Self> {
        if block == 0 || vocab == 0 {
            return Err(Error::Config(format!(
                "token windows need a block size and a vocabulary above 0 (block {block}, \
                 vocabulary {vocab})"
            )));
        }
        let end = range.end.min(tokens.len());
        let n = end.saturating_sub(range.start);
        if n < block + 1 {
            return Err(invalid(
                tokens.path(),
                format!(
                    "holds {n} token ids in this split, fewer than block_size + 1 = {}: a \
                     sample is {block} inputs and the {block} ids after them\nHINT: use \
                     more text, a smaller block_size, or a smaller --val-split",
                    block + 1
                ),
            ));
        }
        if vocab > 1 << 24 {
            return Err(Error::Config(format!(
                "a vocabulary of {vocab} ids: inputs carry ids as f32, exact only below 2^24"
            )));
        }
        tokens.check_vocab(vocab)?;
        Ok(Self {
            tokens,
            start: range.start,
            end,
            block,
            vocab,
            how,
            dims: [block],
            epoch: AtomicUsize::new(0),
        })
    }

    /// The range's last `frac` of ids as an evaluation split (consecutive
    /// windows), and the rest for training (windows drawn as before):
    /// nanoGPT's 90/10 cut of a text. Each part must hold a window.
    pub fn split_tail(&self, frac: f64) -> Result<(Self, Self)> {
        let held = ((self.tokens() as f64) * frac).round() as usize;
        let cut = self.end - held.min(self.tokens());
        let train = Self::new(
            self.tokens.clone(),
            self.start..cut,
            self.block,
            self.vocab,
            self.how,
        )?;
        let val = Self::new(
            self.tokens.clone(),
            cut..self.end,
            self.block,
            self.vocab,
            Windows::Consecutive,
        )?;
        Ok((train, val))
    }

    /// Ids in the range.
    pub fn tokens(&self) -> usize {
        self.end - self.start
    }

    /// Where sample `i`'s window starts in the file.
    pub fn window_start(&self, i: usize) -> usize {
        let span = self.tokens() - self.block;
        match self.how {
            Windows::Consecutive => self.start + i * self.block,
            Windows::Random { seed } => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                // A stream apart from the loader's shuffling streams.
                rng.set_stream(u64::MAX - 2);
                let epoch = self.epoch.load(Ordering::Relaxed) as u128;
                // Each sample's draw from its own place in the stream (8
                // words apart: a draw takes two, rejection rarely more).
                rng.set_word_pos((epoch * self.len() as u128 + i as u128) * 8);
                self.start + rng.random_range(0..span)
            }
        }
    }
}

impl Dataset for TokenWindows {
    /// Training: as many windows as the range has blocks (an epoch sees
    /// about as many ids as the split holds); evaluation: its whole blocks.
    fn len(&self) -> usize {
        (self.tokens() - 1) / self.block
    }

    fn input_dims(&self) -> &[usize] {
        &self.dims
    }

    fn target(&self) -> TargetKind {
        TargetKind::Tokens {
            vocab: self.vocab,
            len: self.block,
        }
    }

    fn gather(&self, idx: &[u32], x: &mut [f32], y: TargetsMut<'_>) -> Result<()> {
        let t = self.block;
        let TargetsMut::Classes(y) = y else {
            return Err(Error::Config(
                "token windows take id targets (a staging buffer for values was given)".into(),
            ));
        };
        if x.len() < idx.len() * t || y.len() < idx.len() * t {
            return Err(Error::Config(format!(
                "staging buffer holds {} windows, batch has {}",
                (x.len() / t).min(y.len() / t),
                idx.len()
            )));
        }
        let n = self.len();
        for (k, &i) in idx.iter().enumerate() {
            let i = i as usize;
            if i >= n {
                return Err(Error::Config(format!(
                    "sample index {i} beyond the split's {n} windows"
                )));
            }
            let s = self.window_start(i);
            let (xs, ys) = (&mut x[k * t..(k + 1) * t], &mut y[k * t..(k + 1) * t]);
            for j in 0..t {
                xs[j] = self.tokens.id(s + j) as f32;
                ys[j] = self.tokens.id(s + j + 1);
            }
        }
        Ok(())
    }

    fn source(&self) -> &Path {
        self.tokens.path()
    }

    fn set_epoch(&self, epoch: usize) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
