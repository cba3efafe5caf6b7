//! Fully connected layer `y = x W^T + b`, optionally followed by ReLU, as one
//! fused CPU kernel: the GEMM adds `x W^T` to rows of the bias (and one pass
//! clamps for the ReLU).
//!
//! The backward is one kernel too: it masks the incoming gradient by the ReLU,
//! sums the bias gradient, runs the dW GEMM and, only when the input needs a
//! gradient, the dx GEMM (candle's matmul backward always computes dx, which
//! for the first layer is the data batch: wasted work every step). Through
//! [`linear_param`], dW and db go straight into the parameters' gradient
//! buffers ([`Param::grad`]) and candle sees only dx.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Shape, Storage, Tensor};

use crate::error::Result;
use crate::gemm::{matmul, threads, Mat};
use crate::gemm_bf16::matmul_in;
use crate::grad::{layer_buffers, Param, ParamBuffers};
use crate::slices::{f32s, fused_cpu, unpack_grads};
use redline_core::trace;

/// `x (B, in) -> (B, out)` with `w (out, in)` and `b (out)`; ReLU when `relu`.
/// The weight's and bias's gradients come back in candle's `GradStore`.
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor, relu: bool) -> Result<Tensor> {
    linear_with(x, w, b, relu, None)
}

/// [`linear`] over parameters: where the fused kernel runs, its backward
/// writes dW and db into `w.grad()` and `b.grad()` (PyTorch's `.grad`),
/// otherwise they come in the `GradStore` for [`Param::absorb`].
pub fn linear_param(x: &Tensor, w: &Param, b: &Param, relu: bool) -> Result<Tensor> {
    let buffers = layer_buffers(w, b);
    linear_with(x, w.as_tensor(), b.as_tensor(), relu, buffers)
}

pub(crate) fn linear_with(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    relu: bool,
    buffers: Option<ParamBuffers>,
) -> Result<Tensor> {
    let cpu = fused_cpu(x) && fused_cpu(w) && fused_cpu(b);
    // Redline's cuBLASLt path where `--fused-kernels` turned it on.
    // f32, or one 16-bit type (autocast's cast operands: tensor cores).
    let gpu = cfg!(feature = "cuda")
        && x.device().is_cuda()
        && crate::fused_gpu::takes(x.dtype())
        && [w, b].iter().all(|t| t.dtype() == x.dtype())
        && [w, b].iter().all(|t| t.device().same_device(x.device()));
    if !cpu && !gpu {
        let y = x.matmul(&w.t()?)?.broadcast_add(b)?;
        return Ok(if relu { y.relu()? } else { y });
    }
    let op = LinearOp {
        relu,
        input_grad: x.track_op(),
        layer: trace::current_layer(),
        buffers,
    };
    Ok(x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, op)?)
}

/// `x W^T + b` (ReLU'd when `relu`) of f32 slices: `(B, in) -> (B, out)`,
/// the product in `gemm` ([`crate::gemm_bf16::matmul_in`]).
pub(crate) fn forward_f32(
    gemm: DType,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    (bsz, fan_in, fan_out): (usize, usize, usize),
    relu: bool,
) -> candle_core::Result<Vec<f32>> {
    // `y` starts as the bias rows and the GEMM adds `x W^T` into them
    // (PyTorch's `addmm`): no pass of its own over `y` for the bias.
    let mut y = crate::slices::rows_par(b, bsz);
    // (B, in) x (in, out) -> (B, out)
    if !matmul_in(
        gemm,
        &mut y,
        Mat::new(x, bsz, fan_in),
        Mat::new(w, fan_out, fan_in).t(),
        true,
    ) {
        bail!("linear: gemm shapes do not fit")
    }
    if relu {
        // Not `max(0.0)`, which turns NaN into 0: PyTorch's ReLU keeps it.
        // The ReLU layers are classifier-sized; one thread clamps.
        for v in &mut y {
            if *v < 0.0 {
                *v = 0.0;
            }
        }
    }
    Ok(y)
}

struct LinearOp {
    relu: bool,
    input_grad: bool,
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
    /// Where dW and db go, when the layer's parameters were given.
    buffers: Option<ParamBuffers>,
}

/// `(B, in, out)` of `x (B, in)`, `w (out, in)`, `b (out)`, or an error
/// naming the three shapes.
pub(crate) fn dims(
    l1: &Layout,
    l2: &Layout,
    l3: &Layout,
) -> candle_core::Result<(usize, usize, usize)> {
    let (bsz, fan_in) = l1.shape().dims2()?;
    let (fan_out, fan_in2) = l2.shape().dims2()?;
    let bias = l3.shape().dims1()?;
    if fan_in != fan_in2 || bias != fan_out {
        bail!(
            "linear: input {:?}, weight {:?}, bias {:?} do not fit",
            l1.shape(),
            l2.shape(),
            l3.shape()
        )
    }
    Ok((bsz, fan_in, fan_out))
}

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        "redline-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (bsz, fan_in, fan_out) = dims(l1, l2, l3)?;
        trace::count("linear.forward");
        let (x, w, b) = (
            f32s(s1, l1, "linear")?,
            f32s(s2, l2, "linear")?,
            f32s(s3, l3, "linear")?,
        );
        let y = forward_f32(DType::F32, x, w, b, (bsz, fan_in, fan_out), self.relu)?;
        Ok((CpuStorage::F32(y), Shape::from((bsz, fan_out))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let dims = dims(l1, l2, l3)?;
        let y = crate::cuda::linear::forward((s1, l1), (s2, l2), (s3, l3), dims, self.relu)?;
        Ok((y, Shape::from((dims.0, dims.2))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = trace::backward(self.layer.as_ref(), "linear");
        trace::count("linear.backward");
        let bsz = x.dims2()?.0;
        let grad = grad.flatten_all()?.contiguous()?;
        let buffered = self.buffers.is_some();
        // One buffer holds [dW | db | dx]; the three results are views into it.
        let op = LinearBwd {
            relu: self.relu.then(|| y.clone()),
            input_grad: self.input_grad,
            bsz,
            buffers: self.buffers.clone(),
        };
        let flat = grad.apply_op3_no_bwd(x, w, &op)?;
        unpack_grads(&flat, w.shape(), x.shape(), self.input_grad, buffered)
    }
}

/// Multiply-adds of one of a linear layer's backward GEMMs from which its
/// weight and input gradients are computed on two threads at once
/// (`rayon::join`); below it the fork costs more than it saves (the
/// classifier layers: 64 x 128 x 10).
const CONCURRENT_MIN_FLOPS: usize = 2_000_000;

/// Whether a linear backward whose GEMMs take `flops` multiply-adds each
/// computes dW and dx at once: with two compute threads or more, and
/// [`CONCURRENT_MIN_FLOPS`] or more. Each GEMM below the GEMMs' own split
/// size ran on one thread, so the CNN's fc1 backward (64 x 3136 x 128) ran
/// on one core of two.
pub(crate) fn concurrent(flops: usize) -> bool {
    threads() > 1 && flops >= CONCURRENT_MIN_FLOPS
}

/// Backward kernel: inputs `g (B*out)`, `x`, `w`; output
/// `[dW (out*in) | db (out) | dx (B*in) when input_grad]`, or only dx when dW
/// and db go to the parameters' gradient buffers.
struct LinearBwd {
    /// With ReLU, the forward's output `y`: the gradient passes where `y > 0`
    /// (read from its storage here rather than copied next to `g`).
    relu: Option<Tensor>,
    input_grad: bool,
    bsz: usize,
    /// The weight's and bias's gradient buffers, when attached.
    buffers: Option<ParamBuffers>,
}

impl CustomOp3 for LinearBwd {
    fn name(&self) -> &'static str {
        "redline-linear-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = "linear backward";
        let (g, x, w) = (f32s(s1, l1, op)?, f32s(s2, l2, op)?, f32s(s3, l3, op)?);
        let (fan_out, fan_in) = l3.shape().dims2()?;
        let bsz = self.bsz;
        if g.len() != bsz * fan_out || x.len() != bsz * fan_in {
            bail!("{op}: gradient/input sizes do not fit")
        }
        let masked: Vec<f32>;
        let g: &[f32] = match &self.relu {
            Some(y) => {
                let (storage, layout) = y.storage_and_layout();
                let Storage::Cpu(ys) = &*storage else {
                    bail!("{op}: the layer output is not on the CPU")
                };
                let y = f32s(ys, layout, op)?;
                if y.len() != g.len() {
                    bail!("{op}: output and gradient sizes do not fit")
                }
                masked = g
                    .iter()
                    .zip(y)
                    .map(|(g, y)| if *y > 0.0 { *g } else { 0.0 })
                    .collect();
                &masked
            }
            None => g,
        };
        let nw = fan_out * fan_in;
        let dx_len = if self.input_grad { bsz * fan_in } else { 0 };
        let own = if self.buffers.is_some() {
            0
        } else {
            nw + fan_out
        };
        let mut out = vec![0f32; own + dx_len];
        let (dwb, dx) = out.split_at_mut(own);
        // dW (out, in) = g^T (out, B) x (B, in), written or accumulated
        let dw = |dst: &mut [f32], accumulate: bool| {
            matmul(
                dst,
                Mat::new(g, bsz, fan_out).t(),
                Mat::new(x, bsz, fan_in),
                accumulate,
            )
        };
        let db = |dst: &mut [f32], accumulate: bool| {
            if !accumulate {
                dst.fill(0.0);
            }
            for row in g.chunks_exact(fan_out) {
                dst.iter_mut().zip(row).for_each(|(acc, v)| *acc += v);
            }
        };
        let mut params = move || match &self.buffers {
            Some((wbuf, bbuf)) => {
                bbuf.write(fan_out, db);
                wbuf.write(nw, dw)
            }
            None => {
                let (dwp, dbp) = dwb.split_at_mut(nw);
                db(dbp, false);
                dw(dwp, false)
            }
        };
        // dx (B, in) = g (B, out) x W (out, in)
        let mut input = move || {
            !self.input_grad
                || matmul(
                    dx,
                    Mat::new(g, bsz, fan_out),
                    Mat::new(w, fan_out, fan_in),
                    false,
                )
        };
        // dW and db, and dx, are independent ([`concurrent`]).
        let ok = if self.input_grad && concurrent(bsz * fan_in * fan_out) {
            let (a, b) = rayon::join(params, input);
            a && b
        } else {
            params() && input()
        };
        if !ok {
            bail!("{op}: gemm shapes do not fit")
        }
        let total = out.len();
        Ok((CpuStorage::F32(out), Shape::from(total)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let op = "linear backward";
        let (fan_out, fan_in) = l3.shape().dims2()?;
        if self.buffers.is_some() {
            bail!("{op}: the GPU path has no host gradient buffers")
        }
        let guard = self.relu.as_ref().map(|y| y.storage_and_layout());
        let y = match &guard {
            Some((storage, layout)) => match &**storage {
                Storage::Cuda(ys) => Some((ys, *layout)),
                _ => bail!("{op}: the layer output is not on the GPU"),
            },
            None => None,
        };
        let dims = (self.bsz, fan_in, fan_out);
        let out =
            crate::cuda::linear::backward((s1, l1), (s2, l2), (s3, l3), y, dims, self.input_grad)?;
        let total = fan_out * fan_in
            + fan_out
            + if self.input_grad {
                self.bsz * fan_in
            } else {
                0
            };
        Ok((out, Shape::from(total)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn data(n: usize, f: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + 1.0) * f).sin()).collect()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .and_then(|d| d.abs()?.max_all()?.to_scalar::<f32>())
            .unwrap_or(f32::INFINITY)
    }

    /// Fused forward and gradients equal candle's unfused ops.
    fn check(relu: bool, x_is_var: bool) -> Result<()> {
        let dev = Device::Cpu;
        let (bsz, fi, fo) = (5, 7, 3);
        let xv = Var::from_vec(data(bsz * fi, 0.3), (bsz, fi), &dev)?;
        let x = if x_is_var {
            xv.as_tensor().clone()
        } else {
            xv.as_tensor().detach()
        };
        let w = Var::from_vec(data(fo * fi, 0.7), (fo, fi), &dev)?;
        let b = Var::from_vec(data(fo, 1.1), fo, &dev)?;
        let up = Tensor::new(data(bsz * fo, 0.9), &dev)?.reshape((bsz, fo))?;

        let fused = linear(&x, w.as_tensor(), b.as_tensor(), relu)?;
        let plain = {
            let y = x
                .matmul(&w.as_tensor().t()?)?
                .broadcast_add(b.as_tensor())?;
            if relu {
                y.relu()?
            } else {
                y
            }
        };
        assert!(max_diff(&fused, &plain) < 1e-6);
        let gf = (fused * &up)?.sum_all()?.backward()?;
        let gp = (plain * &up)?.sum_all()?.backward()?;
        for t in [w.as_tensor(), b.as_tensor()] {
            let (a, e) = (gf.get(t), gp.get(t));
            assert!(a.zip(e).is_some_and(|(a, e)| max_diff(a, e) < 1e-5));
        }
        match (gf.get(&x), gp.get(&x)) {
            (Some(a), Some(e)) => assert!(x_is_var && max_diff(a, e) < 1e-5),
            (None, _) => assert!(!x_is_var, "input gradient missing"),
            _ => unreachable!(),
        }
        Ok(())
    }

    #[test]
    fn matches_unfused_ops() -> Result<()> {
        for relu in [false, true] {
            for x_is_var in [false, true] {
                check(relu, x_is_var)?;
            }
        }
        Ok(())
    }

    /// A NaN input stays NaN through the bias and the ReLU, as PyTorch's
    /// `relu(linear(x))` keeps it (a diverged run must show as NaN, not 0).
    #[test]
    fn nan_survives_the_bias_and_the_relu() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::new(&[[f32::NAN, 1.0], [1.0, 1.0]], &dev)?;
        let w = Tensor::new(&[[1f32, 0.0], [0.0, -1.0]], &dev)?;
        let b = Tensor::new(&[-5f32, 0.5], &dev)?;
        let y = linear(&x, &w, &b, true)?.to_vec2::<f32>()?;
        // Row 0 holds the NaN (0 x NaN is NaN too); row 1 is negative.
        assert!(y[0].iter().all(|v| v.is_nan()), "{y:?}");
        assert_eq!(y[1], vec![0.0, 0.0]);
        Ok(())
    }

    #[test]
    fn shape_mismatch_is_an_error() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 4), candle_core::DType::F32, &dev)?;
        let w = Tensor::zeros((3, 5), candle_core::DType::F32, &dev)?;
        let b = Tensor::zeros(3, candle_core::DType::F32, &dev)?;
        assert!(linear(&x, &w, &b, false).is_err());
        Ok(())
    }
}

#[cfg(test)]
mod concurrent_tests {
    use super::*;
    use crate::autocast::linear_in;
    use candle_core::{Device, Var};

    /// `(dx, dW, db)` bits of one backward through a layer large enough to
    /// compute dW and dx at once, on `threads` compute threads.
    fn grads(dtype: DType, threads: usize) -> Result<Vec<Vec<u32>>> {
        let _scope = redline_core::threads::scoped(threads);
        let dev = Device::Cpu;
        let vals = |n: usize, f: f32| -> Vec<f32> {
            (0..n).map(|i| ((i as f32 + 1.0) * f).sin()).collect()
        };
        let (b, i, o) = (64, 256, 128);
        assert!(concurrent(b * i * o) == (threads > 1), "the layer's size");
        let x = Var::from_tensor(&Tensor::from_vec(vals(b * i, 0.37), (b, i), &dev)?)?;
        let w = Param::new(Var::from_tensor(&Tensor::from_vec(
            vals(o * i, 0.11),
            (o, i),
            &dev,
        )?)?);
        let bias = Param::new(Var::from_tensor(&Tensor::from_vec(vals(o, 0.7), o, &dev)?)?);
        let up = Tensor::from_vec(vals(b * o, 0.53), (b, o), &dev)?;
        let y = linear_in(x.as_tensor(), &w, &bias, true, dtype)?.to_dtype(DType::F32)?;
        let mut store = (y * up)?.sum_all()?.backward()?;
        let dx = store.remove(x.as_tensor()).map(|t| t.to_dtype(DType::F32));
        w.absorb(&mut store)?;
        bias.absorb(&mut store)?;
        let bits = |t: Option<Tensor>| -> Result<Vec<u32>> {
            let t = t.ok_or_else(|| candle_core::Error::Msg("no gradient".into()))?;
            let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            Ok(v.iter().map(|v| v.to_bits()).collect())
        };
        Ok(vec![
            bits(dx.transpose()?)?,
            bits(w.grad().to_tensor(w.as_tensor())?)?,
            bits(bias.grad().to_tensor(bias.as_tensor())?)?,
        ])
    }

    /// The fp32 and the bf16 layer's backward give the same bits with dW
    /// and dx computed at once (two compute threads) as one after the
    /// other (one).
    #[test]
    fn weight_and_input_gradients_at_once_change_no_bits() -> Result<()> {
        for dtype in [DType::F32, DType::BF16] {
            let (one, two) = (grads(dtype, 1)?, grads(dtype, 2)?);
            assert!(one
                .iter()
                .all(|g| !g.is_empty() && g.iter().any(|b| *b != 0)));
            assert_eq!(one, two, "{dtype:?}");
        }
        Ok(())
    }
}
