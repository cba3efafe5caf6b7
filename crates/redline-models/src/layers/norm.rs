//! LayerNorm, Embedding and residual blocks.

use candle_core::{Tensor, D};
use redline_core::grad::Param;
use redline_core::trace;

use super::basic::as_ids;
use super::Layer;
use crate::error::Result;

/// `nn.LayerNorm(last_dim)`: normalises over the last dimension with the
/// biased variance, then scales and shifts.
pub(super) struct LayerNorm {
    pub(super) w: Param,
    pub(super) b: Param,
    pub(super) eps: f64,
}

impl Layer for LayerNorm {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centred.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        Ok(normed
            .broadcast_mul(self.w.as_tensor())?
            .broadcast_add(self.b.as_tensor())?)
    }
}

/// `nn.Embedding(num, dim)`: ids `(B, L)` (floats holding whole numbers, as
/// the loader gives them) -> `(B, L, dim)`.
pub(super) struct Embedding {
    pub(super) w: Param,
}

impl Layer for Embedding {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let ids = as_ids(x)?;
        let dim = self.w.as_tensor().dim(1)?;
        let mut shape = ids.dims().to_vec();
        let rows = self.w.as_tensor().index_select(&ids.flatten_all()?, 0)?;
        shape.push(dim);
        Ok(rows.reshape(shape)?)
    }
}

/// `x + body(x)`: the body's output has the input's shape.
pub(super) struct Residual {
    pub(super) body: Vec<(String, Box<dyn Layer>)>,
}

impl Layer for Residual {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let mut h = x.clone();
        for (name, layer) in &self.body {
            let _span = trace::layer(name);
            h = layer.forward_t(&h, train)?;
        }
        Ok((x + h)?)
    }
}
