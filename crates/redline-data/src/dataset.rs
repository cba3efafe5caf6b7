//! The `Dataset` trait the loader draws from, typed targets, and [`HostData`],
//! the in-memory dataset every shipped source produces.
//!
//! A dataset knows its length, the shape of one input and what its targets
//! are, and copies any list of samples into caller-owned buffers. That is all
//! the loader needs: the prefetch thread gathers into pinned staging slots
//! (streaming), or the whole set is gathered once and uploaded (resident).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::stream::ChannelNorm;

/// What a dataset's targets are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// Class ids, one `u32 < classes` per sample: a batch's targets are `(B,)` u32.
    Classes(usize),
    /// Float targets, `width` per sample: `(B,)` f32 when `width` is 1, else `(B, width)`.
    Values(usize),
    /// The next token at each of `len` positions, ids `< vocab` (a language
    /// model's targets): a batch's are `(B, len)` u32.
    Tokens {
        /// Ids in the vocabulary.
        vocab: usize,
        /// Positions per sample (the model's block size).
        len: usize,
    },
}

impl TargetKind {
    /// Target values per sample.
    pub fn width(self) -> usize {
        match self {
            Self::Classes(_) => 1,
            Self::Values(w) => w,
            Self::Tokens { len, .. } => len,
        }
    }

    /// The classes of a classification target (a language model's: its
    /// vocabulary).
    pub fn classes(self) -> Option<usize> {
        match self {
            Self::Classes(c) | Self::Tokens { vocab: c, .. } => Some(c),
            Self::Values(_) => None,
        }
    }

    /// Whether the targets are class ids (one or many per sample), stored
    /// as u32.
    pub fn is_ids(self) -> bool {
        !matches!(self, Self::Values(_))
    }

    /// The targets' shape for a batch of `b` samples.
    pub fn batch_shape(self, b: usize) -> Vec<usize> {
        match self {
            Self::Values(w) if w != 1 => vec![b, w],
            Self::Tokens { len, .. } => vec![b, len],
            _ => vec![b],
        }
    }
}

impl std::fmt::Display for TargetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Classes(c) => write!(f, "{c} classes"),
            Self::Values(1) => f.write_str("1 value"),
            Self::Values(w) => write!(f, "{w} values"),
            Self::Tokens { vocab, len } => {
                write!(f, "next tokens at {len} positions, vocabulary {vocab}")
            }
        }
    }
}

/// Targets held on the host, row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum Targets {
    /// Class ids.
    Classes(Vec<u32>),
    /// Float values, `width` per sample.
    Values(Vec<f32>),
}

impl Targets {
    /// Zeroed targets of `kind` for `n` samples (a staging buffer).
    pub fn zeros(kind: TargetKind, n: usize) -> Self {
        match kind {
            TargetKind::Classes(_) => Self::Classes(vec![0; n]),
            TargetKind::Tokens { len, .. } => Self::Classes(vec![0; n * len]),
            TargetKind::Values(w) => Self::Values(vec![0.0; n * w]),
        }
    }

    /// A mutable view, for [`Dataset::gather`].
    pub fn as_mut(&mut self) -> TargetsMut<'_> {
        match self {
            Self::Classes(v) => TargetsMut::Classes(v),
            Self::Values(v) => TargetsMut::Values(v),
        }
    }

    /// Stored values (samples times width).
    pub fn values(&self) -> usize {
        match self {
            Self::Classes(v) => v.len(),
            Self::Values(v) => v.len(),
        }
    }
}

/// Where [`Dataset::gather`] writes a batch's targets.
#[derive(Debug)]
pub enum TargetsMut<'a> {
    /// Class ids, one per sample.
    Classes(&'a mut [u32]),
    /// Float values, `width` per sample.
    Values(&'a mut [f32]),
}

/// A source of samples the loader can draw batches from.
///
/// Implement it for data that is not one of the shipped formats; the loader
/// then shuffles, prefetches, stages (pinned on GPUs) or uploads it like any
/// other.
pub trait Dataset: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;
    /// True when there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Dimensions of one input, e.g. `[1, 28, 28]` or `[13]` for 13 features.
    fn input_dims(&self) -> &[usize];
    /// What the targets are.
    fn target(&self) -> TargetKind;
    /// Copies the inputs of samples `idx` into `x` (row-major, `idx.len()` rows
    /// of `input_dims().product()` values) and their targets into `y`.
    fn gather(&self, idx: &[u32], x: &mut [f32], y: TargetsMut<'_>) -> Result<()>;
    /// Where the data came from, for messages.
    fn source(&self) -> &Path;
    /// How [`Dataset::gather`] turns bytes into values, when the inputs are
    /// 8-bit pixels normalised per channel (decoded images): then
    /// [`Dataset::gather_bytes`] gives the bytes themselves, a quarter of
    /// fp32's, and a GPU normalises them ([`crate::stage::Staged`]).
    fn byte_norm(&self) -> Option<ChannelNorm> {
        None
    }
    /// The inputs of samples `idx` as the bytes [`Dataset::gather`] would
    /// normalise (same layout and order; `byte_norm()` maps them), and their
    /// targets into `y`. Only where `byte_norm()` is `Some`.
    fn gather_bytes(&self, _idx: &[u32], _x: &mut [u8], _y: TargetsMut<'_>) -> Result<()> {
        Err(Error::Config(format!(
            "{} has no 8-bit form of its inputs",
            self.source().display()
        )))
    }
    /// Called by the loader before it gathers `epoch`'s batches (0-based),
    /// as PyTorch's `set_epoch`: a data set whose samples are random (an
    /// augmentation) draws from it, so that an epoch's samples do not depend
    /// on the order they are gathered in, and a resumed run sees the same.
    fn set_epoch(&self, _epoch: usize) {}
    /// Each sample's shard (an id per sample, samples in stored order) when
    /// the data is read from tar shards: the loader's shuffle buffer reads
    /// shard by shard. `None`: not sharded.
    fn shard_ids(&self) -> Option<Vec<u32>> {
        None
    }
}

/// Values in one input.
pub fn row(data: &dyn Dataset) -> usize {
    data.input_dims().iter().product()
}

/// The input shape of a batch of `b` samples.
pub fn batch_shape(data: &dyn Dataset, b: usize) -> Vec<usize> {
    let mut s = vec![b];
    s.extend_from_slice(data.input_dims());
    s
}

/// A dataset held in host memory: what IDX, CIFAR, CSV and tensor files load into.
#[derive(Debug, Clone)]
pub struct HostData {
    /// Inputs, `len * row` values, row-major.
    pub x: Vec<f32>,
    /// Targets, `len * width` values.
    pub y: Targets,
    /// Dimensions of one input.
    pub input_dims: Vec<usize>,
    /// What the targets are.
    pub target: TargetKind,
    /// Where it came from.
    pub source: PathBuf,
}

impl HostData {
    /// Takes the samples out, leaving none of the same shape and kind in
    /// their place (a loader takes the host copy; nothing is copied).
    pub fn take(&mut self) -> HostData {
        let empty = HostData {
            x: Vec::new(),
            y: match self.y {
                Targets::Classes(_) => Targets::Classes(Vec::new()),
                Targets::Values(_) => Targets::Values(Vec::new()),
            },
            input_dims: self.input_dims.clone(),
            target: self.target,
            source: self.source.clone(),
        };
        std::mem::replace(self, empty)
    }

    /// Checks that the buffers agree with the shapes and that class ids are in range.
    pub fn new(
        x: Vec<f32>,
        input_dims: Vec<usize>,
        y: Targets,
        target: TargetKind,
        source: PathBuf,
    ) -> Result<Self> {
        let bad = |msg: String| Error::Invalid {
            path: source.clone(),
            msg,
        };
        let row: usize = input_dims.iter().product();
        if row == 0 {
            return Err(bad(format!(
                "inputs of shape {input_dims:?} hold no values"
            )));
        }
        if !x.len().is_multiple_of(row) {
            return Err(bad(format!(
                "{} input values do not divide into samples of {input_dims:?}",
                x.len()
            )));
        }
        let n = x.len() / row;
        match (&y, target) {
            (Targets::Classes(v), TargetKind::Classes(classes))
            | (Targets::Classes(v), TargetKind::Tokens { vocab: classes, .. }) => {
                if let Some((i, l)) = v.iter().enumerate().find(|(_, &l)| l as usize >= classes) {
                    return Err(bad(format!(
                        "label {l} at index {i} is >= the {classes} classes\n\
                         HINT: pass --classes {} or check the target column",
                        l + 1
                    )));
                }
            }
            (Targets::Values(_), TargetKind::Values(w)) if w > 0 => {}
            _ => {
                return Err(bad(format!(
                    "targets stored as {} do not match the target kind {target}",
                    match y {
                        Targets::Classes(_) => "class ids",
                        Targets::Values(_) => "values",
                    }
                )))
            }
        }
        if y.values() != n * target.width() {
            return Err(bad(format!(
                "{} target values for {n} samples of {} each (truncated file?)",
                y.values(),
                target.width()
            )));
        }
        Ok(Self {
            x,
            y,
            input_dims,
            target,
            source,
        })
    }

    /// The samples `idx`, as a new data set (a train/validation split).
    pub fn subset(&self, idx: &[u32]) -> Result<Self> {
        let mut x = vec![0.0; idx.len() * row(self)];
        let mut y = Targets::zeros(self.target, idx.len());
        self.gather(idx, &mut x, y.as_mut())?;
        Ok(Self {
            x,
            y,
            input_dims: self.input_dims.clone(),
            target: self.target,
            source: self.source.clone(),
        })
    }

    /// Splits the samples at `taken` (sorted, distinct indices) off into a
    /// second set, keeping the rest in order. The kept samples are moved down
    /// in place, so the peak is the data plus the taken part, not two copies.
    pub fn split_rows(mut self, taken: &[u32]) -> Result<(Self, Self)> {
        let taken_set = self.subset(taken)?;
        let (n, r) = (self.len(), row(&self));
        let width = self.y.values() / n.max(1);
        keep_rows(&mut self.x, r, n, taken);
        match &mut self.y {
            Targets::Classes(v) => keep_rows(v, width, n, taken),
            Targets::Values(v) => keep_rows(v, width, n, taken),
        }
        Ok((self, taken_set))
    }

    /// Bytes the inputs and targets take.
    pub fn bytes(&self) -> u64 {
        (self.x.len() * 4 + self.y.values() * 4) as u64
    }
}

/// Keeps the rows of `width` values of `v` (`n` rows) that are not in `taken`
/// (sorted), moved down in place, and gives back the rest of the buffer.
fn keep_rows<T: Copy>(v: &mut Vec<T>, width: usize, n: usize, taken: &[u32]) {
    let (mut next, mut keep) = (taken.iter().peekable(), 0usize);
    for i in 0..n {
        if next.peek().is_some_and(|&&t| t as usize == i) {
            next.next();
            continue;
        }
        // keep <= i: copying down never overwrites a row still to be read.
        v.copy_within(i * width..(i + 1) * width, keep * width);
        keep += 1;
    }
    v.truncate(keep * width);
    v.shrink_to_fit();
}

impl Dataset for HostData {
    fn len(&self) -> usize {
        self.x.len() / row(self).max(1)
    }

    fn input_dims(&self) -> &[usize] {
        &self.input_dims
    }

    fn target(&self) -> TargetKind {
        self.target
    }

    fn gather(&self, idx: &[u32], x: &mut [f32], y: TargetsMut<'_>) -> Result<()> {
        let (row, w, n) = (row(self), self.target.width(), self.len());
        let room = match &y {
            TargetsMut::Classes(v) => v.len() / w,
            TargetsMut::Values(v) => v.len() / w,
        };
        if x.len() < idx.len() * row || room < idx.len() {
            return Err(Error::Config(format!(
                "staging buffer holds {} samples, batch has {}",
                room.min(x.len() / row.max(1)),
                idx.len()
            )));
        }
        // One pass: the bounds check rides on the copy of each row.
        for (k, &i) in idx.iter().enumerate() {
            let i = i as usize;
            let src = self.x.get(i * row..(i + 1) * row).ok_or_else(|| {
                Error::Config(format!(
                    "sample index {i} beyond the data set's {n} samples"
                ))
            })?;
            x[k * row..(k + 1) * row].copy_from_slice(src);
        }
        match (&self.y, y) {
            (Targets::Classes(src), TargetsMut::Classes(dst)) if w == 1 => {
                for (k, &i) in idx.iter().enumerate() {
                    dst[k] = src[i as usize];
                }
            }
            // Several ids a sample (a language model's next tokens).
            (Targets::Classes(src), TargetsMut::Classes(dst)) => {
                for (k, &i) in idx.iter().enumerate() {
                    let i = i as usize;
                    dst[k * w..(k + 1) * w].copy_from_slice(&src[i * w..(i + 1) * w]);
                }
            }
            (Targets::Values(src), TargetsMut::Values(dst)) => {
                for (k, &i) in idx.iter().enumerate() {
                    let i = i as usize;
                    dst[k * w..(k + 1) * w].copy_from_slice(&src[i * w..(i + 1) * w]);
                }
            }
            _ => {
                return Err(Error::Config(
                    "staging buffer's target type differs from the data set's".into(),
                ))
            }
        }
        Ok(())
    }

    fn source(&self) -> &Path {
        &self.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Result<HostData> {
        HostData::new(
            (0..12).map(|v| v as f32).collect(),
            vec![2],
            Targets::Values((0..12).map(|v| -(v as f32)).collect()),
            TargetKind::Values(2),
            PathBuf::from("t"),
        )
    }

    #[test]
    fn gathers_rows_and_vector_targets() -> Result<()> {
        let d = data()?;
        assert_eq!(d.len(), 6);
        let (mut x, mut y) = (vec![0.0; 4], Targets::zeros(d.target, 2));
        d.gather(&[5, 1], &mut x, y.as_mut())?;
        assert_eq!(x, vec![10.0, 11.0, 2.0, 3.0]);
        assert_eq!(y, Targets::Values(vec![-10.0, -11.0, -2.0, -3.0]));
        let sub = d.subset(&[2])?;
        assert_eq!(
            (sub.x, sub.y),
            (vec![4.0, 5.0], Targets::Values(vec![-4.0, -5.0]))
        );
        Ok(())
    }

    /// Token windows gathered into memory (a probe's head of a token
    /// split): several ids a sample, gathered and checked as class ids.
    #[test]
    fn token_targets_hold_several_ids_a_sample() -> Result<()> {
        let kind = TargetKind::Tokens { vocab: 9, len: 3 };
        let d = HostData::new(
            (0..6).map(|v| v as f32).collect(),
            vec![3],
            Targets::Classes(vec![1, 2, 3, 4, 5, 6]),
            kind,
            PathBuf::from("tokens"),
        )?;
        let (mut x, mut y) = (vec![0.0; 6], Targets::zeros(kind, 2));
        d.gather(&[1, 0], &mut x, y.as_mut())?;
        assert_eq!(x, vec![3.0, 4.0, 5.0, 0.0, 1.0, 2.0]);
        assert_eq!(y, Targets::Classes(vec![4, 5, 6, 1, 2, 3]));
        let m = HostData::new(
            vec![0.0; 3],
            vec![3],
            Targets::Classes(vec![1, 9, 2]),
            kind,
            PathBuf::from("tokens"),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(m.contains("label 9 at index 1"), "{m}");
        Ok(())
    }

    #[test]
    fn refuses_out_of_range_indices_labels_and_sizes() {
        let err = |r: Result<HostData>| r.err().map(|e| e.to_string()).unwrap_or_default();
        let d = data();
        let m = d
            .and_then(|d| {
                let (mut x, mut y) = (vec![0.0; 2], Targets::zeros(d.target, 1));
                d.gather(&[6], &mut x, y.as_mut()).map(|()| d)
            })
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(m.contains("index 6 beyond the data set's 6 samples"), "{m}");
        let m = err(HostData::new(
            vec![0.0; 3],
            vec![1],
            Targets::Classes(vec![0, 4, 1]),
            TargetKind::Classes(3),
            "lbl".into(),
        ));
        assert!(m.contains("label 4 at index 1 is >= the 3 classes"), "{m}");
        let m = err(HostData::new(
            vec![0.0; 3],
            vec![1],
            Targets::Values(vec![0.0; 2]),
            TargetKind::Values(1),
            "y".into(),
        ));
        assert!(m.contains("2 target values for 3 samples"), "{m}");
        let m = err(HostData::new(
            vec![0.0; 5],
            vec![2],
            Targets::Values(vec![0.0; 2]),
            TargetKind::Values(1),
            "x".into(),
        ));
        assert!(m.contains("do not divide"), "{m}");
    }
}
