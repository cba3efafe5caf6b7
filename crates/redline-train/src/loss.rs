//! Loss functions.

use candle_core::Tensor;

use crate::error::Result;

/// Mean cross-entropy of `logits (B, C)` against class indices `targets (B,)`,
/// as PyTorch's `F.cross_entropy` with the default `reduction="mean"`; fused
/// with its gradient on the CPU (`redline_kernels::cross_entropy`).
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    Ok(redline_kernels::cross_entropy(logits, targets)?)
}

/// Mean squared error over every element, as PyTorch's `F.mse_loss`
/// (`reduction="mean"`); `pred` and `target` have the same shape.
pub fn mse(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    Ok((pred - target)?.sqr()?.mean_all()?)
}

/// Mean absolute error over every element, as PyTorch's `F.l1_loss`.
pub fn l1(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    Ok((pred - target)?.abs()?.mean_all()?)
}
