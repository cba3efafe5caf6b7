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
    #[inline(always)]
    fn out(&self, n: usize) -> usize {
        (n + 2 * self.pad - self.k) / self.stride + 1
    }

    /// The input range `lo..hi` under output position `o` of a side `n`.
    #[inline(always)]
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
    /// row-major order. Both passes run along whole output rows, so that
    /// they vectorise: the first tap by tap ([`Window::row_pass`]).
    #[inline(always)]
    fn pool_plane(
        &self,
        plane: &[f32],
        (h, w): (usize, usize),
        (out, at): (&mut [f32], &mut [u32]),
        rows: &mut Scratch,
    ) {
        let (oh, ow) = (self.out(h), self.out(w));
        let Scratch { best, pos, phases } = rows;
        best.resize(h * ow, 0.0);
        pos.resize(h * ow, 0);
        phases.resize(w.div_ceil(self.stride) * self.stride, f32::NEG_INFINITY);
        for (iy, (row, (hb, hp))) in plane
            .chunks(w)
            .zip(best.chunks_mut(ow).zip(pos.chunks_mut(ow)))
            .enumerate()
        {
            // In range: the caller checked h * w against u32::MAX.
            self.row_pass(row, (iy * w) as u32, (hb, hp), phases);
        }
        for (oy, (out, at)) in out
            .chunks_mut(ow)
            .zip(at.chunks_mut(ow))
            .enumerate()
            .take(oh)
        {
            let (y0, y1) = self.span(oy, h);
            out.copy_from_slice(&best[y0 * ow..][..ow]);
            at.copy_from_slice(&pos[y0 * ow..][..ow]);
            for iy in y0 + 1..y1 {
                let (cb, cp) = (&best[iy * ow..][..ow], &pos[iy * ow..][..ow]);
                for ((o, a), (&v, &p)) in out.iter_mut().zip(at.iter_mut()).zip(cb.iter().zip(cp)) {
                    let take = v > *o || v.is_nan();
                    *o = if take { v } else { *o };
                    *a = if take { p } else { *a };
                }
            }
        }
    }

    /// One input row's candidate per output column into `hb` (value) and
    /// `hp` (its index in the plane; the row starts at `base`): the taps
    /// of the window in column order, each over every output column it
    /// reaches, so that each window sees its columns in the scan's order.
    /// A strided window reads its taps from the row split into `stride`
    /// phases (`phases`: column `j * stride + r` at `r * len + j`), so every
    /// tap's loop reads contiguous values.
    #[inline(always)]
    fn row_pass(
        &self,
        row: &[f32],
        base: u32,
        (hb, hp): (&mut [f32], &mut [u32]),
        phases: &mut [f32],
    ) {
        let (w, ow, s) = (row.len(), hb.len(), self.stride);
        for (ox, (b, p)) in hb.iter_mut().zip(hp.iter_mut()).enumerate() {
            *b = f32::NEG_INFINITY;
            *p = base + self.span(ox, w).0 as u32;
        }
        let len = w.div_ceil(s);
        if s == 2 {
            // Even and odd columns: pairs, so that the split vectorises.
            let (even, odd) = phases.split_at_mut(len);
            let pairs = row.chunks_exact(2);
            if let Some(&last) = pairs.remainder().first() {
                even[len - 1] = last;
            }
            for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(pairs) {
                (*e, *o) = (pair[0], pair[1]);
            }
        } else if s > 1 {
            for (j, cell) in row.chunks(s).enumerate() {
                for (r, &v) in cell.iter().enumerate() {
                    phases[r * len + j] = v;
                }
            }
        }
        for t in 0..self.k {
            // Tap t of output column ox reads column ox * s + t - pad:
            // inside the row for ox in lo..hi.
            let lo = self.pad.saturating_sub(t).div_ceil(s);
            let hi = (w + self.pad).saturating_sub(t).div_ceil(s).min(ow);
            if lo >= hi {
                continue;
            }
            let first = lo * s + t - self.pad;
            let src = if s > 1 {
                &phases[(first % s) * len + first / s..][..hi - lo]
            } else {
                &row[first..][..hi - lo]
            };
            let (hb, hp) = (&mut hb[lo..hi], &mut hp[lo..hi]);
            let start = base + first as u32;
            for (i, ((b, p), &v)) in hb.iter_mut().zip(hp.iter_mut()).zip(src).enumerate() {
                let take = v > *b || v.is_nan();
                *b = if take { v } else { *b };
                *p = if take { start + (i * s) as u32 } else { *p };
            }
        }
    }
}

/// A worker's scratch for [`Window::pool_plane`]: each input row's
/// candidates (values, positions) and one row split into phases.
#[derive(Default)]
struct Scratch {
    best: Vec<f32>,
    pos: Vec<u32>,
    phases: Vec<f32>,
}

/// The forward's planes of one worker, in a pulp dispatch so that the row
/// passes vectorise with the machine's widest vectors.
struct PoolPlanes<'a> {
    win: Window,
    dims: (usize, usize),
    x: &'a [f32],
    out: &'a mut [f32],
    at: &'a mut [u32],
}

impl pulp::WithSimd for PoolPlanes<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let (h, w) = self.dims;
        let (oh, ow) = (self.win.out(h), self.win.out(w));
        let mut rows = Scratch::default();
        let planes = self
            .out
            .chunks_mut(oh * ow)
            .zip(self.at.chunks_mut(oh * ow))
            .zip(self.x.chunks(h * w));
        for ((out, at), plane) in planes {
            self.win.pool_plane(plane, (h, w), (out, at), &mut rows);
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
        let mut out = crate::slices::zeros_par::<f32>(b * c * oh * ow);
        let mut at = crate::slices::zeros_par::<u32>(out.len());
        if !out.is_empty() {
            let per = planes_per_chunk(b * c);
            out.par_chunks_mut(per * oh * ow)
                .zip(at.par_chunks_mut(per * oh * ow))
                .zip(x.par_chunks(per * h * w))
                .for_each(|((out, at), x)| {
                    pulp::Arch::new().dispatch(PoolPlanes {
                        win,
                        dims: (h, w),
                        x,
                        out,
                        at,
                    });
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
        let mut dx = crate::slices::zeros_par::<f32>(b * c * h * w);
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
        for (k, stride, pad, h, w) in [
            (3, 2, 1, 9, 8),
            (3, 1, 1, 9, 8),
            (5, 2, 2, 9, 8),
            (2, 1, 0, 9, 8),
            // Rows wider than a vector, odd and even, strides 2 and 3.
            (3, 2, 1, 7, 37),
            (3, 2, 1, 6, 40),
            (4, 3, 1, 5, 41),
            (3, 3, 0, 5, 40),
        ] {
            for ties in [false, true] {
                check_scan(Window { k, stride, pad }, (h, w), ties);
            }
        }
    }

    /// One plane of NaNs and ties (or, with `ties`, only three values, so
    /// that most windows hold several maxima in a row), pooled and
    /// differentiated, against [`scan`].
    fn check_scan(win: Window, (h, w): (usize, usize), ties: bool) {
        let Window { k, stride, pad } = win;
        let v: Vec<f32> = (0..h * w)
            .map(|i| match (i * 7) % 11 {
                _ if ties => ((i * 5 + i / w) % 3) as f32,
                0 | 5 => f32::NAN,
                1..=3 => 2.0,
                n => n as f32 * 0.25,
            })
            .collect();
        let x = Var::from_tensor(&Tensor::from_vec(v.clone(), (1, 1, h, w), &Device::Cpu).unwrap())
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
        assert_eq!(
            got, want,
            "window {k}, stride {stride}, padding {pad}, ties {ties}"
        );
    }
}
