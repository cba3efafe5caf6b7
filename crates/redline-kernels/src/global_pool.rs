//! `nn.AdaptiveAvgPool2d(1)` (global average pooling), optionally after a
//! ReLU, as one CPU kernel each way (f32).
//!
//! From candle's ops the mean is two reductions forward, and backward two
//! broadcasts and their copies; a ReLU before it adds a pass forward and
//! three backward (a zeros tensor, a comparison, a select). Fused: the
//! forward reads the input once (the ReLU applied as it is summed, nothing
//! materialised), and the backward writes `dy / (H * W)` into each plane,
//! masked by the input where the ReLU is fused. PyTorch's rules: a NaN
//! passes the ReLU, and the gradient stops where its input is `<= 0`.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;
use redline_core::trace;

use crate::add_relu::passes;
use crate::slices::{f32s, fused_cpu, half_cpu, widened};
use crate::{Error, Result};

/// Planes per thread task.
const PLANES: usize = 64;

/// `(B, C, H, W) -> (B, C, 1, 1)`: the mean of each plane, of `relu(x)`
/// when `relu`. The fused CPU kernel for f32, candle's ops otherwise.
pub fn global_avg_pool2d(x: &Tensor, relu: bool) -> Result<Tensor> {
    let (_, _, h, w) = x.dims4().map_err(|_| {
        Error::Candle(candle_core::Error::Msg(format!(
            "global average pooling takes (B, C, H, W); got {:?}",
            x.dims()
        )))
    })?;
    if half_cpu(x) && h * w > 0 {
        return widened(x, |x| global_avg_pool2d(x, relu));
    }
    if fused_cpu(x) && h * w > 0 {
        let op = GlobalAvgPool {
            relu,
            layer: trace::current_layer(),
        };
        return Ok(x.contiguous()?.apply_op1(op)?);
    }
    let x = if relu { x.relu()? } else { x.clone() };
    Ok(x.mean_keepdim(3)?.mean_keepdim(2)?)
}

/// The sum of a plane, of its ReLU'd values when `relu`, in eight lanes.
#[inline(always)]
fn plane_sum(plane: &[f32], relu: bool) -> f32 {
    let mut lanes = [0f32; 8];
    let mut it = plane.chunks_exact(8);
    for c in &mut it {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += if !relu || passes(v) { v } else { 0.0 };
        }
    }
    let tail: f32 = it
        .remainder()
        .iter()
        .map(|&v| if !relu || passes(v) { v } else { 0.0 })
        .sum();
    lanes.iter().sum::<f32>() + tail
}

struct GlobalAvgPool {
    relu: bool,
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
}

impl CustomOp1 for GlobalAvgPool {
    fn name(&self) -> &'static str {
        "redline-global-avg-pool"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        trace::count("global_avg_pool.forward");
        let x = f32s(s, l, self.name())?;
        let (b, c, h, w) = l.shape().dims4()?;
        let hw = h * w;
        let mut y = vec![0f32; b * c];
        let relu = self.relu;
        if hw > 0 {
            y.par_chunks_mut(PLANES)
                .zip(x.par_chunks(PLANES * hw))
                .for_each(|(y, x)| {
                    for (y, plane) in y.iter_mut().zip(x.chunks(hw)) {
                        *y = plane_sum(plane, relu) / hw as f32;
                    }
                });
        }
        Ok((CpuStorage::F32(y), Shape::from((b, c, 1, 1))))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let _span = trace::backward(self.layer.as_ref(), "global_avg_pool");
        trace::count("global_avg_pool.backward");
        let op = Spread { relu: self.relu };
        Ok(Some(arg.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// `(x, dy (B, C, 1, 1)) -> dx`: each plane `dy / (H * W)`, zero where a
/// fused ReLU stopped the gradient.
struct Spread {
    relu: bool,
}

impl CustomOp2 for Spread {
    fn name(&self) -> &'static str {
        "redline-global-avg-pool-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, dy) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        let (b, c, h, w) = l1.shape().dims4()?;
        let hw = h * w;
        if dy.len() != b * c || hw == 0 {
            candle_core::bail!(
                "{}: gradient of {} values for {b} x {c} planes of {h} x {w}",
                self.name(),
                dy.len()
            );
        }
        let mut dx = crate::slices::zeros_par::<f32>(x.len());
        let relu = self.relu;
        dx.par_chunks_mut(PLANES * hw)
            .zip(x.par_chunks(PLANES * hw).zip(dy.par_chunks(PLANES)))
            .for_each(|(dx, (x, dy))| {
                for ((dx, x), &g) in dx.chunks_mut(hw).zip(x.chunks(hw)).zip(dy) {
                    let v = g / hw as f32;
                    if relu {
                        for (d, &xv) in dx.iter_mut().zip(x) {
                            *d = if passes(xv) { v } else { 0.0 };
                        }
                    } else {
                        dx.fill(v);
                    }
                }
            });
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use candle_core::{Device, Var};

    /// Against candle's ops (`relu` then the two means, whose backward is
    /// the vendored PyTorch rule): values and the input gradient, with and
    /// without the ReLU, planes across thread tasks and a tail past the
    /// eight lanes, a NaN propagated forward and passing its gradient.
    #[test]
    fn matches_candles_ops_with_and_without_the_relu() {
        for (b, c, h, w) in [(2, 3, 5, 7), (3, 50, 4, 4)] {
            let n = b * c * h * w;
            let mut v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.61).sin()).collect();
            v[9] = f32::NAN;
            let x = Var::from_tensor(&Tensor::from_vec(v, (b, c, h, w), &Device::Cpu).unwrap())
                .unwrap();
            let up: Vec<f32> = (0..b * c).map(|i| (i as f32 * 0.3 + 1.0).cos()).collect();
            let up = Tensor::from_vec(up, (b, c, 1, 1), &Device::Cpu).unwrap();
            for relu in [false, true] {
                let ours = global_avg_pool2d(x.as_tensor(), relu).unwrap();
                let r = if relu {
                    x.as_tensor().relu().unwrap()
                } else {
                    x.as_tensor().clone()
                };
                let theirs = r.mean_keepdim(3).unwrap().mean_keepdim(2).unwrap();
                assert_eq!(ours.dims(), [b, c, 1, 1]);
                let (o, t): (Vec<f32>, Vec<f32>) = (
                    ours.flatten_all().unwrap().to_vec1().unwrap(),
                    theirs.flatten_all().unwrap().to_vec1().unwrap(),
                );
                assert!(o[0].is_nan() && t[0].is_nan(), "NaN propagates ({relu})");
                for (a, e) in o.iter().zip(&t).skip(1) {
                    assert!(
                        (a - e).abs() <= 1e-6 * e.abs().max(1.0),
                        "{a} vs {e} ({relu})"
                    );
                }
                let go = (&ours * &up)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let gt = (&theirs * &up)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let (o, t): (Vec<f32>, Vec<f32>) = (
                    go.get(x.as_tensor())
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap(),
                    gt.get(x.as_tensor())
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap(),
                );
                let mut stopped = 0;
                for (a, e) in o.iter().zip(&t) {
                    assert!(
                        (a - e).abs() <= 1e-6 * e.abs().max(1.0),
                        "{a} vs {e} ({relu})"
                    );
                    stopped += usize::from(*a == 0.0);
                }
                assert_eq!(stopped > n / 5, relu, "the ReLU stops gradients ({relu})");
                assert_ne!(o[9], 0.0, "NaN's gradient passes ({relu})");
            }
        }
    }
}
