//! Convolution, max pooling and ReLU as one op:
//! `relu(max_pool2d(conv2d(x, w, b, padding), k))`, a CNN's usual block.
//!
//! Apart, the three ops make the conv output a tensor (6.4 MB per batch for
//! the zoo CNN's first block) that is written, pooled, then in the backward
//! rebuilt from the pooled gradient, summed into a zero tensor by candle's
//! autograd and read again by the conv backward, with two more small tensors
//! and their gradients for the ReLU. Fused, each sample's conv output lives in
//! one thread-local buffer: the forward pools it while it is in cache and
//! keeps one byte per pooled value (where its window's first maximum was, or
//! that the ReLU zeroed it); the backward rebuilds that sample's conv output
//! gradient in a buffer and feeds it straight to the conv backward GEMMs.
//!
//! The conv runs in the wide layout of `conv_wide`. Same arithmetic as the
//! separate ops: the first maximum of each window in
//! row-major order takes the gradient (PyTorch), NaN counts as a maximum, and
//! the ReLU passes gradient where its output is positive.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::conv::{conv2d_with, Geom};
use crate::conv_backward::{backward, Unpool, NO_GRAD};
use crate::error::Result;
use crate::grad::{layer_buffers, Param, ParamBuffers};
use crate::pool::{first_max4, max_pool2d};
use crate::slices::{fused_cpu, Grads3};
use redline_core::trace;

/// `relu(max_pool2d(conv2d(x, w, b, padding), k))`: `x (B, Cin, H, W)`,
/// `w (Cout, Cin, kh, kw)`, `b (Cout)` -> `(B, Cout, oh / k, ow / k)` with
/// `oh = H + 2p - kh + 1` (likewise `ow`), pooling in floor mode. CPU f32
/// tensors take the fused kernel, CUDA f32 tensors (with `--fused-kernels`)
/// the implicit-GEMM convolution and one bias+pool+ReLU kernel; anything
/// else (and windows over 15x15) the separate ops. The weight's and bias's
/// gradients come back in candle's `GradStore`.
pub fn conv2d_pool_relu(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    padding: usize,
    k: usize,
) -> Result<Tensor> {
    pool_relu_with(x, w, b, padding, k, None)
}

/// [`conv2d_pool_relu`] over parameters: where the fused kernel runs, its
/// backward writes dW and db into `w.grad()` and `b.grad()`, otherwise they
/// come in the `GradStore` for [`Param::absorb`].
pub fn conv2d_pool_relu_param(
    x: &Tensor,
    w: &Param,
    b: &Param,
    padding: usize,
    k: usize,
) -> Result<Tensor> {
    let buffers = layer_buffers(w, b);
    pool_relu_with(x, w.as_tensor(), b.as_tensor(), padding, k, buffers)
}

pub(crate) fn pool_relu_with(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    padding: usize,
    k: usize,
    buffers: Option<ParamBuffers>,
) -> Result<Tensor> {
    let geom = Geom::new(x, w, b, padding)?;
    #[cfg(feature = "cuda")]
    if (1..16).contains(&k)
        && crate::fused_gpu::enabled()
        && x.device().is_cuda()
        && [x, w, b]
            .iter()
            .all(|t| t.dtype() == candle_core::DType::F32)
    {
        // The implicit-GEMM convolution, then bias, pooling and ReLU in one kernel.
        let conv = crate::cuda::conv::conv2d(x, w, padding)?;
        return crate::cuda::pool::bias_pool_relu(&conv, b, k);
    }
    if !(1..16).contains(&k) || ![x, w, b].into_iter().all(fused_cpu) {
        let y = conv2d_with(x, w, b, padding, buffers)?;
        return Ok(max_pool2d(&y, k)?.relu()?);
    }
    block(geom, x, w, b, k, buffers)
}

fn block(
    geom: Geom,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    k: usize,
    buffers: Option<ParamBuffers>,
) -> Result<Tensor> {
    let op = BlockOp {
        geom,
        k,
        input_grad: x.track_op(),
        layer: trace::current_layer(),
        argmax: Mutex::new(None),
        buffers,
    };
    Ok(x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, op)?)
}

/// The forward op; keeps the window maxima for its backward.
struct BlockOp {
    geom: Geom,
    k: usize,
    /// Whether `x` was tracked at forward time; if not, no dx is computed.
    input_grad: bool,
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
    /// Set by the forward: per pooled output, [`Unpool::argmax`].
    argmax: Mutex<Option<Arc<Vec<u8>>>>,
    /// Where dW and db go, when the layer's parameters were given.
    buffers: Option<ParamBuffers>,
}

impl BlockOp {
    /// Pools one sample's wide conv output `y (Cout, oh*wp)` into `out` with
    /// ReLU, recording each window's first maximum in `at`.
    #[inline(always)]
    fn pool_sample(&self, y: &[f32], out: &mut [f32], at: &mut [u8]) {
        let (g, k) = (self.geom, self.k);
        let (ph, pw, wp) = (g.oh / k, g.ow / k, g.wp());
        let planes = y
            .chunks(g.ohw_wide())
            .zip(out.chunks_mut(ph * pw).zip(at.chunks_mut(ph * pw)));
        for (plane, (out, at)) in planes {
            for py in 0..ph {
                let (out, at) = (&mut out[py * pw..][..pw], &mut at[py * pw..][..pw]);
                if k == 2 {
                    let (r0, r1) = (&plane[2 * py * wp..], &plane[(2 * py + 1) * wp..]);
                    let wins = r0.chunks_exact(2).zip(r1.chunks_exact(2));
                    for ((o, a), (t, u)) in out.iter_mut().zip(at.iter_mut()).zip(wins) {
                        let (m, first) = first_max4([t[0], t[1], u[0], u[1]]);
                        let pos =
                            u8::from(first[1]) + 2 * u8::from(first[2]) + 3 * u8::from(first[3]);
                        (*o, *a) = relu(m, pos);
                    }
                } else {
                    for (px, (o, a)) in out.iter_mut().zip(at.iter_mut()).enumerate() {
                        let (mut m, mut pos) = (plane[py * k * wp + px * k], 0usize);
                        for j in 1..k * k {
                            let v = plane[(py * k + j / k) * wp + px * k + j % k];
                            if v > m || v.is_nan() {
                                (m, pos) = (v, j);
                            }
                        }
                        // k < 16, so pos < 255 = NO_GRAD.
                        (*o, *a) = relu(m, pos as u8);
                    }
                }
            }
        }
    }
}

/// [`BlockOp::pool_sample`] compiled for the best instruction set present
/// (`pulp`): the windows' max/select chains vectorise there, not in
/// baseline x86-64 code.
struct PoolLoop<'a> {
    block: &'a BlockOp,
    y: &'a [f32],
    out: &'a mut [f32],
    at: &'a mut [u8],
}

impl pulp::WithSimd for PoolLoop<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        self.block.pool_sample(self.y, self.out, self.at);
    }
}

/// ReLU of a window maximum: the value and where its gradient goes. NaN
/// stays NaN (PyTorch) but passes no gradient (`NaN > 0` is false there too).
/// Selects, not branches: the sign of a conv output is a coin toss, and a
/// mispredicted branch per window cost a third of the pooling time.
#[inline(always)]
fn relu(m: f32, pos: u8) -> (f32, u8) {
    let keep = m > 0.0;
    let v = if keep || m.is_nan() { m } else { 0.0 };
    (v, if keep { pos } else { NO_GRAD })
}

impl CustomOp3 for BlockOp {
    fn name(&self) -> &'static str {
        "redline-conv2d-pool-relu"
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
        let (g, name) = (self.geom, self.name());
        trace::count("conv2d_pool_relu.forward");
        let [x, w, b] = g.operands(name, [(s1, l1), (s2, l2), (s3, l3)], ("bias", g.cout))?;
        let (ph, pw) = (g.oh / self.k, g.ow / self.k);
        let plen = g.cout * ph * pw;
        let shape = Shape::from((g.b, g.cout, ph, pw));
        let mut out = vec![0f32; g.b * plen];
        let mut argmax = vec![NO_GRAD; g.b * plen];
        if g.b > 0 && plen > 0 {
            let w = g.permute_taps(w, false);
            let per = g.per_chunk();
            out.par_chunks_mut(per * plen)
                .zip(argmax.par_chunks_mut(per * plen))
                .zip(x.par_chunks(per * g.in_len()))
                .try_for_each(|((out, at), x)| {
                    // The padded input's border stays zero: only its interior is written.
                    let mut xp = vec![0f32; g.padded_len()];
                    let mut cols = vec![0f32; g.k() * g.ohw_wide()];
                    let mut y = vec![0f32; g.cout * g.ohw_wide()];
                    let samples = out.chunks_mut(plen).zip(at.chunks_mut(plen));
                    for ((out, at), x) in samples.zip(x.chunks(g.in_len())) {
                        g.pad_into(x, &mut xp);
                        g.forward_sample_wide(name, &w, b, &xp, &mut cols, &mut y)?;
                        pulp::Arch::new().dispatch(PoolLoop {
                            block: self,
                            y: &y,
                            out,
                            at,
                        });
                    }
                    Ok::<(), candle_core::Error>(())
                })?;
        }
        crate::slices::keep(&self.argmax, Arc::new(argmax));
        Ok((CpuStorage::F32(out), shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Grads3> {
        let _span = trace::backward(self.layer.as_ref(), "conv2d+max_pool2d+relu");
        trace::count("conv2d_pool_relu.backward");
        let argmax = crate::slices::saved(&self.argmax, self.name())?;
        let unpool = Unpool { k: self.k, argmax };
        backward(
            self.geom,
            self.input_grad,
            Some(unpool),
            self.buffers.clone(),
            x,
            w,
            grad,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv2d;
    use candle_core::{Device, Var};

    fn data(dims: &[usize], seed: f32) -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
        Ok(Tensor::from_vec(v, dims, &Device::Cpu)?)
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
        if a.elem_count() == 0 {
            return Ok(0.0);
        }
        Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
    }

    /// (B, Cin, H, W, Cout, kernel, padding, pool window, input tracked)
    type Case = (usize, usize, usize, usize, usize, usize, usize, usize, bool);
    const CASES: [Case; 6] = [
        (2, 1, 8, 8, 4, 3, 1, 2, false),
        (3, 2, 7, 7, 5, 3, 1, 2, true),
        (2, 3, 9, 6, 2, 3, 0, 2, true),
        (2, 2, 9, 9, 3, 3, 1, 3, true),
        (1, 2, 5, 5, 2, 1, 0, 1, true),
        (2, 1, 4, 4, 2, 3, 1, 5, true),
    ];

    /// Forward values and every gradient equal the separate fused ops'
    /// (which the conv and pool tests hold against candle and PyTorch).
    #[test]
    fn matches_the_separate_ops() -> Result<()> {
        for (bs, cin, h, wd, cout, kk, p, k, tracked) in CASES {
            let case = (bs, cin, h, wd, cout, kk, p, k);
            let x = Var::from_tensor(&data(&[bs, cin, h, wd], 0.0)?)?;
            let w = Var::from_tensor(&data(&[cout, cin, kk, kk], 1.0)?)?;
            let b = Var::from_tensor(&data(&[cout], 2.0)?)?;
            let xin = if tracked {
                x.as_tensor().clone()
            } else {
                x.as_tensor().detach()
            };
            let fused = conv2d_pool_relu(&xin, &w, &b, p, k)?;
            let plain = max_pool2d(&conv2d(&xin, &w, &b, p)?, k)?.relu()?;
            assert_eq!(fused.dims(), plain.dims(), "{case:?}");
            assert_eq!(max_abs_diff(&fused, &plain)?, 0.0, "forward {case:?}");
            let up = data(fused.dims(), 3.0)?;
            let gf = (fused * &up)?.sum_all()?.backward()?;
            let gp = (plain * &up)?.sum_all()?.backward()?;
            for (name, v) in [("dW", &w), ("db", &b)] {
                let (Some(a), Some(e)) = (gf.get(v), gp.get(v)) else {
                    panic!("{name} missing for {case:?}")
                };
                assert!(max_abs_diff(a, e)? < 1e-5, "{name} {case:?}");
            }
            match (gf.get(&x), gp.get(&x)) {
                (Some(a), Some(e)) => assert!(tracked && max_abs_diff(a, e)? < 1e-5, "dx {case:?}"),
                (None, None) => assert!(!tracked, "dx missing {case:?}"),
                _ => panic!("dx present in one path only {case:?}"),
            }
        }
        Ok(())
    }

    #[test]
    fn ties_send_the_gradient_to_the_first_maximum() -> Result<()> {
        // A 1x1 conv with weight 1 and bias 0 passes a constant image through:
        // every 2x2 window is a tie, and the top-left element takes it all.
        let x = Var::from_tensor(&Tensor::ones(
            (1, 1, 4, 4),
            candle_core::DType::F32,
            &Device::Cpu,
        )?)?;
        let w = Tensor::ones((1, 1, 1, 1), candle_core::DType::F32, &Device::Cpu)?;
        let b = Tensor::zeros(1, candle_core::DType::F32, &Device::Cpu)?;
        let y = conv2d_pool_relu(&x, &w, &b, 0, 2)?;
        let Some(dx) = y.sum_all()?.backward()?.get(&x).cloned() else {
            panic!("no input gradient")
        };
        let want = [
            1f32, 0., 1., 0., 0., 0., 0., 0., 1., 0., 1., 0., 0., 0., 0., 0.,
        ];
        assert_eq!(dx.flatten_all()?.to_vec1::<f32>()?, want);
        Ok(())
    }

    #[test]
    fn bad_shapes_are_errors() -> Result<()> {
        let x = data(&[1, 2, 5, 5], 0.0)?;
        let w = data(&[3, 1, 3, 3], 1.0)?;
        let b = data(&[3], 2.0)?;
        assert!(conv2d_pool_relu(&x, &w, &b, 1, 2).is_err());
        Ok(())
    }
}
