//! Layers in a 16-bit compute dtype (`--precision bf16-mixed | 16-mixed`),
//! as PyTorch's autocast runs them: the input and the (fp32 master, or bf16)
//! parameters are cast to the compute dtype, the product is taken there and
//! the result stays in it for the next layer. The casts are recorded ops, so
//! the backward hands each parameter its gradient in the parameter's own
//! dtype (fp32 master weights get fp32 gradients, through the `GradStore`
//! that [`Param::absorb`] reads). In fp32 the fused kernels run instead.
//!
//! On the CPU, over fp32 master weights or bf16 weights (`bf16-true`,
//! whose gradients reach their buffers as bf16 tensors): a linear layer is one op
//! ([`crate::linear16`]) that takes the 16-bit activation, rounds the
//! weights in scratch memory, accumulates in fp32 and stores its output in
//! 16 bits, so the step keeps 16-bit activations and no weight copies; a
//! convolution is the fused fp32 kernel on operands rounded by cast ops,
//! its output rounded back, then pooled (ties as autocast's), or, a bf16
//! one on the bf16 pixel-major kernels, those kernels reading and writing
//! the bf16 activations themselves ([`crate::conv_io16`]). Both are a
//! 16-bit product with fp32 accumulation (how oneDNN's, AMX's and tensor
//! cores' bf16 GEMMs accumulate, and so PyTorch's CPU autocast), and both
//! round the weight gradients to the 16-bit type before the fp32 master
//! gradients, as autocast's 16-bit GEMMs do (candle's own bf16 convolution
//! refuses on the CPU: its im2col matmul has no bf16).

use candle_core::{DType, Tensor};

use crate::conv::{conv2d, conv2d_strided_in};
use crate::conv_block::{pool_relu16, pool_relu_with};
use crate::error::Result;
use crate::gemm_bf16::route;
use crate::grad::{half_buffers, layer_buffers, Param, ParamBuffers};
use crate::linear16::linear16;
use crate::pool::max_pool2d;
use crate::{conv2d_param, conv2d_pool_relu_param, linear, linear_param};

/// `t` rounded to `dtype` and widened back to fp32 (a recorded op pair, so
/// gradients flow through it, rounded the same way).
fn rounded(t: &Tensor, dtype: DType) -> Result<Tensor> {
    crate::cast16::round_to(t, dtype)
}

/// The parameters' gradient buffers when a 16-bit product takes the CPU's
/// fused 16-bit path (`None`: candle's ops): fp32 master weights' (written
/// in fp32), or 16-bit weights' (`bf16-true`: handed a 16-bit tensor).
fn cpu16(x: &Tensor, w: &Param, b: &Param) -> Option<ParamBuffers> {
    let (wd, bd) = (w.as_tensor().dtype(), b.as_tensor().dtype());
    if !x.device().is_cpu() || wd != bd {
        return None;
    }
    match wd {
        DType::F32 => layer_buffers(w, b),
        _ => half_buffers(w, b),
    }
}

/// `y = x W^T + b` (ReLU'd when `relu`) in `dtype`: the fused kernel for an
/// fp32 layer, else the cast operands' product (on a GPU with the fused
/// kernels, Redline's cuBLASLt layer in the 16-bit type).
// (B, in) -> (B, out)
pub fn linear_in(x: &Tensor, w: &Param, b: &Param, relu: bool, dtype: DType) -> Result<Tensor> {
    if dtype == DType::F32 && x.dtype() == DType::F32 && w.as_tensor().dtype() == DType::F32 {
        return linear_param(x, w, b, relu);
    }
    if let Some(buffers) = cpu16(x, w, b) {
        let kinds = (dtype, route(dtype));
        return linear16(x, w.as_tensor(), b.as_tensor(), relu, kinds, buffers);
    }
    let (x, wt, bt) = (
        x.to_dtype(dtype)?,
        w.as_tensor().to_dtype(dtype)?,
        b.as_tensor().to_dtype(dtype)?,
    );
    // On a GPU with the fused kernels (`--fused-kernels auto` or `on`): one
    // cuBLASLt call with the bias and ReLU in its epilogue; else candle's
    // matmul, add and ReLU.
    linear(&x, &wt, &bt, relu)
}

/// A stride-1 convolution with bias, then (`pool_relu: Some(k)`) ReLU and a
/// k x k max pool, in `dtype`: the fused kernels for an fp32 layer, else
/// the cast operands' convolution (on a GPU with the fused kernels, the
/// 16-bit tensor-core kernels; else candle's).
// (B, Cin, H, W) -> (B, Cout, H', W')
pub fn conv2d_in(
    x: &Tensor,
    w: &Param,
    b: &Param,
    padding: usize,
    pool_relu: Option<usize>,
    dtype: DType,
) -> Result<Tensor> {
    if dtype == DType::F32 && x.dtype() == DType::F32 && w.as_tensor().dtype() == DType::F32 {
        return match pool_relu {
            Some(k) => conv2d_pool_relu_param(x, w, b, padding, k),
            None => conv2d_param(x, w, b, padding),
        };
    }
    if let Some(buffers) = cpu16(x, w, b) {
        if let Some(k) = pool_relu.filter(|k| (1..16).contains(k)) {
            let (w, b) = (w.as_tensor(), b.as_tensor());
            return pool_relu16(x, w, b, (padding, k), (dtype, route(dtype)), buffers);
        }
        // The casts themselves, not leaves with buffers: the kernel's fp32
        // weight gradients pass back through them and are rounded to the
        // 16-bit type (fp16: inf above 65504, which the loss scaler sees),
        // as autocast's 16-bit weight gradients are.
        let (wr, br) = (
            rounded(w.as_tensor(), dtype)?,
            rounded(b.as_tensor(), dtype)?,
        );
        if pool_relu.is_none() && route(dtype) == DType::BF16 {
            // A bf16 activation in and out of the bf16 kernels, no casts
            // (an f32 one, such as a LayerNorm's output, cast to bf16 once:
            // half the bytes of the rounded f32 copy).
            if let Some(y) = crate::conv_io16::conv2d_bf16(x, &wr, &br, (padding, 1))? {
                return Ok(y);
            }
        }
        let xr = rounded(x, dtype)?;
        // bf16 products on the native bf16 GEMM where the CPU has one.
        let y = conv2d_strided_in(&xr, &wr, &br, (padding, 1), route(dtype))?;
        let y = match pool_relu {
            // Pooled after the rounding, as autocast pools the 16-bit
            // convolution's output: rounding makes ties, and the window's
            // first maximum among them (PyTorch's choice, and the fused
            // pool's) takes the gradient. Pooling the fp32 output would
            // route it to a different element of about one window in ten.
            Some(k) => max_pool2d(&rounded(&y, dtype)?.relu()?, k)?,
            None => y,
        };
        return crate::cast16::to_dtype(&y, dtype);
    }
    let (x, wt, bt) = (
        x.to_dtype(dtype)?,
        w.as_tensor().to_dtype(dtype)?,
        b.as_tensor().to_dtype(dtype)?,
    );
    // On a GPU with the fused kernels (`--fused-kernels auto` or `on`): the
    // tensor-core implicit GEMMs (and one kernel for the bias, pooling and
    // ReLU); else candle's ops.
    match pool_relu {
        Some(k) => Ok(pool_relu_with(&x, &wt, &bt, padding, k, None)?),
        None => conv2d(&x, &wt, &bt, padding),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn param(t: Tensor) -> Result<Param> {
        Ok(Param::new(Var::from_tensor(&t)?))
    }

    /// A bf16 layer over fp32 master weights: bf16 out, fp32 gradients for
    /// the weights, close to the fp32 layer's (bf16 keeps 8 bits).
    #[test]
    fn bf16_products_give_fp32_master_weights_fp32_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (4, 6), &dev)?;
        let w = param(Tensor::randn(0f32, 0.5, (3, 6), &dev)?)?;
        let b = param(Tensor::randn(0f32, 0.5, 3, &dev)?)?;
        let y16 = linear_in(&x, &w, &b, true, DType::BF16)?;
        assert_eq!(y16.dtype(), DType::BF16);
        let y32 = linear_in(&x, &w, &b, true, DType::F32)?;
        let diff = (y16.to_dtype(DType::F32)? - &y32)?.abs()?.max_all()?;
        assert!(diff.to_scalar::<f32>()? < 0.05, "{diff}");
        let mut grads = y16.to_dtype(DType::F32)?.sum_all()?.backward()?;
        w.absorb(&mut grads)?;
        let gw = w.grad().to_tensor(w.as_tensor())?;
        assert_eq!(
            gw.as_ref().map(Tensor::dtype),
            Some(DType::F32),
            "the master weight's gradient is fp32"
        );
        // The gradient of a rounded product: as the fp32 one to bf16's 8 bits.
        let mut grads32 = y32.sum_all()?.backward()?;
        w.grad().clear();
        w.absorb(&mut grads32)?;
        let g32 = w.grad().to_tensor(w.as_tensor())?;
        if let (Some(a), Some(b)) = (gw, g32) {
            let d = (a - &b)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let n = b.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(d <= 0.02 * n && d > 0.0, "bf16 {d} of {n}");
        }

        let img = Tensor::randn(0f32, 1.0, (2, 1, 6, 6), &dev)?;
        let cw = param(Tensor::randn(0f32, 0.3, (2, 1, 3, 3), &dev)?)?;
        let cb = param(Tensor::zeros(2, DType::F32, &dev)?)?;
        let c16 = conv2d_in(&img, &cw, &cb, 1, Some(2), DType::BF16)?;
        let c32 = conv2d_in(&img, &cw, &cb, 1, Some(2), DType::F32)?;
        assert_eq!((c16.dims(), c16.dtype()), (c32.dims(), DType::BF16));
        let diff = (c16.to_dtype(DType::F32)? - &c32)?.abs()?.max_all()?;
        assert!(diff.to_scalar::<f32>()? < 0.05, "{diff}");
        Ok(())
    }
}
