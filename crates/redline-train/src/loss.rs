//! Loss functions.

use candle_core::Tensor;

use crate::error::Result;

/// Mean cross-entropy of `logits (B, C)` against class indices `targets (B,)`,
/// as PyTorch's `F.cross_entropy` with the default `reduction="mean"`.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::loss::cross_entropy(logits, targets)?)
}
