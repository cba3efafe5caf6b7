//! A whole data set as two tensors on one device: what a device-resident
//! loader gathers batches from.

use std::path::PathBuf;

use candle_core::{Device, Tensor};

use crate::dataset::{batch_shape, row, Dataset, HostData, TargetKind, Targets};
use crate::error::Result;

/// One split held as two tensors on a device.
#[derive(Debug, Clone)]
pub struct Split {
    /// Inputs, `(N, ...)` f32 (images `(N, C, H, W)`, features `(N, F)`).
    pub x: Tensor,
    /// Targets: class ids `(N,)` u32, or values `(N,)` / `(N, W)` f32.
    pub y: Tensor,
    /// What the targets are.
    pub target: TargetKind,
    /// Where the data came from (for messages).
    pub source: PathBuf,
}

impl Split {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.x.dims().first().copied().unwrap_or(0)
    }

    /// True when the split holds no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The classes of a classification split.
    pub fn classes(&self) -> Option<usize> {
        self.target.classes()
    }

    /// Bytes the split's tensors take (inputs and targets).
    pub fn bytes(&self) -> u64 {
        let t = |x: &Tensor| (x.elem_count() * x.dtype().size_in_bytes()) as u64;
        t(&self.x) + t(&self.y)
    }

    /// The same split on `device` (one upload; a cheap clone when already there).
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            x: self.x.to_device(device)?,
            y: self.y.to_device(device)?,
            target: self.target,
            source: self.source.clone(),
        })
    }

    /// Uploads host data to `device` as one input and one target tensor.
    pub fn from_host(data: &HostData, device: &Device) -> Result<Self> {
        let n = data.len();
        let x = Tensor::from_slice(&data.x, batch_shape(data, n), device)?;
        let shape = data.target.batch_shape(n);
        let y = match &data.y {
            Targets::Classes(v) => Tensor::from_slice(v, shape, device)?,
            Targets::Values(v) => Tensor::from_slice(v, shape, device)?,
        };
        Ok(Self {
            x,
            y,
            target: data.target,
            source: data.source.clone(),
        })
    }

    /// Copies the split back to host memory (a streaming loader's source).
    pub fn to_host(&self) -> Result<HostData> {
        let x = self.x.flatten_all()?.to_vec1::<f32>()?;
        let y = match self.target {
            TargetKind::Classes(_) | TargetKind::Tokens { .. } => {
                Targets::Classes(self.y.flatten_all()?.to_vec1::<u32>()?)
            }
            TargetKind::Values(_) => Targets::Values(self.y.flatten_all()?.to_vec1::<f32>()?),
        };
        let dims = self.x.dims().get(1..).unwrap_or_default().to_vec();
        HostData::new(x, dims, y, self.target, self.source.clone())
    }

    /// Gathers every sample of `data` and uploads it to `device`.
    pub fn from_dataset(data: &dyn Dataset, device: &Device) -> Result<Self> {
        let n = data.len();
        let mut x = vec![0.0; n * row(data)];
        let mut y = Targets::zeros(data.target(), n);
        let all: Vec<u32> = (0..n as u32).collect();
        data.gather(&all, &mut x, y.as_mut())?;
        Self::from_host(
            &HostData::new(
                x,
                data.input_dims().to_vec(),
                y,
                data.target(),
                data.source().to_path_buf(),
            )?,
            device,
        )
    }
}
