//! Causal multi-head self-attention as nanoGPT's `CausalSelfAttention`
//! writes it: one linear layer makes the queries, keys and values
//! (`c_attn`, C -> 3C), the heads attend causally (the fused kernel of
//! `redline_kernels::attention`), and a linear layer projects them back
//! (`c_proj`, C -> C). On `(B, T, C)`.

use candle_core::Tensor;
use redline_kernels::causal_attention;
use redline_kernels::grad::Param;

use super::basic::linear_rows;

use super::Layer;
use crate::error::Result;

/// The layer: `c_attn` and `c_proj`'s weights and biases, and the heads.
pub(crate) struct Attention {
    pub(crate) c_attn: (Param, Param),
    pub(crate) c_proj: (Param, Param),
    pub(crate) heads: usize,
    /// The products' dtype (fp32, or 16-bit under `--precision`).
    pub(crate) dtype: candle_core::DType,
}

impl Layer for Attention {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let (h, d) = (self.heads, c / self.heads);
        // (B, T, C) -> (B, T, 3C) -> three of (B, H, T, d)
        let qkv = linear_rows(x, (&self.c_attn.0, &self.c_attn.1), false, self.dtype)?;
        let head = |i: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(2, i * c, c)?
                .reshape((b, t, h, d))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let y = causal_attention(&head(0)?, &head(1)?, &head(2)?)?;
        // (B, H, T, d) -> (B, T, C) -> c_proj
        let y = y.transpose(1, 2)?.contiguous()?.reshape((b, t, c))?;
        linear_rows(&y, (&self.c_proj.0, &self.c_proj.1), false, self.dtype)
    }
}
