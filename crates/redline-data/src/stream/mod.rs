//! Images read from disk as they are needed: an image folder or tar shards
//! listed up front (paths and labels only), each sample read, decoded,
//! transformed and normalised when a batch gathers it, on a pool of worker
//! threads (`--workers`). Nothing is decoded ahead of the loader's prefetch
//! window, so memory is bounded by workers x prefetch x batch whatever the
//! data set's size.
//!
//! A sample's random draws (the crop box, the flip) come from their own
//! place in one seeded stream, keyed by the epoch and the sample, so a
//! resumed run, another batch order or another worker count gives the same
//! pixels. [`Streamed::materialise`] decodes every sample once through the
//! same code: resident and streamed data hold the same values.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::dataset::{Dataset, HostData, TargetKind, Targets, TargetsMut};
use crate::error::{Error, Result};

pub mod crop;
pub mod decode;
pub mod shards;
pub mod stats;

pub use crop::{ChannelNorm, Plane, Transform};
use decode::Pixels;
pub use stats::PipelineStats;

/// The largest image file or shard member read (1 GiB): far beyond any
/// photograph, and a 10 GB file named `.jpg` (or a FIFO, or a device) is
/// refused by name instead of read whole.
pub const MAX_IMAGE_BYTES: u64 = 1 << 30;

/// Words of the random stream one sample's draws may use: ten crop tries of
/// two doubles and two offsets, and a coin, with room to spare.
const WORDS_PER_SAMPLE: u128 = 128;

/// Where one sample's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A file of an image folder.
    File(PathBuf),
    /// A member of a tar shard: the shard's index in the list, where its
    /// bytes start and how many.
    Member {
        /// Index into the shard list.
        shard: u32,
        /// Offset of the member's bytes in the shard.
        offset: u64,
        /// Its length in bytes.
        len: u64,
        /// Its name in the shard, for messages.
        name: Box<str>,
    },
}

/// The samples of a streamed source: where each one is, and its label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Each sample's bytes.
    pub items: Vec<Item>,
    /// Each sample's class id.
    pub labels: Vec<u32>,
    /// The shard files members refer to.
    pub shards: Vec<PathBuf>,
    /// The classes the labels lie in.
    pub classes: usize,
    /// The folder or pattern it was listed from.
    pub source: PathBuf,
}

impl Listing {
    /// The path that names sample `i` in messages: its file, or
    /// `SHARD:MEMBER`.
    pub fn name(&self, i: usize) -> PathBuf {
        match &self.items[i] {
            Item::File(p) => p.clone(),
            Item::Member { shard, name, .. } => {
                let s = self
                    .shards
                    .get(*shard as usize)
                    .cloned()
                    .unwrap_or_default();
                PathBuf::from(format!("{}:{name}", s.display()))
            }
        }
    }

    /// Reads sample `i`'s bytes: a regular file or member of at most
    /// [`MAX_IMAGE_BYTES`]; another file (too large, a FIFO, a device) is
    /// a bad sample named by its path (skipped with `--bad-samples skip`).
    pub fn read(&self, i: usize) -> Result<Vec<u8>> {
        let io = |path: PathBuf, source: std::io::Error| Error::Io {
            path,
            source,
            hint: "the data changed on disk while training? check that it is readable".into(),
        };
        match &self.items[i] {
            Item::File(p) => {
                redline_core::files::read_input(p, MAX_IMAGE_BYTES).map_err(|e| match e.kind() {
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput => {
                        Error::Invalid {
                            path: p.clone(),
                            msg: format!("{e} (images are read whole)"),
                        }
                    }
                    _ => io(p.clone(), e),
                })
            }
            Item::Member { len, .. } if *len > MAX_IMAGE_BYTES => Err(Error::Invalid {
                path: self.name(i),
                msg: format!("is {len} bytes; an image member is at most {MAX_IMAGE_BYTES} bytes"),
            }),
            Item::Member {
                shard, offset, len, ..
            } => {
                use std::os::unix::fs::FileExt;
                let path = self
                    .shards
                    .get(*shard as usize)
                    .cloned()
                    .unwrap_or_default();
                let f = std::fs::File::open(&path).map_err(|e| io(path.clone(), e))?;
                let mut buf = vec![0u8; *len as usize];
                f.read_exact_at(&mut buf, *offset)
                    .map_err(|e| io(self.name(i), e))?;
                Ok(buf)
            }
        }
    }
}

/// How a streamed split turns bytes into samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// The transform every sample goes through.
    pub transform: Transform,
    /// Normalisation after it.
    pub norm: ChannelNorm,
    /// 1 (grey) or 3 (RGB) channels.
    pub channels: usize,
    /// Output width and height.
    pub side: (u32, u32),
    /// Skip samples that cannot be decoded (`--bad-samples skip`) instead
    /// of stopping with an error naming them.
    pub skip_bad: bool,
}

/// Images streamed from disk, decoded on a worker pool as batches gather them.
pub struct Streamed {
    list: Arc<Listing>,
    /// This split's samples, as indices into the listing (`None`: all).
    subset: Option<Arc<[u32]>>,
    view: View,
    dims: Vec<usize>,
    pool: Arc<rayon::ThreadPool>,
    rng: ChaCha8Rng,
    epoch: AtomicUsize,
    skipped: Arc<AtomicUsize>,
    /// What the workers did while batches gathered samples.
    stats: Arc<stats::Counters>,
}

impl std::fmt::Debug for Streamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streamed")
            .field("samples", &self.len())
            .field("view", &self.view)
            .field("workers", &self.pool.current_num_threads())
            .finish()
    }
}

impl Clone for Streamed {
    fn clone(&self) -> Self {
        Self {
            list: self.list.clone(),
            subset: self.subset.clone(),
            view: self.view,
            dims: self.dims.clone(),
            pool: self.pool.clone(),
            rng: self.rng.clone(),
            epoch: AtomicUsize::new(self.epoch.load(Ordering::Relaxed)),
            skipped: self.skipped.clone(),
            stats: self.stats.clone(),
        }
    }
}

/// A pool of `workers` decode threads.
pub fn worker_pool(workers: usize) -> Result<Arc<rayon::ThreadPool>> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(workers.max(1))
        .thread_name(|i| format!("redline-data-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| Error::Config(format!("cannot start {workers} data workers: {e}")))
}

impl Streamed {
    /// Every sample of `list`, turned into samples by `view`, decoded on
    /// `pool`; random draws from `seed`.
    pub fn new(
        list: Arc<Listing>,
        view: View,
        pool: Arc<rayon::ThreadPool>,
        seed: u64,
    ) -> Result<Self> {
        if list.items.is_empty() {
            return Err(Error::Invalid {
                path: list.source.clone(),
                msg: "holds no images".into(),
            });
        }
        if let Some((i, l)) = list
            .labels
            .iter()
            .enumerate()
            .find(|(_, &l)| l as usize >= list.classes)
        {
            return Err(Error::Invalid {
                path: list.name(i),
                msg: format!(
                    "label {l} is beyond the {} classes\nHINT: pass --classes {} or check \
                     the labels",
                    list.classes,
                    l + 1
                ),
            });
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // A stream apart from the loader's and the hold-out's.
        rng.set_stream(u64::MAX - 2);
        Ok(Self {
            dims: vec![view.channels, view.side.1 as usize, view.side.0 as usize],
            list,
            subset: None,
            view,
            pool,
            rng,
            epoch: AtomicUsize::new(0),
            skipped: Arc::new(AtomicUsize::new(0)),
            stats: Arc::default(),
        })
    }

    /// The listing's index of this split's sample `i`.
    fn item(&self, i: usize) -> usize {
        self.subset.as_ref().map_or(i, |s| s[i] as usize)
    }

    /// Each sample's shard, when every sample is a tar shard's member.
    pub fn shard_ids(&self) -> Option<Vec<u32>> {
        (0..self.len())
            .map(|i| match self.list.items.get(self.item(i)) {
                Some(Item::Member { shard, .. }) => Some(*shard),
                _ => None,
            })
            .collect()
    }

    /// Bytes the samples take in their shards or files as stored (members'
    /// lengths; files' sizes are not read and count 0).
    pub fn stored_bytes(&self) -> u64 {
        (0..self.len())
            .map(|i| match self.list.items.get(self.item(i)) {
                Some(Item::Member { len, .. }) => *len,
                _ => 0,
            })
            .sum()
    }

    /// The samples `idx` of this split, with another view (validation
    /// takes the evaluation transform).
    pub fn subset(&self, idx: &[u32], view: View) -> Self {
        let items: Arc<[u32]> = idx.iter().map(|&i| self.item(i as usize) as u32).collect();
        Self {
            subset: Some(items),
            view,
            ..self.clone()
        }
    }

    /// The same samples decoded on a new pool of `workers` threads (what
    /// `redline tune workers` times).
    pub fn with_workers(&self, workers: usize) -> Result<Self> {
        Ok(Self {
            pool: worker_pool(workers)?,
            ..self.clone()
        })
    }

    /// How samples are made.
    pub fn view(&self) -> View {
        self.view
    }

    /// The class ids of this split's samples.
    pub fn labels(&self) -> Vec<u32> {
        (0..self.len())
            .map(|i| self.list.labels[self.item(i)])
            .collect()
    }

    /// Decode threads.
    pub fn workers(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Samples skipped so far as undecodable (`--bad-samples skip`).
    pub fn skipped(&self) -> usize {
        self.skipped.load(Ordering::Relaxed)
    }

    /// What the decode workers did so far for batches (this source, its
    /// clones and its splits together; [`Streamed::materialise`] not counted).
    pub fn pipeline(&self) -> PipelineStats {
        self.stats.read(self.workers())
    }

    /// Whether `other` counts into the same totals as this one (a clone or
    /// a split of the same source), so that totals are not added twice.
    pub fn shares_pipeline(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.stats, &other.stats)
    }

    /// Bytes the split would take decoded as fp32 (what resident data costs).
    pub fn decoded_bytes(&self) -> u64 {
        let row: usize = self.dims.iter().product();
        (self.len() * (row + 1) * 4) as u64
    }

    /// Decodes sample `i` of the listing into `out` with `rng` at its place.
    fn one<T: Plane>(&self, i: usize, rng: &mut ChaCha8Rng, out: &mut [T]) -> Result<()> {
        let what = self.list.name(i);
        let bytes = self.list.read(i)?;
        let px: Pixels = decode::decode(&bytes, self.view.channels, &what)?;
        let v = &self.view;
        crop::apply(&px, v.transform, &v.norm, rng, out, v.side).ok_or_else(|| Error::Invalid {
            path: what,
            msg: format!(
                "is {}x{} while the first image is {}x{}\nHINT: pass --image-size N to \
                 resize every image to N x N, or --augment random-resized-crop=N",
                px.width, px.height, v.side.0, v.side.1
            ),
        })
    }

    /// Sample `i` of this split for `epoch`: its pixels in `out`, its label
    /// returned. With `skip_bad`, an undecodable sample is replaced by the
    /// next one that decodes (counted in [`Streamed::skipped`]).
    fn sample<T: Plane>(&self, i: usize, epoch: u128, out: &mut [T]) -> Result<u32> {
        let n = self.len();
        let total = self.list.items.len() as u128;
        let mut k = i;
        loop {
            let item = self.item(k);
            let mut rng = self.rng.clone();
            rng.set_word_pos((epoch * total + item as u128) * WORDS_PER_SAMPLE);
            match self.one(item, &mut rng, out) {
                Ok(()) => return Ok(self.list.labels[item]),
                Err(e @ Error::Io { .. }) => return Err(e),
                Err(e) if !self.view.skip_bad => {
                    return Err(match e {
                        Error::Invalid { path, msg } => Error::Invalid {
                            path,
                            msg: format!(
                                "{msg}\nHINT: --bad-samples skip skips such files (counted \
                                 in the summary)"
                            ),
                        },
                        e => e,
                    })
                }
                Err(e) => {
                    self.skipped.fetch_add(1, Ordering::Relaxed);
                    k = (k + 1) % n;
                    if k == i {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Samples `idx` as planes of `T` in `x`, their labels in `y`, decoded
    /// on the worker pool.
    fn gather_planes<T: Plane>(&self, idx: &[u32], x: &mut [T], y: TargetsMut<'_>) -> Result<()> {
        let row: usize = self.dims.iter().product();
        let TargetsMut::Classes(y) = y else {
            return Err(Error::Config("streamed images have class targets".into()));
        };
        if x.len() < idx.len() * row || y.len() < idx.len() {
            return Err(Error::Config(format!(
                "a batch of {} samples does not fit the buffers given",
                idx.len()
            )));
        }
        if let Some(&bad) = idx.iter().find(|&&i| i as usize >= self.len()) {
            return Err(Error::Config(format!(
                "sample {bad} asked of a split of {}",
                self.len()
            )));
        }
        let epoch = self.epoch.load(Ordering::Relaxed) as u128;
        self.pool.install(|| {
            x.par_chunks_mut(row)
                .zip(y.par_iter_mut())
                .zip(idx.par_iter())
                .try_for_each(|((out, label), &i)| {
                    let start = std::time::Instant::now();
                    *label = self.sample(i as usize, epoch, out)?;
                    self.stats.add(start.elapsed());
                    Ok(())
                })
        })
    }

    /// Decodes every sample once into host memory (resident data), on the
    /// worker pool, giving up with [`Error::Interrupted`] once `stop` is set.
    pub fn materialise(&self, stop: &AtomicBool) -> Result<HostData> {
        let row: usize = self.dims.iter().product();
        let n = self.len();
        let mut x = vec![0f32; n * row];
        let epoch = self.epoch.load(Ordering::Relaxed) as u128;
        let labels: Vec<u32> = self.pool.install(|| {
            x.par_chunks_mut(row)
                .enumerate()
                .map(|(i, out)| match stop.load(Ordering::Relaxed) {
                    true => Err(Error::Interrupted),
                    false => self.sample(i, epoch, out),
                })
                .collect::<Result<Vec<u32>>>()
        })?;
        HostData::new(
            x,
            self.dims.clone(),
            Targets::Classes(labels),
            TargetKind::Classes(self.list.classes),
            self.list.source.clone(),
        )
    }
}

impl Dataset for Streamed {
    fn len(&self) -> usize {
        self.subset
            .as_ref()
            .map_or(self.list.items.len(), |s| s.len())
    }

    fn input_dims(&self) -> &[usize] {
        &self.dims
    }

    fn target(&self) -> TargetKind {
        TargetKind::Classes(self.list.classes)
    }

    fn gather(&self, idx: &[u32], x: &mut [f32], y: TargetsMut<'_>) -> Result<()> {
        self.gather_planes(idx, x, y)
    }

    fn byte_norm(&self) -> Option<ChannelNorm> {
        Some(self.view.norm)
    }

    fn gather_bytes(&self, idx: &[u32], x: &mut [u8], y: TargetsMut<'_>) -> Result<()> {
        self.gather_planes(idx, x, y)
    }

    fn source(&self) -> &Path {
        &self.list.source
    }

    fn set_epoch(&self, epoch: usize) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
