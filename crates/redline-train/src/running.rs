//! Device-side running sums of loss and correct predictions.
//!
//! Each step adds into tensors; nothing is read back until a log point or the
//! end of an epoch, so the hot loop never waits for the device.

use candle_core::{DType, Device, Tensor};
use redline_core::host;

use crate::error::Result;

/// The summed loss of a batch from its mean loss, detached from the graph;
/// computed once per step and shared by every running sum.
pub(crate) fn batch_loss_sum(mean_loss: &Tensor, batch: usize) -> Result<Tensor> {
    Ok(mean_loss.detach().affine(batch as f64, 0.0)?)
}

/// Sums over a window of steps, kept on the device.
pub(crate) struct Running {
    /// Sum of per-sample losses (`mean_loss * batch`).
    loss_sum: Tensor,
    /// Count of correct top-1 predictions.
    correct: Tensor,
    /// Samples added (a host counter: no read needed).
    pub samples: usize,
}

impl Running {
    pub fn new(device: &Device) -> Result<Self> {
        Ok(Self {
            loss_sum: Tensor::zeros((), DType::F32, device)?,
            correct: Tensor::zeros((), DType::F32, device)?,
            samples: 0,
        })
    }

    /// Adds a batch: `loss_sum` is the batch's summed loss (scalar, detached:
    /// see [`batch_loss_sum`]), `logits (B, C)`, `targets (B,)`.
    pub fn add(&mut self, loss_sum: &Tensor, logits: &Tensor, targets: &Tensor) -> Result<()> {
        let b = targets.dims().first().copied().unwrap_or(0);
        self.add_loss(loss_sum, b)?;
        let hits = logits
            .detach()
            .argmax(1)?
            .eq(targets)?
            .to_dtype(DType::F32)?
            .sum_all()?;
        self.correct = (&self.correct + hits)?;
        Ok(())
    }

    /// Adds only a batch's summed loss (for windows that do not track accuracy).
    pub fn add_loss(&mut self, loss_sum: &Tensor, batch: usize) -> Result<()> {
        self.loss_sum = (&self.loss_sum + loss_sum)?;
        self.samples += batch;
        Ok(())
    }

    /// Reads (mean loss, accuracy) back in one host sync.
    pub fn read(&self) -> Result<(f64, f64)> {
        if self.samples == 0 {
            return Ok((f64::NAN, f64::NAN));
        }
        let both = host::vec::<f32>(&Tensor::stack(&[&self.loss_sum, &self.correct], 0)?)?;
        let n = self.samples as f64;
        Ok((both[0] as f64 / n, both[1] as f64 / n))
    }

    /// Reads only the mean loss (one host sync).
    pub fn read_loss(&self) -> Result<f64> {
        if self.samples == 0 {
            return Ok(f64::NAN);
        }
        Ok(host::scalar::<f32>(&self.loss_sum)? as f64 / self.samples as f64)
    }
}
