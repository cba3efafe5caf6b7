//! Streaming: batches gathered on the host into reusable staging buffers and
//! copied to the device, so a split that does not live on the device still
//! feeds it without a fresh host allocation per batch.
//!
//! A [`Stage`] owns `slots` staging buffers used in turn (batch `b` goes
//! through slot `b % slots`). On a GPU the buffers are pinned and the copy runs
//! on its own stream; the batch comes with a [`Fence`] that makes the compute
//! stream wait for that batch's copy only. The plain stage, used on the CPU and
//! any device without a faster path, copies synchronously.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::dataset::{batch_shape, row, Dataset, Targets};
use crate::error::Result;

/// What the consumer must wait for before computing on a staged batch.
pub enum Fence {
    /// Nothing: the batch is already in place.
    Ready,
    /// The copy stream's event after this batch's copies: the compute stream
    /// waits for it (the host does not).
    #[cfg(feature = "cuda")]
    Cuda {
        /// Recorded on the copy stream after the batch's copies (shared with
        /// the staging slot, whose host buffers wait on it before refilling).
        event: Arc<candle_core::cuda_backend::cudarc::driver::CudaEvent>,
        /// The compute stream that must wait.
        compute: Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    },
}

impl Fence {
    /// Orders the compute stream after the batch's copy (no host wait).
    pub fn wait(self) -> Result<()> {
        match self {
            Self::Ready => Ok(()),
            #[cfg(feature = "cuda")]
            Self::Cuda { event, compute } => compute.wait(&event).map_err(|e| {
                crate::Error::Candle(candle_core::Error::Msg(format!("stream wait: {e:?}")))
            }),
        }
    }
}

/// Moves gathered batches to the device through reusable staging buffers.
pub trait Stage: Send {
    /// Gathers samples `idx` into slot `slot % slots` and starts their copy;
    /// returns the device tensors `(x, y)` and the fence to wait on.
    fn stage(
        &mut self,
        slot: usize,
        data: &dyn Dataset,
        idx: &[u32],
    ) -> Result<(Tensor, Tensor, Fence)>;

    /// Staging slots used in turn.
    fn slots(&self) -> usize;
}

/// Host staging buffers and a synchronous copy (`Tensor::from_slice`): the CPU,
/// and the fallback for devices without an asynchronous path.
pub struct PlainStage {
    device: Device,
    buffers: Vec<(Vec<f32>, Targets)>,
}

impl PlainStage {
    /// `slots` buffers of `batch` samples each, copying to `device`.
    pub fn new(device: &Device, data: &dyn Dataset, batch: usize, slots: usize) -> Self {
        let slots = slots.max(1);
        Self {
            device: device.clone(),
            buffers: (0..slots)
                .map(|_| {
                    (
                        vec![0f32; batch * row(data)],
                        Targets::zeros(data.target(), batch),
                    )
                })
                .collect(),
        }
    }
}

impl Stage for PlainStage {
    fn stage(
        &mut self,
        slot: usize,
        data: &dyn Dataset,
        idx: &[u32],
    ) -> Result<(Tensor, Tensor, Fence)> {
        let n = self.buffers.len();
        let (x, y) = &mut self.buffers[slot % n];
        let b = idx.len();
        if self.device.is_cpu() {
            // Gathered straight into the batch's own storage: no copy on
            // this thread while the gather's workers wait for the next batch.
            let mut own = vec![0f32; b * row(data)];
            data.gather(idx, &mut own, y.as_mut())?;
            let xs = Tensor::from_vec(own, batch_shape(data, b), &self.device)?;
            let kind = data.target();
            let ys = match y {
                Targets::Classes(v) => {
                    Tensor::from_slice(&v[..b * kind.width()], kind.batch_shape(b), &self.device)?
                }
                Targets::Values(v) => {
                    Tensor::from_slice(&v[..b * kind.width()], kind.batch_shape(b), &self.device)?
                }
            };
            return Ok((xs, ys, Fence::Ready));
        }
        data.gather(idx, x, y.as_mut())?;
        let xs = Tensor::from_slice(&x[..b * row(data)], batch_shape(data, b), &self.device)?;
        let kind = data.target();
        let ys = match y {
            Targets::Classes(v) => {
                Tensor::from_slice(&v[..b * kind.width()], kind.batch_shape(b), &self.device)?
            }
            Targets::Values(v) => {
                Tensor::from_slice(&v[..b * kind.width()], kind.batch_shape(b), &self.device)?
            }
        };
        Ok((xs, ys, Fence::Ready))
    }

    fn slots(&self) -> usize {
        self.buffers.len()
    }
}

/// The fastest stage for `device`: pinned buffers and a copy stream on a GPU
/// (with the `cuda` feature), else [`PlainStage`].
pub fn stage_for(
    device: &Device,
    data: &dyn Dataset,
    batch: usize,
    slots: usize,
) -> Result<Box<dyn Stage>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        return Ok(Box::new(crate::cuda_stage::PinnedStage::new(
            d, data, batch, slots,
        )?));
    }
    Ok(Box::new(PlainStage::new(device, data, batch, slots)))
}

/// Shared pool of stages, so pinned buffers outlive an epoch.
pub(crate) type StagePool = Arc<std::sync::Mutex<Vec<Box<dyn Stage>>>>;
