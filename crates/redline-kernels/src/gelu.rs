//! GPT-2's GELU, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`
//! (PyTorch's `F.gelu(x, approximate="tanh")`, Hugging Face's `gelu_new`),
//! as one CPU kernel each way (f32; 16-bit inputs widened to it).
//!
//! candle's CPU GELU calls libm's `powf` and `tanhf` element by element on
//! one thread, forward and again backward: on a small GPT it was 40% of a
//! training step. Here the tanh comes from an exponential evaluated in
//! plain arithmetic the compiler vectorises (range reduction by ln 2 and a
//! degree-7 polynomial, within 2 ulp of `expf`), as
//! `tanh(u) = 1 - 2 / (exp(2u) + 1)`: exact to about 1e-7 absolute, which
//! is what `1 + tanh` and `1 - tanh^2` need. Elements are split across the
//! compute threads. The backward recomputes the tanh from the input.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor};
use rayon::prelude::*;
use redline_core::trace;

use crate::fast_exp::exp;
use crate::slices::{f32s, fused_cpu};
use crate::Result;

/// Elements per thread task.
const CHUNK: usize = 1 << 15;
/// `sqrt(2 / pi)`.
const K: f32 = 0.797_884_6;
/// The cubic term's weight.
const C: f32 = 0.044_715;

/// GPT-2's tanh GELU: the fused CPU kernel for f32 tensors, and for 16-bit
/// ones on the CPU (widened, computed in f32 and rounded back, as PyTorch's
/// CPU kernels compute 16-bit GELU); candle's `gelu` (the same formula)
/// elsewhere.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    if x.device().is_cpu() && matches!(dtype, DType::BF16 | DType::F16) {
        return Ok(gelu_tanh(&x.to_dtype(DType::F32)?)?.to_dtype(dtype)?);
    }
    if fused_cpu(x) {
        let op = GeluTanh {
            layer: trace::current_layer(),
        };
        return Ok(x.contiguous()?.apply_op1(op)?);
    }
    Ok(x.gelu()?)
}

/// `tanh(u)` to about 1e-7 absolute.
#[inline(always)]
fn tanh(u: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * u) + 1.0)
}

/// The GELU of `x` and the tanh it used.
#[inline(always)]
fn forward(x: f32) -> (f32, f32) {
    let t = tanh(K * (x + C * x * x * x));
    (0.5 * x * (1.0 + t), t)
}

/// `d gelu / dx` at `x`.
#[inline(always)]
fn slope(x: f32) -> f32 {
    let (_, t) = forward(x);
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * K * (1.0 + 3.0 * C * x * x)
}

struct GeluTanh {
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
}

impl CustomOp1 for GeluTanh {
    fn name(&self) -> &'static str {
        "redline-gelu-tanh"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        trace::count("gelu.forward");
        let x = f32s(s, l, self.name())?;
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(y, x)| pulp::Arch::new().dispatch(Map { x, y, grad: None }));
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let _span = trace::backward(self.layer.as_ref(), "gelu");
        trace::count("gelu.backward");
        Ok(Some(
            arg.apply_op2_no_bwd(&grad.contiguous()?, &GeluTanhGrad)?,
        ))
    }
}

/// `(x, dy) -> dy * gelu'(x)`.
struct GeluTanhGrad;

impl CustomOp2 for GeluTanhGrad {
    fn name(&self) -> &'static str {
        "redline-gelu-tanh-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, dy) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        if x.len() != dy.len() {
            candle_core::bail!(
                "{}: {} inputs, {} gradients",
                self.name(),
                x.len(),
                dy.len()
            );
        }
        let mut dx = vec![0f32; x.len()];
        dx.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
            .for_each(|(y, (x, g))| {
                pulp::Arch::new().dispatch(Map {
                    x,
                    y,
                    grad: Some(g),
                })
            });
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

/// The forward (`grad` `None`: `y = gelu(x)`) or backward (`y = grad *
/// gelu'(x)`) over a chunk, compiled for the best instruction set present.
struct Map<'a> {
    x: &'a [f32],
    y: &'a mut [f32],
    grad: Option<&'a [f32]>,
}

impl pulp::WithSimd for Map<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        match self.grad {
            None => {
                for (y, &x) in self.y.iter_mut().zip(self.x) {
                    *y = forward(x).0;
                }
            }
            Some(g) => {
                for ((y, &x), &g) in self.y.iter_mut().zip(self.x).zip(g) {
                    *y = g * slope(x);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use candle_core::{Device, Var};

    /// The exponential within 2 ulp of libm's over the range that matters.
    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        let mut worst = 0f32;
        for i in -8000..=8000 {
            let x = i as f32 * 0.01;
            let (a, e) = (exp(x), x.exp());
            worst = worst.max((a - e).abs() / (e * f32::EPSILON));
        }
        assert!(worst <= 2.0, "{worst} ulp");
    }

    /// Values and input gradients against the formula in f64 (what
    /// PyTorch's `approximate="tanh"` computes), across thread chunks,
    /// large magnitudes (saturated tanh) and small ones.
    #[test]
    fn matches_the_tanh_formula_in_f64_both_ways() {
        let n = CHUNK + 77;
        let xs: Vec<f32> = (0..n)
            .map(|i| (i as f32 * 0.37).sin() * 6.0 + if i % 97 == 0 { 40.0 } else { 0.0 })
            .collect();
        let x = Var::from_tensor(&Tensor::from_vec(xs.clone(), n, &Device::Cpu).unwrap()).unwrap();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let y = gelu_tanh(x.as_tensor()).unwrap();
        let g = (&y * Tensor::from_vec(up.clone(), n, &Device::Cpu).unwrap())
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let ys: Vec<f32> = y.to_vec1().unwrap();
        let gs: Vec<f32> = g.get(x.as_tensor()).unwrap().to_vec1().unwrap();
        let (k, c) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715f64);
        for i in 0..n {
            let v = f64::from(xs[i]);
            let t = (k * (v + c * v * v * v)).tanh();
            let want = 0.5 * v * (1.0 + t);
            let dwant = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * c * v * v);
            let dwant = dwant * f64::from(up[i]);
            assert!(
                (f64::from(ys[i]) - want).abs() <= 2e-6 * want.abs().max(1.0),
                "y[{i}] at {v}: {} vs {want}",
                ys[i]
            );
            assert!(
                (f64::from(gs[i]) - dwant).abs() <= 2e-6 * dwant.abs().max(1.0),
                "dx[{i}] at {v}: {} vs {dwant}",
                gs[i]
            );
        }
    }
}
