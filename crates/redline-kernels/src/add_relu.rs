//! `relu(a + b)`, a residual block's end, as one CPU kernel each way (f32,
//! and bf16 for `bf16-true`: the sum in f32 of the widened values, rounded
//! once, as candle's bf16 add rounds it).
//!
//! From candle's ops the sum and the ReLU are two passes forward, and the
//! ReLU's backward four more (a zeros tensor, a comparison, a cast and a
//! product) before the sum's passes the gradient on. Fused: one pass
//! forward, and one backward that masks the gradient by the output and
//! hands the same tensor to both inputs. PyTorch's rules: NaN passes the
//! ReLU, and its gradient passes where the output is not `<= 0`.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Shape, Tensor};
use half::bf16;
use rayon::prelude::*;
use redline_core::trace;

use crate::half16::{bf16_store, bf16_widen};
use crate::slices::{f32s, fused_cpu, vectorised};
use crate::Result;

/// Elements per thread task.
const CHUNK: usize = 1 << 16;

/// `relu(a + b)` for tensors of one shape: the fused CPU kernel for f32
/// and bf16, candle's ops otherwise.
pub fn add_relu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let bf16_cpu = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::BF16;
    let fused = (fused_cpu(a) && fused_cpu(b)) || (bf16_cpu(a) && bf16_cpu(b));
    if fused && a.shape() == b.shape() {
        let op = AddRelu {
            layer: trace::current_layer(),
        };
        return Ok(a.contiguous()?.apply_op2(&b.contiguous()?, op)?);
    }
    Ok((a + b)?.relu()?)
}

/// Whether a ReLU passes its input `v` (and its gradient at output `v`):
/// PyTorch's rules, where NaN passes and a gradient is stopped where the
/// output is `<= 0`.
#[inline(always)]
pub(crate) fn passes(v: f32) -> bool {
    v > 0.0 || v.is_nan()
}

struct AddRelu {
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
}

impl CustomOp2 for AddRelu {
    fn name(&self) -> &'static str {
        "redline-add-relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        trace::count("add_relu.forward");
        if let (CpuStorage::BF16(a), CpuStorage::BF16(b)) = (s1, s2) {
            let (a, b) = (bf16s(a, l1, self.name())?, bf16s(b, l2, self.name())?);
            let y = each_pair(a, b, |a, b| {
                let s = bf16_widen(a) + bf16_widen(b);
                bf16_store(if passes(s) { s } else { 0.0 })
            })?;
            return Ok((CpuStorage::BF16(y), l1.shape().clone()));
        }
        let (a, b) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        if a.len() != b.len() {
            candle_core::bail!("{}: {} and {} elements", self.name(), a.len(), b.len());
        }
        let mut y = vec![0f32; a.len()];
        y.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
            .for_each(|(y, (a, b))| {
                for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                    let s = a + b;
                    *y = if passes(s) { s } else { 0.0 };
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        _a: &Tensor,
        _b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let _span = trace::backward(self.layer.as_ref(), "add_relu");
        trace::count("add_relu.backward");
        let grad = grad.to_dtype(res.dtype())?.contiguous()?;
        let g = res.apply_op2_no_bwd(&grad, &ReluMask)?;
        Ok((Some(g.clone()), Some(g)))
    }
}

/// `(y, dy) -> dy` where the ReLU passed, 0 elsewhere.
struct ReluMask;

impl CustomOp2 for ReluMask {
    fn name(&self) -> &'static str {
        "redline-relu-mask"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if let (CpuStorage::BF16(y), CpuStorage::BF16(dy)) = (s1, s2) {
            let (y, dy) = (bf16s(y, l1, self.name())?, bf16s(dy, l2, self.name())?);
            let g = each_pair(y, dy, |y, dy| {
                if passes(bf16_widen(y)) {
                    dy
                } else {
                    bf16::ZERO
                }
            })?;
            return Ok((CpuStorage::BF16(g), l1.shape().clone()));
        }
        let (y, dy) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        if y.len() != dy.len() {
            candle_core::bail!(
                "{}: output {} and gradient {} elements",
                self.name(),
                y.len(),
                dy.len()
            );
        }
        let mut g = vec![0f32; y.len()];
        g.par_chunks_mut(CHUNK)
            .zip(y.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
            .for_each(|(g, (y, dy))| {
                for ((g, &y), &dy) in g.iter_mut().zip(y).zip(dy) {
                    *g = if passes(y) { dy } else { 0.0 };
                }
            });
        Ok((CpuStorage::F32(g), l1.shape().clone()))
    }
}

/// The contiguous bf16 elements `v` holds under `l`, or an error naming `op`.
fn bf16s<'a>(v: &'a [bf16], l: &Layout, op: &str) -> candle_core::Result<&'a [bf16]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("{op}: operand is not contiguous ({:?})", l.shape()),
    }
}

/// `f(a[i], b[i])` for each `i` of two bf16 slices of one length, split
/// across the compute threads and vectorised.
fn each_pair(
    a: &[bf16],
    b: &[bf16],
    f: impl Fn(bf16, bf16) -> bf16 + Sync,
) -> candle_core::Result<Vec<bf16>> {
    if a.len() != b.len() {
        candle_core::bail!(
            "redline-add-relu (bf16): {} and {} elements",
            a.len(),
            b.len()
        );
    }
    let mut y = vec![bf16::ZERO; a.len()];
    y.par_chunks_mut(CHUNK)
        .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
        .for_each(|(y, (a, b))| {
            vectorised(
                #[inline(always)]
                || {
                    for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                        *y = f(a, b);
                    }
                },
            );
        });
    Ok(y)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use candle_core::{Device, Var};

    fn vals(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.61 + seed).sin()).collect()
    }

    /// Against candle's `(a + b).relu()` with PyTorch's gradient rule
    /// written out: values, both gradients (the same masked tensor), a NaN
    /// kept and passing its gradient, and sizes across the thread chunks.
    #[test]
    fn matches_the_separate_ops_and_pytorchs_rules() {
        for n in [7, CHUNK + 5] {
            let mut av = vals(n, 0.0);
            av[3] = f32::NAN;
            let a =
                Var::from_tensor(&Tensor::from_vec(av.clone(), n, &Device::Cpu).unwrap()).unwrap();
            let bv = vals(n, 1.3);
            let b =
                Var::from_tensor(&Tensor::from_vec(bv.clone(), n, &Device::Cpu).unwrap()).unwrap();
            let up = Tensor::from_vec(vals(n, 2.1), n, &Device::Cpu).unwrap();
            let y = add_relu(a.as_tensor(), b.as_tensor()).unwrap();
            let g = (&y * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let ys: Vec<f32> = y.to_vec1().unwrap();
            let ups: Vec<f32> = up.to_vec1().unwrap();
            let ga: Vec<f32> = g.get(a.as_tensor()).unwrap().to_vec1().unwrap();
            let gb: Vec<f32> = g.get(b.as_tensor()).unwrap().to_vec1().unwrap();
            let mut stopped = 0;
            for i in 0..n {
                let s = av[i] + bv[i];
                if s.is_nan() {
                    assert!(ys[i].is_nan());
                } else {
                    assert_eq!(ys[i], s.max(0.0), "y[{i}]");
                }
                let want = if s <= 0.0 { 0.0 } else { ups[i] };
                stopped += usize::from(s <= 0.0);
                assert_eq!((ga[i], gb[i]), (want, want), "gradient [{i}]");
            }
            assert!(stopped > n / 5 && stopped < n * 4 / 5);
        }
    }

    /// bf16 tensors (`bf16-true`): the sum of the widened values rounded
    /// once (candle's bf16 add), NaN kept and passing its gradient, and
    /// both gradients the upstream one where the output passed, in bf16.
    #[test]
    fn bf16_sums_round_once_and_mask_the_gradient() {
        let dev = Device::Cpu;
        for n in [7, CHUNK + 5] {
            let mut av = vals(n, 0.0);
            av[3] = f32::NAN;
            let bf = |v: &[f32]| {
                Tensor::from_vec(v.to_vec(), n, &dev)
                    .unwrap()
                    .to_dtype(DType::BF16)
                    .unwrap()
            };
            let a = Var::from_tensor(&bf(&av)).unwrap();
            let b = Var::from_tensor(&bf(&vals(n, 1.3))).unwrap();
            let up = bf(&vals(n, 2.1));
            let y = add_relu(a.as_tensor(), b.as_tensor()).unwrap();
            assert_eq!(y.dtype(), DType::BF16);
            let g = crate::grad::weighted_grads(&y, &up).unwrap();
            let f32s =
                |t: &Tensor| -> Vec<f32> { t.to_dtype(DType::F32).unwrap().to_vec1().unwrap() };
            let (ys, ups) = (f32s(&y), f32s(&up));
            let (a32, b32) = (f32s(a.as_tensor()), f32s(b.as_tensor()));
            let ga = g.get(a.as_tensor()).unwrap();
            assert_eq!(ga.dtype(), DType::BF16);
            let (ga, gb) = (f32s(ga), f32s(g.get(b.as_tensor()).unwrap()));
            let mut stopped = 0;
            for i in 0..n {
                let s = half::bf16::from_f32(a32[i] + b32[i]).to_f32();
                if s.is_nan() {
                    assert!(ys[i].is_nan(), "y[{i}]");
                } else {
                    assert_eq!(ys[i].to_bits(), s.max(0.0).to_bits(), "y[{i}]");
                }
                let want = if s <= 0.0 { 0.0 } else { ups[i] };
                stopped += usize::from(s <= 0.0);
                assert_eq!((ga[i], gb[i]), (want, want), "gradient [{i}]");
            }
            assert!(stopped > n / 5 && stopped < n * 4 / 5);
        }
    }
}
