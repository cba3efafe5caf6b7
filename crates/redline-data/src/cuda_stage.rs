//! The GPU stage (built with the `cuda` feature): pinned host buffers, one
//! copy stream, an event per batch.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaStream, PinnedHostSlice};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Storage, Tensor};

use crate::error::{Error, Result};
use crate::stage::{Fence, HostData, Stage};

fn cuda(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Candle(candle_core::Error::Msg(format!("CUDA {what}: {e:?}")))
}

/// Pinned staging slots and an asynchronous copy stream.
pub struct PinnedStage {
    device: CudaDevice,
    copy: Arc<CudaStream>,
    slots: Vec<(PinnedHostSlice<f32>, PinnedHostSlice<u32>)>,
    batch: usize,
}

impl PinnedStage {
    /// `slots` pinned buffers of `batch` samples for `device`.
    pub fn new(device: &CudaDevice, data: &HostData, batch: usize, slots: usize) -> Result<Self> {
        let ctx = device.cuda_stream().context().clone();
        let copy = ctx.new_stream().map_err(|e| cuda("copy stream", e))?;
        let mut bufs = Vec::with_capacity(slots.max(1));
        for _ in 0..slots.max(1) {
            // SAFETY: every element is written by `gather` before it is copied
            // (the tail of a partial batch is copied but never read: the tensor
            // is narrowed to the batch).
            let x = unsafe { ctx.alloc_pinned::<f32>(batch * data.row()) }
                .map_err(|e| cuda("pinned allocation", e))?;
            let y = unsafe { ctx.alloc_pinned::<u32>(batch) }
                .map_err(|e| cuda("pinned allocation", e))?;
            bufs.push((x, y));
        }
        Ok(Self {
            device: device.clone(),
            copy,
            slots: bufs,
            batch,
        })
    }

    fn wrap<T: candle_core::cuda_backend::CudaDType>(
        &self,
        slice: candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
        shape: Vec<usize>,
    ) -> Tensor {
        let storage = CudaStorage::wrap_cuda_slice(slice, self.device.clone());
        Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
    }
}

impl Stage for PinnedStage {
    fn stage(
        &mut self,
        slot: usize,
        data: &HostData,
        idx: &[u32],
    ) -> Result<(Tensor, Tensor, Fence)> {
        let n = self.slots.len();
        let (hx, hy) = &mut self.slots[slot % n];
        {
            // Waits (sleeping) for this slot's previous copy to finish.
            let x = hx.as_mut_slice().map_err(|e| cuda("pinned slot", e))?;
            let y = hy.as_mut_slice().map_err(|e| cuda("pinned slot", e))?;
            data.gather(idx, x, y)?;
        }
        let (full_x, full_y) = (hx.len(), hy.len());
        // SAFETY: the copies below write every element before any use.
        let mut dx = unsafe { self.copy.alloc::<f32>(full_x) }.map_err(|e| cuda("alloc", e))?;
        let mut dy = unsafe { self.copy.alloc::<u32>(full_y) }.map_err(|e| cuda("alloc", e))?;
        self.copy
            .memcpy_htod(&*hx, &mut dx)
            .map_err(|e| cuda("copy", e))?;
        self.copy
            .memcpy_htod(&*hy, &mut dy)
            .map_err(|e| cuda("copy", e))?;
        let event = self.copy.record_event(None).map_err(|e| cuda("event", e))?;
        let b = idx.len();
        let x = self
            .wrap(dx, data.batch_shape(self.batch))
            .narrow(0, 0, b)?;
        let y = self.wrap(dy, vec![self.batch]).narrow(0, 0, b)?;
        Ok((
            x,
            y,
            Fence::Cuda {
                event,
                compute: self.device.cuda_stream(),
            },
        ))
    }

    fn slots(&self) -> usize {
        self.slots.len()
    }
}
