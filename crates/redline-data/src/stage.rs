//! Streaming: batches gathered on the host into reusable staging buffers and
//! copied to the device, so a split that does not live on the device still
//! feeds it without a fresh host allocation per batch.
//!
//! A [`Stage`] owns `slots` staging buffers used in turn (batch `b` goes
//! through slot `b % slots`). On a GPU the buffers are pinned and the copy runs
//! on its own stream; the batch comes with a [`Fence`] that makes the compute
//! stream wait for that batch's copy only. Decoded images cross to a device
//! other than the CPU as their bytes, a quarter of fp32's, and are normalised
//! there after the fence ([`Staged::ready`]). The plain stage, used on the CPU
//! and any device without a faster path, copies synchronously.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::dataset::{batch_shape, row, Dataset, Targets};
use crate::error::Result;
use crate::stream::crop::byte_values;
use crate::stream::ChannelNorm;

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

/// A batch on its way to the device: its tensors, and what must happen
/// before computing on them.
pub struct Staged {
    /// The inputs: values, or bytes when `values` is given.
    pub x: Tensor,
    /// The targets.
    pub y: Tensor,
    /// What the compute stream waits for.
    pub fence: Fence,
    /// For a batch of bytes: each sample's normalised value of each byte
    /// per channel, `(b, C, 256)` fp32 on the device ([`byte_table`]).
    pub values: Option<Tensor>,
}

impl Staged {
    /// A batch of values, ready once `fence` is.
    pub fn new(x: Tensor, y: Tensor, fence: Fence) -> Self {
        Self {
            x,
            y,
            fence,
            values: None,
        }
    }

    /// Orders the compute stream after the batch's copy (no host wait),
    /// then normalises a batch of bytes there: `(x, y)` to compute on.
    pub fn ready(self) -> Result<(Tensor, Tensor)> {
        self.fence.wait()?;
        let x = match &self.values {
            Some(table) => normalise_bytes(&self.x, table)?,
            None => self.x,
        };
        Ok((x, self.y))
    }
}

/// The table that normalises bytes of `batch` samples of `channels`
/// channels on `device`: `(batch, channels, 256)` fp32, each channel's
/// `(p / 255 - mean) / std` for every byte `p` (the values the host's
/// gather writes; a grey image uses the first channel's).
pub fn byte_table(
    norm: &ChannelNorm,
    channels: usize,
    batch: usize,
    device: &Device,
) -> Result<Tensor> {
    let values = byte_values(norm);
    let one: Vec<f32> = (0..channels)
        .flat_map(|c| values[c.min(2)].iter().copied())
        .collect();
    let all: Vec<f32> = (0..batch).flat_map(|_| one.iter().copied()).collect();
    Ok(Tensor::from_vec(all, (batch, channels, 256), device)?)
}

/// A batch of bytes `(b, C, ...)` normalised on its device by looking each
/// byte up in `table` ([`byte_table`], at least `b` rows): the same values
/// as the host's gather. Two kernels: the bytes widened to u32, then a
/// gather (candle's gather takes an index of `u8::MAX` for padding and
/// gives 0 there, so byte 255 cannot be an index of its own).
pub fn normalise_bytes(x: &Tensor, table: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let (b, c) = match dims[..] {
        [b, c, ..] => (b, c),
        _ => {
            return Err(crate::Error::Config(format!(
                "a batch of bytes of shape {dims:?} has no channels"
            )))
        }
    };
    let table = table.narrow(0, 0, b)?;
    let ids = x.reshape((b, c, ()))?.to_dtype(candle_core::DType::U32)?;
    Ok(table.gather(&ids, 2)?.reshape(dims)?)
}

/// Moves gathered batches to the device through reusable staging buffers.
pub trait Stage: Send {
    /// Gathers samples `idx` into slot `slot % slots` and starts their copy;
    /// returns the device tensors and what to wait for ([`Staged::ready`]).
    fn stage(&mut self, slot: usize, data: &dyn Dataset, idx: &[u32]) -> Result<Staged>;

    /// Staging slots used in turn.
    fn slots(&self) -> usize;
}

/// A slot's host buffer of inputs.
enum HostX {
    Values(Vec<f32>),
    Bytes(Vec<u8>),
}

/// Host staging buffers and a synchronous copy (`Tensor::from_slice`): the CPU,
/// and the fallback for devices without an asynchronous path. On a device
/// other than the CPU, images cross as bytes and are normalised there.
pub struct PlainStage {
    device: Device,
    buffers: Vec<(HostX, Targets)>,
    /// With bytes: [`byte_table`] on the device.
    table: Option<Tensor>,
}

impl PlainStage {
    /// `slots` buffers of `batch` samples each, copying to `device`. Data of
    /// 8-bit pixels crosses as bytes to a device other than the CPU (where
    /// the gather normalises as it writes).
    pub fn new(device: &Device, data: &dyn Dataset, batch: usize, slots: usize) -> Result<Self> {
        Self::with_bytes(device, data, batch, slots, !device.is_cpu())
    }

    /// [`PlainStage::new`], with batches of bytes normalised on the device
    /// whenever the data has them and `bytes` is set (on the CPU too).
    pub fn with_bytes(
        device: &Device,
        data: &dyn Dataset,
        batch: usize,
        slots: usize,
        bytes: bool,
    ) -> Result<Self> {
        let norm = data.byte_norm().filter(|_| bytes);
        let table = match &norm {
            Some(n) => Some(byte_table(n, channels(data), batch, device)?),
            None => None,
        };
        let buffers = (0..slots.max(1))
            .map(|_| {
                let x = match norm {
                    Some(_) => HostX::Bytes(vec![0u8; batch * row(data)]),
                    None => HostX::Values(vec![0f32; batch * row(data)]),
                };
                (x, Targets::zeros(data.target(), batch))
            })
            .collect();
        Ok(Self {
            device: device.clone(),
            buffers,
            table,
        })
    }
}

/// Channels of one input (its first dimension).
pub(crate) fn channels(data: &dyn Dataset) -> usize {
    data.input_dims().first().copied().unwrap_or(1)
}

impl Stage for PlainStage {
    fn stage(&mut self, slot: usize, data: &dyn Dataset, idx: &[u32]) -> Result<Staged> {
        let n = self.buffers.len();
        let (x, y) = &mut self.buffers[slot % n];
        let b = idx.len();
        let shape = batch_shape(data, b);
        let xs = match x {
            // Gathered straight into the batch's own storage: no copy on
            // this thread while the gather's workers wait for the next batch.
            HostX::Values(_) if self.device.is_cpu() => {
                let mut own = vec![0f32; b * row(data)];
                data.gather(idx, &mut own, y.as_mut())?;
                Tensor::from_vec(own, shape, &self.device)?
            }
            HostX::Values(x) => {
                data.gather(idx, x, y.as_mut())?;
                Tensor::from_slice(&x[..b * row(data)], shape, &self.device)?
            }
            HostX::Bytes(x) => {
                data.gather_bytes(idx, x, y.as_mut())?;
                Tensor::from_slice(&x[..b * row(data)], shape, &self.device)?
            }
        };
        let kind = data.target();
        let ys = match y {
            Targets::Classes(v) => {
                Tensor::from_slice(&v[..b * kind.width()], kind.batch_shape(b), &self.device)?
            }
            Targets::Values(v) => {
                Tensor::from_slice(&v[..b * kind.width()], kind.batch_shape(b), &self.device)?
            }
        };
        Ok(Staged {
            x: xs,
            y: ys,
            fence: Fence::Ready,
            values: self.table.clone(),
        })
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
    Ok(Box::new(PlainStage::new(device, data, batch, slots)?))
}

/// Shared pool of stages, so pinned buffers outlive an epoch.
pub(crate) type StagePool = Arc<std::sync::Mutex<Vec<Box<dyn Stage>>>>;
