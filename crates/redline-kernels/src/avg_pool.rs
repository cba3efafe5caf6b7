//! Average pooling with any window, stride and padding: PyTorch's
//! `F.avg_pool2d(x, kernel, stride, padding, count_include_pad=...)` (floor
//! mode). The CPU f32 kernel runs each plane in two passes both ways
//! (window sums along rows, then down columns; the backward spreads each
//! window's share down, then along); other devices and dtypes build it
//! from candle's ops.
//!
//! The divisor is the window's area (`count_include_pad`, PyTorch's
//! default: zeros of the padding counted), or the part of it inside the
//! image.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;
use redline_core::trace;

use crate::pool::planes_per_chunk;
use crate::slices::{f32s, fused_cpu, half_cpu, widened};
use crate::{Error, Result};

/// An average pool's window over `(h, w)` planes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgWindow {
    /// Window side.
    pub kernel: usize,
    /// Step between windows.
    pub stride: usize,
    /// Zero padding on each side (at most half the window, as PyTorch).
    pub padding: usize,
    /// Whether the padding's zeros count in the divisor (PyTorch's default).
    pub count_include_pad: bool,
}

impl AvgWindow {
    /// The output side for an input side `n`, or `None` when the window
    /// does not fit (or the sizes are zero, or the padding is more than
    /// half the window).
    pub fn out(&self, n: usize) -> Option<usize> {
        let fits = self.kernel > 0
            && self.stride > 0
            && self.padding <= self.kernel / 2
            && self.kernel <= n + 2 * self.padding;
        fits.then(|| (n + 2 * self.padding - self.kernel) / self.stride + 1)
    }

    /// The input range `lo..hi` under output position `o` of a side `n`.
    fn span(&self, o: usize, n: usize) -> (usize, usize) {
        let start = o * self.stride;
        let lo = start.saturating_sub(self.padding);
        let hi = (start + self.kernel).saturating_sub(self.padding).min(n);
        (lo, hi)
    }

    /// Each output's divisor over a `(h, w)` plane, row-major.
    fn divisors(&self, (h, w): (usize, usize), (oh, ow): (usize, usize)) -> Vec<f32> {
        let mut d = Vec::with_capacity(oh * ow);
        for oy in 0..oh {
            let (y0, y1) = self.span(oy, h);
            for ox in 0..ow {
                let (x0, x1) = self.span(ox, w);
                d.push(if self.count_include_pad {
                    (self.kernel * self.kernel) as f32
                } else {
                    ((y1 - y0) * (x1 - x0)) as f32
                });
            }
        }
        d
    }

    /// One plane's averages: row sums per output column, then each
    /// window's rows summed in order.
    fn pool_plane(
        &self,
        plane: &[f32],
        (h, w): (usize, usize),
        ow: usize,
        (div, rows): (&[f32], &mut Vec<f32>),
        out: &mut [f32],
    ) {
        // Every entry is written below: a task's scratch, resized only.
        rows.resize(h * ow, 0.0);
        for (row, sums) in plane.chunks(w).zip(rows.chunks_mut(ow)) {
            for (ox, s) in sums.iter_mut().enumerate() {
                let (x0, x1) = self.span(ox, w);
                *s = row[x0..x1].iter().sum();
            }
        }
        for (oy, (o, d)) in out.chunks_mut(ow).zip(div.chunks(ow)).enumerate() {
            let (y0, y1) = self.span(oy, h);
            o.fill(0.0);
            for sums in rows[y0 * ow..y1 * ow].chunks(ow) {
                for (a, s) in o.iter_mut().zip(sums) {
                    *a += s;
                }
            }
            for (a, d) in o.iter_mut().zip(d) {
                *a /= d;
            }
        }
    }

    /// One plane's input gradient (overwritten) from its output gradient:
    /// each window's share `dy / divisor` spread down its rows, then along
    /// its columns.
    fn unpool_plane(
        &self,
        dy: &[f32],
        (div, cols): (&[f32], &mut Vec<f32>),
        (h, w): (usize, usize),
        ow: usize,
        dx: &mut [f32],
    ) {
        // Sums from zero: a task's scratch, cleared for each plane.
        cols.clear();
        cols.resize(h * ow, 0.0);
        for (oy, (g, d)) in dy.chunks(ow).zip(div.chunks(ow)).enumerate() {
            let (y0, y1) = self.span(oy, h);
            for c in cols[y0 * ow..y1 * ow].chunks_mut(ow) {
                for ((c, g), d) in c.iter_mut().zip(g).zip(d) {
                    *c += g / d;
                }
            }
        }
        for (row, c) in dx.chunks_mut(w).zip(cols.chunks(ow)) {
            row.fill(0.0);
            for (ox, &v) in c.iter().enumerate() {
                let (x0, x1) = self.span(ox, w);
                row[x0..x1].iter_mut().for_each(|r| *r += v);
            }
        }
    }
}

/// `F.avg_pool2d` on `(B, C, H, W)`: the fused CPU kernel for f32, candle's
/// ops otherwise (its own pool where the windows tile the input, else a sum
/// of the window's strided taps).
pub fn avg_pool2d(x: &Tensor, win: AvgWindow) -> Result<Tensor> {
    let bad = |m: String| Error::Candle(candle_core::Error::Msg(m));
    let (_, _, h, w) = x
        .dims4()
        .map_err(|_| bad(format!("avg_pool2d takes (B, C, H, W); got {:?}", x.dims())))?;
    let (Some(oh), Some(ow)) = (win.out(h), win.out(w)) else {
        return Err(bad(format!(
            "avg_pool2d: kernel {}, stride {}, padding {} do not fit a {h}x{w} input (the \
             window must fit the padded input, and the padding be at most half the window)",
            win.kernel, win.stride, win.padding
        )));
    };
    if half_cpu(x) {
        return widened(x, |x| avg_pool2d(x, win));
    }
    if fused_cpu(x) {
        let op = AvgPool {
            win,
            layer: trace::current_layer(),
        };
        return Ok(x.contiguous()?.apply_op1(op)?);
    }
    // candle's own pool where its backward is right: its gradient is the
    // output's upsampled to the input's size, which misplaces it unless the
    // windows tile the input exactly (an 11-row input under 2x2 windows
    // sends gradient to the unread 11th row, and shifts the others).
    let tiles = win.stride == win.kernel && h % win.kernel == 0 && w % win.kernel == 0;
    if tiles && win.padding == 0 {
        return Ok(x.avg_pool2d(win.kernel)?);
    }
    generic(x, win, (h, w), (oh, ow))
}

/// The pool from candle's ops on any device and dtype: the padded input's
/// strided taps summed, then divided.
fn generic(
    x: &Tensor,
    win: AvgWindow,
    hw: (usize, usize),
    (oh, ow): (usize, usize),
) -> Result<Tensor> {
    let p = win.padding;
    let xp = x.pad_with_zeros(2, p, p)?.pad_with_zeros(3, p, p)?;
    let dev = x.device();
    let taps = |k: usize, n: usize| -> Result<Tensor> {
        let idx: Vec<u32> = (0..n).map(|o| (o * win.stride + k) as u32).collect();
        Ok(Tensor::new(idx.as_slice(), dev)?)
    };
    let mut sum: Option<Tensor> = None;
    for ky in 0..win.kernel {
        let rows = xp.index_select(&taps(ky, oh)?, 2)?;
        for kx in 0..win.kernel {
            let t = rows.index_select(&taps(kx, ow)?, 3)?;
            sum = Some(match sum {
                Some(s) => (s + t)?,
                None => t,
            });
        }
    }
    let Some(sum) = sum else {
        return Err(Error::Candle(candle_core::Error::Msg(
            "avg_pool2d: an empty window".into(),
        )));
    };
    let div =
        Tensor::from_vec(win.divisors(hw, (oh, ow)), (1, 1, oh, ow), dev)?.to_dtype(x.dtype())?;
    Ok(sum.broadcast_div(&div)?)
}

struct AvgPool {
    win: AvgWindow,
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
}

impl CustomOp1 for AvgPool {
    fn name(&self) -> &'static str {
        "redline-avg-pool"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        trace::count("avg_pool.forward");
        let x = f32s(s, l, self.name())?;
        let (b, c, h, w) = l.shape().dims4()?;
        let (Some(oh), Some(ow)) = (self.win.out(h), self.win.out(w)) else {
            candle_core::bail!("{}: {:?} does not fit {h}x{w}", self.name(), self.win);
        };
        let div = self.win.divisors((h, w), (oh, ow));
        let mut y = vec![0f32; b * c * oh * ow];
        let per = planes_per_chunk(b * c);
        if oh * ow > 0 && h * w > 0 {
            y.par_chunks_mut(per * oh * ow)
                .zip(x.par_chunks(per * h * w))
                .for_each(|(y, x)| {
                    // One scratch of row sums a task, not one a plane.
                    let mut rows = Vec::new();
                    for (o, plane) in y.chunks_mut(oh * ow).zip(x.chunks(h * w)) {
                        self.win.pool_plane(plane, (h, w), ow, (&div, &mut rows), o);
                    }
                });
        }
        Ok((CpuStorage::F32(y), Shape::from((b, c, oh, ow))))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let _span = trace::backward(self.layer.as_ref(), "avg_pool");
        trace::count("avg_pool.backward");
        let op = AvgUnpool { win: self.win };
        Ok(Some(arg.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// `(x, dy) -> dx` of [`AvgPool`] (`x` only for its shape).
struct AvgUnpool {
    win: AvgWindow,
}

impl CustomOp2 for AvgUnpool {
    fn name(&self) -> &'static str {
        "redline-avg-pool-backward"
    }

    fn cpu_fwd(
        &self,
        _s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dy = f32s(s2, l2, self.name())?;
        let (b, c, h, w) = l1.shape().dims4()?;
        let (Some(oh), Some(ow)) = (self.win.out(h), self.win.out(w)) else {
            candle_core::bail!("{}: {:?} does not fit {h}x{w}", self.name(), self.win);
        };
        if dy.len() != b * c * oh * ow {
            candle_core::bail!(
                "{}: gradient of {} values for {b} x {c} planes of {oh} x {ow}",
                self.name(),
                dy.len()
            );
        }
        let div = self.win.divisors((h, w), (oh, ow));
        let mut dx = vec![0f32; b * c * h * w];
        let per = planes_per_chunk(b * c);
        if oh * ow > 0 && h * w > 0 {
            dx.par_chunks_mut(per * h * w)
                .zip(dy.par_chunks(per * oh * ow))
                .for_each(|(dx, dy)| {
                    let mut cols = Vec::new();
                    for (d, g) in dx.chunks_mut(h * w).zip(dy.chunks(oh * ow)) {
                        self.win.unpool_plane(g, (&div, &mut cols), (h, w), ow, d);
                    }
                });
        }
        Ok((CpuStorage::F32(dx), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use candle_core::{DType, Device, Var};

    fn win(kernel: usize, stride: usize, padding: usize, count_include_pad: bool) -> AvgWindow {
        AvgWindow {
            kernel,
            stride,
            padding,
            count_include_pad,
        }
    }

    /// The fused kernel against the same pool from candle's ops (values and
    /// input gradients), across windows that overlap, skip, pad and do not
    /// divide the input, with and without the padding counted.
    #[test]
    fn fused_kernel_matches_candles_ops() {
        let (b, c, h, w) = (2, 3, 11, 10);
        let n = b * c * h * w;
        let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 + 0.1).sin()).collect();
        let x =
            Var::from_tensor(&Tensor::from_vec(v, (b, c, h, w), &Device::Cpu).unwrap()).unwrap();
        for wn in [
            win(3, 2, 1, true),
            win(3, 2, 1, false),
            win(3, 1, 1, false),
            win(2, 2, 0, true),
            win(5, 3, 2, false),
            win(4, 1, 0, true),
        ] {
            let ours = avg_pool2d(x.as_tensor(), wn).unwrap();
            let (oh, ow) = (wn.out(h).unwrap(), wn.out(w).unwrap());
            let theirs = generic(x.as_tensor(), wn, (h, w), (oh, ow)).unwrap();
            assert_eq!(ours.dims(), [b, c, oh, ow], "{wn:?}");
            let diff = |a: &Tensor, e: &Tensor| -> f32 {
                (a - e)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar()
                    .unwrap()
            };
            assert!(diff(&ours, &theirs) < 1e-6, "{wn:?} forward");
            let up: Vec<f32> = (0..b * c * oh * ow)
                .map(|i| (i as f32 * 0.61).cos())
                .collect();
            let up = Tensor::from_vec(up, (b, c, oh, ow), &Device::Cpu).unwrap();
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
            let (dxo, dxt) = (
                go.get(x.as_tensor()).unwrap(),
                gt.get(x.as_tensor()).unwrap(),
            );
            assert!(diff(dxo, dxt) < 1e-6, "{wn:?} backward");
        }
    }

    /// Where the windows tile the input, candle's own pool (f64 here) gives
    /// the fused kernel's values and gradients; where they do not, the taps
    /// path does (candle's upsampled gradient would misplace it).
    #[test]
    fn other_dtypes_take_a_path_with_the_right_gradient() {
        for (h, w) in [(8, 10), (11, 10)] {
            let n = 2 * 3 * h * w;
            let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 + 0.1).sin()).collect();
            let x = Var::from_tensor(&Tensor::from_vec(v, (2, 3, h, w), &Device::Cpu).unwrap())
                .unwrap();
            let x64 = Var::from_tensor(&x.as_tensor().to_dtype(DType::F64).unwrap()).unwrap();
            let wn = win(2, 2, 0, true);
            let (a, b) = (
                avg_pool2d(x.as_tensor(), wn).unwrap(),
                avg_pool2d(x64.as_tensor(), wn).unwrap(),
            );
            let up = a.ones_like().unwrap();
            let ga = (&a * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let gb = (&b * up.to_dtype(DType::F64).unwrap())
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            for (p, q) in [
                (a, b),
                (
                    ga.get(x.as_tensor()).unwrap().clone(),
                    gb.get(x64.as_tensor()).unwrap().clone(),
                ),
            ] {
                let d: f32 = (p - q.to_dtype(DType::F32).unwrap())
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar()
                    .unwrap();
                assert!(d < 1e-6, "{h}x{w}: {d}");
            }
        }
    }

    /// The divisor: the whole window with the padding counted, else only
    /// the part inside the image (a corner window of 3/2/1 covers 2 x 2).
    #[test]
    fn divisors_follow_count_include_pad() {
        let d = win(3, 2, 1, true).divisors((5, 5), (3, 3));
        assert!(d.iter().all(|&v| v == 9.0));
        let d = win(3, 2, 1, false).divisors((5, 5), (3, 3));
        assert_eq!(d, vec![4.0, 6.0, 4.0, 6.0, 9.0, 6.0, 4.0, 6.0, 4.0]);
    }

    #[test]
    fn windows_that_do_not_fit_are_clear_errors() {
        let x = Tensor::zeros((1, 1, 4, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        for wn in [
            win(0, 1, 0, true),
            win(3, 0, 0, true),
            win(3, 1, 2, true),
            win(7, 1, 1, true),
        ] {
            let e = avg_pool2d(&x, wn).unwrap_err().to_string();
            assert!(e.contains("do not fit a 4x4 input"), "{e}");
        }
        let e = avg_pool2d(
            &Tensor::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap(),
            win(2, 2, 0, true),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("(B, C, H, W)"), "{e}");
    }
}
