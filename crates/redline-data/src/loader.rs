//! The loader: a seeded permutation per epoch, batches gathered from the split
//! tensors, and the next batches assembled on a background thread while the
//! current step runs.
//!
//! The prefetch thread blocks on a bounded channel (it sleeps, it never spins),
//! so it does not compete with the compute threads for cores.

use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

use candle_core::Tensor;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};
use crate::mnist::Split;

/// How batches are drawn from a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Samples per batch; the last batch of an epoch may be smaller.
    pub batch_size: usize,
    /// A fresh seeded permutation each epoch; `false` keeps file order.
    pub shuffle: bool,
    /// Seed of the permutation stream (epoch `e` uses stream `e` of this seed).
    pub seed: u64,
    /// Batches assembled ahead on a background thread; 0 assembles inline.
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

/// One batch, on the split's device.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Inputs, `(B, 1, H, W)`.
    pub x: Tensor,
    /// Class indices, `(B,)` u32.
    pub y: Tensor,
    /// Position of this batch within its epoch (0-based).
    pub index: usize,
}

impl Batch {
    /// Number of samples in the batch.
    pub fn size(&self) -> usize {
        self.y.dims().first().copied().unwrap_or(0)
    }
}

/// Draws batches from one split.
#[derive(Debug, Clone)]
pub struct Loader {
    split: Split,
    cfg: LoaderConfig,
}

impl Loader {
    /// A loader over `split`; refuses a zero batch size.
    pub fn new(split: Split, cfg: LoaderConfig) -> Result<Self> {
        if cfg.batch_size == 0 {
            return Err(Error::Config("batch size must be at least 1".into()));
        }
        Ok(Self { split, cfg })
    }

    /// The split this loader draws from.
    pub fn split(&self) -> &Split {
        &self.split
    }

    /// The loader's settings.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// Samples in the split.
    pub fn len(&self) -> usize {
        self.split.len()
    }

    /// True when the split is empty.
    pub fn is_empty(&self) -> bool {
        self.split.is_empty()
    }

    /// Batches one epoch yields.
    pub fn batches_per_epoch(&self) -> usize {
        let (n, b) = (self.split.len(), self.cfg.batch_size);
        if self.cfg.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    /// The sample order of `epoch`: identity without shuffling, otherwise a
    /// Fisher-Yates permutation from ChaCha8 seeded by `seed`, stream `epoch`
    /// (independent of every other epoch, so a resumed run draws the same order).
    pub fn order(&self, epoch: usize) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..self.split.len() as u32).collect();
        if self.cfg.shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(self.cfg.seed);
            rng.set_stream(epoch as u64);
            idx.shuffle(&mut rng);
        }
        idx
    }

    /// Iterates over the batches of `epoch`, prefetching when configured.
    pub fn epoch(&self, epoch: usize) -> EpochIter {
        let source = BatchSource {
            images: self.split.images.clone(),
            labels: self.split.labels.clone(),
            order: if self.cfg.shuffle {
                Some(self.order(epoch))
            } else {
                None
            },
            batch_size: self.cfg.batch_size,
            batches: self.batches_per_epoch(),
            len: self.split.len(),
        };
        if self.cfg.prefetch == 0 {
            return EpochIter(Inner::Inline { source, next: 0 });
        }
        let (tx, rx) = sync_channel(self.cfg.prefetch);
        let spawned = std::thread::Builder::new()
            .name("redline-prefetch".into())
            .spawn(move || {
                redline_core::trace::name_thread("loader/prefetch");
                for b in 0..source.batches {
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

/// What the producer needs: the split tensors and this epoch's order.
struct BatchSource {
    images: Tensor,
    labels: Tensor,
    order: Option<Vec<u32>>,
    batch_size: usize,
    batches: usize,
    len: usize,
}

impl BatchSource {
    fn batch(&self, b: usize) -> Result<Batch> {
        let start = b * self.batch_size;
        let size = self.batch_size.min(self.len - start);
        let (x, y) = match &self.order {
            // File order: a zero-copy view of consecutive rows.
            None => (
                self.images.narrow(0, start, size)?,
                self.labels.narrow(0, start, size)?,
            ),
            Some(order) => {
                let idx =
                    Tensor::from_slice(&order[start..start + size], size, self.images.device())?;
                (
                    self.images.index_select(&idx, 0)?,
                    self.labels.index_select(&idx, 0)?,
                )
            }
        };
        Ok(Batch { x, y, index: b })
    }
}

/// The batches of one epoch, in order.
pub struct EpochIter(Inner);

enum Inner {
    /// Batches built on the caller's thread.
    Inline { source: BatchSource, next: usize },
    /// Batches built ahead on the prefetch thread; joined on drop.
    Threaded {
        rx: Option<Receiver<Result<Batch>>>,
        handle: Option<JoinHandle<()>>,
    },
    /// The prefetch thread could not be started; yields this error once.
    Failed(Option<Error>),
}

impl Iterator for EpochIter {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        match &mut self.0 {
            Inner::Inline { source, next } => {
                if *next >= source.batches {
                    return None;
                }
                *next += 1;
                Some(source.batch(*next - 1))
            }
            Inner::Threaded { rx, .. } => rx.as_ref()?.recv().ok(),
            Inner::Failed(e) => e.take().map(Err),
        }
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
    use candle_core::Device;
    use std::path::Path;

    fn split(n: usize) -> Result<Split> {
        Split::from_idx(
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
            10,
            Normalize {
                mean: 0.0,
                std: 1.0 / 255.0,
            },
            &Device::Cpu,
        )
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
    fn stopping_early_does_not_hang() -> Result<()> {
        let l = Loader::new(split(100)?, cfg(true, 1))?;
        let mut it = l.epoch(0);
        assert!(it.next().is_some());
        drop(it);
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
