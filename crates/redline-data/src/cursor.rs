//! Batches drawn by a counter that lives on the device.
//!
//! The resident loader slices each batch's indices out of the epoch's
//! permutation at an offset the host computes. That is right while the host
//! launches every step, but a step captured once as a CUDA graph would
//! replay the first batch forever. A [`DeviceCursor`] keeps the batch number
//! in device memory instead: a draw computes its rows as
//! `perm[counter * B + (0..B)]` with device ops, and [`DeviceCursor::advance`]
//! counts on the device, so the same launches, replayed, walk the epoch. The
//! permutation and the counter are buffers written in place at each epoch's
//! start, so their addresses never change.
//!
//! Only full batches are drawn this way; the caller runs an epoch's last,
//! shorter batch as an ordinary step ([`DeviceCursor::full_batches`]).

use candle_core::{DType, Device, Tensor, Var};

use crate::error::{Error, Result};
use crate::split::Split;

/// The position of a capturable step in a device-resident split.
#[derive(Debug)]
pub struct DeviceCursor {
    batch: usize,
    len: usize,
    /// Batches drawn this epoch: u32, shape (1,).
    counter: Var,
    /// 0..batch, u32.
    lanes: Tensor,
    /// The epoch's sample order, u32, shape (len,).
    perm: Var,
}

impl DeviceCursor {
    /// A cursor over `len` samples in batches of `batch`, on `device`, at the
    /// start of an epoch in file order.
    pub fn new(len: usize, batch: usize, device: &Device) -> Result<Self> {
        if batch == 0 || batch > len {
            return Err(Error::Config(format!(
                "a device cursor needs 1 <= batch <= samples, got batch {batch} of {len} samples"
            )));
        }
        let n = u32::try_from(len).map_err(|_| {
            Error::Config(format!(
                "{len} samples do not fit the cursor's u32 indices (at most {})",
                u32::MAX
            ))
        })?;
        Ok(Self {
            batch,
            len,
            counter: Var::from_tensor(&Tensor::zeros(1, DType::U32, device)?)?,
            lanes: Tensor::arange(0u32, batch as u32, device)?,
            perm: Var::from_tensor(&Tensor::arange(0u32, n, device)?)?,
        })
    }

    /// Batch size.
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// The epoch's sample order on the device (u32, one per sample), for a
    /// kernel that draws the batch itself (`redline_kernels::cuda::cursor_gather`).
    pub fn perm(&self) -> &Tensor {
        self.perm.as_tensor()
    }

    /// The batches drawn this epoch, on the device (u32, shape (1,)).
    pub fn counter(&self) -> &Tensor {
        self.counter.as_tensor()
    }

    /// Full batches in an epoch: how many draws an epoch allows.
    pub fn full_batches(&self) -> usize {
        self.len / self.batch
    }

    /// Starts an epoch: writes `order` (a permutation of `0..len`, e.g.
    /// [`crate::Loader::order`]) into the permutation buffer and sets the
    /// counter to 0. Both are copies into the existing buffers, made between
    /// captured steps, never inside one.
    pub fn start_epoch(&self, order: &[u32]) -> Result<()> {
        self.start_epoch_at(order, 0)
    }

    /// [`DeviceCursor::start_epoch`] with the counter at `batch`: the next
    /// draw is the epoch's batch `batch` (a run resumed mid-epoch). `batch`
    /// may be [`DeviceCursor::full_batches`] itself (only the last, shorter
    /// batch is left), not more.
    pub fn start_epoch_at(&self, order: &[u32], batch: usize) -> Result<()> {
        if batch > self.full_batches() {
            return Err(Error::Config(format!(
                "an epoch started at batch {batch}, past its {} full batches",
                self.full_batches()
            )));
        }
        if order.len() != self.len {
            return Err(Error::Config(format!(
                "an epoch order of {} samples for a cursor over {}",
                order.len(),
                self.len
            )));
        }
        if let Some(&bad) = order.iter().find(|&&i| i as usize >= self.len) {
            return Err(Error::Config(format!(
                "sample {bad} in an epoch order over {} samples",
                self.len
            )));
        }
        let device = self.perm.device();
        self.perm
            .set(&Tensor::from_slice(order, self.len, device)?)?;
        // `batch` <= full_batches <= len, which fits a u32 (checked in `new`).
        self.counter.set(&Tensor::new(&[batch as u32], device)?)?;
        Ok(())
    }

    /// The sample indices of the current batch, `(B,)` u32, computed on the
    /// device from the counter. Detached from the cursor's variables, so a
    /// batch gathered with them is data that no backward pass differentiates
    /// (a tracked batch made the first layer's input gradient run every step,
    /// unused: on an H200, the CNN's first convolution's dx).
    pub fn rows(&self) -> Result<Tensor> {
        let first = self.counter.as_tensor().affine(self.batch as f64, 0.0)?;
        let at = self.lanes.broadcast_add(&first)?;
        Ok(self.perm.as_tensor().index_select(&at, 0)?.detach())
    }

    /// The current batch of a device-resident `split`: its inputs and targets.
    /// Draw at most [`DeviceCursor::full_batches`] times per epoch: past
    /// that the rows would lie outside the permutation.
    pub fn gather(&self, split: &Split) -> Result<(Tensor, Tensor)> {
        if split.len() != self.len {
            return Err(Error::Config(format!(
                "a split of {} samples for a cursor over {}",
                split.len(),
                self.len
            )));
        }
        let rows = self.rows()?;
        Ok((
            split.x.index_select(&rows, 0)?,
            split.y.index_select(&rows, 0)?,
        ))
    }

    /// The epoch's last, shorter batch (the samples after the full batches),
    /// or `None` when the batches divide the split. Its rows are a slice of
    /// the permutation at an offset the host knows: an ordinary step, never
    /// a captured one.
    pub fn rest(&self, split: &Split) -> Result<Option<(Tensor, Tensor)>> {
        let start = self.full_batches() * self.batch;
        if start == self.len {
            return Ok(None);
        }
        let rows = self
            .perm
            .as_tensor()
            .narrow(0, start, self.len - start)?
            .detach();
        Ok(Some((
            split.x.index_select(&rows, 0)?,
            split.y.index_select(&rows, 0)?,
        )))
    }

    /// Counts one batch drawn, on the device.
    pub fn advance(&self) -> Result<()> {
        self.counter
            .set(&self.counter.as_tensor().affine(1.0, 1.0)?)?;
        Ok(())
    }

    /// Batches drawn this epoch (read back from the device: a sync).
    pub fn position(&self) -> Result<usize> {
        Ok(self.counter.as_tensor().to_vec1::<u32>()?[0] as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::{Loader, LoaderConfig};
    use crate::TargetKind;
    use std::path::PathBuf;

    /// Sample i has inputs (i, -i) and class i mod 5.
    fn split(n: usize) -> Result<Split> {
        let x: Vec<f32> = (0..n).flat_map(|i| [i as f32, -(i as f32)]).collect();
        let y: Vec<u32> = (0..n as u32).map(|i| i % 5).collect();
        Ok(Split {
            x: Tensor::from_vec(x, (n, 2), &Device::Cpu)?,
            y: Tensor::from_vec(y, n, &Device::Cpu)?,
            target: TargetKind::Classes(5),
            source: PathBuf::from("cursor-test"),
        })
    }

    /// Draws from the cursor are the loader's batches, epoch after epoch:
    /// the same rows, in the same order, with the counter on the device.
    #[test]
    fn draws_are_the_loaders_batches() -> Result<()> {
        let data = split(103)?;
        let cfg = LoaderConfig {
            batch_size: 10,
            shuffle: true,
            seed: 7,
            prefetch: 0,
            ..LoaderConfig::default()
        };
        let loader = Loader::new(data.clone(), cfg)?;
        let cursor = DeviceCursor::new(data.len(), 10, &Device::Cpu)?;
        assert_eq!(cursor.full_batches(), 10);
        for epoch in 0..3 {
            cursor.start_epoch(&loader.order(epoch))?;
            let batches: Vec<_> = loader.epoch(epoch).collect::<Result<_>>()?;
            assert_eq!(batches.len(), 11, "10 full batches and a last one of 3");
            for b in &batches[..10] {
                let (x, y) = cursor.gather(&data)?;
                assert!(
                    !x.track_op() && !y.track_op(),
                    "a batch is data, not tracked"
                );
                assert_eq!(x.to_vec2::<f32>()?, b.x.to_vec2::<f32>()?, "epoch {epoch}");
                assert_eq!(y.to_vec1::<u32>()?, b.y.to_vec1::<u32>()?);
                cursor.advance()?;
            }
            assert_eq!(cursor.position()?, 10);
            let Some((x, y)) = cursor.rest(&data)? else {
                panic!("103 samples leave a batch of 3")
            };
            assert!(
                !x.track_op() && !y.track_op(),
                "the last batch is not tracked"
            );
            assert_eq!(x.to_vec2::<f32>()?, batches[10].x.to_vec2::<f32>()?);
            assert_eq!(y.to_vec1::<u32>()?, batches[10].y.to_vec1::<u32>()?);
        }
        Ok(())
    }

    /// An epoch started at batch k draws the loader's batches from k on
    /// (a resumed run), and the last, shorter batch is still the rest.
    #[test]
    fn an_epoch_can_start_at_any_full_batch() -> Result<()> {
        let data = split(53)?;
        let cfg = LoaderConfig {
            batch_size: 10,
            shuffle: true,
            seed: 11,
            prefetch: 0,
            ..LoaderConfig::default()
        };
        let loader = Loader::new(data.clone(), cfg)?;
        let cursor = DeviceCursor::new(data.len(), 10, &Device::Cpu)?;
        for first in [0, 1, 3, 5] {
            cursor.start_epoch_at(&loader.order(2), first)?;
            assert_eq!(cursor.position()?, first);
            let batches: Vec<_> = loader.epoch_from(2, first).collect::<Result<_>>()?;
            assert_eq!(
                batches.len(),
                6 - first,
                "5 full batches and a last one of 3"
            );
            for b in &batches[..5 - first] {
                let (x, y) = cursor.gather(&data)?;
                assert_eq!(x.to_vec2::<f32>()?, b.x.to_vec2::<f32>()?, "from {first}");
                assert_eq!(y.to_vec1::<u32>()?, b.y.to_vec1::<u32>()?);
                cursor.advance()?;
            }
            let rest = cursor.rest(&data)?.map(|(x, _)| x.to_vec2::<f32>());
            assert_eq!(
                rest.transpose()?,
                Some(batches[5 - first].x.to_vec2::<f32>()?)
            );
        }
        let msg = cursor
            .start_epoch_at(&loader.order(0), 6)
            .err()
            .map(|e| e.to_string());
        assert!(msg.is_some_and(|m| m.contains("batch 6, past its 5 full batches")));
        Ok(())
    }

    #[test]
    fn bad_orders_and_sizes_are_refused() -> Result<()> {
        let err = |r: Result<DeviceCursor>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(DeviceCursor::new(5, 0, &Device::Cpu)).contains("batch 0 of 5"));
        assert!(err(DeviceCursor::new(5, 6, &Device::Cpu)).contains("batch 6 of 5"));
        let c = DeviceCursor::new(4, 2, &Device::Cpu)?;
        let msg = c.start_epoch(&[0, 1, 2]).err().map(|e| e.to_string());
        assert!(msg.is_some_and(|m| m.contains("3 samples for a cursor over 4")));
        let msg = c.start_epoch(&[0, 1, 2, 9]).err().map(|e| e.to_string());
        assert!(msg.is_some_and(|m| m.contains("sample 9")));
        let msg = c.gather(&split(5)?).err().map(|e| e.to_string());
        assert!(msg.is_some_and(|m| m.contains("5 samples for a cursor over 4")));
        assert!(
            c.rest(&split(4)?)?.is_none(),
            "2 batches of 2 leave nothing"
        );
        Ok(())
    }
}
