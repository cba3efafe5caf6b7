//! Max pooling with any window, stride and padding on the CPU (f32): the
//! fused kernel of [`crate::max_pool2d_window`] for windows other than
//! their stride (ResNet's stem pool, 3 with stride 2 and padding 1).
//! PyTorch's CPU kernel's semantics: each window scans its rows in order
//! from `-inf` with `val > max || isnan(val)`, so the first maximum (the
//! last NaN) takes the gradient, and padding is never read.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

#[cfg(test)]
use crate::max_pool2d_window;
use crate::pool::planes_per_chunk;
use crate::slices::{f32s, keep};
use redline_core::trace;

/// A pooling window's geometry over one `(h, w)` plane.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) k: usize,
    pub(crate) stride: usize,
    pub(crate) pad: usize,
}

impl Window {
    /// The output side for an input side `n`.
    fn out(&self, n: usize) -> usize {
        (n + 2 * self.pad - self.k) / self.stride + 1
    }

    /// The input range `lo..hi` under output position `o` of a side `n`.
    fn span(&self, o: usize, n: usize) -> (usize, usize) {
        let start = o * self.stride;
        let lo = start.saturating_sub(self.pad);
        let hi = (start + self.k).saturating_sub(self.pad).min(n);
        (lo, hi)
    }

    /// Pools one `(h, w)` plane into `out` (`oh x ow`), each window's maximum
    /// and its index in the plane into `at`, with `rows` as scratch.
    ///
    /// In two passes, as the window scan's rule allows: each input row's
    /// candidate per output column (its last NaN, else its first maximum),
    /// then the rows of each window combined in order by the same rule,
    /// which gives the window's last NaN, else its first maximum in
    /// row-major order. The second pass runs along whole output rows (it
    /// vectorises); the first has no window bounds inside its loop.
    fn pool_plane(
        &self,
        plane: &[f32],
        (h, w): (usize, usize),
        (out, at): (&mut [f32], &mut [u32]),
        rows: &mut (Vec<f32>, Vec<u32>),
    ) {
        let (oh, ow) = (self.out(h), self.out(w));
        let (hb, hp) = rows;
        hb.resize(h * ow, 0.0);
        hp.resize(h * ow, 0);
        for (iy, (row, (hb, hp))) in plane
            .chunks(w)
            .zip(hb.chunks_mut(ow).zip(hp.chunks_mut(ow)))
            .enumerate()
        {
            for (ox, (b, p)) in hb.iter_mut().zip(hp.iter_mut()).enumerate() {
                let (x0, x1) = self.span(ox, w);
                let (mut best, mut pos) = (f32::NEG_INFINITY, x0);
                for (ix, &v) in row.iter().enumerate().take(x1).skip(x0) {
                    let take = v > best || v.is_nan();
                    best = if take { v } else { best };
                    pos = if take { ix } else { pos };
                }
                // In range: the caller checked h * w against u32::MAX.
                (*b, *p) = (best, (iy * w + pos) as u32);
            }
        }
        for (oy, (out, at)) in out
            .chunks_mut(ow)
            .zip(at.chunks_mut(ow))
            .enumerate()
            .take(oh)
        {
            let (y0, y1) = self.span(oy, h);
            out.copy_from_slice(&hb[y0 * ow..][..ow]);
            at.copy_from_slice(&hp[y0 * ow..][..ow]);
            for iy in y0 + 1..y1 {
                let (cb, cp) = (&hb[iy * ow..][..ow], &hp[iy * ow..][..ow]);
                for ((o, a), (&v, &p)) in out.iter_mut().zip(at.iter_mut()).zip(cb.iter().zip(cp)) {
                    let take = v > *o || v.is_nan();
                    *o = if take { v } else { *o };
                    *a = if take { p } else { *a };
                }
            }
        }
    }
}

/// Where each window's maximum was: its index in its `(h, w)` plane, per
/// output, left by the forward for the backward.
type Argmax = Arc<Vec<u32>>;

/// The forward op: `x (B, C, H, W) -> (B, C, oh, ow)`, contiguous f32.
pub(crate) struct MaxPoolWindow {
    pub(crate) win: Window,
    /// The layer that built it, for the backward span (only while tracing).
    pub(crate) layer: Option<Arc<str>>,
    /// The forward's maxima positions, for the backward.
    pub(crate) saved: Mutex<Option<Argmax>>,
}

impl CustomOp1 for MaxPoolWindow {
    fn name(&self) -> &'static str {
        "redline-max-pool2d-window"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        trace::count("max_pool2d.forward");
        let x = f32s(storage, layout, "max_pool2d input")?;
        let (b, c, h, w) = layout.shape().dims4()?;
        let (oh, ow) = (self.win.out(h), self.win.out(w));
        if h * w > u32::MAX as usize {
            candle_core::bail!("max_pool2d: a {h}x{w} plane is too large to index with u32");
        }
        let win = self.win;
        let mut out = vec![0f32; b * c * oh * ow];
        let mut at = vec![0u32; out.len()];
        if !out.is_empty() {
            let per = planes_per_chunk(b * c);
            out.par_chunks_mut(per * oh * ow)
                .zip(at.par_chunks_mut(per * oh * ow))
                .zip(x.par_chunks(per * h * w))
                .for_each(|((out, at), x)| {
                    let mut rows = (Vec::new(), Vec::new());
                    let planes = out
                        .chunks_mut(oh * ow)
                        .zip(at.chunks_mut(oh * ow))
                        .zip(x.chunks(h * w));
                    for ((out, at), plane) in planes {
                        win.pool_plane(plane, (h, w), (out, at), &mut rows);
                    }
                });
        }
        keep(&self.saved, Arc::new(at));
        Ok((CpuStorage::F32(out), Shape::from((b, c, oh, ow))))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let _span = trace::backward(self.layer.as_ref(), "max_pool2d");
        trace::count("max_pool2d.backward");
        let saved = self
            .saved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(at) = saved else {
            candle_core::bail!("max_pool2d backward: the forward kept no maxima");
        };
        let (b, c, h, w) = x.dims4()?;
        let op = MaxPoolWindowBackward {
            dims: (b, c, h, w),
            at,
        };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&op)?))
    }
}

/// The backward kernel: `dy -> dx`, each window's gradient added onto its
/// maximum's position (overlapping windows add up).
struct MaxPoolWindowBackward {
    dims: (usize, usize, usize, usize),
    at: Argmax,
}

impl CustomOp1 for MaxPoolWindowBackward {
    fn name(&self) -> &'static str {
        "redline-max-pool2d-window-backward"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dy = f32s(storage, layout, "max_pool2d output grad")?;
        let (b, c, h, w) = self.dims;
        if dy.len() != self.at.len() {
            candle_core::bail!(
                "{}: output grad has {} elements, the forward kept {} maxima",
                self.name(),
                dy.len(),
                self.at.len()
            );
        }
        let mut dx = vec![0f32; b * c * h * w];
        let per_plane = dy.len() / (b * c).max(1);
        if per_plane > 0 && h * w > 0 {
            let per = planes_per_chunk(b * c);
            dx.par_chunks_mut(per * h * w)
                .zip(dy.par_chunks(per * per_plane))
                .zip(self.at.par_chunks(per * per_plane))
                .for_each(|((dx, dy), at)| {
                    let planes = dx
                        .chunks_mut(h * w)
                        .zip(dy.chunks(per_plane))
                        .zip(at.chunks(per_plane));
                    for ((dx, dy), at) in planes {
                        for (&g, &a) in dy.iter().zip(at) {
                            if let Some(d) = dx.get_mut(a as usize) {
                                *d += g;
                            }
                        }
                    }
                });
        }
        Ok((CpuStorage::F32(dx), Shape::from((b, c, h, w))))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use candle_core::{Device, Var};

    /// PyTorch's scan of one window, the reference: rows in order from
    /// `-inf`, `val > max || isnan(val)`.
    fn scan(win: Window, plane: &[f32], (h, w): (usize, usize), oy: usize, ox: usize) -> usize {
        let ((y0, y1), (x0, x1)) = (win.span(oy, h), win.span(ox, w));
        let (mut best, mut at) = (f32::NEG_INFINITY, y0 * w + x0);
        for iy in y0..y1 {
            for ix in x0..x1 {
                let v = plane[iy * w + ix];
                if v > best || v.is_nan() {
                    (best, at) = (v, iy * w + ix);
                }
            }
        }
        at
    }

    /// NaNs and ties in every arrangement a window can hold them (several
    /// in one row, a larger value after a NaN in its row and below it): the
    /// gradient reaches the position the scan names, and the output is
    /// NaN exactly where the window holds one.
    #[test]
    fn nans_and_ties_route_as_pytorchs_scan() {
        let (h, w) = (9, 8);
        for (k, stride, pad) in [(3, 2, 1), (3, 1, 1), (5, 2, 2), (2, 1, 0)] {
            let win = Window { k, stride, pad };
            let v: Vec<f32> = (0..h * w)
                .map(|i| match (i * 7) % 11 {
                    0 | 5 => f32::NAN,
                    1..=3 => 2.0,
                    n => n as f32 * 0.25,
                })
                .collect();
            let x =
                Var::from_tensor(&Tensor::from_vec(v.clone(), (1, 1, h, w), &Device::Cpu).unwrap())
                    .unwrap();
            let y = max_pool2d_window(x.as_tensor(), k, stride, pad).unwrap();
            let (oh, ow) = (win.out(h), win.out(w));
            // Each window's gradient is its index + 1, so positions are told apart.
            let r = Tensor::arange(1f32, (oh * ow + 1) as f32, &Device::Cpu)
                .unwrap()
                .reshape((1, 1, oh, ow))
                .unwrap();
            let g = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
            let got: Vec<f32> = g
                .get(x.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let ys: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
            let mut want = vec![0f32; h * w];
            for oy in 0..oh {
                for ox in 0..ow {
                    let at = scan(win, &v, (h, w), oy, ox);
                    want[at] += (oy * ow + ox + 1) as f32;
                    let y = ys[oy * ow + ox];
                    assert!(y.is_nan() == v[at].is_nan() && (y.is_nan() || y == v[at]));
                }
            }
            assert_eq!(got, want, "window {k}, stride {stride}, padding {pad}");
        }
    }
}
