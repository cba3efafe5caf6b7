//! `nn.LayerNorm(C)` over the last dimension as one CPU kernel each way
//! (f32): `y = (x - mean) / sqrt(var + eps) * w + b` per row of `C`.
//!
//! From candle's ops the forward is seven passes (mean, centring, square,
//! mean, add, root, divide) and two more for the affine, each on one
//! thread, and the backward about twice that. Here the forward reads each
//! row twice (two-pass statistics, as PyTorch's CPU kernel: the mean first,
//! then the centred variance) and writes it once; the backward recomputes
//! each row's statistics and gives `dx = rstd (g - mean(g) - xhat
//! mean(g xhat))` with `g = dy w`, and `dw`, `db` summed over the rows of
//! each thread's chunk, then over the chunks in order. Rows are split
//! across the compute threads.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;
use redline_core::trace;

use crate::slices::{f32s, fused_cpu};
use crate::Result;

/// Rows per thread task (at least).
const ROWS: usize = 16;

/// LayerNorm of `x (..., C)` with weight and bias `(C)`: the fused CPU
/// kernel for f32 tensors, candle's ops (the same formula) otherwise.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let c = x.dims().last().copied().unwrap_or(0);
    if [x, w, b].into_iter().all(fused_cpu) && w.dims() == [c] && b.dims() == [c] && c > 0 {
        let op = LayerNormOp {
            eps: eps as f32,
            layer: trace::current_layer(),
        };
        return Ok(x
            .contiguous()?
            .apply_op3(&w.contiguous()?, &b.contiguous()?, op)?);
    }
    let d = candle_core::D::Minus1;
    let mean = x.mean_keepdim(d)?;
    let centred = x.broadcast_sub(&mean)?;
    let var = centred.sqr()?.mean_keepdim(d)?;
    let normed = centred.broadcast_div(&(var + eps)?.sqrt()?)?;
    Ok(normed.broadcast_mul(w)?.broadcast_add(b)?)
}

/// A row's mean and `1 / sqrt(var + eps)` (biased variance, two passes).
#[inline(always)]
fn stats(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = lanes_sum(row, |v| v) / n;
    let var = lanes_sum(row, |v| (v - mean) * (v - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `sum(f(v))` over `row` in eight lanes (vectorises).
#[inline(always)]
fn lanes_sum(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut it = row.chunks_exact(8);
    for c in &mut it {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f(v);
        }
    }
    lanes.iter().sum::<f32>() + it.remainder().iter().map(|&v| f(v)).sum::<f32>()
}

struct LayerNormOp {
    eps: f32,
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
}

impl LayerNormOp {
    fn rows_per_task(rows: usize) -> usize {
        rows.div_ceil(4 * rayon::current_num_threads().max(1))
            .max(ROWS)
    }
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        "redline-layer-norm"
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
        trace::count("layer_norm.forward");
        let name = self.name();
        let (x, w, b) = (
            f32s(s1, l1, name)?,
            f32s(s2, l2, name)?,
            f32s(s3, l3, name)?,
        );
        let c = w.len();
        if c == 0 || x.len() % c != 0 || b.len() != c {
            candle_core::bail!(
                "{name}: input {} values, weight {c}, bias {}",
                x.len(),
                b.len()
            );
        }
        let mut y = vec![0f32; x.len()];
        let per = Self::rows_per_task(x.len() / c) * c;
        let eps = self.eps;
        y.par_chunks_mut(per)
            .zip(x.par_chunks(per))
            .for_each(|(y, x)| {
                for (yr, xr) in y.chunks_mut(c).zip(x.chunks(c)) {
                    let (mean, rstd) = stats(xr, eps);
                    for (((o, &v), &wv), &bv) in yr.iter_mut().zip(xr).zip(w).zip(b) {
                        *o = (v - mean) * rstd * wv + bv;
                    }
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = trace::backward(self.layer.as_ref(), "layer_norm");
        trace::count("layer_norm.backward");
        let c = w.elem_count();
        let flat = x.apply_op3_no_bwd(w, &grad.contiguous()?, &LayerNormGrad { eps: self.eps })?;
        let n = x.elem_count();
        let dx = flat.narrow(0, 0, n)?.reshape(x.shape())?;
        let dw = flat.narrow(0, n, c)?;
        let db = flat.narrow(0, n + c, c)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// `(x, w, dy) -> [dx | dw | db]`.
struct LayerNormGrad {
    eps: f32,
}

impl CustomOp3 for LayerNormGrad {
    fn name(&self) -> &'static str {
        "redline-layer-norm-backward"
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
        let name = self.name();
        let (x, w, dy) = (
            f32s(s1, l1, name)?,
            f32s(s2, l2, name)?,
            f32s(s3, l3, name)?,
        );
        let c = w.len();
        if c == 0 || x.len() % c != 0 || dy.len() != x.len() {
            candle_core::bail!(
                "{name}: input {}, weight {c}, gradient {}",
                x.len(),
                dy.len()
            );
        }
        let n = x.len();
        let mut out = vec![0f32; n + 2 * c];
        let (dx, _) = out.split_at_mut(n);
        let per = LayerNormOp::rows_per_task(n / c) * c;
        let eps = self.eps;
        let partials: Vec<Vec<f32>> = dx
            .par_chunks_mut(per)
            .zip(x.par_chunks(per).zip(dy.par_chunks(per)))
            .map(|(dx, (x, dy))| {
                let mut acc = vec![0f32; 2 * c];
                let (dw, db) = acc.split_at_mut(c);
                let mut g = vec![0f32; c];
                for ((dxr, xr), dyr) in dx.chunks_mut(c).zip(x.chunks(c)).zip(dy.chunks(c)) {
                    let (mean, rstd) = stats(xr, eps);
                    let (mut sg, mut sgx) = (0f32, 0f32);
                    for ((((gv, &d), &wv), &v), (dwv, dbv)) in g
                        .iter_mut()
                        .zip(dyr)
                        .zip(w)
                        .zip(xr)
                        .zip(dw.iter_mut().zip(db.iter_mut()))
                    {
                        let xhat = (v - mean) * rstd;
                        *gv = d * wv;
                        sg += *gv;
                        sgx += *gv * xhat;
                        *dwv += d * xhat;
                        *dbv += d;
                    }
                    let (mg, mgx) = (sg / c as f32, sgx / c as f32);
                    for ((o, &gv), &v) in dxr.iter_mut().zip(&g).zip(xr) {
                        let xhat = (v - mean) * rstd;
                        *o = rstd * (gv - mg - xhat * mgx);
                    }
                }
                acc
            })
            .collect();
        let (_, dwb) = out.split_at_mut(n);
        for p in partials {
            for (d, s) in dwb.iter_mut().zip(p) {
                *d += s;
            }
        }
        Ok((CpuStorage::F32(out), Shape::from(n + 2 * c)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use candle_core::{DType, Device, Var};

    /// Against candle's ops in f64 (the formula): values and all three
    /// gradients, rows across thread tasks and a width past the lanes.
    #[test]
    fn matches_the_formula_both_ways() {
        let (rows, c) = (300, 37);
        let v = |n: usize, a: f32, s: f32| -> Vec<f32> {
            (0..n)
                .map(|i| (i as f32 * a + s).sin() * 2.0 + 0.5)
                .collect()
        };
        let x = Var::from_tensor(
            &Tensor::from_vec(v(rows * c, 0.37, 0.1), (3, rows / 3, c), &Device::Cpu).unwrap(),
        )
        .unwrap();
        let w =
            Var::from_tensor(&Tensor::from_vec(v(c, 0.53, 0.2), c, &Device::Cpu).unwrap()).unwrap();
        let b =
            Var::from_tensor(&Tensor::from_vec(v(c, 0.29, 0.3), c, &Device::Cpu).unwrap()).unwrap();
        let up = Tensor::from_vec(v(rows * c, 0.61, 0.4), (3, rows / 3, c), &Device::Cpu).unwrap();
        let ours = layer_norm(x.as_tensor(), w.as_tensor(), b.as_tensor(), 1e-5).unwrap();
        let go = (&ours * &up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        let (x64, w64, b64) = (
            Var::from_tensor(&f64s(x.as_tensor())).unwrap(),
            Var::from_tensor(&f64s(w.as_tensor())).unwrap(),
            Var::from_tensor(&f64s(b.as_tensor())).unwrap(),
        );
        let theirs = layer_norm(x64.as_tensor(), w64.as_tensor(), b64.as_tensor(), 1e-5).unwrap();
        let gt = (&theirs * f64s(&up))
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let close = |a: &Tensor, e: &Tensor, what: &str| {
            let e = e.to_dtype(DType::F32).unwrap();
            let scale = e
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                .max(1.0);
            let d = (a - &e)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(d <= 2e-5 * scale, "{what}: {d} (scale {scale})");
        };
        close(&ours, &theirs, "y");
        for (name, a, e) in [
            ("dx", x.as_tensor(), x64.as_tensor()),
            ("dw", w.as_tensor(), w64.as_tensor()),
            ("db", b.as_tensor(), b64.as_tensor()),
        ] {
            close(go.get(a).unwrap(), gt.get(e).unwrap(), name);
        }
    }
}
