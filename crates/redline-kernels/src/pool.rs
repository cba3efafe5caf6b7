//! Max pooling with PyTorch's gradient semantics.
//!
//! candle 0.11's max-pool backward scales the gradient by
//! (number of maxima)/(k*k) instead of routing it to the maximum, so a window
//! with one maximum passes back a quarter of its gradient (2x2). Here the
//! first maximum of each window (row-major) receives the whole gradient, as in
//! PyTorch: a fused CPU kernel for f32 (the backward recomputes each window's
//! argmax from the input), and a version built from differentiable candle
//! primitives for every other device and dtype.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor, D};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::gemm;
use crate::slices::{f32s, fused_cpu, half_cpu, widened};
use redline_core::trace;

/// Max pooling with a `k x k` window and stride `k` (PyTorch's `MaxPool2d(k)`,
/// floor mode): `(B, C, H, W) -> (B, C, H/k, W/k)`. CPU f32 tensors take the
/// fused kernel, anything else [`max_pool2d_generic`].
pub fn max_pool2d(x: &Tensor, k: usize) -> Result<Tensor> {
    check(x, k)?;
    if half_cpu(x) {
        return widened(x, |x| max_pool2d(x, k));
    }
    if fused_cpu(x) {
        let layer = trace::current_layer();
        Ok(x.contiguous()?.apply_op1(MaxPool2d { k, layer })?)
    } else {
        max_pool2d_generic(x, k)
    }
}

/// Refuses a zero window and anything but a 4-D input.
fn check(x: &Tensor, k: usize) -> Result<()> {
    if k == 0 || x.rank() != 4 {
        return Err(Error::Candle(candle_core::Error::Msg(format!(
            "max_pool2d: input {:?}, window {k}: expected a (B, C, H, W) input and a window of at least 1",
            x.dims()
        ))));
    }
    Ok(())
}

/// Max pooling with a `k x k` window and stride `k` (PyTorch's `MaxPool2d(k)`,
/// floor mode): `(B, C, H, W) -> (B, C, H/k, W/k)`. Built from generic candle
/// ops, so it runs (and differentiates correctly) on every device.
pub fn max_pool2d_generic(x: &Tensor, k: usize) -> Result<Tensor> {
    check(x, k)?;
    let (b, c, h, w) = x.dims4()?;
    let (oh, ow) = (h / k, w / k);
    if oh == 0 || ow == 0 {
        // Nothing to pool (and candle's argmax refuses empty windows' rows).
        return Ok(Tensor::zeros((b, c, oh, ow), x.dtype(), x.device())?);
    }
    let x = if oh * k != h || ow * k != w {
        x.narrow(2, 0, oh * k)?.narrow(3, 0, ow * k)?
    } else {
        x.clone()
    };
    // (B, C, oh, k, ow, k) -> (B, C, oh, ow, k*k): one row per window.
    let windows = x
        .contiguous()?
        .reshape((b, c, oh, k, ow, k))?
        .permute((0, 1, 2, 4, 3, 5))?
        .contiguous()?
        .reshape((b, c, oh, ow, k * k))?;
    // The first maximum of each window: the smallest slot holding the
    // window's maximum, on every device. Not `argmax`, whose CUDA kernel
    // reduces in parallel and promises no particular one of tied maxima;
    // the plain regions of real images tie often (82,165 windows of the
    // golden CNN's first batch). A window holding a NaN finds no slot; its
    // sum below is NaN all the same (NaN * 0).
    first_max(&windows)
}

/// The first maximum of each row of `windows` `(B, C, oh, ow, k*k)`, with
/// the whole gradient routed to it: `(B, C, oh, ow)`.
fn first_max(windows: &Tensor) -> Result<Tensor> {
    let plain = windows.detach();
    let hit = plain.broadcast_eq(&plain.max_keepdim(D::Minus1)?)?;
    let n = windows.dim(D::Minus1)?;
    let slots = Tensor::arange(0u32, n as u32, windows.device())?
        .reshape((1, 1, 1, 1, n))?
        .broadcast_as(windows.shape())?;
    let none = Tensor::full(n as u32, windows.shape(), windows.device())?;
    let first = hit.where_cond(&slots, &none)?.min_keepdim(D::Minus1)?;
    // The one-hot mask carries no gradient, so the product routes the whole
    // window gradient to that element.
    let onehot = slots.broadcast_eq(&first)?.to_dtype(windows.dtype())?;
    Ok((windows * onehot)?.sum(D::Minus1)?)
}

/// Refuses what PyTorch's `MaxPool2d` refuses: a zero window or stride,
/// padding over half the window, a window larger than the padded input;
/// the input's dimensions otherwise.
fn check_window(
    x: &Tensor,
    k: usize,
    stride: usize,
    padding: usize,
) -> Result<(usize, usize, usize, usize)> {
    check(x, k)?;
    let (b, c, h, w) = x.dims4()?;
    if stride == 0 || padding > k / 2 || k > h + 2 * padding || k > w + 2 * padding {
        return Err(Error::Candle(candle_core::Error::Msg(format!(
            "max_pool2d: window {k}, stride {stride}, padding {padding} on a {h}x{w} input: \
             need a stride of at least 1, padding at most half the window (as PyTorch), and a \
             window that fits"
        ))));
    }
    Ok((b, c, h, w))
}

/// Max pooling with any window, stride and padding (PyTorch's
/// `MaxPool2d(k, stride, padding)`, floor mode; ResNet's stem is `(3, 2,
/// 1)`): `(B, C, H, W) -> (B, C, (H + 2p - k)/s + 1, ...)`. The padding is
/// the dtype's lowest finite value, so it never wins over a real value, and
/// the first maximum of each window takes its gradient, as in PyTorch. A window equal to its stride without padding
/// takes [`max_pool2d`]; others are built from generic candle ops (any
/// device and dtype).
pub fn max_pool2d_window(x: &Tensor, k: usize, stride: usize, padding: usize) -> Result<Tensor> {
    check_window(x, k, stride, padding)?;
    if stride == k && padding == 0 {
        return max_pool2d(x, k);
    }
    if half_cpu(x) {
        return widened(x, |x| max_pool2d_window(x, k, stride, padding));
    }
    if fused_cpu(x) {
        let op = crate::pool_window::MaxPoolWindow {
            win: crate::pool_window::Window {
                k,
                stride,
                pad: padding,
            },
            layer: trace::current_layer(),
            saved: std::sync::Mutex::new(None),
        };
        return Ok(x.contiguous()?.apply_op1(op)?);
    }
    max_pool2d_window_generic(x, k, stride, padding)
}

/// [`max_pool2d_window`] from generic candle ops (any device and dtype);
/// the CPU's f32 takes the fused kernel.
pub fn max_pool2d_window_generic(
    x: &Tensor,
    k: usize,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    let (b, c, h, w) = check_window(x, k, stride, padding)?;
    let (oh, ow) = (
        (h + 2 * padding - k) / stride + 1,
        (w + 2 * padding - k) / stride + 1,
    );
    // Padded so that every window start `d + stride * i` has a whole
    // `stride`-long cell: `k - 1 + stride * o` rows (at least `h + 2p`).
    let (hp, wp) = (k - 1 + stride * oh, k - 1 + stride * ow);
    // The padding: the dtype's lowest finite value rather than -inf, whose
    // product with the one-hot mask's zeros would be NaN. With padding at
    // most half the window, every window holds a real value.
    let lowest = match x.dtype() {
        candle_core::DType::F16 => -65504.0,
        _ => -3.0e38,
    };
    let fill = |rows: usize, cols: usize| -> Result<Tensor> {
        Ok(Tensor::full(lowest, (b, c, rows, cols), x.device())?.to_dtype(x.dtype())?)
    };
    let mut parts = Vec::new();
    if padding > 0 {
        parts.push(fill(h, padding)?);
    }
    parts.push(x.clone());
    if wp > padding + w {
        parts.push(fill(h, wp - padding - w)?);
    }
    let x = Tensor::cat(&parts, 3)?;
    let mut parts = Vec::new();
    if padding > 0 {
        parts.push(fill(padding, wp)?);
    }
    parts.push(x);
    if hp > padding + h {
        parts.push(fill(hp - padding - h, wp)?);
    }
    let x = Tensor::cat(&parts, 2)?.contiguous()?;
    // Window offset (dy, dx): the values at (dy + stride * i, dx + stride * j).
    let mut taps = Vec::with_capacity(k * k);
    for dy in 0..k {
        let rows = x
            .narrow(2, dy, stride * oh)?
            .reshape((b, c, oh, stride, wp))?
            .narrow(3, 0, 1)?
            .reshape((b, c, oh, wp))?;
        for dx in 0..k {
            let tap = rows
                .narrow(3, dx, stride * ow)?
                .reshape((b, c, oh, ow, stride))?
                .narrow(4, 0, 1)?;
            taps.push(tap);
        }
    }
    first_max(&Tensor::cat(&taps, 4)?)
}

/// The first maximum of a 2x2 window's values in row-major order: its value
/// and which of the four it is. A NaN counts as a maximum, as in PyTorch's
/// kernel (`val > max || isnan(val)`, so the last NaN wins). Written as
/// selects rather than an index so the row loops can vectorise (the
/// forward's does): where the maximum lies is random, and branching on it
/// made the 2x2 pool cost as much as a conv.
#[inline(always)]
pub(super) fn first_max4(v: [f32; 4]) -> (f32, [bool; 4]) {
    let wins = |best: f32, x: f32| (x > best) | x.is_nan();
    let t1 = wins(v[0], v[1]);
    let m1 = if t1 { v[1] } else { v[0] };
    let t2 = wins(m1, v[2]);
    let m2 = if t2 { v[2] } else { m1 };
    let t3 = wins(m2, v[3]);
    let m3 = if t3 { v[3] } else { m2 };
    (m3, [!(t1 | t2 | t3), t1 & !t2 & !t3, t2 & !t3, t3])
}

/// The first maximum of each window along output row `oy` of one `(H, W)`
/// plane, any window size: `best[ox] = (value, index in the plane)`, windows
/// scanned in row-major order.
fn row_argmax(plane: &[f32], w: usize, k: usize, oy: usize, best: &mut [(f32, usize)]) {
    let (span, top) = (best.len() * k, oy * k * w);
    for (ox, b) in best.iter_mut().enumerate() {
        *b = (plane[top + ox * k], top + ox * k);
    }
    for ky in 0..k {
        let start = top + ky * w;
        let row = &plane[start..start + span];
        for (ox, (win, b)) in row.chunks_exact(k).zip(best.iter_mut()).enumerate() {
            for (kx, &v) in win.iter().enumerate() {
                if v > b.0 || v.is_nan() {
                    *b = (v, start + ox * k + kx);
                }
            }
        }
    }
}

/// Pools output row `oy` of one `(H, W)` plane into `out` (`ow` values).
fn forward_row(
    plane: &[f32],
    w: usize,
    k: usize,
    oy: usize,
    out: &mut [f32],
    best: &mut [(f32, usize)],
) {
    if k == 2 {
        let span = 2 * out.len();
        let (r0, r1) = (
            &plane[2 * oy * w..][..span],
            &plane[(2 * oy + 1) * w..][..span],
        );
        for ((o, a), b) in out
            .iter_mut()
            .zip(r0.chunks_exact(2))
            .zip(r1.chunks_exact(2))
        {
            *o = first_max4([a[0], a[1], b[0], b[1]]).0;
        }
    } else {
        row_argmax(plane, w, k, oy, best);
        for (o, &(v, _)) in out.iter_mut().zip(best.iter()) {
            *o = v;
        }
    }
}

/// Routes output row `oy`'s gradient `dy` onto the first maxima in `dx`, the
/// zeroed `(H, W)` gradient plane of `plane`.
fn backward_row(
    plane: &[f32],
    w: usize,
    k: usize,
    oy: usize,
    dy: &[f32],
    dx: &mut [f32],
    best: &mut [(f32, usize)],
) {
    if k == 2 {
        let span = 2 * dy.len();
        let (r0, r1) = (
            &plane[2 * oy * w..][..span],
            &plane[(2 * oy + 1) * w..][..span],
        );
        let (d0, d1) = dx[2 * oy * w..].split_at_mut(w);
        let (d0, d1) = (&mut d0[..span], &mut d1[..span]);
        let rows = r0.chunks_exact(2).zip(r1.chunks_exact(2));
        let grads = d0.chunks_exact_mut(2).zip(d1.chunks_exact_mut(2));
        for (((a, b), (da, db)), &g) in rows.zip(grads).zip(dy) {
            // Writes all four (windows do not overlap): no branch on the position.
            let at = first_max4([a[0], a[1], b[0], b[1]]).1;
            let put = |first: bool| if first { g } else { 0.0 };
            (da[0], da[1], db[0], db[1]) = (put(at[0]), put(at[1]), put(at[2]), put(at[3]));
        }
    } else {
        row_argmax(plane, w, k, oy, best);
        for (&g, &(_, i)) in dy.iter().zip(best.iter()) {
            dx[i] = g;
        }
    }
}

/// Planes (`H x W` images) per thread chunk.
pub(crate) fn planes_per_chunk(planes: usize) -> usize {
    planes.div_ceil(gemm::threads()).max(1)
}

/// The forward op: `x (B, C, H, W) -> (B, C, H/k, W/k)`, contiguous f32 on the CPU.
struct MaxPool2d {
    k: usize,
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
}

impl CustomOp1 for MaxPool2d {
    fn name(&self) -> &'static str {
        "redline-max-pool2d"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        trace::count("max_pool2d.forward");
        let x = f32s(storage, layout, "max_pool2d input")?;
        let (b, c, h, w) = layout.shape().dims4()?;
        let (k, oh, ow) = (self.k, h / self.k, w / self.k);
        let scratch = || vec![(0f32, 0usize); ow];
        Ok(pool_planes(
            x,
            (b, c, h, w),
            (oh, ow),
            scratch,
            |best, plane, out| {
                for (oy, out) in out.chunks_mut(ow).enumerate() {
                    forward_row(plane, w, k, oy, out, best);
                }
            },
        ))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let _span = trace::backward(self.layer.as_ref(), "max_pool2d");
        trace::count("max_pool2d.backward");
        let dx = x.apply_op2_no_bwd(&grad.contiguous()?, &MaxPool2dBackward { k: self.k })?;
        Ok(Some(dx))
    }
}

/// The backward kernel: `(x, dy) -> dx`, each window's gradient on its first maximum.
struct MaxPool2dBackward {
    k: usize,
}

impl CustomOp2 for MaxPool2dBackward {
    fn name(&self) -> &'static str {
        "redline-max-pool2d-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, dy) = (
            f32s(s1, l1, "max_pool2d input")?,
            f32s(s2, l2, "max_pool2d output grad")?,
        );
        let (b, c, h, w) = l1.shape().dims4()?;
        let (k, oh, ow) = (self.k, h / self.k, w / self.k);
        let scratch = || vec![(0f32, 0usize); ow];
        let dims = ((b, c, h, w), (oh, ow));
        unpool_planes(self.name(), x, dy, dims, scratch, |best, plane, dy, dx| {
            for (oy, dy) in dy.chunks(ow).enumerate() {
                backward_row(plane, w, k, oy, dy, dx, best);
            }
        })
    }
}

/// A pool's output `(B, C, oh, ow)` from `x (B, C, h, w)`: planes split
/// across the compute threads, each written by `f(scratch, plane, out)`
/// with one `scratch()` a thread chunk.
pub(crate) fn pool_planes<S>(
    x: &[f32],
    (b, c, h, w): (usize, usize, usize, usize),
    (oh, ow): (usize, usize),
    scratch: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &[f32], &mut [f32]) + Sync,
) -> (CpuStorage, Shape) {
    let mut out = vec![0f32; b * c * oh * ow];
    if !out.is_empty() {
        let per = planes_per_chunk(b * c);
        out.par_chunks_mut(per * oh * ow)
            .zip(x.par_chunks(per * h * w))
            .for_each(|(out, x)| {
                let mut s = scratch();
                for (out, plane) in out.chunks_mut(oh * ow).zip(x.chunks(h * w)) {
                    f(&mut s, plane, out);
                }
            });
    }
    (CpuStorage::F32(out), Shape::from((b, c, oh, ow)))
}

/// A pool's input gradient `dx` (the shape of `x`) from the output gradient
/// `dy` (its length checked; `name` names the op): planes split across the
/// compute threads, each by `f(scratch, plane, dy, dx)` onto a zeroed `dx`.
pub(crate) fn unpool_planes<S>(
    name: &str,
    x: &[f32],
    dy: &[f32],
    ((b, c, h, w), (oh, ow)): ((usize, usize, usize, usize), (usize, usize)),
    scratch: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &[f32], &[f32], &mut [f32]) + Sync,
) -> candle_core::Result<(CpuStorage, Shape)> {
    if dy.len() != b * c * oh * ow {
        bail!(
            "{name}: output grad has {} elements, expected {}",
            dy.len(),
            b * c * oh * ow
        );
    }
    let mut dx = vec![0f32; x.len()];
    if !dy.is_empty() {
        let per = planes_per_chunk(b * c);
        dx.par_chunks_mut(per * h * w)
            .zip(x.par_chunks(per * h * w))
            .zip(dy.par_chunks(per * oh * ow))
            .for_each(|((dx, x), dy)| {
                let mut s = scratch();
                let planes = dx
                    .chunks_mut(h * w)
                    .zip(x.chunks(h * w))
                    .zip(dy.chunks(oh * ow));
                for ((dx, plane), dy) in planes {
                    f(&mut s, plane, dy, dx);
                }
            });
    }
    Ok((CpuStorage::F32(dx), Shape::from((b, c, h, w))))
}

/// Threads per block of the GPU CNN block's backward kernel
/// (`redline_bias_pool_relu_bwd_*` in `cuda/pool.cu`: the size of its shared
/// array, a power of two).
pub const BLOCK_BWD_THREADS: u32 = 256;

/// How many ranges of images the GPU CNN block's backward splits each of `c`
/// channels into, for `n` images: its grid is `(splits, c)` and its bias
/// gradient `splits` partial sums per channel, added in order afterwards.
/// About 1024 blocks in all, so the work spreads over every SM (one block per
/// channel, as before, kept 100 of an H100's 132 SMs idle in the MNIST CNN),
/// and at most one split per image. A function of the shape alone, so the
/// sums' order, and their bits, are the same on every run and every GPU.
pub fn block_bwd_splits(n: usize, c: usize) -> usize {
    1024usize.div_ceil(c.max(1)).clamp(1, n.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    #[test]
    fn the_gpu_blocks_backward_splits_channels_into_whole_images() {
        // The MNIST CNN's blocks: 32 and 64 channels, batches 512 and 64.
        assert_eq!(block_bwd_splits(512, 32), 32);
        assert_eq!(block_bwd_splits(512, 64), 16);
        assert_eq!(block_bwd_splits(64, 32), 32);
        // At most one split per image, at least one per channel.
        assert_eq!(block_bwd_splits(3, 32), 3);
        assert_eq!(block_bwd_splits(1, 1), 1);
        assert_eq!(block_bwd_splits(512, 4096), 1);
        for n in 1..70 {
            for c in [1, 3, 32, 1000, 1025] {
                let s = block_bwd_splits(n, c);
                assert!((1..=n).contains(&s), "{n} images, {c} channels: {s}");
                assert!(s == n || s * c >= 1024 || s == 1, "{n}, {c}: {s}");
            }
        }
    }

    /// bf16 max pooling on the CPU (the f32 kernel between casts): the
    /// outputs are candle's generic pooling of the same values, bit for
    /// bit (ties included: rounding to bf16 makes them), and dx is the
    /// generic f32 pooling's gradient rounded once to bf16 (overlapping
    /// windows' sums in f32, as PyTorch's CPU kernel accumulates).
    #[test]
    fn bf16_pools_are_the_generic_ones_rounded_once() -> Result<()> {
        let x = Tensor::arange(0f32, 2.0 * 3.0 * 9.0 * 8.0, &Device::Cpu)?
            .reshape((2, 3, 9, 8))?
            .affine(0.37, 0.0)?
            .sin()?
            .to_dtype(DType::BF16)?;
        let up = x.affine(0.5, 0.25)?;
        let vals = |t: &Tensor| -> Result<Vec<f32>> {
            let t = t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?;
            Ok(t.flatten_all()?.to_vec1::<f32>()?)
        };
        for (k, s, p) in [(3, 2, 1), (2, 2, 0), (3, 1, 1)] {
            let run = |dtype: DType| -> Result<(Tensor, Vec<f32>)> {
                let xv = Var::from_tensor(&x.to_dtype(dtype)?)?;
                let y = if dtype == DType::BF16 {
                    max_pool2d_window(xv.as_tensor(), k, s, p)?
                } else if s == k && p == 0 {
                    max_pool2d_generic(xv.as_tensor(), k)?
                } else {
                    max_pool2d_window_generic(xv.as_tensor(), k, s, p)?
                };
                let up = up.narrow(2, 0, y.dim(2)?)?.narrow(3, 0, y.dim(3)?)?;
                let g = (&y * &up.to_dtype(dtype)?)?
                    .to_dtype(DType::F32)?
                    .sum_all()?
                    .backward()?;
                let dx = g
                    .get(xv.as_tensor())
                    .ok_or_else(|| Error::Candle(candle_core::Error::Msg("no dx".into())))?;
                Ok((y, vals(dx)?))
            };
            let ((y16, dx16), (y32, dx32)) = (run(DType::BF16)?, run(DType::F32)?);
            let what = format!("window {k}, stride {s}, padding {p}");
            assert_eq!(y16.dtype(), DType::BF16, "{what}");
            assert_eq!(vals(&y16)?, vals(&y32)?, "{what}");
            assert_eq!(dx16, dx32, "{what}");
        }
        Ok(())
    }

    #[test]
    fn forward_matches_candle_and_gradient_goes_to_first_max() -> Result<()> {
        // Two 2x2 windows: one with a unique max, one with a tie (3, 3).
        let x = Var::new(&[[[[1f32, 5., 3., 3.], [2., 0., 1., 0.]]]], &Device::Cpu)?;
        let y = max_pool2d(x.as_tensor(), 2)?;
        assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![5., 3.]);
        let candle = x.as_tensor().max_pool2d(2)?;
        assert_eq!(candle.flatten_all()?.to_vec1::<f32>()?, vec![5., 3.]);
        let g = (y * Tensor::new(&[[[[10f32, 20.]]]], &Device::Cpu)?)?
            .sum_all()?
            .backward()?;
        let gx = g
            .get(x.as_tensor())
            .map(|t| t.flatten_all().and_then(|t| t.to_vec1::<f32>()));
        // PyTorch: [[0,10,20,0],[0,0,0,0]] (the tie goes to the first element).
        assert_eq!(
            gx.transpose()?,
            Some(vec![0., 10., 20., 0., 0., 0., 0., 0.])
        );
        Ok(())
    }

    /// ResNet's stem pool (3, stride 2, padding 1) on a 4x4 plane:
    /// `F.max_pool2d(torch.arange(16.).view(1, 1, 4, 4), 3, 2, 1)` is
    /// `[[5, 7], [13, 15]]`; on a plane of ties each window's first real
    /// element (row-major, the padding never) takes the gradient, as
    /// PyTorch's `val > max` scan from -inf gives it.
    #[test]
    fn padded_overlapping_windows_pool_and_route_like_pytorch() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::arange(0f32, 16., &dev)?.reshape((1, 1, 4, 4))?)?;
        let y = max_pool2d_window(x.as_tensor(), 3, 2, 1)?;
        assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, [5., 7., 13., 15.]);
        let g = y.sum_all()?.backward()?;
        let gx = g
            .get(x.as_tensor())
            .map(|t| t.flatten_all()?.to_vec1::<f32>());
        let mut want = [0f32; 16];
        for i in [5, 7, 13, 15] {
            want[i] = 1.0;
        }
        assert_eq!(gx.transpose()?.as_deref(), Some(&want[..]));
        let ties = Var::from_tensor(&Tensor::zeros((1, 1, 4, 4), DType::F32, &dev)?)?;
        let y = max_pool2d_window(ties.as_tensor(), 3, 2, 1)?;
        assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, [0.; 4]);
        let g = y.sum_all()?.backward()?;
        let gx = g
            .get(ties.as_tensor())
            .map(|t| t.flatten_all()?.to_vec1::<f32>());
        let mut want = [0f32; 16];
        for i in [0, 1, 4, 5] {
            want[i] = 1.0;
        }
        assert_eq!(gx.transpose()?.as_deref(), Some(&want[..]));
        // A window equal to its stride takes the plain pool; bad windows
        // are refused.
        let a = max_pool2d_window(x.as_tensor(), 2, 2, 0)?;
        assert_eq!(a.flatten_all()?.to_vec1::<f32>()?, [5., 7., 13., 15.]);
        assert!(max_pool2d_window(x.as_tensor(), 3, 2, 2).is_err());
        assert!(max_pool2d_window(x.as_tensor(), 3, 0, 1).is_err());
        Ok(())
    }

    /// The fused windowed kernel against the generic ops: values with many
    /// ties (rounded to quarters) and odd sizes, the output and the input
    /// gradient (overlapping windows add up), for ResNet's (3, 2, 1) and
    /// other windows.
    #[test]
    fn fused_windowed_kernel_matches_the_generic_ops() -> Result<()> {
        let dev = Device::Cpu;
        for (h, w, k, s, p) in [
            (9, 7, 3, 2, 1),
            (8, 8, 3, 2, 1),
            (10, 9, 5, 3, 2),
            (6, 5, 2, 1, 1),
        ] {
            let n = 2 * 3 * h * w;
            let v: Vec<f32> = (0..n)
                .map(|i| ((i as f32 * 0.77).sin() * 4.0).round() / 4.0)
                .collect();
            let x = Var::from_tensor(&Tensor::from_vec(v, (2, 3, h, w), &dev)?)?;
            let fused = max_pool2d_window(x.as_tensor(), k, s, p)?;
            let generic = max_pool2d_window_generic(x.as_tensor(), k, s, p)?;
            assert_eq!(
                fused.flatten_all()?.to_vec1::<f32>()?,
                generic.flatten_all()?.to_vec1::<f32>()?,
                "{:?}",
                (h, w, k, s, p)
            );
            let r =
                Tensor::arange(0f32, fused.elem_count() as f32, &dev)?.reshape(fused.shape())?;
            let gf = (fused * &r)?.sum_all()?.backward()?;
            let gg = (generic * &r)?.sum_all()?.backward()?;
            let take = |g: &candle_core::backprop::GradStore| -> Result<Vec<f32>> {
                match g.get(x.as_tensor()) {
                    Some(t) => Ok(t.flatten_all()?.to_vec1::<f32>()?),
                    None => Ok(Vec::new()),
                }
            };
            assert_eq!(take(&gf)?, take(&gg)?, "{:?}", (h, w, k, s, p));
        }
        Ok(())
    }

    #[test]
    fn odd_sizes_floor_like_pytorch() -> Result<()> {
        let x = Tensor::arange(0f32, 25., &Device::Cpu)?.reshape((1, 1, 5, 5))?;
        let y = max_pool2d(&x, 2)?;
        assert_eq!(y.dims(), &[1, 1, 2, 2]);
        assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![6., 8., 16., 18.]);
        Ok(())
    }

    /// Forward and input gradient of `f` on `x` under a non-uniform output gradient.
    fn run(
        f: fn(&Tensor, usize) -> Result<Tensor>,
        x: &Tensor,
        k: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let x = Var::from_tensor(x)?;
        let y = f(x.as_tensor(), k)?;
        let n = y.elem_count();
        let r = Tensor::from_vec(
            (0..n).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>(),
            y.shape(),
            &Device::Cpu,
        )?;
        let grads = (&y * r)?.sum_all()?.backward()?;
        let Some(gx) = grads.get(x.as_tensor()) else {
            panic!("no input gradient");
        };
        Ok((y.flatten_all()?.to_vec1()?, gx.flatten_all()?.to_vec1()?))
    }

    #[test]
    fn fused_kernel_matches_generic_with_ties_and_odd_sizes() -> Result<()> {
        // (B, C, H, W, k); values rounded to a few levels so windows have ties.
        for (b, c, h, w, k) in [
            (2, 3, 6, 6, 2),
            (1, 2, 7, 5, 2),
            (2, 1, 9, 8, 3),
            (1, 1, 3, 3, 1),
        ] {
            let n = b * c * h * w;
            let v: Vec<f32> = (0..n)
                .map(|i| ((i as f32 * 0.37).sin() * 2.0).round())
                .collect();
            let x = Tensor::from_vec(v, (b, c, h, w), &Device::Cpu)?;
            let fused = run(max_pool2d, &x, k)?;
            let generic = run(max_pool2d_generic, &x, k)?;
            assert_eq!(fused, generic, "shape {:?}", (b, c, h, w, k));
        }
        Ok(())
    }

    #[test]
    fn zero_window_is_an_error_and_oversized_window_pools_to_nothing() -> Result<()> {
        let x = Tensor::zeros((1, 1, 2, 2), DType::F32, &Device::Cpu)?;
        assert!(max_pool2d(&x, 0).is_err());
        assert!(max_pool2d_generic(&x, 0).is_err());
        // A window larger than the image pools to nothing, as in PyTorch.
        assert_eq!(max_pool2d(&x, 3)?.dims(), &[1, 1, 0, 0]);
        assert_eq!(max_pool2d_generic(&x, 3)?.dims(), &[1, 1, 0, 0]);
        Ok(())
    }

    #[test]
    fn nan_wins_like_pytorch() -> Result<()> {
        // PyTorch's kernel takes `val > max || isnan(val)`: the window's value
        // is NaN and its gradient goes to the last NaN.
        let x = Var::new(&[[[[1f32, f32::NAN], [2., f32::NAN]]]], &Device::Cpu)?;
        let y = max_pool2d(x.as_tensor(), 2)?;
        assert!(y.flatten_all()?.to_vec1::<f32>()?[0].is_nan());
        let grads = y.sum_all()?.backward()?;
        let Some(gx) = grads.get(x.as_tensor()) else {
            panic!("no input gradient");
        };
        assert_eq!(gx.flatten_all()?.to_vec1::<f32>()?, vec![0., 0., 0., 1.]);
        Ok(())
    }
}
