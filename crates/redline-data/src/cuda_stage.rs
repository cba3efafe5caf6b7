//! The GPU stage (built with the `cuda` feature): pinned host buffers, one
//! copy stream, an event per batch.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, PinnedHostSlice};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Storage, Tensor};

use crate::dataset::{batch_shape, row, Dataset, TargetKind, TargetsMut};
use crate::error::{Error, Result};
use crate::stage::{Fence, Stage};

fn cuda(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Candle(candle_core::Error::Msg(format!("CUDA {what}: {e:?}")))
}

/// A slot's pinned target buffer, typed as the data set's targets.
enum PinnedTargets {
    Classes(PinnedHostSlice<u32>),
    Values(PinnedHostSlice<f32>),
}

/// Pinned staging slots and an asynchronous copy stream.
pub struct PinnedStage {
    device: CudaDevice,
    copy: Arc<CudaStream>,
    slots: Vec<(PinnedHostSlice<f32>, PinnedTargets)>,
    batch: usize,
}

impl PinnedStage {
    /// `slots` pinned buffers of `batch` samples for `device`.
    pub fn new(
        device: &CudaDevice,
        data: &dyn Dataset,
        batch: usize,
        slots: usize,
    ) -> Result<Self> {
        let ctx = device.cuda_stream().context().clone();
        let copy = ctx.new_stream().map_err(|e| cuda("copy stream", e))?;
        let mut bufs = Vec::with_capacity(slots.max(1));
        for _ in 0..slots.max(1) {
            // SAFETY: every element is written by `gather` before it is copied
            // (the tail of a partial batch is copied but never read: the tensor
            // is narrowed to the batch).
            let x = unsafe { ctx.alloc_pinned::<f32>(batch * row(data)) }
                .map_err(|e| cuda("pinned allocation", e))?;
            let y = match data.target() {
                TargetKind::Classes(_) => PinnedTargets::Classes(
                    unsafe { ctx.alloc_pinned::<u32>(batch) }
                        .map_err(|e| cuda("pinned allocation", e))?,
                ),
                TargetKind::Values(w) => PinnedTargets::Values(
                    unsafe { ctx.alloc_pinned::<f32>(batch * w) }
                        .map_err(|e| cuda("pinned allocation", e))?,
                ),
            };
            bufs.push((x, y));
        }
        Ok(Self {
            device: device.clone(),
            copy,
            slots: bufs,
            batch,
        })
    }
}

/// Queues the copy of a whole pinned slot into fresh device memory on the copy stream.
fn upload<T: candle_core::cuda_backend::cudarc::driver::DeviceRepr>(
    copy: &Arc<CudaStream>,
    host: &PinnedHostSlice<T>,
) -> Result<CudaSlice<T>> {
    // SAFETY: the copy below writes every element before any use.
    let mut d = unsafe { copy.alloc::<T>(host.len()) }.map_err(|e| cuda("alloc", e))?;
    copy.memcpy_htod(host, &mut d)
        .map_err(|e| cuda("copy", e))?;
    Ok(d)
}

/// A device slice as a tensor of `shape` (no copy).
fn wrap<T: candle_core::cuda_backend::CudaDType>(
    device: &CudaDevice,
    slice: CudaSlice<T>,
    shape: Vec<usize>,
) -> Tensor {
    let storage = CudaStorage::wrap_cuda_slice(slice, device.clone());
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

impl Stage for PinnedStage {
    fn stage(
        &mut self,
        slot: usize,
        data: &dyn Dataset,
        idx: &[u32],
    ) -> Result<(Tensor, Tensor, Fence)> {
        let n = self.slots.len();
        let (hx, hy) = &mut self.slots[slot % n];
        {
            // Waits (sleeping) for this slot's previous copy to finish.
            let x = hx.as_mut_slice().map_err(|e| cuda("pinned slot", e))?;
            let y = match hy {
                PinnedTargets::Classes(v) => {
                    TargetsMut::Classes(v.as_mut_slice().map_err(|e| cuda("pinned slot", e))?)
                }
                PinnedTargets::Values(v) => {
                    TargetsMut::Values(v.as_mut_slice().map_err(|e| cuda("pinned slot", e))?)
                }
            };
            data.gather(idx, x, y)?;
        }
        let (b, y_shape) = (idx.len(), data.target().batch_shape(self.batch));
        let x = wrap(
            &self.device,
            upload(&self.copy, hx)?,
            batch_shape(data, self.batch),
        );
        let y = match hy {
            PinnedTargets::Classes(h) => wrap(&self.device, upload(&self.copy, h)?, y_shape),
            PinnedTargets::Values(h) => wrap(&self.device, upload(&self.copy, h)?, y_shape),
        };
        let event = self.copy.record_event(None).map_err(|e| cuda("event", e))?;
        let (x, y) = (x.narrow(0, 0, b)?, y.narrow(0, 0, b)?);
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
