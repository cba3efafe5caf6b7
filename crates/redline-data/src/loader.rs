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

use crate::dataset::{Dataset, HostData, TargetKind};
use crate::error::{Error, Result};
use crate::place::Placement;
use crate::split::Split;
use crate::stage::{stage_for, Fence, Stage, StagePool};

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

    /// A loader over host data for `device`: resident uploads it once,
    /// streaming keeps it on the host and copies a batch at a time.
    pub fn placed_host(
        data: HostData,
        device: &Device,
        placement: Placement,
        cfg: LoaderConfig,
    ) -> Result<Self> {
        match placement {
            Placement::Resident => Self::new(Split::from_host(&data, device)?, cfg),
            Placement::Streaming => Self::from_dataset(Arc::new(data), device, cfg),
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
            idx.shuffle(&mut rng);
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
                    .map(|o| Tensor::from_vec(o, len, split.x.device()))
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
        perm: Option<Tensor>,
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
    fn batch(&mut self, b: usize) -> Result<(Batch, Fence)> {
        let start = b * self.batch_size;
        let size = self.batch_size.min(self.len - start);
        let (x, y, fence) = match &mut self.how {
            // File order: a zero-copy view of consecutive rows.
            Source::Resident {
                images,
                labels,
                perm: None,
            } => (
                images.narrow(0, start, size)?,
                labels.narrow(0, start, size)?,
                Fence::Ready,
            ),
            Source::Resident {
                images,
                labels,
                perm: Some(perm),
            } => {
                let idx = perm.narrow(0, start, size)?;
                (
                    images.index_select(&idx, 0)?,
                    labels.index_select(&idx, 0)?,
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
        Ok((Batch { x, y, index: b }, fence))
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
        rx: Option<Receiver<Result<(Batch, Fence)>>>,
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
        // The compute stream waits for this batch's copy, and only for it.
        Some(staged.and_then(|(batch, fence)| fence.wait().map(|()| batch)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idx::IdxArray;
    use crate::mnist::Normalize;
    use crate::stage::PlainStage;
    use candle_core::Device;
    use std::path::Path;

    fn split(n: usize) -> Result<Split> {
        let host = crate::mnist::from_idx(
            Path::new("i"),
            IdxArray {
                dims: vec![n, 1, 1],
                data: (0..n).map(|i| i as u8).collect(),
            },
            Path::new("l"),
            IdxArray {
                dims: vec![n],
                data: (0..n).map(|i| (i % 10) as u8).collect(),
            },
            Some(10),
            Normalize {
                mean: 0.0,
                std: 1.0 / 255.0,
            },
        )?;
        Split::from_host(&host, &Device::Cpu)
    }

    fn pixels(l: &Loader, epoch: usize) -> Result<Vec<Vec<u32>>> {
        l.epoch(epoch)
            .map(|b| {
                let b = b?;
                let v = b.x.flatten_all()?.to_vec1::<f32>()?;
                Ok(v.into_iter().map(|p| p.round() as u32).collect())
            })
            .collect()
    }

    fn cfg(shuffle: bool, prefetch: usize) -> LoaderConfig {
        LoaderConfig {
            batch_size: 4,
            shuffle,
            seed: 7,
            prefetch,
            drop_last: false,
        }
    }

    /// PyTorch's `DistributedSampler` on 5 samples and 2 ranks: padded,
    /// `[0, 2, 4]` and `[1, 3, 0]`; unpadded, `[0, 2, 4]` and `[1, 3]`. The
    /// batches of every feed hold exactly the samples of the rank's order.
    #[test]
    fn shards_split_each_epochs_order_as_distributed_sampler() -> Result<()> {
        let shard = |l: Loader, rank, pad| {
            l.shard(Shard {
                rank,
                world: 2,
                pad,
            })
        };
        let plain = |pad, rank| -> Result<Vec<u32>> {
            Ok(shard(Loader::new(split(5)?, cfg(false, 0))?, rank, pad)?.order(0))
        };
        assert_eq!(
            (plain(true, 0)?, plain(true, 1)?),
            (vec![0, 2, 4], vec![1, 3, 0])
        );
        assert_eq!(
            (plain(false, 0)?, plain(false, 1)?),
            (vec![0, 2, 4], vec![1, 3])
        );
        for (shuffle, prefetch, streaming) in [(true, 0, false), (true, 2, true), (false, 2, true)]
        {
            let whole = Loader::new(split(37)?, cfg(shuffle, 0))?;
            let mut seen = Vec::new();
            for rank in 0..2 {
                let base = if streaming {
                    Loader::streaming(split(37)?, &Device::Cpu, cfg(shuffle, prefetch))?
                } else {
                    Loader::new(split(37)?, cfg(shuffle, prefetch))?
                };
                let l = shard(base, rank, false)?;
                let order = l.order(3);
                assert_eq!(l.len(), order.len());
                let got: Vec<u32> = pixels(&l, 3)?.into_iter().map(|b| b[0]).collect();
                // The first pixel of each batch is its first sample's index.
                let firsts: Vec<u32> = order.chunks(4).map(|c| c[0]).collect();
                assert_eq!(got, firsts, "rank {rank} shuffle {shuffle}");
                seen.extend(order);
            }
            seen.sort_unstable();
            let mut all = whole.order(3);
            all.sort_unstable();
            assert_eq!(seen, all, "the two parts cover the epoch once");
        }
        assert!(Loader::new(split(5)?, cfg(false, 0))?
            .shard(Shard {
                rank: 2,
                world: 2,
                pad: true
            })
            .is_err());
        Ok(())
    }

    #[test]
    fn a_limit_yields_the_first_batches_of_each_epochs_order() -> Result<()> {
        for prefetch in [0, 2] {
            let whole = Loader::new(split(10)?, cfg(true, prefetch))?;
            let l = Loader::new(split(10)?, cfg(true, prefetch))?.limit_batches(2);
            assert_eq!(l.batches_per_epoch(), 2);
            for epoch in 0..3 {
                let all = pixels(&whole, epoch)?;
                assert_eq!(pixels(&l, epoch)?, all[..2].to_vec(), "epoch {epoch}");
            }
            // A limit past the data's batches changes nothing.
            let l = Loader::new(split(10)?, cfg(true, prefetch))?.limit_batches(9);
            assert_eq!(l.batches_per_epoch(), 3);
        }
        Ok(())
    }

    #[test]
    fn file_order_keeps_last_partial_batch() -> Result<()> {
        let l = Loader::new(split(10)?, cfg(false, 0))?;
        assert_eq!(l.batches_per_epoch(), 3);
        let got = pixels(&l, 0)?;
        assert_eq!(got, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        Ok(())
    }

    #[test]
    fn shuffle_is_a_seeded_permutation_fresh_each_epoch() -> Result<()> {
        let l = Loader::new(split(50)?, cfg(true, 0))?;
        let (e0, e1) = (l.order(0), l.order(1));
        assert_ne!(e0, e1);
        assert_eq!(e0, l.order(0));
        let mut sorted = e0.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<u32>>());
        let flat: Vec<u32> = pixels(&l, 0)?.concat();
        assert_eq!(flat, e0);
        Ok(())
    }

    #[test]
    fn prefetch_yields_the_same_batches_as_inline() -> Result<()> {
        let inline = Loader::new(split(37)?, cfg(true, 0))?;
        let ahead = Loader::new(split(37)?, cfg(true, 3))?;
        assert_eq!(pixels(&inline, 2)?, pixels(&ahead, 2)?);
        Ok(())
    }

    #[test]
    fn epoch_from_continues_where_the_epoch_was() -> Result<()> {
        for prefetch in [0, 2] {
            let l = Loader::new(split(37)?, cfg(true, prefetch))?;
            let whole: Vec<(usize, Vec<f32>)> = l
                .epoch(3)
                .map(|b| b.and_then(|b| Ok((b.index, b.x.flatten_all()?.to_vec1()?))))
                .collect::<Result<_>>()?;
            let tail: Vec<(usize, Vec<f32>)> = l
                .epoch_from(3, 2)
                .map(|b| b.and_then(|b| Ok((b.index, b.x.flatten_all()?.to_vec1()?))))
                .collect::<Result<_>>()?;
            assert!(whole.len() > 2);
            assert_eq!(tail, whole[2..]);
        }
        Ok(())
    }

    #[test]
    fn stopping_early_does_not_hang() -> Result<()> {
        // The drop runs on another thread so that a hang fails the test (after
        // 10 s) instead of stalling the whole test run.
        let l = Loader::new(split(100)?, cfg(true, 1))?;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut it = l.epoch(0);
            let first = it.next().is_some();
            drop(it);
            let _ = done_tx.send(first);
        });
        let got = done_rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(got, Ok(true), "the epoch did not stop within 10 s");
        Ok(())
    }

    fn labels(l: &Loader, epoch: usize) -> Result<Vec<Vec<u32>>> {
        l.epoch(epoch).map(|b| Ok(b?.y.to_vec1::<u32>()?)).collect()
    }

    #[test]
    fn resident_and_streaming_yield_the_same_batches() -> Result<()> {
        for shuffle in [false, true] {
            for prefetch in [0, 1, 3] {
                let resident = Loader::new(split(37)?, cfg(shuffle, prefetch))?;
                let streaming =
                    Loader::streaming(split(37)?, &Device::Cpu, cfg(shuffle, prefetch))?;
                assert_eq!(resident.placement(), Placement::Resident);
                assert_eq!(streaming.placement(), Placement::Streaming);
                for epoch in [0, 1] {
                    let want = pixels(&resident, epoch)?;
                    assert_eq!(want.len(), 10, "9 full batches and a partial one");
                    assert_eq!(
                        want,
                        pixels(&streaming, epoch)?,
                        "shuffle {shuffle} prefetch {prefetch}"
                    );
                    assert_eq!(labels(&resident, epoch)?, labels(&streaming, epoch)?);
                }
            }
        }
        Ok(())
    }

    #[test]
    fn placed_uploads_or_streams_as_told() -> Result<()> {
        let r = Loader::placed(split(5)?, &Device::Cpu, Placement::Resident, cfg(true, 0))?;
        let s = Loader::placed(split(5)?, &Device::Cpu, Placement::Streaming, cfg(true, 0))?;
        assert_eq!(
            (r.placement(), s.placement()),
            (Placement::Resident, Placement::Streaming)
        );
        assert_eq!(pixels(&r, 3)?, pixels(&s, 3)?);
        Ok(())
    }

    /// A stage that records which slot each batch went through and how far
    /// the producer ran ahead of the consumer.
    struct Recording {
        inner: PlainStage,
        log: Arc<Mutex<Vec<(usize, usize)>>>,
        produced: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Stage for Recording {
        fn stage(
            &mut self,
            slot: usize,
            data: &dyn Dataset,
            idx: &[u32],
        ) -> Result<(Tensor, Tensor, Fence)> {
            let n = self.inner.slots();
            if let Ok(mut l) = self.log.lock() {
                l.push((slot, slot % n));
            }
            self.produced
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.stage(slot, data, idx)
        }

        fn slots(&self) -> usize {
            self.inner.slots()
        }
    }

    #[test]
    fn streaming_uses_slots_in_turn_and_runs_at_most_prefetch_ahead() -> Result<()> {
        use std::sync::atomic::Ordering;
        let prefetch = 2;
        let l = Loader::streaming(split(40)?, &Device::Cpu, cfg(true, prefetch))?;
        let Feed::Streaming { host, stages, .. } = &l.feed else {
            return Err(Error::Config("not streaming".into()));
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        let produced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let rec = Recording {
            inner: PlainStage::new(&Device::Cpu, host.as_ref(), 4, prefetch + 1),
            log: log.clone(),
            produced: produced.clone(),
        };
        stages
            .lock()
            .map_err(|_| Error::Prefetch("poisoned".into()))?
            .push(Box::new(rec));
        let mut consumed = 0;
        for (b, batch) in l.epoch(0).enumerate() {
            assert_eq!(batch?.index, b, "batches arrive in order");
            consumed += 1;
            // Give the producer time to fill every slot it may, then check it did
            // not pass the bound: `prefetch` queued plus one being staged.
            std::thread::sleep(std::time::Duration::from_millis(5));
            let ahead = produced.load(Ordering::SeqCst) - consumed;
            assert!(ahead <= prefetch + 1, "producer ran {ahead} batches ahead");
        }
        assert_eq!(consumed, 10);
        let log = log
            .lock()
            .map_err(|_| Error::Prefetch("poisoned".into()))?
            .clone();
        let want: Vec<(usize, usize)> = (0..10).map(|b| (b, b % (prefetch + 1))).collect();
        assert_eq!(log, want);
        // The stage went back to the pool for the next epoch (pinned buffers are reused).
        assert_eq!(stages.lock().map(|p| p.len()).unwrap_or(0), 1);
        Ok(())
    }

    #[test]
    fn staging_refuses_a_batch_larger_than_its_slot() -> Result<()> {
        let host = split(10)?.to_host()?;
        let mut st = PlainStage::new(&Device::Cpu, &host, 2, 1);
        let err = st.stage(0, &host, &[0, 1, 2]).err().map(|e| e.to_string());
        assert!(err.is_some_and(|m| m.contains("holds 2 samples, batch has 3")));
        Ok(())
    }

    #[test]
    fn zero_batch_size_is_refused() -> Result<()> {
        assert!(Loader::new(split(3)?, cfg(false, 0).clone_with(0)).is_err());
        Ok(())
    }

    impl LoaderConfig {
        fn clone_with(mut self, batch_size: usize) -> Self {
            self.batch_size = batch_size;
            self
        }
    }
}
