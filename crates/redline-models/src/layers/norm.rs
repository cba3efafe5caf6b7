//! LayerNorm, BatchNorm2d, Embedding and residual blocks.

use candle_core::{DType, Tensor, Var};
use redline_core::trace;
use redline_kernels::batch_norm::batch_norm2d_train;
use redline_kernels::grad::Param;

use super::basic::as_ids;
use super::Layer;
use crate::error::Result;

/// `nn.LayerNorm(last_dim)`: normalises over the last dimension with the
/// biased variance, then scales and shifts.
pub(crate) struct LayerNorm {
    pub(crate) w: Param,
    pub(crate) b: Param,
    pub(crate) eps: f64,
}

impl Layer for LayerNorm {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        // Norms run in their parameters' dtype: fp32 under autocast.
        let x = &redline_kernels::cast16::to_dtype(x, self.w.as_tensor().dtype())?;
        // One fused kernel each way on the CPU (f32), candle's ops elsewhere.
        Ok(redline_kernels::layer_norm(
            x,
            self.w.as_tensor(),
            self.b.as_tensor(),
            self.eps,
        )?)
    }
}

/// `nn.BatchNorm2d(C, eps, momentum)` on `(B, C, H, W)`: in training,
/// normalises by the batch's statistics per channel (biased variance) and
/// updates the running ones (unbiased variance), on the device; in eval mode,
/// normalises by the running statistics.
pub(super) struct BatchNorm2d {
    pub(super) w: Param,
    pub(super) b: Param,
    pub(super) running_mean: Var,
    pub(super) running_var: Var,
    pub(super) tracked: Var,
    pub(super) eps: f64,
    pub(super) momentum: f64,
    /// A ReLU follows, fused into the kernel.
    pub(super) relu: bool,
}

impl BatchNorm2d {
    /// The training forward, with a ReLU after it when `relu`: the fused
    /// CPU kernel (or candle's ops elsewhere), then the running statistics
    /// from the batch's, detached.
    fn train_forward(&self, x: &Tensor, relu: bool) -> Result<Tensor> {
        // Norms run in their parameters' dtype (fp32 under autocast): the
        // kernel casts, or reads a bf16 input itself on the CPU (and writes
        // a bf16 output).
        let (b, _, h, w) = x.dims4()?;
        let out = batch_norm2d_train(x, &self.w, &self.b, self.eps, relu)?;
        let n = (b * h * w) as f64;
        let m = self.momentum;
        let unbiased = out.var.affine(n / (n - 1.0).max(1.0), 0.0)?;
        let rm = self.running_mean.as_tensor();
        let rv = self.running_var.as_tensor();
        let dtype = rm.dtype();
        let new_rm = (rm.affine(1.0 - m, 0.0)? + out.mean.to_dtype(dtype)?.affine(m, 0.0)?)?;
        let new_rv = (rv.affine(1.0 - m, 0.0)? + unbiased.to_dtype(dtype)?.affine(m, 0.0)?)?;
        self.running_mean.set(&new_rm)?;
        self.running_var.set(&new_rv)?;
        let one = Tensor::new(1i64, x.device())?;
        self.tracked
            .set(&self.tracked.as_tensor().broadcast_add(&one)?)?;
        Ok(out.y)
    }
}

impl Layer for BatchNorm2d {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if train {
            return self.train_forward(x, self.relu);
        }
        // Norms run in their parameters' dtype: fp32 under autocast. On the
        // CPU a bf16 input's output is bf16, as in training (PyTorch's CPU
        // autocast's batch norm).
        let stored = if x.device().is_cpu() && x.dtype() == DType::BF16 {
            DType::BF16
        } else {
            self.w.as_tensor().dtype()
        };
        let x = &redline_kernels::cast16::to_dtype(x, self.w.as_tensor().dtype())?;
        let c = x.dim(1)?;
        let shape = (1, c, 1, 1);
        let mean = self.running_mean.as_tensor().reshape(shape)?;
        let var = self.running_var.as_tensor().reshape(shape)?;
        let normed = x
            .broadcast_sub(&mean)?
            .broadcast_div(&(var + self.eps)?.sqrt()?)?;
        let y = normed
            .broadcast_mul(&self.w.as_tensor().reshape(shape)?)?
            .broadcast_add(&self.b.as_tensor().reshape(shape)?)?;
        let y = if self.relu { y.relu()? } else { y };
        Ok(redline_kernels::cast16::to_dtype(&y, stored)?)
    }
}

/// A buffer of `len` values `v` in `dtype` (or a 0-d i64 counter when `len`
/// is `None`).
pub(super) fn buffer(
    device: &candle_core::Device,
    len: Option<usize>,
    v: f32,
    dtype: DType,
) -> Result<Var> {
    Ok(match len {
        Some(n) => Var::from_tensor(&Tensor::full(v, n, device)?.to_dtype(dtype)?)?,
        None => Var::from_tensor(&Tensor::zeros((), DType::I64, device)?)?,
    })
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

/// A learned position table added to `(B, T, C)`: its first T rows.
pub(super) struct Positions {
    pub(super) w: Param,
}

impl Layer for Positions {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let t = x.dim(x.rank().saturating_sub(2))?;
        let rows = self.w.as_tensor().narrow(0, 0, t)?;
        Ok(x.broadcast_add(&rows.to_dtype(x.dtype())?)?)
    }
}

/// Named layers applied in order.
pub(super) type Chain = Vec<(String, Box<dyn Layer>)>;

/// The random stream positions of `chain`'s layers, in order.
pub(super) fn chain_rng_state(chain: &Chain, out: &mut Vec<u128>) {
    for (_, layer) in chain {
        layer.rng_state(out);
    }
}

/// Puts back positions [`chain_rng_state`] gave.
pub(super) fn chain_load_rng_state(
    chain: &Chain,
    from: &mut dyn Iterator<Item = u128>,
) -> Result<()> {
    for (_, layer) in chain {
        layer.load_rng_state(from)?;
    }
    Ok(())
}

/// The first layer of `chain` that cannot be captured, named.
pub(super) fn chain_capture_safe(chain: &Chain) -> std::result::Result<(), String> {
    for (name, layer) in chain {
        layer
            .capture_safe()
            .map_err(|why| format!("layer {name}: {why}"))?;
    }
    Ok(())
}

/// The chain's output for `x`.
pub(super) fn run_chain(chain: &Chain, x: &Tensor, train: bool) -> Result<Tensor> {
    let mut h = x.clone();
    for (name, layer) in chain {
        let _span = trace::layer(name);
        h = layer.forward_t(&h, train)?;
    }
    Ok(h)
}

/// `shortcut(x) + body(x)`, the shortcut being the identity when empty (a
/// projection, e.g. a strided 1x1 conv and batch norm, when the body changes
/// the shape).
pub(super) struct Residual {
    pub(super) body: Chain,
    pub(super) shortcut: Chain,
    /// A ReLU follows, fused with the sum.
    pub(super) relu: bool,
}

impl Residual {
    /// The shortcut's and the body's outputs for `x`, in one dtype: a
    /// 16-bit body over an fp32 shortcut is added in fp32 (as autocast
    /// promotes).
    fn branches(&self, x: &Tensor, train: bool) -> Result<(Tensor, Tensor)> {
        let h = run_chain(&self.body, x, train)?;
        let s = run_chain(&self.shortcut, x, train)?;
        if h.dtype() != s.dtype() {
            return Ok((s.to_dtype(DType::F32)?, h.to_dtype(DType::F32)?));
        }
        Ok((s, h))
    }
}

impl Layer for Residual {
    fn capture_safe(&self) -> std::result::Result<(), String> {
        chain_capture_safe(&self.body)?;
        chain_capture_safe(&self.shortcut)
    }

    fn rng_state(&self, out: &mut Vec<u128>) {
        chain_rng_state(&self.body, out);
        chain_rng_state(&self.shortcut, out);
    }

    fn load_rng_state(&self, from: &mut dyn Iterator<Item = u128>) -> Result<()> {
        chain_load_rng_state(&self.body, from)?;
        chain_load_rng_state(&self.shortcut, from)
    }

    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let (s, h) = self.branches(x, train)?;
        if self.relu {
            return Ok(redline_kernels::add_relu::add_relu(&s, &h)?);
        }
        Ok((s + h)?)
    }
}
