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

use crate::error::{Error, Result};
use crate::mnist::Split;

/// A split held in host memory, row-major, for gathering batches from.
#[derive(Debug)]
pub struct HostData {
    /// Normalised pixels, `n * row` values.
    pub images: Vec<f32>,
    /// Class indices, `n` values.
    pub labels: Vec<u32>,
    /// Per-sample dimensions after the batch axis, e.g. `[1, 28, 28]`.
    pub sample_dims: Vec<usize>,
}

impl HostData {
    /// Copies a split's tensors to host vectors (once, when the loader is built).
    pub fn from_split(split: &Split) -> Result<Self> {
        let dims = split.images.dims();
        Ok(Self {
            images: split.images.flatten_all()?.to_vec1::<f32>()?,
            labels: split.labels.to_vec1::<u32>()?,
            sample_dims: dims.get(1..).unwrap_or_default().to_vec(),
        })
    }

    /// Values per sample.
    pub fn row(&self) -> usize {
        self.sample_dims.iter().product()
    }

    /// Copies the samples `idx` into `x` and their labels into `y`.
    pub fn gather(&self, idx: &[u32], x: &mut [f32], y: &mut [u32]) -> Result<()> {
        let row = self.row();
        if x.len() < idx.len() * row || y.len() < idx.len() {
            return Err(Error::Config(format!(
                "staging buffer holds {} samples, batch has {}",
                y.len().min(x.len() / row.max(1)),
                idx.len()
            )));
        }
        for (k, &i) in idx.iter().enumerate() {
            let i = i as usize;
            let src = self.images.get(i * row..(i + 1) * row).ok_or_else(|| {
                Error::Config(format!(
                    "sample index {i} beyond the split's {} samples",
                    self.labels.len()
                ))
            })?;
            x[k * row..(k + 1) * row].copy_from_slice(src);
            y[k] = self.labels[i];
        }
        Ok(())
    }

    /// The batch shape for `b` samples.
    pub fn batch_shape(&self, b: usize) -> Vec<usize> {
        let mut s = vec![b];
        s.extend_from_slice(&self.sample_dims);
        s
    }
}

/// What the consumer must wait for before computing on a staged batch.
pub enum Fence {
    /// Nothing: the batch is already in place.
    Ready,
    /// The copy stream's event after this batch's copies: the compute stream
    /// waits for it (the host does not).
    #[cfg(feature = "cuda")]
    Cuda {
        /// Recorded on the copy stream after the batch's copies.
        event: candle_core::cuda_backend::cudarc::driver::CudaEvent,
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
            Self::Cuda { event, compute } => compute
                .wait(&event)
                .map_err(|e| Error::Candle(candle_core::Error::Msg(format!("stream wait: {e:?}")))),
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
        data: &HostData,
        idx: &[u32],
    ) -> Result<(Tensor, Tensor, Fence)>;

    /// Staging slots used in turn.
    fn slots(&self) -> usize;
}

/// Host staging buffers and a synchronous copy (`Tensor::from_slice`): the CPU,
/// and the fallback for devices without an asynchronous path.
pub struct PlainStage {
    device: Device,
    buffers: Vec<(Vec<f32>, Vec<u32>)>,
}

impl PlainStage {
    /// `slots` buffers of `batch` samples each, copying to `device`.
    pub fn new(device: &Device, data: &HostData, batch: usize, slots: usize) -> Self {
        let slots = slots.max(1);
        Self {
            device: device.clone(),
            buffers: (0..slots)
                .map(|_| (vec![0f32; batch * data.row()], vec![0u32; batch]))
                .collect(),
        }
    }
}

impl Stage for PlainStage {
    fn stage(
        &mut self,
        slot: usize,
        data: &HostData,
        idx: &[u32],
    ) -> Result<(Tensor, Tensor, Fence)> {
        let n = self.buffers.len();
        let (x, y) = &mut self.buffers[slot % n];
        data.gather(idx, x, y)?;
        let b = idx.len();
        let xs = Tensor::from_slice(&x[..b * data.row()], data.batch_shape(b), &self.device)?;
        let ys = Tensor::from_slice(&y[..b], b, &self.device)?;
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
    data: &HostData,
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
