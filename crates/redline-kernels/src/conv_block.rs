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

use std::borrow::Cow;

use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::conv::{conv2d_with, Geom};
use crate::conv_backward::{backward, Unpool, NO_GRAD};
use crate::error::Result;
use crate::gemm_bf16::pre_rounding;
use crate::grad::{layer_buffers, Param, ParamBuffers};
use crate::half16::{cast, round_in_place, rounded, store};
use crate::pool::max_pool2d;
use crate::pool2x2::{self, relu};
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
        && x.device().is_cuda()
        && crate::fused_gpu::takes(x.dtype())
        && [w, b].iter().all(|t| t.dtype() == x.dtype())
    {
        // The implicit-GEMM convolution (16-bit: on tensor cores), then bias,
        // pooling and ReLU in one kernel.
        let conv = crate::cuda::conv::conv2d(x, w, padding)?;
        return crate::cuda::pool::bias_pool_relu(&conv, b, k);
    }
    if !(1..16).contains(&k) || ![x, w, b].into_iter().all(fused_cpu) {
        let y = conv2d_with(x, w, b, padding, buffers)?;
        return Ok(max_pool2d(&y, k)?.relu()?);
    }
    block(geom, x, w, b, k, buffers, None)
}

/// The block in a 16-bit compute dtype on the CPU (`bf16-mixed`,
/// `16-mixed`) over fp32 master weights `w` and `b` whose gradients go to
/// `buffers`: `x` (the f32 batch or a 16-bit activation), the weights and
/// bias rounded to `dtype` in scratch memory, the convolution accumulated
/// in fp32 and rounded to `dtype` before the pooling (rounding makes ties,
/// and the window's first maximum among them takes the gradient, as in
/// autocast's 16-bit pooling), the output stored in `dtype`. The backward
/// rounds dW and db to `dtype` (as a 16-bit GEMM's outputs; fp16: inf above
/// 65504) before they reach the fp32 buffers, and returns dx in x's dtype.
/// Only the 16-bit output, the input and one byte per pooled value stay
/// between forward and backward. Weights of `dtype` themselves (`bf16-true`)
/// get dW and db in their buffers as tensors of their dtype.
pub(crate) fn pool_relu16(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    (padding, k): (usize, usize),
    (dtype, gemm): (DType, DType),
    buffers: ParamBuffers,
) -> Result<Tensor> {
    let geom = Geom {
        gemm,
        ..Geom::new(x, w, b, padding)?
    };
    block(geom, x, w, b, k, Some(buffers), Some(dtype))
}

fn block(
    geom: Geom,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    k: usize,
    buffers: Option<ParamBuffers>,
    half: Option<DType>,
) -> Result<Tensor> {
    let op = BlockOp {
        geom,
        k,
        input_grad: x.track_op(),
        layer: trace::current_layer(),
        argmax: Mutex::new(None),
        buffers,
        half,
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
    /// The 16-bit compute dtype ([`pool_relu16`]); `None`: fp32.
    half: Option<DType>,
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
                    pool2x2::pool_rows(r0, r1, out, at);
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
        let (x, w, b) = match self.half {
            None => {
                let [x, w, b] =
                    g.operands(name, [(s1, l1), (s2, l2), (s3, l3)], ("bias", g.cout))?;
                (Cow::Borrowed(x), Cow::Borrowed(w), Cow::Borrowed(b))
            }
            Some(d) => {
                // The bias is added after the GEMM, in f32: always rounded.
                let to = pre_rounding(d, g.gemm);
                let (x, w, b) = (
                    rounded(s1, l1, to, name)?,
                    rounded(s2, l2, to, name)?,
                    rounded(s3, l3, d, name)?,
                );
                g.check(
                    name,
                    &[
                        ("input", x.len(), g.b * g.in_len()),
                        ("weight", w.len(), g.cout * g.k()),
                        ("bias", b.len(), g.cout),
                    ],
                )?;
                (x, w, b)
            }
        };
        let (x, b) = (&*x, &*b);
        let (ph, pw) = (g.oh / self.k, g.ow / self.k);
        let plen = g.cout * ph * pw;
        let shape = Shape::from((g.b, g.cout, ph, pw));
        let mut out = vec![0f32; g.b * plen];
        let mut argmax = vec![NO_GRAD; g.b * plen];
        if g.b > 0 && plen > 0 {
            let w = g.permute_taps(&w, false);
            let per = g.per_chunk();
            out.par_chunks_mut(per * plen)
                .zip(argmax.par_chunks_mut(per * plen))
                .zip(x.par_chunks(per * g.in_len()))
                .try_for_each(|((out, at), x)| {
                    let mut scratch = g.wide_scratch(&w);
                    let mut y = vec![0f32; g.cout * g.ohw_wide()];
                    let samples = out.chunks_mut(plen).zip(at.chunks_mut(plen));
                    for ((out, at), x) in samples.zip(x.chunks(g.in_len())) {
                        g.forward_wide(name, &w, b, x, &mut scratch, &mut y)?;
                        if let Some(d) = self.half {
                            round_in_place(&mut y, d);
                        }
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
        Ok((store(out, self.half.unwrap_or(DType::F32))?, shape))
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
        let Some(d) = self.half else {
            return backward(
                self.geom,
                self.input_grad,
                Some(unpool),
                self.buffers.clone(),
                x,
                w,
                grad,
            );
        };
        // 16 bits: the fp32 kernel on the rounded operands (made here, in
        // scratch), its dW and db rounded into the buffers, dx rounded.
        let f32_of = |t: &Tensor, to| cast(t, to, DType::F32);
        let to = pre_rounding(d, self.geom.gemm);
        let (x32, w32, g32) = (f32_of(x, to)?, f32_of(w, to)?, f32_of(grad, DType::F32)?);
        let (dx, dw, db) = backward(
            self.geom,
            self.input_grad,
            Some(unpool),
            None,
            &x32,
            &w32,
            &g32,
        )?;
        let dx = dx.map(|t| cast(&t, d, x.dtype())).transpose()?;
        let Some(bufs) = self.buffers.as_ref() else {
            bail!(
                "{}: a 16-bit block without its gradient buffers",
                self.name()
            )
        };
        for (g, buf) in [(dw, &bufs.0), (db, &bufs.1)] {
            let Some(g) = g else {
                bail!("{}: the backward gave no weight gradient", self.name())
            };
            if w.dtype() == DType::F32 {
                // fp32 master weights: rounded, into their host buffers.
                let mut v = g.flatten_all()?.to_vec1::<f32>()?;
                round_in_place(&mut v, d);
                buf.add(&v);
            } else {
                // 16-bit weights (`bf16-true`): a tensor of their dtype.
                buf.absorb(&cast(&g, d, w.dtype())?)
                    .map_err(candle_core::Error::wrap)?;
            }
        }
        Ok((dx, None, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv2d;
    use crate::half16::bits;
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

    /// The 16-bit block equals the casts around the fp32 ops it replaces
    /// (conv of the rounded operands, rounded, ReLU, pool, stored in 16
    /// bits; every gradient back through the casts): output, dx, dW and db
    /// bit for bit, both 16-bit types, from an f32 and a 16-bit input.
    #[test]
    fn the_16_bit_block_equals_the_casts_around_the_fp32_ops() -> Result<()> {
        use crate::grad::Param;
        use candle_core::DType;
        for dtype in [DType::BF16, DType::F16] {
            for x16 in [false, true] {
                let x0 = data(&[2, 3, 6, 6], 0.0)?.affine(3.0, 0.0)?;
                let x0 = if x16 { x0.to_dtype(dtype)? } else { x0 };
                let (w0, b0) = (data(&[4, 3, 3, 3], 1.0)?, data(&[4], 2.0)?);
                let (w, b) = (
                    Param::new(Var::from_tensor(&w0)?),
                    Param::new(Var::from_tensor(&b0)?),
                );
                let xv = Var::from_tensor(&x0)?;
                let bufs = layer_buffers(&w, &b).expect("fp32 CPU params");
                let y = pool_relu16(
                    xv.as_tensor(),
                    w.as_tensor(),
                    b.as_tensor(),
                    (1, 2),
                    (dtype, DType::F32),
                    bufs,
                )?;
                assert_eq!(y.dtype(), dtype);
                let up = data(y.dims(), 3.0)?.to_dtype(dtype)?;
                let g = (&y * &up)?.to_dtype(DType::F32)?.sum_all()?.backward()?;

                let (wv, bv, xv2) = (
                    Var::from_tensor(&w0)?,
                    Var::from_tensor(&b0)?,
                    Var::from_tensor(&x0)?,
                );
                let r =
                    |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(dtype)?.to_dtype(DType::F32)?) };
                let c = conv2d(
                    &r(xv2.as_tensor())?,
                    &r(wv.as_tensor())?,
                    &r(bv.as_tensor())?,
                    1,
                )?;
                let y2 = max_pool2d(&r(&c)?.relu()?, 2)?.to_dtype(dtype)?;
                let g2 = (&y2 * &up)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
                let case = format!("{dtype:?} x16 {x16}");
                assert_eq!(bits(&y)?, bits(&y2)?, "y {case}");
                let dx = g.get(xv.as_tensor()).expect("dx");
                assert_eq!(dx.dtype(), x0.dtype(), "{case}");
                assert_eq!(
                    bits(dx)?,
                    bits(g2.get(xv2.as_tensor()).expect("dx2"))?,
                    "dx {case}"
                );
                let dw = w.grad().to_tensor(w.as_tensor())?.expect("dW");
                let db = b.grad().to_tensor(b.as_tensor())?.expect("db");
                let max_rel = |a: &Tensor, e: &Tensor| -> Result<f32> {
                    let n = e.abs()?.max_all()?.to_scalar::<f32>()?;
                    Ok(max_abs_diff(a, e)? / n.max(1e-30))
                };
                // dW and db: the fused kernel's sums in another order than
                // candle's, then rounded: within one 16-bit step.
                assert!(
                    max_rel(&dw, g2.get(wv.as_tensor()).expect("dw2"))? <= 8e-3,
                    "dW {case}"
                );
                assert!(
                    max_rel(&db, g2.get(bv.as_tensor()).expect("db2"))? <= 8e-3,
                    "db {case}"
                );
            }
        }
        Ok(())
    }

    /// Over bf16 weights (`bf16-true`), through the layer set: the output
    /// as the casts around the fp32 ops give it, bit for bit; dx through
    /// autograd and bf16 dW and db in the weights' buffers, within one bf16
    /// step of the casts' (sums in another order).
    #[test]
    fn bf16_weights_get_bf16_gradients_in_their_buffers() -> Result<()> {
        use candle_core::DType;
        let bf = DType::BF16;
        let x0 = data(&[2, 3, 6, 6], 0.0)?.affine(3.0, 0.0)?.to_dtype(bf)?;
        let (w0, b0) = (
            data(&[4, 3, 3, 3], 1.0)?.to_dtype(bf)?,
            data(&[4], 2.0)?.to_dtype(bf)?,
        );
        let x = Var::from_tensor(&x0)?;
        let (wp, bp) = (
            crate::grad::Param::new(Var::from_tensor(&w0)?),
            crate::grad::Param::new(Var::from_tensor(&b0)?),
        );
        let y = crate::conv2d_in(x.as_tensor(), &wp, &bp, 1, Some(2), bf)?;
        let up = data(y.dims(), 3.0)?.to_dtype(bf)?;
        let g = (&y * &up)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
        assert!(g.get(wp.as_tensor()).is_none(), "dW went to the buffer");
        let [x2, w2, b2] = [&x0, &w0, &b0].map(Var::from_tensor);
        let (x2, w2, b2) = (x2?, w2?, b2?);
        let f = |t: &Tensor| t.to_dtype(DType::F32);
        let c = conv2d(
            &f(x2.as_tensor())?,
            &f(w2.as_tensor())?,
            &f(b2.as_tensor())?,
            1,
        )?;
        let y2 = max_pool2d(&c.to_dtype(bf)?.to_dtype(DType::F32)?.relu()?, 2)?.to_dtype(bf)?;
        let g2 = (&y2 * &up)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
        assert_eq!(bits(&y)?, bits(&y2)?, "y");
        let held = |p: &crate::grad::Param| p.grad().to_tensor(p.as_tensor());
        for (ours, theirs, what) in [
            (g.get(x.as_tensor()).cloned(), x2.as_tensor(), "dx"),
            (held(&wp)?, w2.as_tensor(), "dW"),
            (held(&bp)?, b2.as_tensor(), "db"),
        ] {
            let (Some(a), Some(e)) = (ours, g2.get(theirs)) else {
                panic!("{what}: no gradient")
            };
            assert_eq!(a.dtype(), bf, "{what}");
            let (a, e) = (a.to_dtype(DType::F32)?, e.to_dtype(DType::F32)?);
            let n = e.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(n > 0.0, "{what}");
            assert!(max_abs_diff(&a, &e)? <= 8e-3 * n, "{what}");
        }
        Ok(())
    }

    /// `y`, dx, dW and db of a bf16 block with its GEMMs in `gemm`.
    fn run16(gemm: candle_core::DType) -> Result<[Vec<f32>; 4]> {
        use crate::grad::Param;
        use candle_core::DType;
        let x0 = data(&[3, 5, 9, 9], 0.0)?.affine(3.0, 0.0)?;
        let (w0, b0) = (data(&[7, 5, 3, 3], 1.0)?, data(&[7], 2.0)?);
        let (w, b) = (
            Param::new(Var::from_tensor(&w0)?),
            Param::new(Var::from_tensor(&b0)?),
        );
        let x = Var::from_tensor(&x0)?;
        let bufs = layer_buffers(&w, &b).expect("fp32 CPU params");
        let kinds = (DType::BF16, gemm);
        let y = pool_relu16(
            x.as_tensor(),
            w.as_tensor(),
            b.as_tensor(),
            (1, 2),
            kinds,
            bufs,
        )?;
        let up = data(y.dims(), 3.0)?.to_dtype(DType::BF16)?;
        crate::grad::outputs_and_grads(&y, &up, &x, &w, &b)
    }

    /// On the native bf16 GEMM (forward, dW and dx) the block gives the
    /// fp32 route's values within one bf16 rounding, far from zero. A
    /// rounding flip before the pool can move a window's winner, so the
    /// gradients are held to the largest gradient's bf16 step instead.
    #[test]
    fn the_native_gemm_gives_the_fp32_routes_values() -> Result<()> {
        use candle_core::DType;
        if !crate::gemm_bf16::available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return Ok(());
        }
        let (ours, theirs) = (run16(DType::BF16)?, run16(DType::F32)?);
        for (what, (a, e)) in ["y", "dx", "dW", "db"].iter().zip(ours.iter().zip(&theirs)) {
            let scale = e.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(scale > 1.0, "{what}: {scale}");
            let near = a
                .iter()
                .zip(e)
                .filter(|(x, y)| (*x - *y).abs() <= 2f32.powi(-7) * x.abs().max(y.abs()))
                .count();
            let worst = a.iter().zip(e).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(worst <= 2f32.powi(-6) * scale, "{what}: {worst} of {scale}");
            assert!(near * 100 >= a.len() * 99, "{what}: {near} of {}", a.len());
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
