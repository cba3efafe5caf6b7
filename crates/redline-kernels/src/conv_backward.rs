//! The fused conv2d backward kernel, shared by [`conv2d`](crate::conv2d) and
//! the conv + max-pool + ReLU block ([`conv2d_pool_relu`](crate::conv2d_pool_relu)).
//!
//! One pass per sample: (for the block, first rebuild the conv output's
//! gradient from the pooled gradient and the saved window maxima), then dW
//! and db (GEMM of the output gradient with the im2col matrix) and, only when
//! the input needs a gradient, dx (GEMM + col2im). Samples are split across
//! the compute threads; each GEMM is small, so it stays on its thread.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::conv::{gemm_or_err, Geom, Path};
use crate::gemm::Mat;
use crate::grad::ParamBuffers;
use crate::half16::Act;
use crate::slices::{unpack_grads, Grads3};

/// Marks a pooled output the ReLU zeroed: no gradient flows back through it.
pub(super) const NO_GRAD: u8 = u8::MAX;

/// How the block's pooled output gradient maps back onto the conv output.
#[derive(Debug, Clone)]
pub(super) struct Unpool {
    /// Pooling window (and stride).
    pub(super) k: usize,
    /// Per pooled output: the position of its window's first maximum
    /// (`ky * k + kx`), or [`NO_GRAD`].
    pub(super) argmax: Arc<Vec<u8>>,
}

impl Unpool {
    fn ph_pw(&self, g: Geom) -> (usize, usize) {
        (g.oh / self.k, g.ow / self.k)
    }

    /// Pooled elements of one sample.
    fn pooled_len(&self, g: Geom) -> usize {
        let (ph, pw) = self.ph_pw(g);
        g.cout * ph * pw
    }

    /// One sample's wide conv output gradient `dy (Cout, oh*wp)` (see
    /// `conv_wide`) from its pooled gradient `gp` and window maxima `at`:
    /// each window's gradient on its first maximum, zero elsewhere (junk
    /// columns included).
    #[inline(always)]
    fn unpool(&self, geom: Geom, gp: &[f32], at: &[u8], dy: &mut [f32]) {
        let (k, (ph, pw)) = (self.k, self.ph_pw(geom));
        dy.fill(0.0);
        if ph * pw == 0 {
            return;
        }
        let wp = geom.wp();
        let planes = dy
            .chunks_mut(geom.ohw_wide())
            .zip(gp.chunks(ph * pw).zip(at.chunks(ph * pw)));
        for (plane, (gp, at)) in planes {
            for (py, (gp, at)) in gp.chunks(pw).zip(at.chunks(pw)).enumerate() {
                if k == 2 {
                    // All four of each window written, no branch on where the
                    // maximum was (random: a branch mispredicts half the time).
                    let (r0, r1) = plane[2 * py * wp..].split_at_mut(wp);
                    let wins = r0.chunks_exact_mut(2).zip(r1.chunks_exact_mut(2));
                    for ((t, u), (&g, &a)) in wins.zip(gp.iter().zip(at)) {
                        let put = |pos: u8| if a == pos { g } else { 0.0 };
                        (t[0], t[1], u[0], u[1]) = (put(0), put(1), put(2), put(3));
                    }
                } else {
                    for (px, (&g, &a)) in gp.iter().zip(at).enumerate() {
                        if a != NO_GRAD {
                            let a = usize::from(a);
                            plane[(py * k + a / k) * wp + px * k + a % k] = g;
                        }
                    }
                }
            }
        }
    }
}

/// Adds each `len`-element row's sum to its entry of `acc`, eight partial
/// sums per row so that the loop vectorises (a single running sum is one
/// dependent add per element; on the CNN's bias gradients that was 10% of
/// the conv backward).
/// Rows stored bf16 are widened as they are read ([`Act`]).
pub(crate) fn add_row_sums<T: Act>(acc: &mut [f32], rows: &[T], len: usize) {
    for (d, row) in acc.iter_mut().zip(rows.chunks(len)) {
        let mut lanes = [0f32; 8];
        let mut it = row.chunks_exact(8);
        for c in &mut it {
            lanes.iter_mut().zip(c).for_each(|(l, v)| *l += v.widen());
        }
        let tail: f32 = it.remainder().iter().map(|v| v.widen()).sum();
        *d += lanes.iter().sum::<f32>() + tail;
    }
}

/// [`Unpool::unpool`] compiled for the best instruction set present (`pulp`).
struct UnpoolLoop<'a> {
    u: &'a Unpool,
    geom: Geom,
    gp: &'a [f32],
    at: &'a [u8],
    dy: &'a mut [f32],
}

impl pulp::WithSimd for UnpoolLoop<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        self.u.unpool(self.geom, self.gp, self.at, self.dy);
    }
}

/// Gradients of a conv (or conv block) through the fused kernel: dW and db
/// into the parameters' gradient buffers where given, else returned.
pub(super) fn backward(
    geom: Geom,
    input_grad: bool,
    unpool: Option<Unpool>,
    buffers: Option<ParamBuffers>,
    x: &Tensor,
    w: &Tensor,
    grad: &Tensor,
) -> candle_core::Result<Grads3> {
    let buffered = buffers.is_some();
    let op = Conv2dBackward {
        geom,
        input_grad,
        buffers,
        unpool,
    };
    // One flat tensor [dW | db | dx]: the kernel computes all three in one pass.
    let flat = x.apply_op3_no_bwd(w, &grad.contiguous()?, &op)?;
    unpack_grads(&flat, w.shape(), x.shape(), input_grad, buffered)
}

/// The input gradient's columns of one sample, `dcols (K, n) = w^T (K,
/// Cout) * dy (Cout, n)` (n: the output pixels, in the plain or the wide
/// layout), for `col2im` to scatter.
fn input_cols(
    g: Geom,
    name: &str,
    w: &[f32],
    dy: Mat<'_>,
    dcols: &mut [f32],
) -> candle_core::Result<()> {
    gemm_or_err(
        g.gemm,
        name,
        dcols,
        Mat::new(w, g.cout, g.k()).t(),
        dy,
        false,
    )
}

/// dx of each sample of `dy` as `w^T * dy` and col2im (`w` in im2col row
/// order), one sample after another on this thread.
fn input_grad_samples(
    g: Geom,
    name: &str,
    w: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) -> candle_core::Result<()> {
    let mut dcols = vec![0f32; g.k() * g.ohw()];
    for (dx, dy) in dx.chunks_mut(g.in_len()).zip(dy.chunks(g.out_len())) {
        input_cols(g, name, w, Mat::new(dy, g.cout, g.ohw()), &mut dcols)?;
        g.col2im(&dcols, dx);
    }
    Ok(())
}

/// [`input_grad_samples`] of the whole batch, the samples split across the
/// compute threads.
fn input_grad_per_sample(
    g: Geom,
    name: &str,
    w: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) -> candle_core::Result<()> {
    let per = g.per_chunk();
    dx.par_chunks_mut(per * g.in_len())
        .zip(dy.par_chunks(per * g.out_len()))
        .try_for_each(|(dx, dy)| input_grad_samples(g, name, w, dy, dx))
}

/// The backward kernel: `(x, w, dy) -> [dW | db | dx]` (dx only when asked),
/// or only dx when dW and db go to the parameters' gradient buffers. With
/// `unpool`, the third input is the pooled gradient instead of dy.
struct Conv2dBackward {
    geom: Geom,
    input_grad: bool,
    /// The weight's and bias's gradient buffers, when attached.
    buffers: Option<ParamBuffers>,
    unpool: Option<Unpool>,
}

/// A thread chunk's output gradient: as given, or pooled with its maxima.
enum Dy<'a> {
    Full(&'a [f32]),
    Pooled(&'a Unpool, &'a [f32], &'a [u8]),
}

impl Conv2dBackward {
    /// dW and db (as one `[dW | db]` buffer, dW in im2col row order like `w`)
    /// of a chunk of samples, and dx of each sample into `dx` when given.
    fn chunk(
        &self,
        x: &[f32],
        w: &[f32],
        dys: Dy<'_>,
        dx: Option<&mut [f32]>,
    ) -> candle_core::Result<Vec<f32>> {
        let dys = match dys {
            Dy::Full(dys) => dys,
            Dy::Pooled(u, gp, at) => return self.chunk_wide(u, x, w, gp, at, dx),
        };
        let (g, name) = (self.geom, self.name());
        if g.weight_grad_path() == Path::Direct {
            let acc = g.weight_grad_direct(name, x, dys)?;
            if let Some(dx) = dx {
                // Only where dx is not the transposed forward (`accumulate`).
                input_grad_samples(g, name, w, dys, dx)?;
            }
            return Ok(acc);
        }
        let wlen = g.cout * g.k();
        let mut acc = vec![0f32; wlen + g.cout];
        let mut cols = vec![0f32; if g.pointwise() { 0 } else { g.k() * g.ohw() }];
        let mut dcols = vec![0f32; if dx.is_some() { g.k() * g.ohw() } else { 0 }];
        let mut dx = dx.map(|d| d.chunks_mut(g.in_len()));
        for (x, dy) in x.chunks(g.in_len()).zip(dys.chunks(g.out_len())) {
            let c = g.cols_of(x, &mut cols);
            let (dw, db) = acc.split_at_mut(wlen);
            let dym = Mat::new(dy, g.cout, g.ohw());
            // dW (Cout, K) += dy (Cout, oh*ow) * cols^T (oh*ow, K)
            gemm_or_err(g.gemm, name, dw, dym, Mat::new(c, g.k(), g.ohw()).t(), true)?;
            add_row_sums(db, dy, g.ohw());
            if let Some(dx) = dx.as_mut().and_then(Iterator::next) {
                input_cols(g, name, w, dym, &mut dcols)?;
                g.col2im(&dcols, dx);
            }
        }
        Ok(acc)
    }

    /// [`Conv2dBackward::chunk`] for the conv block, in the wide layout:
    /// each sample's output gradient rebuilt from the pooled one.
    fn chunk_wide(
        &self,
        u: &Unpool,
        x: &[f32],
        w: &[f32],
        gp: &[f32],
        at: &[u8],
        dx: Option<&mut [f32]>,
    ) -> candle_core::Result<Vec<f32>> {
        let (g, name) = (self.geom, self.name());
        let (wlen, n, plen) = (g.cout * g.k(), g.ohw_wide(), u.pooled_len(g));
        let mut acc = vec![0f32; wlen + g.cout];
        let mut xp = vec![0f32; g.padded_len()];
        let input_grad = dx.is_some();
        let mut scratch = g.wide_grad_scratch(w, input_grad);
        let mut dy = vec![0f32; g.cout * n];
        let mut dxp = vec![0f32; if input_grad { g.padded_len() } else { 0 }];
        let mut dcols = vec![0f32; if input_grad { g.k() * n } else { 0 }];
        let mut dx = dx.map(|d| d.chunks_mut(g.in_len()));
        for (i, x) in x.chunks(g.in_len()).enumerate() {
            pulp::Arch::new().dispatch(UnpoolLoop {
                u,
                geom: g,
                gp: &gp[i * plen..][..plen],
                at: &at[i * plen..][..plen],
                dy: &mut dy,
            });
            g.pad_into(x, &mut xp);
            let (dw, db) = acc.split_at_mut(wlen);
            // dW (Cout, K) += dy (Cout, oh*wp) * cols^T (oh*wp, K); junk columns of dy are 0
            g.weight_grad_wide(name, &xp, &dy, dw, &mut scratch)?;
            add_row_sums(db, &dy, n);
            if let Some(dx) = dx.as_mut().and_then(Iterator::next) {
                g.input_cols_wide(name, w, &dy, &mut dcols, &mut scratch)?;
                dxp.fill(0.0);
                g.col2im_wide(&dcols, &mut dxp);
                g.unpad_into(&dxp, dx);
            }
        }
        g.finish_weight_grad(&scratch, &mut acc[..wlen]);
        Ok(acc)
    }

    /// `[dW | db]` of the whole batch into `dwb` (dW as `(Cout, Cin, kh, kw)`),
    /// and dx into `dx` when the input needs it.
    fn accumulate(
        &self,
        x: &[f32],
        w: &[f32],
        dy: &[f32],
        dwb: &mut [f32],
        dx: &mut [f32],
    ) -> candle_core::Result<()> {
        let g = self.geom;
        if g.patch_backward() && self.unpool.is_none() {
            let dx = self.input_grad.then_some(dx);
            g.backward_patch((x, w, dy), dwb, dx);
            return Ok(());
        }
        // Stride 1 on maps that take per-sample GEMMs: dx as a forward
        // convolution of dy, after dW and db. Small maps (batched) keep
        // w^T * dy: their Cout is large, so that GEMM is not thin, and
        // flipping their large weights costs more than it saves (ResNet-18's
        // last stage at 64 px: 2x2 maps under 512 x 4608 weights).
        let path = g.weight_grad_path();
        if matches!(path, Path::PixelMajor | Path::Winograd) && self.unpool.is_none() {
            if path == Path::Winograd {
                g.weight_grad_winograd(self.name(), x, dy, dwb)?;
            } else {
                g.weight_grad_nhwc(self.name(), x, dy, dwb)?;
            }
            if self.input_grad {
                let name = self.name();
                match g.transposed() {
                    Some(t) => g.input_grad_as_conv(&t, name, w, dy, dx)?,
                    None if g.batched() => {
                        g.input_grad_whole(name, &g.permute_taps(w, false), dy, dx)?
                    }
                    // Strided bf16 convolutions on large maps: a whole-batch
                    // `w^T * dy` would be a (K, B * oh*ow) matrix (58 MB on
                    // ResNet-18's 56 -> 28 one at batch 32).
                    None => input_grad_per_sample(g, name, &g.permute_taps(w, false), dy, dx)?,
                }
            }
            return Ok(());
        }
        let as_conv = g
            .transposed()
            .filter(|_| self.input_grad && self.unpool.is_none() && !g.batched());
        let stored_w = w;
        let w = g.permute_taps(w, false);
        if g.batched() && self.unpool.is_none() {
            let dx = self.input_grad.then_some(dx);
            g.backward_whole(self.name(), (x, &w, dy), dwb, dx)?;
            g.unpermute_weight_grad(dwb);
            return Ok(());
        }
        let per = g.per_chunk();
        let dx_chunks: Vec<Option<&mut [f32]>> = if self.input_grad && as_conv.is_none() {
            dx.chunks_mut(per * g.in_len()).map(Some).collect()
        } else {
            (0..g.b.div_ceil(per)).map(|_| None).collect()
        };
        let dy_chunks: Vec<Dy<'_>> = match &self.unpool {
            None => dy.chunks(per * g.out_len()).map(Dy::Full).collect(),
            Some(u) if u.pooled_len(g) == 0 => (0..g.b.div_ceil(per))
                .map(|_| Dy::Pooled(u, &[], &[]))
                .collect(),
            Some(u) => {
                let n = per * u.pooled_len(g);
                dy.chunks(n)
                    .zip(u.argmax.chunks(n))
                    .map(|(gp, at)| Dy::Pooled(u, gp, at))
                    .collect()
            }
        };
        // Each chunk accumulates its own [dW | db]; summed below in chunk order.
        let partials = x
            .par_chunks(per * g.in_len())
            .zip(dy_chunks)
            .zip(dx_chunks)
            .map(|((x, dy), dx)| self.chunk(x, &w, dy, dx))
            .collect::<candle_core::Result<Vec<_>>>()?;
        for p in partials {
            for (d, s) in dwb.iter_mut().zip(p) {
                *d += s;
            }
        }
        if let Some(t) = as_conv {
            g.input_grad_as_conv(&t, self.name(), stored_w, dy, dx)?;
        }
        g.unpermute_weight_grad(dwb);
        Ok(())
    }
}

impl CustomOp3 for Conv2dBackward {
    fn name(&self) -> &'static str {
        "redline-conv2d-backward"
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
        let dy_len = match &self.unpool {
            None => g.b * g.out_len(),
            Some(u) => g.b * u.pooled_len(g),
        };
        let [x, w, dy] = g.operands(
            name,
            [(s1, l1), (s2, l2), (s3, l3)],
            ("output grad", dy_len),
        )?;
        let saved = self.unpool.as_ref().map_or(dy_len, |u| u.argmax.len());
        g.check(name, &[("saved maxima", saved, dy_len)])?;
        let wlen = g.cout * g.k() + g.cout;
        let dx_len = if self.input_grad { x.len() } else { 0 };
        let own = if self.buffers.is_some() { 0 } else { wlen };
        let mut out = crate::slices::zeros_par::<f32>(own + dx_len);
        let shape = Shape::from(out.len());
        let (own_dwb, dx) = out.split_at_mut(own);
        match &self.buffers {
            Some((wbuf, bbuf)) => {
                let mut dwb = vec![0f32; wlen];
                if g.b > 0 {
                    self.accumulate(x, w, dy, &mut dwb, dx)?;
                }
                let (dw, db) = dwb.split_at(g.cout * g.k());
                wbuf.add(dw);
                bbuf.add(db);
            }
            // Straight into the output's zeros.
            None if g.b > 0 => self.accumulate(x, w, dy, own_dwb, dx)?,
            None => {}
        }
        Ok((CpuStorage::F32(out), shape))
    }
}

/// `[dW | db]` (dW as `(Cout, Cin, kh, kw)`) and, with `input_grad`, dx of
/// a plain convolution of geometry `geom` over contiguous `x`, `w`, `dy`:
/// the fused backward's arithmetic without its op (the grouped convolution
/// runs it per group).
pub(super) fn plain_grads(
    geom: Geom,
    input_grad: bool,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
) -> candle_core::Result<(Vec<f32>, Vec<f32>)> {
    let op = Conv2dBackward {
        geom,
        input_grad,
        buffers: None,
        unpool: None,
    };
    let mut dwb = vec![0f32; geom.cout * geom.k() + geom.cout];
    let mut dx = vec![0f32; if input_grad { x.len() } else { 0 }];
    if geom.b > 0 {
        op.accumulate(x, w, dy, &mut dwb, &mut dx)?;
    }
    Ok((dwb, dx))
}
