//! The loader: a seeded permutation per epoch, batches drawn in that order, and
//! the next batches prepared on a background thread while the current step runs.
//!
//! Two ways to feed the device ([`Placement`]):
//! * **device-resident**: the split was uploaded once; each epoch uploads its
//!   permutation once and every batch is an index gather on the device;
//! * **streaming**: the split stays in host memory; each batch is gathered into
//!   a reusable staging slot (pinned on GPUs) and copied asynchronously
//!   ([`crate::stage`]), up to `prefetch` batches ahead.
//!
//! Both yield the same batches for the same seed. The prefetch thread blocks on
//! a bounded channel (it sleeps, it never spins), so it does not compete with
//! the compute threads for cores.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use candle_core::{Device, Tensor};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::dataset::{Dataset, TargetKind};
use crate::error::{Error, Result};
use crate::place::Placement;
use crate::samples::Samples;
use crate::split::Split;
use crate::stage::{stage_for, Fence, Stage, StagePool, Staged};

/// How batches are drawn from a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Samples per batch; the last batch of an epoch may be smaller.
    pub batch_size: usize,
    /// A fresh seeded permutation each epoch; `false` keeps file order.
    pub shuffle: bool,
    /// Seed of the permutation stream (epoch `e` uses stream `e` of this seed).
    pub seed: u64,
    /// Batches prepared ahead on a background thread (streaming: copies in
    /// flight); 0 prepares each batch inline.
    pub prefetch: usize,
    /// Drop the last partial batch (PyTorch's `drop_last`).
    pub drop_last: bool,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        Self {
            batch_size: 64,
            shuffle: true,
            seed: 0,
            prefetch: 2,
            drop_last: false,
        }
    }
}

/// Refuses settings no loader can work with.
fn check(cfg: &LoaderConfig) -> Result<()> {
    if cfg.batch_size == 0 {
        return Err(Error::Config("batch size must be at least 1".into()));
    }
    Ok(())
}

/// One batch, on the device the loader feeds.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Inputs, `(B, ...)` f32, e.g. images `(B, C, H, W)`.
    pub x: Tensor,
    /// Targets: class ids `(B,)` u32, or values `(B,)` / `(B, W)` f32.
    pub y: Tensor,
    /// Position of this batch within its epoch (0-based).
    pub index: usize,
}

impl Batch {
    /// Number of samples in the batch.
    pub fn size(&self) -> usize {
        self.x.dims().first().copied().unwrap_or(0)
    }
}

/// Where batches come from.
#[derive(Clone)]
enum Feed {
    /// The split's tensors are on the target device.
    Resident(Split),
    /// A data set in host memory, streamed to `device` through pooled stages.
    Streaming {
        host: Arc<dyn Dataset>,
        device: Device,
        stages: StagePool,
    },
}

/// Draws batches from one data set.
#[derive(Clone)]
pub struct Loader {
    cfg: LoaderConfig,
    feed: Feed,
    /// Shard data's shuffle buffer ([`Loader::shuffle_buffer`]).
    buffer: Option<usize>,
    /// At most this many batches an epoch ([`Loader::limit_batches`]).
    limit: Option<usize>,
    /// This rank's part of every epoch ([`Loader::shard`]).
    shard: Option<Shard>,
}

/// A rank's part of each epoch's order (PyTorch's `DistributedSampler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Pad the order to a multiple of `world` by repeating its start, so
    /// every rank gets the same number of samples (training: every rank
    /// takes the same steps); without it the ranks' parts differ by at most
    /// one sample and cover each sample once (evaluation: exact sums).
    pub pad: bool,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("samples", &self.len())
            .field("cfg", &self.cfg)
            .field("placement", &self.placement())
            .finish()
    }
}

impl Loader {
    /// A device-resident loader: batches are gathered from `split` on the
    /// device its tensors live on. Refuses a zero batch size.
    pub fn new(split: Split, cfg: LoaderConfig) -> Result<Self> {
        check(&cfg)?;
        Ok(Self {
            cfg,
            feed: Feed::Resident(split),
            limit: None,
            shard: None,
            buffer: None,
        })
    }

    /// A streaming loader over any data set: each batch is gathered into a
    /// staging slot and copied to `device` (pinned memory and an asynchronous
    /// copy on GPUs).
    pub fn from_dataset(
        data: Arc<dyn Dataset>,
        device: &Device,
        cfg: LoaderConfig,
    ) -> Result<Self> {
        check(&cfg)?;
        Ok(Self {
            cfg,
            feed: Feed::Streaming {
                host: data,
                device: device.clone(),
                stages: Arc::new(Mutex::new(Vec::new())),
            },
            limit: None,
            shard: None,
            buffer: None,
        })
    }

    /// A streaming loader over a split's samples (copied to host memory once).
    pub fn streaming(split: Split, device: &Device, cfg: LoaderConfig) -> Result<Self> {
        Self::from_dataset(Arc::new(split.to_host()?), device, cfg)
    }

    /// A loader over `split` for `device` with the given placement: resident
    /// uploads the split once (a no-op when it is already there).
    pub fn placed(
        split: Split,
        device: &Device,
        placement: Placement,
        cfg: LoaderConfig,
    ) -> Result<Self> {
        match placement {
            Placement::Resident => Self::new(split.to_device(device)?, cfg),
            Placement::Streaming => Self::streaming(split, device, cfg),
        }
    }

    /// A loader over a split's samples for `device`: resident host data is
    /// uploaded once; streaming host data stays on the host and is copied a
    /// batch at a time; streamed images are always read from disk batch by
    /// batch, whatever `placement` says.
    pub fn placed_host(
        data: impl Into<Samples>,
        device: &Device,
        placement: Placement,
        cfg: LoaderConfig,
    ) -> Result<Self> {
        match (data.into(), placement) {
            (Samples::Host(d), Placement::Resident) => {
                Self::new(Split::from_host(&d, device)?, cfg)
            }
            (Samples::Host(d), Placement::Streaming) => {
                Self::from_dataset(Arc::new(d), device, cfg)
            }
            (s @ (Samples::Streamed(_) | Samples::Tokens(_)), _) => {
                Self::from_dataset(Arc::new(s), device, cfg)
            }
        }
    }

    /// The split kept on the device, when this loader is resident.
    pub fn resident(&self) -> Option<&Split> {
        match &self.feed {
            Feed::Resident(s) => Some(s),
            Feed::Streaming { .. } => None,
        }
    }

    /// How this loader feeds the device.
    pub fn placement(&self) -> Placement {
        match self.feed {
            Feed::Resident(_) => Placement::Resident,
            Feed::Streaming { .. } => Placement::Streaming,
        }
    }

    /// Dimensions of one input.
    pub fn input_dims(&self) -> Vec<usize> {
        match &self.feed {
            Feed::Resident(s) => s.x.dims().get(1..).unwrap_or_default().to_vec(),
            Feed::Streaming { host, .. } => host.input_dims().to_vec(),
        }
    }

    /// What the targets are.
    pub fn target(&self) -> TargetKind {
        match &self.feed {
            Feed::Resident(s) => s.target,
            Feed::Streaming { host, .. } => host.target(),
        }
    }

    /// The loader's settings.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// Samples one epoch yields: the data set's, or this rank's part of it
    /// when sharded.
    pub fn len(&self) -> usize {
        let n = self.data_len();
        match self.shard {
            None => n,
            Some(s) if s.pad => n.div_ceil(s.world),
            Some(s) => n.saturating_sub(s.rank).div_ceil(s.world),
        }
    }

    /// Samples in the data set (all ranks together).
    pub fn data_len(&self) -> usize {
        match &self.feed {
            Feed::Resident(s) => s.len(),
            Feed::Streaming { host, .. } => host.len(),
        }
    }

    /// Every epoch yields only rank `shard.rank`'s part of its order:
    /// positions `rank, rank + world, ...` of the (padded) order, as
    /// PyTorch's `DistributedSampler`. Refuses a rank outside the world.
    pub fn shard(mut self, shard: Shard) -> Result<Self> {
        if shard.world == 0 || shard.rank >= shard.world {
            return Err(Error::Config(format!(
                "rank {} of a world of {}",
                shard.rank, shard.world
            )));
        }
        self.shard = (shard.world > 1).then_some(shard);
        Ok(self)
    }

    /// The sharding [`Loader::shard`] set (none for a world of one).
    pub fn sharding(&self) -> Option<Shard> {
        self.shard
    }

    /// True when the data set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batches one epoch yields.
    pub fn batches_per_epoch(&self) -> usize {
        let (n, b) = (self.len(), self.cfg.batch_size);
        let all = if self.cfg.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        };
        self.limit.map_or(all, |l| all.min(l))
    }

    /// Every epoch yields only its first `batches` batches (of that epoch's
    /// order), as Lightning's `limit_train_batches` and `overfit_batches`;
    /// [`Loader::batches_per_epoch`] counts them.
    pub fn limit_batches(mut self, batches: usize) -> Self {
        self.limit = Some(batches);
        self
    }

    /// The limit [`Loader::limit_batches`] set.
    pub fn limit(&self) -> Option<usize> {
        self.limit
    }

    /// The sample order of `epoch`: identity without shuffling, otherwise a
    /// Fisher-Yates permutation from ChaCha8 seeded by `seed`, stream `epoch`
    /// (independent of every other epoch, so a resumed run draws the same order).
    ///
    /// Sharded, it is this rank's part of that order (same seed on every
    /// rank, so the parts are disjoint).
    pub fn order(&self, epoch: usize) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..self.data_len() as u32).collect();
        if self.cfg.shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(self.cfg.seed);
            rng.set_stream(epoch as u64);
            // Shard ids are listed only when a buffer is asked for.
            match self.buffer.and_then(|n| Some((n, self.groups()?))) {
                Some((n, g)) => idx = buffered::order(&g, n, &mut rng),
                None => idx.shuffle(&mut rng),
            }
        }
        match self.shard {
            None => idx,
            Some(s) => {
                let total = if s.pad {
                    self.len() * s.world
                } else {
                    idx.len()
                };
                // Padding repeats the order's start (again, for tiny sets).
                (s.rank..total)
                    .step_by(s.world)
                    .filter_map(|i| idx.get(i % idx.len().max(1)).copied())
                    .collect()
            }
        }
    }

    /// Shuffles tar shards as WebDataset does (`buffered`'s order): the
    /// shards in a random order each epoch, their members in stored order
    /// through a buffer of `samples`. Data that is not in shards keeps the
    /// full permutation.
    pub fn shuffle_buffer(mut self, samples: usize) -> Self {
        self.buffer = Some(samples.max(1));
        self
    }

    /// Each sample's shard, when the data is tar shards.
    fn groups(&self) -> Option<Vec<u32>> {
        match &self.feed {
            Feed::Streaming { host, .. } => host.shard_ids(),
            Feed::Resident(_) => None,
        }
    }

    /// Iterates over the batches of `epoch`, prefetching when configured.
    pub fn epoch(&self, epoch: usize) -> EpochIter {
        self.epoch_from(epoch, 0)
    }

    /// Iterates over the batches of `epoch` from batch `first` on (the
    /// same batches [`Loader::epoch`] yields there, with their indices): how
    /// a resumed run continues mid-epoch without gathering what it skips.
    pub fn epoch_from(&self, epoch: usize, first: usize) -> EpochIter {
        match self.source(epoch) {
            Ok(source) => self.iterate(source, first),
            Err(e) => EpochIter(Inner::Failed(Some(e))),
        }
    }

    fn source(&self, epoch: usize) -> Result<BatchSource> {
        let order = (self.cfg.shuffle || self.shard.is_some()).then(|| self.order(epoch));
        let (batch_size, batches, len) =
            (self.cfg.batch_size, self.batches_per_epoch(), self.len());
        let how = match &self.feed {
            Feed::Resident(split) => Source::Resident {
                images: split.x.clone(),
                labels: split.y.clone(),
                // The epoch's permutation goes to the device once; each batch
                // gathers with a slice of it.
                perm: order
                    .map(|o| {
                        let t = Tensor::from_slice(&o, len, split.x.device());
                        t.map(|t| (o, t))
                    })
                    .transpose()?,
            },
            Feed::Streaming {
                host,
                device,
                stages,
            } => {
                host.set_epoch(epoch);
                let stage = match stages.lock().ok().and_then(|mut p| p.pop()) {
                    Some(s) => s,
                    None => stage_for(device, host.as_ref(), batch_size, self.cfg.prefetch + 1)?,
                };
                Source::Streaming {
                    host: host.clone(),
                    order: order.unwrap_or_else(|| (0..len as u32).collect()),
                    stage: Some(stage),
                    pool: stages.clone(),
                }
            }
        };
        Ok(BatchSource {
            how,
            batch_size,
            batches,
            len,
        })
    }

    fn iterate(&self, mut source: BatchSource, first: usize) -> EpochIter {
        if self.cfg.prefetch == 0 {
            return EpochIter(Inner::Inline {
                source,
                next: first,
            });
        }
        let (tx, rx) = sync_channel(self.cfg.prefetch);
        // Traced with the thread that iterates (`--profiler detailed`).
        let tracer = redline_core::trace::current();
        let spawned = std::thread::Builder::new()
            .name("redline-prefetch".into())
            .spawn(move || {
                redline_core::trace::name_thread("loader/prefetch");
                let _traced = tracer.as_ref().map(redline_core::trace::Tracer::attach);
                for b in first..source.batches {
                    let batch = {
                        let _span = redline_core::trace::span("loader", "assemble batch");
                        source.batch(b)
                    };
                    let failed = batch.is_err();
                    // A closed channel means the consumer stopped early: done.
                    if tx.send(batch).is_err() || failed {
                        return;
                    }
                }
            });
        match spawned {
            Ok(handle) => EpochIter(Inner::Threaded {
                rx: Some(rx),
                handle: Some(handle),
            }),
            Err(e) => EpochIter(Inner::Failed(Some(Error::Prefetch(e.to_string())))),
        }
    }
}

/// How one epoch's batches are made.
enum Source {
    Resident {
        images: Tensor,
        labels: Tensor,
        /// The epoch's order, on the host and on the data's device.
        perm: Option<(Vec<u32>, Tensor)>,
    },
    Streaming {
        host: Arc<dyn Dataset>,
        order: Vec<u32>,
        /// Taken from the pool at the start of the epoch, returned on drop.
        stage: Option<Box<dyn Stage>>,
        pool: StagePool,
    },
}

/// What the producer needs: the source and the epoch's geometry.
struct BatchSource {
    how: Source,
    batch_size: usize,
    batches: usize,
    len: usize,
}

impl BatchSource {
    fn batch(&mut self, b: usize) -> Result<(usize, Staged)> {
        let start = b * self.batch_size;
        let size = self.batch_size.min(self.len - start);
        let staged = match &mut self.how {
            // File order: a zero-copy view of consecutive rows.
            Source::Resident {
                images,
                labels,
                perm: None,
            } => Staged::new(
                images.narrow(0, start, size)?,
                labels.narrow(0, start, size)?,
                Fence::Ready,
            ),
            Source::Resident {
                images,
                labels,
                perm: Some((order, perm)),
            } => {
                let idx = perm.narrow(0, start, size)?;
                let order = &order[start..start + size];
                Staged::new(
                    gather::rows(images, order, &idx)?,
                    gather::rows(labels, order, &idx)?,
                    Fence::Ready,
                )
            }
            Source::Streaming {
                host, order, stage, ..
            } => {
                let stage = stage
                    .as_mut()
                    .ok_or_else(|| Error::Prefetch("staging buffers already released".into()))?;
                stage.stage(b, host.as_ref(), &order[start..start + size])?
            }
        };
        Ok((b, staged))
    }
}

impl Drop for BatchSource {
    fn drop(&mut self) {
        if let Source::Streaming { stage, pool, .. } = &mut self.how {
            if let (Some(s), Ok(mut p)) = (stage.take(), pool.lock()) {
                p.push(s);
            }
        }
    }
}

/// The batches of one epoch, in order.
pub struct EpochIter(Inner);

enum Inner {
    /// Batches built on the caller's thread.
    Inline { source: BatchSource, next: usize },
    /// Batches built ahead on the prefetch thread; joined on drop.
    Threaded {
        rx: Option<Receiver<Result<(usize, Staged)>>>,
        handle: Option<JoinHandle<()>>,
    },
    /// The epoch could not be started; yields this error once.
    Failed(Option<Error>),
}

impl Iterator for EpochIter {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        let staged = match &mut self.0 {
            Inner::Inline { source, next } => {
                if *next >= source.batches {
                    return None;
                }
                *next += 1;
                source.batch(*next - 1)
            }
            Inner::Threaded { rx, .. } => rx.as_ref()?.recv().ok()?,
            Inner::Failed(e) => return e.take().map(Err),
        };
        // The compute stream waits for this batch's copy, and only for it;
        // a batch of bytes is normalised after it, on the compute stream.
        Some(staged.and_then(|(index, s)| s.ready().map(|(x, y)| Batch { x, y, index })))
    }
}

impl Drop for EpochIter {
    fn drop(&mut self) {
        if let Inner::Threaded { rx, handle } = &mut self.0 {
            // Closing the channel first unblocks a producer waiting to send.
            drop(rx.take());
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}

mod buffered;
mod gather;
#[cfg(test)]
mod tests;
