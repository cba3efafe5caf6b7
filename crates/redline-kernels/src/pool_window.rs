//! Max pooling with any window, stride and padding on the CPU (f32): the
//! fused kernel of [`crate::max_pool2d_window`] for windows other than
//! their stride (ResNet's stem pool, 3 with stride 2 and padding 1).
//! PyTorch's CPU kernel's semantics: each window scans its rows in order
//! from `-inf` with `val > max || isnan(val)`, so the first maximum (the
//! last NaN) takes the gradient, and padding is never read.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

use crate::pool::{pool_planes, unpool_planes};
use crate::slices::f32s;
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

    /// The index in the plane of the window at `(oy, ox)`'s maximum, and
    /// the maximum.
    fn argmax(&self, plane: &[f32], (h, w): (usize, usize), oy: usize, ox: usize) -> (f32, usize) {
        let ((y0, y1), (x0, x1)) = (self.span(oy, h), self.span(ox, w));
        let (mut best, mut at) = (f32::NEG_INFINITY, y0 * w + x0);
        for iy in y0..y1 {
            for (ix, &v) in plane[iy * w + x0..iy * w + x1].iter().enumerate() {
                if v > best || v.is_nan() {
                    (best, at) = (v, iy * w + x0 + ix);
                }
            }
        }
        (best, at)
    }
}

/// The forward op: `x (B, C, H, W) -> (B, C, oh, ow)`, contiguous f32.
pub(crate) struct MaxPoolWindow {
    pub(crate) win: Window,
    /// The layer that built it, for the backward span (only while tracing).
    pub(crate) layer: Option<Arc<str>>,
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
        let win = self.win;
        Ok(pool_planes(
            x,
            (b, c, h, w),
            (oh, ow),
            || (),
            |(), plane, out| {
                for (oy, row) in out.chunks_mut(ow).enumerate() {
                    for (ox, o) in row.iter_mut().enumerate() {
                        *o = win.argmax(plane, (h, w), oy, ox).0;
                    }
                }
            },
        ))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let _span = trace::backward(self.layer.as_ref(), "max_pool2d");
        trace::count("max_pool2d.backward");
        let op = MaxPoolWindowBackward { win: self.win };
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// The backward kernel: `(x, dy) -> dx`, each window's gradient added onto
/// its first maximum (overlapping windows add up).
struct MaxPoolWindowBackward {
    win: Window,
}

impl CustomOp2 for MaxPoolWindowBackward {
    fn name(&self) -> &'static str {
        "redline-max-pool2d-window-backward"
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
        let (oh, ow) = (self.win.out(h), self.win.out(w));
        let (win, dims) = (self.win, ((b, c, h, w), (oh, ow)));
        unpool_planes(
            self.name(),
            x,
            dy,
            dims,
            || (),
            |(), plane, dy, dx| {
                for (oy, row) in dy.chunks(ow).enumerate() {
                    for (ox, &g) in row.iter().enumerate() {
                        dx[win.argmax(plane, (h, w), oy, ox).1] += g;
                    }
                }
            },
        )
    }
}
