//! Causal multi-head self-attention as nanoGPT's `CausalSelfAttention`
//! writes it: one linear layer makes the queries, keys and values
//! (`c_attn`, C -> 3C), the heads attend causally (the fused kernel of
//! `redline_kernels::attention`, which takes the queries, keys and values
//! side by side as `c_attn` makes them), and a linear layer projects them back
//! (`c_proj`, C -> C). On `(B, T, C)`.

use candle_core::Tensor;
use redline_kernels::attention::{causal_self_attention, split_heads};
use redline_kernels::causal_attention;
use redline_kernels::grad::Param;

use super::basic::{linear_rows, Dropout};

use super::Layer;
use crate::error::Result;

/// The layer: `c_attn` and `c_proj`'s weights and biases, and the heads.
pub(crate) struct Attention {
    pub(crate) c_attn: (Param, Param),
    pub(crate) c_proj: (Param, Param),
    pub(crate) heads: usize,
    /// The products' dtype (fp32, or 16-bit under `--precision`).
    pub(crate) dtype: candle_core::DType,
    /// Dropout of the attention probabilities in training (nanoGPT's
    /// `attn_dropout`); `None` at p = 0.
    pub(crate) dropout: Option<Dropout>,
}

impl Attention {
    /// `c_attn` on `x (B, T, C)`: the queries, keys and values, each
    /// `(B, H, T, C / H)`.
    fn heads(&self, x: &Tensor) -> Result<[Tensor; 3]> {
        let qkv = linear_rows(x, (&self.c_attn.0, &self.c_attn.1), false, self.dtype)?;
        Ok(split_heads(&qkv, self.heads)?)
    }

    /// The heads' outputs `y (B, H, T, d)` joined and projected by `c_proj`.
    fn project(&self, y: &Tensor) -> Result<Tensor> {
        let (b, _, t, _) = y.dims4()?;
        let c = self.c_proj.0.as_tensor().dim(0)?;
        let y = y.transpose(1, 2)?.contiguous()?.reshape((b, t, c))?;
        linear_rows(&y, (&self.c_proj.0, &self.c_proj.1), false, self.dtype)
    }

    /// The forward for generation: `x (B, T, C)` holds the tokens after the
    /// `kv` cache's (their keys and values `(B, H, T0, d)`, `None` at the
    /// start), which gains theirs. Token `i` of `x` attends to the cached
    /// keys and to `x`'s keys `0..=i`.
    pub(crate) fn forward_cached(
        &self,
        x: &Tensor,
        kv: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let [q, k, v] = self.heads(x)?;
        let y = match kv.take() {
            None => {
                let y = causal_attention(&q, &k, &v)?;
                *kv = Some((k, v));
                y
            }
            Some((k0, v0)) => {
                let k = Tensor::cat(&[&k0, &k], 2)?;
                let v = Tensor::cat(&[&v0, &v], 2)?;
                let y = attend_after(&q, &k, &v)?;
                *kv = Some((k, v));
                y
            }
        };
        self.project(&y)
    }
}

/// Attention of the last `Tq` positions (`q (B, H, Tq, d)`) over all `Tk`
/// keys `k, v (B, H, Tk, d)`: query `i` sees keys `0..=Tk - Tq + i`. The
/// scores and softmax are fp32.
fn attend_after(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    use candle_core::DType;
    let (tq, d) = (q.dim(2)?, q.dim(3)?);
    let tk = k.dim(2)?;
    let f = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(DType::F32)?.contiguous()?) };
    let scores = (f(q)?.matmul(&f(k)?.t()?.contiguous()?)? * (1.0 / (d as f64).sqrt()))?;
    let scores = match tq {
        1 => scores,
        _ => {
            let seen = tk - tq;
            let mask: Vec<f32> = (0..tq * tk)
                .map(|n| match n % tk > seen + n / tk {
                    true => f32::NEG_INFINITY,
                    false => 0.0,
                })
                .collect();
            let mask = Tensor::from_vec(mask, (tq, tk), q.device())?;
            scores.broadcast_add(&mask)?
        }
    };
    let max = scores.max_keepdim(3)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(3)?)?;
    Ok(p.matmul(&f(v)?)?.to_dtype(q.dtype())?)
}

impl Layer for Attention {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let qkv = linear_rows(x, (&self.c_attn.0, &self.c_attn.1), false, self.dtype)?;
        // In training the fused kernel drops probabilities by a mask of a
        // seed drawn from the layer's stream.
        let drop = self.dropout.as_ref().and_then(|d| d.draw(train));
        let y = causal_self_attention(&qkv, self.heads, drop)?;
        linear_rows(&y, (&self.c_proj.0, &self.c_proj.1), false, self.dtype)
    }

    fn capture_safe(&self) -> std::result::Result<(), String> {
        Err(crate::gpt::ATTENTION_ON_GPU.into())
    }

    fn rng_state(&self, out: &mut Vec<u128>) {
        if let Some(d) = &self.dropout {
            d.rng_state(out);
        }
    }

    fn load_rng_state(&self, from: &mut dyn Iterator<Item = u128>) -> Result<()> {
        match &self.dropout {
            Some(d) => d.load_rng_state(from),
            None => Ok(()),
        }
    }
}
