//! One split's samples as the readers give them: decoded into host memory
//! ([`HostData`]), or listed on disk and decoded as batches gather them
//! ([`Streamed`]). Both are a [`Dataset`]; the loader treats them alike.

use std::path::Path;

use crate::dataset::{Dataset, HostData, TargetKind, Targets, TargetsMut};
use crate::error::Result;
use crate::stream::{ChannelNorm, Streamed};
use crate::tokens::TokenWindows;
use std::sync::Arc;

/// A split's samples, resident on the host or streamed from disk.
#[derive(Debug, Clone)]
pub enum Samples {
    /// Decoded once, held in host memory.
    Host(HostData),
    /// Read and decoded from disk each time a batch gathers them.
    Streamed(Box<Streamed>),
    /// Windows of a memory-mapped token file (a language model's data):
    /// always streamed, each training window drawn afresh every epoch.
    Tokens(Arc<TokenWindows>),
}

impl From<HostData> for Samples {
    fn from(d: HostData) -> Self {
        Self::Host(d)
    }
}

impl Samples {
    /// The host data, when resident.
    pub fn host(&self) -> Option<&HostData> {
        match self {
            Self::Host(d) => Some(d),
            Self::Streamed(_) | Self::Tokens(_) => None,
        }
    }

    /// The streamed source, when streamed.
    pub fn streamed(&self) -> Option<&Streamed> {
        match self {
            Self::Host(_) | Self::Tokens(_) => None,
            Self::Streamed(s) => Some(s),
        }
    }

    /// Bytes the samples take decoded as fp32: what resident data holds,
    /// and what a streamed split would.
    pub fn bytes(&self) -> u64 {
        match self {
            Self::Host(d) => d.bytes(),
            Self::Streamed(s) => s.decoded_bytes(),
            // The windows' inputs as f32, were they gathered at once.
            Self::Tokens(t) => (t.len() * t.input_dims()[0] * 4) as u64,
        }
    }

    /// Class ids per sample, for a stratified hold-out (`None`: values).
    pub fn class_ids(&self) -> Option<Vec<u32>> {
        match self {
            Self::Host(d) => match &d.y {
                Targets::Classes(ids) => Some(ids.clone()),
                Targets::Values(_) => None,
            },
            Self::Streamed(s) => Some(s.labels()),
            Self::Tokens(_) => None,
        }
    }

    /// The samples `idx` as a new split (resident data is copied; a
    /// streamed split is a view of the same listing).
    pub fn subset(&self, idx: &[u32]) -> Result<Self> {
        Ok(match self {
            Self::Host(d) => Self::Host(d.subset(idx)?),
            Self::Streamed(s) => Self::Streamed(Box::new(s.subset(idx, s.view()))),
            // Those windows, gathered (a token split is cut by ranges).
            Self::Tokens(t) => Self::Host(gathered(t.as_ref(), idx)?),
        })
    }

    /// Splits the samples at `taken` (sorted, distinct) off as a held-out
    /// split, keeping the rest in order. A streamed held-out split takes
    /// the evaluation transform (a centre crop where training crops at random).
    pub fn split_rows(self, taken: &[u32]) -> Result<(Self, Self)> {
        match self {
            Self::Host(d) => {
                let (kept, held) = d.split_rows(taken)?;
                Ok((Self::Host(kept), Self::Host(held)))
            }
            Self::Tokens(t) => Err(crate::Error::Config(format!(
                "{}: token windows are held out by a range of the ids, not by samples",
                t.source().display()
            ))),
            Self::Streamed(s) => {
                let (mut keep, mut t) = (Vec::new(), taken.iter().peekable());
                for i in 0..s.len() as u32 {
                    match t.peek() {
                        Some(&&j) if j == i => {
                            t.next();
                        }
                        _ => keep.push(i),
                    }
                }
                let mut eval = s.view();
                eval.transform = eval.transform.for_eval();
                Ok((
                    Self::Streamed(Box::new(s.subset(&keep, s.view()))),
                    Self::Streamed(Box::new(s.subset(taken, eval))),
                ))
            }
        }
    }

    /// The first `n` samples in host memory (a streamed split decodes them):
    /// what a probe of the job (the device choice, the batch-size search)
    /// places on the device.
    pub fn head(&self, n: usize) -> Result<HostData> {
        let idx: Vec<u32> = (0..n.min(self.len()) as u32).collect();
        match self {
            Self::Host(d) => d.subset(&idx),
            Self::Streamed(s) => s
                .subset(&idx, s.view())
                .materialise(&std::sync::atomic::AtomicBool::new(false)),
            Self::Tokens(t) => gathered(t.as_ref(), &idx),
        }
    }

    /// The samples in host memory (a streamed split is decoded whole).
    pub fn into_host(self) -> Result<HostData> {
        match self {
            Self::Host(d) => Ok(d),
            Self::Streamed(s) => s.materialise(&std::sync::atomic::AtomicBool::new(false)),
            Self::Tokens(t) => {
                let all: Vec<u32> = (0..t.len() as u32).collect();
                gathered(t.as_ref(), &all)
            }
        }
    }

    /// Takes the samples out, leaving an empty split of the same kind.
    pub fn take(&mut self) -> Samples {
        match self {
            Self::Host(d) => Self::Host(d.take()),
            Self::Streamed(s) => {
                let empty = Self::Streamed(Box::new(s.subset(&[], s.view())));
                std::mem::replace(self, empty)
            }
            // The windows are a view of a mapped file: sharing them holds
            // no second copy.
            Self::Tokens(t) => Self::Tokens(t.clone()),
        }
    }
}

impl Dataset for Samples {
    fn len(&self) -> usize {
        match self {
            Self::Host(d) => d.len(),
            Self::Streamed(s) => s.len(),
            Self::Tokens(t) => t.len(),
        }
    }

    fn input_dims(&self) -> &[usize] {
        match self {
            Self::Host(d) => d.input_dims(),
            Self::Streamed(s) => s.input_dims(),
            Self::Tokens(t) => t.input_dims(),
        }
    }

    fn target(&self) -> TargetKind {
        match self {
            Self::Host(d) => d.target(),
            Self::Streamed(s) => s.target(),
            Self::Tokens(t) => t.target(),
        }
    }

    fn gather(&self, idx: &[u32], x: &mut [f32], y: TargetsMut<'_>) -> Result<()> {
        match self {
            Self::Host(d) => d.gather(idx, x, y),
            Self::Streamed(s) => s.gather(idx, x, y),
            Self::Tokens(t) => t.gather(idx, x, y),
        }
    }

    fn byte_norm(&self) -> Option<ChannelNorm> {
        match self {
            Self::Streamed(s) => s.byte_norm(),
            Self::Host(_) | Self::Tokens(_) => None,
        }
    }

    fn gather_bytes(&self, idx: &[u32], x: &mut [u8], y: TargetsMut<'_>) -> Result<()> {
        match self {
            Self::Host(d) => d.gather_bytes(idx, x, y),
            Self::Streamed(s) => s.gather_bytes(idx, x, y),
            Self::Tokens(t) => t.gather_bytes(idx, x, y),
        }
    }

    fn source(&self) -> &Path {
        match self {
            Self::Host(d) => d.source(),
            Self::Streamed(s) => s.source(),
            Self::Tokens(t) => t.source(),
        }
    }

    fn shard_ids(&self) -> Option<Vec<u32>> {
        match self {
            Self::Streamed(s) => s.shard_ids(),
            _ => None,
        }
    }

    fn set_epoch(&self, epoch: usize) {
        match self {
            Self::Host(d) => d.set_epoch(epoch),
            Self::Streamed(s) => s.set_epoch(epoch),
            Self::Tokens(t) => t.set_epoch(epoch),
        }
    }
}

/// Windows `idx` of `t` gathered into host memory.
fn gathered(t: &TokenWindows, idx: &[u32]) -> Result<HostData> {
    let len = t.input_dims()[0];
    let mut x = vec![0f32; idx.len() * len];
    let mut y = Targets::zeros(t.target(), idx.len());
    t.gather(idx, &mut x, y.as_mut())?;
    HostData::new(x, vec![len], y, t.target(), t.source().to_path_buf())
}
