//! 2-D convolution (stride 1, zero padding, bias) with a fused CPU kernel.
//!
//! candle 0.11's CPU conv2d backward runs a conv-transpose for the input
//! gradient and a conv over transposed tensors for the weight gradient; on a
//! small CNN that is most of the step. Here the forward is im2col + GEMM per
//! sample, and one fused backward kernel computes dW and db (GEMM of the
//! output gradient with the im2col matrix) and, only when the input needs a
//! gradient, dx (GEMM + col2im). Samples are split across the compute
//! threads; each GEMM is small, so it stays on its thread.
//!
//! On a GPU with `--fused-kernels` on, the convolution is Redline's
//! implicit GEMM (`cuda/conv.cu`, [`crate::conv_igemm`]) and the bias candle's add.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::conv_backward::backward;
use crate::error::{Error, Result};
use crate::gemm::Mat;
use crate::gemm_bf16;
use crate::grad::{layer_buffers, Param, ParamBuffers};
use crate::half16::bf16_rounded;
use crate::slices::{f32s, fused_cpu};
use redline_core::trace;

/// 2-D convolution with bias, stride 1, dilation 1, one group: PyTorch's
/// `F.conv2d(x, w, b, padding=padding)`.
///
/// `x (B, Cin, H, W)`, `w (Cout, Cin, kh, kw)`, `b (Cout)` ->
/// `(B, Cout, H + 2p - kh + 1, W + 2p - kw + 1)`. CPU f32 tensors take the
/// fused kernel (the input gradient is computed only when `x` is tracked),
/// CUDA tensors of one dtype the implicit-GEMM kernels where
/// `--fused-kernels` turned them on (bf16 and f16, on tensor cores, with
/// [`crate::fused_gpu::reduced_precision`]); anything else takes
/// [`conv2d_generic`]. The weight's and bias's
/// gradients come back in candle's `GradStore`.
pub fn conv2d(x: &Tensor, w: &Tensor, b: &Tensor, padding: usize) -> Result<Tensor> {
    conv2d_with(x, w, b, padding, None)
}

/// [`conv2d`] over parameters: where the fused kernel runs, its backward
/// writes dW and db into `w.grad()` and `b.grad()`, otherwise they come in
/// the `GradStore` for [`Param::absorb`].
pub fn conv2d_param(x: &Tensor, w: &Param, b: &Param, padding: usize) -> Result<Tensor> {
    let buffers = layer_buffers(w, b);
    conv2d_with(x, w.as_tensor(), b.as_tensor(), padding, buffers)
}

pub(crate) fn conv2d_with(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    padding: usize,
    buffers: Option<ParamBuffers>,
) -> Result<Tensor> {
    conv2d_strided_with(x, w, b, (padding, 1), buffers)
}

/// The convolution with windows `stride` apart: Redline's implicit GEMM on
/// CUDA where it is on (stride 1), the fused im2col + GEMM kernel for CPU
/// f32 tensors, candle's convolution otherwise.
fn conv2d_strided_with(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    (padding, stride): (usize, usize),
    buffers: Option<ParamBuffers>,
) -> Result<Tensor> {
    conv2d_routed(x, w, b, (padding, stride), buffers, DType::F32)
}

/// [`conv2d_strided_with`] with its CPU products in `gemm`: F32, or BF16
/// for the native bf16 GEMM (im2col; every operand rounded to bf16 as it is
/// packed, the sums in f32).
fn conv2d_routed(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    (padding, stride): (usize, usize),
    buffers: Option<ParamBuffers>,
    gemm: DType,
) -> Result<Tensor> {
    let geom = Geom {
        gemm,
        ..Geom::strided(x, w, b, padding, stride)?
    };
    #[cfg(feature = "cuda")]
    if stride == 1
        && x.device().is_cuda()
        && crate::fused_gpu::takes(x.dtype())
        && [w, b].iter().all(|t| t.dtype() == x.dtype())
    {
        // Redline's implicit-GEMM convolution (16-bit: on tensor cores),
        // then candle's bias add.
        let y = crate::cuda::conv::conv2d(x, w, padding)?;
        return Ok(y.broadcast_add(&b.reshape((1, geom.cout, 1, 1))?)?);
    }
    if ![x, w, b].into_iter().all(fused_cpu) {
        let y = x.conv2d(w, padding, stride, 1, 1)?;
        return Ok(y.broadcast_add(&b.reshape((1, geom.cout, 1, 1))?)?);
    }
    let op = Conv2dOp {
        geom,
        input_grad: x.track_op(),
        layer: trace::current_layer(),
        buffers,
    };
    Ok(x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, op)?)
}

/// [`conv2d_param`] with windows `stride` apart (PyTorch's
/// `F.conv2d(x, w, b, stride, padding)`): CPU f32 tensors take the im2col +
/// GEMM kernel and its fused backward (the 7x7 stride-2 stems and strided
/// 3x3 and 1x1 downsampling of ResNets); other devices and dtypes candle's
/// convolution.
pub fn conv2d_strided_param(
    x: &Tensor,
    w: &Param,
    b: &Param,
    padding: usize,
    stride: usize,
) -> Result<Tensor> {
    let buffers = layer_buffers(w, b);
    conv2d_strided_with(x, w.as_tensor(), b.as_tensor(), (padding, stride), buffers)
}

/// [`conv2d`] with windows `stride` apart on plain tensors: CPU f32 ones
/// take the fused kernel, dW and db coming back in candle's `GradStore`
/// (what a 16-bit strided convolution runs on its widened operands).
pub fn conv2d_strided(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    padding: usize,
    stride: usize,
) -> Result<Tensor> {
    conv2d_strided_with(x, w, b, (padding, stride), None)
}

/// [`conv2d_strided`] with its CPU products in `gemm` ([`crate::gemm_bf16::route`]'s
/// choice for a 16-bit convolution): BF16 takes the native bf16 GEMM
/// through im2col, every operand rounded to bf16 as it is packed (the
/// values a 16-bit convolution multiplies) and the sums and output in f32;
/// F32 is [`conv2d_strided`]. dW and db come back in candle's `GradStore`.
pub fn conv2d_strided_in(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    (padding, stride): (usize, usize),
    gemm: DType,
) -> Result<Tensor> {
    conv2d_routed(x, w, b, (padding, stride), None, gemm)
}

/// The same convolution from candle's own ops (what `candle_nn::Conv2d`
/// does): runs on every device and dtype, slowly backward on the CPU.
pub fn conv2d_generic(x: &Tensor, w: &Tensor, b: &Tensor, padding: usize) -> Result<Tensor> {
    let cout = w.dim(0)?;
    let y = x.conv2d(w, padding, 1, 1, 1)?;
    Ok(y.broadcast_add(&b.reshape((1, cout, 1, 1))?)?)
}

/// A family of CPU convolution kernels ([`Geom::forward_path`],
/// [`Geom::weight_grad_path`], [`Geom::input_grad_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// im2col (or the input as it lies) and GEMMs.
    Im2col,
    /// The wide direct kernels ([`crate::conv_direct`]).
    Direct,
    /// The pixel-major kernels ([`crate::conv_nhwc`]).
    PixelMajor,
    /// Winograd's F(2x2, 3x3) ([`crate::conv_winograd`]).
    Winograd,
}

impl Path {
    /// The name the timing table prints.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Path::Im2col => "im2col",
            Path::Direct => "direct",
            Path::PixelMajor => "pixel-major",
            Path::Winograd => "winograd",
        }
    }
}

/// Sizes of one convolution, checked once when the op is built.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geom {
    pub(super) b: usize,
    pub(super) cin: usize,
    pub(super) h: usize,
    pub(super) w: usize,
    pub(super) cout: usize,
    pub(super) kh: usize,
    pub(super) kw: usize,
    pub(super) pad: usize,
    /// Step between windows (1 for every fused path but the strided one).
    pub(super) stride: usize,
    pub(super) oh: usize,
    pub(super) ow: usize,
    /// The dtype of the GEMMs' products: F32, or BF16 for the native bf16
    /// kernel (operands already bf16 values; [`crate::gemm_bf16`]).
    pub(super) gemm: DType,
}

impl Geom {
    pub(super) fn new(x: &Tensor, w: &Tensor, b: &Tensor, pad: usize) -> Result<Self> {
        Self::strided(x, w, b, pad, 1)
    }

    /// [`Geom::new`] with windows `stride` apart.
    pub(super) fn strided(
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        pad: usize,
        stride: usize,
    ) -> Result<Self> {
        let bad = || {
            Error::Candle(candle_core::Error::Msg(format!(
                "conv2d: input {:?}, weight {:?}, bias {:?}, padding {pad}, stride {stride}: \
                 expected input (B, Cin, H, W), weight (Cout, Cin, kh, kw), bias (Cout) with \
                 non-zero sizes and stride, and kh <= H + 2*padding, kw <= W + 2*padding",
                x.dims(),
                w.dims(),
                b.dims()
            )))
        };
        let (Ok((bsz, cin, h, wd)), Ok((cout, wcin, kh, kw))) = (x.dims4(), w.dims4()) else {
            return Err(bad());
        };
        let sizes_ok = [cin, h, wd, cout, kh, kw, stride].iter().all(|&n| n > 0);
        if !sizes_ok || wcin != cin || b.dims() != [cout] || kh > h + 2 * pad || kw > wd + 2 * pad {
            return Err(bad());
        }
        Ok(Self::sized(
            bsz,
            (cin, cout),
            (h, wd),
            (kh, kw, pad),
            stride,
        ))
    }

    /// The geometry of checked sizes (f32 products): `b` samples of `(cin,
    /// h, w)`, `cout` kernels of `kh x kw`, padding `pad` and `stride`.
    pub(super) fn sized(
        b: usize,
        (cin, cout): (usize, usize),
        (h, w): (usize, usize),
        (kh, kw, pad): (usize, usize, usize),
        stride: usize,
    ) -> Self {
        Self {
            b,
            cin,
            h,
            w,
            cout,
            kh,
            kw,
            pad,
            stride,
            oh: (h + 2 * pad - kh) / stride + 1,
            ow: (w + 2 * pad - kw) / stride + 1,
            gemm: DType::F32,
        }
    }

    /// Rows of the im2col matrix: `Cin * kh * kw`.
    pub(super) fn k(&self) -> usize {
        self.cin * self.kh * self.kw
    }

    /// Output pixels per channel.
    pub(super) fn ohw(&self) -> usize {
        self.oh * self.ow
    }

    /// Elements of one input sample.
    pub(super) fn in_len(&self) -> usize {
        self.cin * self.h * self.w
    }

    /// Elements of one output sample.
    pub(super) fn out_len(&self) -> usize {
        self.cout * self.ohw()
    }

    /// Samples per thread chunk.
    pub(super) fn per_chunk(&self) -> usize {
        self.b.div_ceil(crate::gemm::threads()).max(1)
    }

    /// Output columns `lo..hi` whose input column `ox * stride + kx - pad`
    /// lies inside the image, and the input column of `lo`; `None` when
    /// there are none.
    pub(super) fn col_span(&self, kx: usize) -> Option<(usize, usize, usize)> {
        let s = self.stride;
        let lo = self.pad.saturating_sub(kx).div_ceil(s);
        let hi = (self.w + self.pad)
            .saturating_sub(kx)
            .div_ceil(s)
            .min(self.ow);
        (lo < hi).then(|| (lo, hi, lo * s + kx - self.pad))
    }

    /// Input row of output row `oy` under kernel row `ky`, if inside the image.
    pub(super) fn in_row(&self, oy: usize, ky: usize) -> Option<usize> {
        (oy * self.stride + ky)
            .checked_sub(self.pad)
            .filter(|&iy| iy < self.h)
    }

    /// (input channel, kernel row, kernel column) of im2col row `r`. Rows run
    /// `(ky, kx, ci)` with the channel fastest, as in candle's CPU conv: the
    /// same summation order gives the same rounding, and max-pool after a
    /// conv breaks near-ties by those last bits (the golden tests see it).
    /// On the whole-batch GEMM paths of small maps ([`Geom::stored_taps`])
    /// they run in the stored weights' order `(ci, ky, kx)`.
    pub(super) fn tap(&self, r: usize) -> (usize, usize, usize) {
        if self.stored_taps() {
            let kk = self.kh * self.kw;
            return (r / kk, (r % kk) / self.kw, r % self.kw);
        }
        (
            r % self.cin,
            r / (self.cin * self.kw),
            (r / self.cin) % self.kw,
        )
    }

    /// The im2col row of tap `(ci, ky, kx)` ([`Geom::tap`]'s inverse).
    pub(super) fn row(&self, ci: usize, ky: usize, kx: usize) -> usize {
        if self.stored_taps() {
            (ci * self.kh + ky) * self.kw + kx
        } else {
            (ky * self.kw + kx) * self.cin + ci
        }
    }

    /// Whether im2col rows run in the stored weights' order: the
    /// whole-batch GEMMs of small maps ([`Geom::batched`], not pixel-major),
    /// whose weights and weight gradient then need no permute (three a
    /// step of 9.4 MB each on ResNet's last stage: 16% of ResNet-18's step
    /// at 64 px).
    pub(super) fn stored_taps(&self) -> bool {
        self.batched() && !self.nhwc()
    }

    /// dW at the front of `dwb` back from the im2col row order to
    /// `(Cout, Cin, kh, kw)`.
    pub(super) fn unpermute_weight_grad(&self, dwb: &mut [f32]) {
        if self.stored_taps() || self.kh * self.kw == 1 {
            return;
        }
        let (dw, _) = dwb.split_at_mut(self.cout * self.k());
        let dw_std = self.permute_taps(dw, true).into_owned();
        dw.copy_from_slice(&dw_std);
    }

    /// Weights `(Cout, Cin, kh, kw)` -> `(Cout, kh, kw, Cin)`, the im2col row
    /// order; with `back`, the inverse; as they are where the rows run in
    /// the stored order ([`Geom::stored_taps`]).
    pub(super) fn permute_taps<'a>(&self, w: &'a [f32], back: bool) -> Cow<'a, [f32]> {
        let (k, kk, cin) = (self.k(), self.kh * self.kw, self.cin);
        let n = w.len();
        // One tap (1x1 kernels): both orders are the same.
        if self.stored_taps() || kk == 1 || k == 0 || !n.is_multiple_of(k) {
            return Cow::Borrowed(w);
        }
        // Rows (one per output channel) in parallel, each written in order
        // into the uninitialised buffer (no zeroing pass: 9.4 MB on ResNet's
        // 512 x 4608 layers, three times a step each; the permutes were 16%
        // of ResNet-18's step at 64 px), read across the row (in cache); no
        // division per element.
        let mut out: Vec<f32> = Vec::with_capacity(n);
        out.spare_capacity_mut()[..n]
            .par_chunks_mut(k)
            .zip(w.par_chunks(k))
            .for_each(|(o, i)| {
                let mut dst = o.iter_mut();
                if back {
                    // (ci, ky, kx) in order, read from (ky, kx, ci).
                    for ci in 0..cin {
                        for t in 0..kk {
                            if let Some(d) = dst.next() {
                                d.write(i[t * cin + ci]);
                            }
                        }
                    }
                } else {
                    // (ky, kx, ci) in order, read from (ci, ky, kx).
                    for t in 0..kk {
                        for ci in 0..cin {
                            if let Some(d) = dst.next() {
                                d.write(i[ci * kk + t]);
                            }
                        }
                    }
                }
            });
        // SAFETY: `n` is a multiple of `k`, so the chunks cover the `n`
        // elements, and each chunk's `cin * kk = k` elements were written.
        unsafe { out.set_len(n) };
        Cow::Owned(out)
    }

    /// One sample's `(Cin, H, W)` input as the `(kh*kw*Cin, oh*ow)` matrix
    /// whose column is the receptive field of one output pixel (zero where
    /// the window hangs over the padding); rows in [`Geom::tap`] order.
    pub(super) fn im2col(&self, x: &[f32], cols: &mut [f32]) {
        if self.gathers() {
            return self.im2col_gather(x, cols);
        }
        self.im2col_copies(x, cols);
    }

    /// [`Geom::im2col`] by row copies (long output rows).
    pub(super) fn im2col_copies(&self, x: &[f32], cols: &mut [f32]) {
        if self.stride > 1 {
            return self.im2col_strided(x, cols);
        }
        let hw = self.h * self.w;
        for (r, row) in cols.chunks_mut(self.ohw()).enumerate() {
            let (ci, ky, kx) = self.tap(r);
            self.im2col_row(&x[ci * hw..(ci + 1) * hw], (ky, kx), row);
        }
    }

    /// One im2col row of one sample: tap `(ky, kx)` of the input plane
    /// `plane` at every output pixel (`row`: `oh*ow` values), zero where the
    /// window hangs over the padding. Any stride.
    fn im2col_row(&self, plane: &[f32], (ky, kx): (usize, usize), row: &mut [f32]) {
        let span = self.col_span(kx);
        for (oy, orow) in row.chunks_mut(self.ow).enumerate() {
            match (self.in_row(oy, ky), span) {
                (Some(iy), Some((lo, hi, ix))) => {
                    orow[..lo].fill(0.0);
                    let src = &plane[iy * self.w + ix..];
                    if self.stride == 1 {
                        orow[lo..hi].copy_from_slice(&src[..hi - lo]);
                    } else {
                        let taken = src.iter().step_by(self.stride);
                        for (o, &v) in orow[lo..hi].iter_mut().zip(taken) {
                            *o = v;
                        }
                    }
                    orow[hi..].fill(0.0);
                }
                _ => orow.fill(0.0),
            }
        }
    }

    /// The im2col matrices of the samples in `x` side by side, `(K, n *
    /// oh*ow)` with sample `s`'s columns at `s * oh*ow`, written in place:
    /// rows in parallel, each row's tap found once for all samples (on 2x2
    /// and 4x4 maps the per-sample matrices and the copy that laid them
    /// side by side cost more than their GEMMs).
    pub(super) fn batch_cols(&self, x: &[f32]) -> Vec<f32> {
        let (k, p, len) = (self.k(), self.ohw(), self.in_len());
        let n = x.len() / len.max(1);
        let hw = self.h * self.w;
        let total = k * n * p;
        let mut cols: Vec<f32> = Vec::with_capacity(total);
        let table = self.gathers().then(|| self.gather_table());
        if total > 0 {
            let rows = cols.spare_capacity_mut()[..total].par_chunks_mut(n * p);
            rows.enumerate().for_each(|(r, row)| {
                // Zeroed here, in the cache of the thread about to write it
                // (im2col_row writes every value; a separate zero fill was a
                // pass over the whole matrix).
                row.fill(std::mem::MaybeUninit::new(0.0));
                // SAFETY: every element was initialised just above, and
                // `MaybeUninit<f32>` has `f32`'s layout.
                let row = unsafe { &mut *(std::ptr::from_mut(row) as *mut [f32]) };
                let (ci, ky, kx) = self.tap(r);
                for (seg, xs) in row.chunks_mut(p).zip(x.chunks(len.max(1))) {
                    let plane = &xs[ci * hw..(ci + 1) * hw];
                    match &table {
                        Some(t) => crate::conv_gather::gather(plane, self.taps(t, ky, kx), seg),
                        None => self.im2col_row(plane, (ky, kx), seg),
                    }
                }
            });
        }
        // SAFETY: the capacity holds `total` values, and the `k` rows of
        // `n * p` (all `total` of them) were initialised above.
        unsafe { cols.set_len(total) };
        cols
    }

    /// Whether the im2col matrix is the input itself: a 1x1 kernel, stride
    /// 1, no padding (ResNet-50's bottleneck convolutions).
    pub(super) fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == 1 && self.pad == 0
    }

    /// One sample's im2col matrix: `x` itself when [`Geom::pointwise`], else
    /// built in `scratch`.
    pub(super) fn cols_of<'a>(&self, x: &'a [f32], scratch: &'a mut [f32]) -> &'a [f32] {
        if self.pointwise() {
            return x;
        }
        self.im2col(x, scratch);
        scratch
    }

    /// The adjoint of [`Geom::im2col`]: adds each column entry back onto the
    /// input pixel it was read from (`dx` must start zeroed).
    pub(super) fn col2im(&self, cols: &[f32], dx: &mut [f32]) {
        if self.gathers() {
            return self.col2im_gather(&self.gather_table(), cols, (0, 1), dx);
        }
        self.col2im_copies(cols, dx);
    }

    /// [`Geom::col2im`] by row segments (long output rows).
    pub(super) fn col2im_copies(&self, cols: &[f32], dx: &mut [f32]) {
        if self.stride > 1 {
            return self.col2im_strided(cols, dx);
        }
        let hw = self.h * self.w;
        for (r, row) in cols.chunks(self.ohw()).enumerate() {
            let (ci, ky, kx) = self.tap(r);
            let Some((lo, hi, ix)) = self.col_span(kx) else {
                continue;
            };
            let plane = &mut dx[ci * hw..(ci + 1) * hw];
            for (oy, orow) in row.chunks(self.ow).enumerate() {
                if let Some(iy) = self.in_row(oy, ky) {
                    let dst = plane[iy * self.w + ix..].iter_mut().step_by(self.stride);
                    for (d, s) in dst.zip(&orow[lo..hi]) {
                        *d += s;
                    }
                }
            }
        }
    }

    /// Whether the samples of a thread's chunk are multiplied side by side
    /// (one GEMM of `n * oh * ow` columns) rather than one by one: for
    /// output maps under 64 pixels, where a sample's GEMM is too thin to
    /// use the weights it reads.
    pub(super) fn batched(&self) -> bool {
        self.ohw() < 64
    }

    /// Sample `s`'s `(rows, oh*ow)` block out of a side-by-side matrix.
    pub(super) fn take_sample(&self, all: &[f32], s: usize, one: &mut [f32]) {
        let p = self.ohw();
        let n = all.len() / one.len().max(1);
        for (r, row) in one.chunks_mut(p).enumerate() {
            row.copy_from_slice(&all[(r * n + s) * p..][..p]);
        }
    }

    /// The outputs of the samples in `x` ([`Geom::batched`]), one GEMM for
    /// the chunk, into `y` (samples one after another), the bias added last.
    pub(super) fn forward_batched(
        &self,
        name: &str,
        w: &[f32],
        b: &[f32],
        x: &[f32],
        y: &mut [f32],
    ) -> candle_core::Result<()> {
        let cols = self.batch_cols(x);
        let np = cols.len() / self.k().max(1);
        let mut all = vec![0f32; self.cout * np];
        let (wm, cm) = (
            Mat::new(w, self.cout, self.k()),
            Mat::new(&cols, self.k(), np),
        );
        gemm_or_err(self.gemm, name, &mut all, wm, cm, false)?;
        for (s, ys) in y.chunks_mut(self.out_len()).enumerate() {
            self.take_sample(&all, s, ys);
            for (row, &bias) in ys.chunks_mut(self.ohw()).zip(b) {
                row.iter_mut().for_each(|v| *v += bias);
            }
        }
        Ok(())
    }

    /// One sample's output `y (Cout, oh*ow)` from its input `x`, with the
    /// weights `w` in im2col row order and `cols` as scratch.
    pub(super) fn forward_sample(
        &self,
        name: &str,
        w: &[f32],
        b: &[f32],
        x: &[f32],
        cols: &mut [f32],
        y: &mut [f32],
    ) -> candle_core::Result<()> {
        let cols = self.cols_of(x, cols);
        // y (Cout, oh*ow) = w (Cout, K) * cols (K, oh*ow) + bias, the bias
        // added last as candle's conv + broadcast_add do.
        let (wm, cm) = (
            Mat::new(w, self.cout, self.k()),
            Mat::new(cols, self.k(), self.ohw()),
        );
        gemm_or_err(self.gemm, name, y, wm, cm, false)?;
        for (row, &bias) in y.chunks_mut(self.ohw()).zip(b) {
            row.iter_mut().for_each(|v| *v += bias);
        }
        Ok(())
    }

    /// The kernels that run this convolution's forward: Winograd
    /// ([`Geom::winograd`]), pixel-major ([`Geom::nhwc`]), direct
    /// ([`Geom::direct`]) or im2col.
    pub(super) fn forward_path(&self) -> Path {
        if self.winograd() {
            Path::Winograd
        } else if self.nhwc() || self.nhwc16() {
            Path::PixelMajor
        } else if self.direct() {
            Path::Direct
        } else {
            Path::Im2col
        }
    }

    /// The kernels that run the weight gradient (fused backward, no conv
    /// block): Winograd ([`Geom::winograd_weight_grad`]), pixel-major
    /// ([`Geom::nhwc_backward`]), whole-batch GEMMs on small maps, direct
    /// ([`Geom::direct_weight_grad`]) or per-sample GEMMs.
    pub(super) fn weight_grad_path(&self) -> Path {
        if self.winograd_weight_grad() {
            Path::Winograd
        } else if self.nhwc_backward() {
            Path::PixelMajor
        } else if !self.batched() && self.direct_weight_grad() {
            Path::Direct
        } else {
            Path::Im2col
        }
    }

    /// The kernels that run the input gradient: the transposed
    /// convolution's forward where there is one ([`Geom::transposed`]; not
    /// on small maps that take whole-batch GEMMs), else `w^T * dy` and
    /// col2im.
    pub(super) fn input_grad_path(&self) -> Path {
        match self.transposed() {
            Some(t) if !self.batched() || self.nhwc_backward() || self.winograd() => {
                t.forward_path()
            }
            _ => Path::Im2col,
        }
    }

    /// The outputs of all samples of `x` into `out`, with the weights `w`
    /// in im2col row order, by [`Geom::forward_path`]: the pixel-major or
    /// direct kernels, else the samples split across the compute threads,
    /// each chunk one GEMM ([`Geom::batched`]) or one per sample.
    pub(super) fn forward_all(
        &self,
        name: &str,
        w: &[f32],
        b: &[f32],
        x: &[f32],
        out: &mut [f32],
    ) -> candle_core::Result<()> {
        match self.forward_path() {
            Path::PixelMajor => {
                let k = self.k();
                let panels =
                    self.nhwc_panels_from(|co, ci, ky, kx| w[co * k + self.row(ci, ky, kx)]);
                self.forward_nhwc(name, &panels, b, x, out)
            }
            Path::Winograd => {
                let k = self.k();
                let u = self.wino_weights(|ci, co| {
                    std::array::from_fn(|t| w[co * k + self.row(ci, t / 3, t % 3)])
                });
                self.forward_winograd(name, &u, b, x, out)
            }
            Path::Direct => self.forward_direct(name, w, b, x, out),
            Path::Im2col => self.forward_im2col(name, w, b, x, out),
        }
    }

    /// [`Geom::forward_all`] through im2col and GEMMs: the samples split
    /// across the compute threads, each chunk one GEMM ([`Geom::batched`])
    /// or one per sample.
    pub(super) fn forward_im2col(
        &self,
        name: &str,
        w: &[f32],
        b: &[f32],
        x: &[f32],
        out: &mut [f32],
    ) -> candle_core::Result<()> {
        let per = self.per_chunk();
        out.par_chunks_mut(per * self.out_len())
            .zip(x.par_chunks(per * self.in_len()))
            .try_for_each(|(out, x)| {
                if self.batched() {
                    return self.forward_batched(name, w, b, x, out);
                }
                let scratch = if self.pointwise() {
                    0
                } else {
                    self.k() * self.ohw()
                };
                let mut cols = vec![0f32; scratch];
                for (y, x) in out.chunks_mut(self.out_len()).zip(x.chunks(self.in_len())) {
                    self.forward_sample(name, w, b, x, &mut cols, y)?;
                }
                Ok(())
            })
    }

    /// The three f32 operands of a conv kernel, `(input, weight, third)`,
    /// each checked against the length the geometry gives it; `third` names
    /// the last one (bias, output gradient...) and its expected length.
    pub(super) fn operands<'a>(
        &self,
        name: &str,
        ops: [(&'a CpuStorage, &Layout); 3],
        third: (&str, usize),
    ) -> candle_core::Result<[&'a [f32]; 3]> {
        let [(s1, l1), (s2, l2), (s3, l3)] = ops;
        let (x, w, t) = (
            f32s(s1, l1, name)?,
            f32s(s2, l2, name)?,
            f32s(s3, l3, name)?,
        );
        self.check(
            name,
            &[
                ("input", x.len(), self.b * self.in_len()),
                ("weight", w.len(), self.cout * self.k()),
                (third.0, t.len(), third.1),
            ],
        )?;
        Ok([x, w, t])
    }

    /// Checks the operand lengths against the geometry.
    pub(super) fn check(
        &self,
        name: &str,
        got: &[(&str, usize, usize)],
    ) -> candle_core::Result<()> {
        for &(what, len, want) in got {
            if len != want {
                bail!("{name}: {what} has {len} elements, expected {want} for {self:?}");
            }
        }
        Ok(())
    }
}

/// `dst = [dst +] a * b` as a product in `dtype` ([`gemm_bf16::matmul_in`]),
/// or a candle error naming the op when the shapes disagree (they cannot
/// once [`Geom`] checked them).
pub(super) fn gemm_or_err(
    dtype: DType,
    name: &str,
    dst: &mut [f32],
    a: Mat<'_>,
    b: Mat<'_>,
    acc: bool,
) -> candle_core::Result<()> {
    if !gemm_bf16::matmul_in(dtype, dst, a, b, acc) {
        bail!(
            "{name}: GEMM shapes disagree ({}x{} * {}x{})",
            a.rows,
            a.cols,
            b.rows,
            b.cols
        )
    }
    Ok(())
}

/// The forward op: `(x, w, b) -> y`, all contiguous f32 on the CPU.
struct Conv2dOp {
    geom: Geom,
    /// Whether `x` was tracked at forward time; if not, no dx is computed.
    input_grad: bool,
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
    /// Where dW and db go, when the layer's parameters were given.
    buffers: Option<ParamBuffers>,
}

impl CustomOp3 for Conv2dOp {
    fn name(&self) -> &'static str {
        "redline-conv2d"
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
        trace::count("conv2d.forward");
        let [x, w, b] = g.operands(name, [(s1, l1), (s2, l2), (s3, l3)], ("bias", g.cout))?;
        let shape = Shape::from((g.b, g.cout, g.oh, g.ow));
        let mut out = crate::slices::zeros_par::<f32>(g.b * g.out_len());
        if g.b == 0 {
            return Ok((CpuStorage::F32(out), shape));
        }
        if g.patch_forward() {
            g.forward_patch(w, b, x, &mut out);
        } else if g.forward_path() == Path::Winograd {
            g.forward_winograd(name, &g.wino_weights_stored(w), b, x, &mut out)?;
        } else if g.forward_path() == Path::PixelMajor {
            g.forward_nhwc(name, &g.nhwc_panels_stored(w), b, x, &mut out)?;
        } else if let Some(f) = g.direct16() {
            let (x, w) = (bf16_rounded(x), bf16_rounded(w));
            f.forward_all(name, &f.permute_taps(&w, false), b, &x, &mut out)?;
        } else {
            g.forward_all(name, &g.permute_taps(w, false), b, x, &mut out)?;
        }
        Ok((CpuStorage::F32(out), shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = trace::backward(self.layer.as_ref(), "conv2d");
        trace::count("conv2d.backward");
        backward(
            self.geom,
            self.input_grad,
            None,
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
    use candle_core::{Device, Var};

    /// Deterministic values in [-1, 1].
    fn data(dims: &[usize], seed: f32) -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
        Ok(Tensor::from_vec(v, dims, &Device::Cpu)?)
    }

    fn max_rel_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
        assert_eq!(a.dims(), b.dims());
        let scale = b.abs()?.max_all()?.to_scalar::<f32>()?.max(1.0);
        Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()? / scale)
    }

    /// (batch, Cin, H, W, Cout, kernel, padding)
    /// The last two have maps of 64 pixels or more (one GEMM a sample), the
    /// others smaller ones (the chunk's samples side by side).
    const SHAPES: [(usize, usize, usize, usize, usize, usize, usize); 10] = [
        // 1x1 kernels without padding: the input is the im2col matrix
        // (per-sample GEMMs at 9x8, whole-batch ones at 3x3).
        (2, 3, 9, 8, 4, 1, 0),
        (3, 5, 3, 3, 2, 1, 0),
        (2, 1, 6, 5, 3, 3, 1),
        (3, 3, 7, 9, 4, 3, 0),
        (2, 3, 8, 6, 2, 5, 1),
        (1, 1, 5, 7, 5, 5, 0),
        (4, 2, 4, 4, 3, 3, 2),
        (3, 2, 3, 5, 2, 5, 2),
        (3, 2, 10, 9, 3, 3, 1),
        (2, 3, 12, 12, 4, 5, 2),
    ];

    #[test]
    fn forward_matches_candle() -> Result<()> {
        for (b, cin, h, w, cout, k, p) in SHAPES {
            let x = data(&[b, cin, h, w], 0.0)?;
            let wt = data(&[cout, cin, k, k], 1.0)?;
            let bias = data(&[cout], 2.0)?;
            let got = conv2d(&x, &wt, &bias, p)?;
            let want = conv2d_generic(&x, &wt, &bias, p)?;
            assert!(
                max_rel_diff(&got, &want)? < 1e-5,
                "shape {:?}",
                (b, cin, h, w, cout, k, p)
            );
        }
        Ok(())
    }

    #[test]
    fn forward_rounds_exactly_like_candle_on_the_cnn_shapes() -> Result<()> {
        // Max-pool after the conv picks among near-equal values by their last
        // bits; the golden tests need the same picks as candle and PyTorch.
        for (b, cin, side, cout) in [(16, 1, 28, 32), (16, 32, 14, 64)] {
            let x = data(&[b, cin, side, side], 0.0)?;
            let (wt, bias) = (
                data(&[cout, cin, 3, 3], 1.0)?.affine(0.1, 0.0)?,
                data(&[cout], 2.0)?,
            );
            let got = conv2d(&x, &wt, &bias, 1)?;
            let want = conv2d_generic(&x, &wt, &bias, 1)?;
            assert_eq!(
                max_rel_diff(&got, &want)?,
                0.0,
                "{:?}",
                (b, cin, side, cout)
            );
        }
        Ok(())
    }

    #[test]
    fn non_contiguous_input_is_accepted() -> Result<()> {
        // (B, W, Cin, H) transposed to (B, Cin, H, W) is a strided view.
        let x = data(&[2, 5, 3, 4], 0.5)?.permute((0, 2, 3, 1))?;
        let (wt, bias) = (data(&[2, 3, 3, 3], 1.0)?, data(&[2], 2.0)?);
        let got = conv2d(&x, &wt, &bias, 1)?;
        assert!(max_rel_diff(&got, &conv2d_generic(&x, &wt, &bias, 1)?)? < 1e-5);
        Ok(())
    }

    #[test]
    fn gradients_match_candle_autograd() -> Result<()> {
        for (b, cin, h, w, cout, k, p) in SHAPES {
            let x = Var::from_tensor(&data(&[b, cin, h, w], 0.0)?)?;
            let wt = Var::from_tensor(&data(&[cout, cin, k, k], 1.0)?)?;
            let bias = Var::from_tensor(&data(&[cout], 2.0)?)?;
            let (oh, ow) = (h + 2 * p - k + 1, w + 2 * p - k + 1);
            // A non-uniform output gradient.
            let r = data(&[b, cout, oh, ow], 3.0)?;
            let run = |f: fn(&Tensor, &Tensor, &Tensor, usize) -> Result<Tensor>| -> Result<_> {
                let y = f(x.as_tensor(), wt.as_tensor(), bias.as_tensor(), p)?;
                let grads = (y * &r)?.sum_all()?.backward()?;
                let get = |v: &Var| grads.get(v.as_tensor()).cloned();
                Ok((get(&x), get(&wt), get(&bias)))
            };
            let got = run(conv2d)?;
            let want = run(conv2d_generic)?;
            for (name, ours, theirs) in [
                ("dx", got.0, want.0),
                ("dW", got.1, want.1),
                ("db", got.2, want.2),
            ] {
                let (Some(ours), Some(theirs)) = (ours, theirs) else {
                    panic!("{name} missing for {:?}", (b, cin, h, w, cout, k, p));
                };
                let d = max_rel_diff(&ours, &theirs)?;
                assert!(
                    d < 1e-4,
                    "{name} differs by {d} for {:?}",
                    (b, cin, h, w, cout, k, p)
                );
            }
        }
        Ok(())
    }

    /// Strided convolutions (ResNet's 7x7 stride-2 stem with padding 3, its
    /// 3x3 and 1x1 stride-2 downsampling, sizes that do not divide) through
    /// the im2col kernel: the output and all three gradients as the stride-1
    /// convolution subsampled gives them through candle's autograd. The
    /// gradients land in the parameters' buffers.
    #[test]
    fn strided_convolutions_match_candle_forward_and_backward() -> Result<()> {
        use crate::grad::Param;
        let shapes = [
            // (b, cin, h, w, cout, k, p, s)
            (2, 3, 13, 11, 4, 7, 3, 2),
            (3, 4, 9, 9, 6, 3, 1, 2),
            (2, 5, 8, 7, 3, 1, 0, 2),
            (1, 2, 10, 10, 2, 3, 0, 3),
            (3, 3, 20, 19, 4, 3, 1, 2),
            // Patches (stride = kernel, no padding: the direct kernels):
            // whole tiles; a remainder row and column with 13 channels (two
            // lane blocks); 16-wide windows (two tap blocks); 3-wide windows
            // and a 2-pixel row (the one-tap and one-pixel tails).
            (2, 3, 16, 16, 8, 8, 0, 8),
            (2, 3, 19, 17, 13, 4, 0, 4),
            (1, 2, 33, 32, 4, 16, 0, 16),
            (3, 2, 7, 8, 3, 3, 0, 3),
            // 28 channels: the GEMM forward, the direct backward; 40: the
            // GEMM both ways.
            (1, 2, 12, 12, 28, 4, 0, 4),
            (1, 2, 8, 8, 40, 2, 0, 2),
        ];
        for (b, cin, h, w, cout, k, p, s) in shapes {
            let what = (b, cin, h, w, cout, k, p, s);
            let x = Var::from_tensor(&data(&[b, cin, h, w], 0.0)?)?;
            let wt = Param::new(Var::from_tensor(&data(&[cout, cin, k, k], 1.0)?)?);
            let bias = Param::new(Var::from_tensor(&data(&[cout], 2.0)?)?);
            let ours = conv2d_strided_param(x.as_tensor(), &wt, &bias, p, s)?;
            // The reference: the stride-1 convolution, every s-th output
            // row and column taken (candle's own strided backward gives an
            // input gradient of the wrong size when the stride does not
            // divide: 8 columns for a 7-column input).
            let full = x
                .as_tensor()
                .conv2d(wt.as_tensor(), p, 1, 1, 1)?
                .broadcast_add(&bias.as_tensor().reshape((1, cout, 1, 1))?)?;
            let every = |n: usize| -> Result<Tensor> {
                let idx: Vec<u32> = (0..(n - 1) / s + 1).map(|i| (i * s) as u32).collect();
                Ok(Tensor::new(idx.as_slice(), &Device::Cpu)?)
            };
            let (fh, fw) = (full.dim(2)?, full.dim(3)?);
            let theirs = full
                .index_select(&every(fh)?, 2)?
                .index_select(&every(fw)?, 3)?;
            assert_eq!(ours.dims(), theirs.dims(), "{what:?}");
            let d = max_rel_diff(&ours, &theirs)?;
            assert!(d < 1e-5, "forward differs by {d} for {what:?}");
            let r = data(theirs.dims(), 3.0)?;
            let mut g_ours = (ours * &r)?.sum_all()?.backward()?;
            let g_theirs = (theirs * &r)?.sum_all()?.backward()?;
            for param in [&wt, &bias] {
                param.absorb(&mut g_ours)?;
            }
            let dx = g_ours.get(x.as_tensor()).cloned();
            for (name, got, want) in [
                ("dx", dx, g_theirs.get(x.as_tensor()).cloned()),
                (
                    "dW",
                    wt.grad().to_tensor(wt.as_tensor())?,
                    g_theirs.get(wt.as_tensor()).cloned(),
                ),
                (
                    "db",
                    bias.grad().to_tensor(bias.as_tensor())?,
                    g_theirs.get(bias.as_tensor()).cloned(),
                ),
            ] {
                let (Some(got), Some(want)) = (got, want) else {
                    panic!("{name} missing for {what:?}");
                };
                let d = max_rel_diff(&got, &want)?;
                assert!(d < 1e-4, "{name} differs by {d} for {what:?}");
            }
        }
        Ok(())
    }

    #[test]
    fn untracked_input_gets_no_gradient() -> Result<()> {
        let x = data(&[2, 1, 5, 5], 0.0)?;
        let wt = Var::from_tensor(&data(&[3, 1, 3, 3], 1.0)?)?;
        let bias = Var::from_tensor(&data(&[3], 2.0)?)?;
        let y = conv2d(&x, wt.as_tensor(), bias.as_tensor(), 1)?;
        let grads = y.sqr()?.sum_all()?.backward()?;
        assert!(grads.get(&x).is_none());
        assert!(grads.get(wt.as_tensor()).is_some());
        assert!(grads.get(bias.as_tensor()).is_some());
        Ok(())
    }

    #[test]
    fn bad_shapes_are_errors() -> Result<()> {
        let x = data(&[1, 2, 4, 4], 0.0)?;
        let bias = data(&[3], 0.0)?;
        // Channel mismatch, kernel larger than the padded image, wrong bias.
        assert!(conv2d(&x, &data(&[3, 1, 3, 3], 0.0)?, &bias, 0).is_err());
        assert!(conv2d(&x, &data(&[3, 2, 7, 7], 0.0)?, &bias, 1).is_err());
        assert!(conv2d(&x, &data(&[3, 2, 3, 3], 0.0)?, &data(&[2], 0.0)?, 0).is_err());
        Ok(())
    }
}
