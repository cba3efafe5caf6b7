//! Loss functions.

use candle_core::Tensor;

use crate::error::Result;

/// Mean cross-entropy of `logits (B, C)` against class indices `targets (B,)`,
/// as PyTorch's `F.cross_entropy` with the default `reduction="mean"`; fused
/// with its gradient on the CPU (`redline_core::ops::cross_entropy`).
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    Ok(redline_core::ops::cross_entropy(logits, targets)?)
}
