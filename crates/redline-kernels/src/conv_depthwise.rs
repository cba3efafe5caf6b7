//! Depthwise convolutions (`groups` = input channels: MobileNet's 3x3s),
//! directly on the planes.
//!
//! The grouped kernel ([`crate::conv_grouped`]) runs each group as a plain
//! convolution: for a depthwise one that is an im2col of `kh * kw` rows and
//! a GEMM with one input channel, per channel, forward and backward. Here
//! each output plane is its input plane times each tap, added at the tap's
//! offset (a row segment at a time, contiguous at stride 1); the input
//! gradient adds the output gradient back the same way, and the weight
//! gradient is one dot product a tap of each output plane with its input
//! plane. Planes run in parallel; every output is summed by one thread in a
//! fixed order, so the same bits on every run and thread count.

use rayon::prelude::*;

use crate::conv::Geom;
use crate::conv_backward::add_row_sums;

/// The sizes of a depthwise convolution's parts: `n` groups of one input
/// channel and `m = geom.cout` output channels each, `geom` one group's
/// convolution.
#[derive(Debug, Clone, Copy)]
pub(super) struct Depthwise {
    pub(super) geom: Geom,
    pub(super) groups: usize,
}

impl Depthwise {
    /// The convolution of `groups` groups of geometry `geom` when it is
    /// depthwise (one input channel a group).
    pub(super) fn of(geom: Geom, groups: usize) -> Option<Self> {
        (geom.cin == 1).then_some(Self { geom, groups })
    }

    /// `out (B, n*m, oh, ow) = x (B, n, H, W) (*) w (n*m, 1, kh, kw) + b`,
    /// the bias added after the taps (as the plain convolution adds it).
    pub(super) fn forward(&self, x: &[f32], w: &[f32], b: &[f32], out: &mut [f32]) {
        let (g, n) = (self.geom, self.groups);
        let (hw, ohw, m, kk) = (g.h * g.w, g.ohw(), g.cout, g.kh * g.kw);
        if ohw == 0 || hw == 0 {
            return;
        }
        out.par_chunks_mut(ohw).enumerate().for_each(|(i, y)| {
            let (s, co) = (i / (n * m), i % (n * m));
            let plane = &x[(s * n + co / m) * hw..][..hw];
            y.fill(0.0);
            g.each_segment(|t, (oy, lo, hi), (iy, ix)| {
                let wt = w[co * kk + t];
                let dst = &mut y[oy * g.ow + lo..oy * g.ow + hi];
                add_scaled_from(dst, (&plane[iy * g.w + ix..], g.stride), wt);
            });
            let bias = b[co];
            y.iter_mut().for_each(|v| *v += bias);
        });
    }

    /// dx `(B, n, H, W)` (overwritten) from dy `(B, n*m, oh, ow)`: each
    /// input plane gets its `m` output planes' gradients back through the
    /// taps.
    pub(super) fn input_grad(&self, w: &[f32], dy: &[f32], dx: &mut [f32]) {
        let (g, n) = (self.geom, self.groups);
        let (hw, ohw, m, kk) = (g.h * g.w, g.ohw(), g.cout, g.kh * g.kw);
        if ohw == 0 || hw == 0 {
            return;
        }
        dx.par_chunks_mut(hw).enumerate().for_each(|(i, plane)| {
            let (s, gi) = (i / n, i % n);
            plane.fill(0.0);
            for co in gi * m..(gi + 1) * m {
                let up = &dy[(s * n * m + co) * ohw..][..ohw];
                g.each_segment(|t, (oy, lo, hi), (iy, ix)| {
                    let wt = w[co * kk + t];
                    let src = &up[oy * g.ow + lo..oy * g.ow + hi];
                    add_scaled_into((&mut plane[iy * g.w + ix..], g.stride), src, wt);
                });
            }
        });
    }

    /// dW `(n*m, 1, kh, kw)` and db `(n*m)` (overwritten): per output
    /// channel, over the batch's samples in order.
    pub(super) fn weight_grad(&self, x: &[f32], dy: &[f32], dw: &mut [f32], db: &mut [f32]) {
        let (g, n) = (self.geom, self.groups);
        let (hw, ohw, m, kk) = (g.h * g.w, g.ohw(), g.cout, g.kh * g.kw);
        if kk == 0 {
            return;
        }
        dw.par_chunks_mut(kk)
            .zip(db.par_iter_mut())
            .enumerate()
            .for_each(|(co, (dwc, dbc))| {
                dwc.fill(0.0);
                *dbc = 0.0;
                if ohw == 0 || hw == 0 {
                    return;
                }
                for s in 0..g.b {
                    let plane = &x[(s * n + co / m) * hw..][..hw];
                    let up = &dy[(s * n * m + co) * ohw..][..ohw];
                    g.each_segment(|t, (oy, lo, hi), (iy, ix)| {
                        let a = &up[oy * g.ow + lo..oy * g.ow + hi];
                        dwc[t] += dot(a, (&plane[iy * g.w + ix..], g.stride));
                    });
                    add_row_sums(std::slice::from_mut(dbc), up, ohw);
                }
            });
    }
}

impl Geom {
    /// Calls `f(tap, (oy, lo, hi), (iy, ix))` for every tap and output row
    /// whose window reads the image: output columns `lo..hi` of row `oy`
    /// read input row `iy` from column `ix`, `stride` apart. Taps in
    /// `(ky, kx)` order, rows in order within each.
    fn each_segment(&self, mut f: impl FnMut(usize, (usize, usize, usize), (usize, usize))) {
        for ky in 0..self.kh {
            for kx in 0..self.kw {
                let Some((lo, hi, ix)) = self.col_span(kx) else {
                    continue;
                };
                for oy in 0..self.oh {
                    if let Some(iy) = self.in_row(oy, ky) {
                        f(ky * self.kw + kx, (oy, lo, hi), (iy, ix));
                    }
                }
            }
        }
    }
}

/// `dst[j] += wt * src[j * stride]`. At stride 1 as slices, not a step
/// iterator, so that the loop vectorises.
fn add_scaled_from(dst: &mut [f32], (src, stride): (&[f32], usize), wt: f32) {
    if stride == 1 {
        dst.iter_mut().zip(src).for_each(|(d, &v)| *d += wt * v);
    } else {
        let src = src.iter().step_by(stride);
        dst.iter_mut().zip(src).for_each(|(d, &v)| *d += wt * v);
    }
}

/// `dst[j * stride] += wt * src[j]` ([`add_scaled_from`]'s adjoint).
fn add_scaled_into((dst, stride): (&mut [f32], usize), src: &[f32], wt: f32) {
    if stride == 1 {
        dst.iter_mut().zip(src).for_each(|(d, &v)| *d += wt * v);
    } else {
        let dst = dst.iter_mut().step_by(stride);
        dst.zip(src).for_each(|(d, &v)| *d += wt * v);
    }
}

/// `sum(a[j] * b[j * stride])`, added in a fixed order: at stride 1 in
/// eight partial sums, so that the loop vectorises.
fn dot(a: &[f32], (b, stride): (&[f32], usize)) -> f32 {
    if stride != 1 {
        return a
            .iter()
            .zip(b.iter().step_by(stride))
            .map(|(x, y)| x * y)
            .sum();
    }
    let b = &b[..a.len().min(b.len())];
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((l, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::conv_backward::plain_grads;

    fn values(n: usize, f: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + 1.0) * f).sin()).collect()
    }

    fn close(what: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{what}: sizes");
        let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!((a - b).abs() <= 1e-5 * scale, "{what} [{i}]: {a} vs {b}");
        }
    }

    /// The direct kernels equal the grouped kernel's per-group plain
    /// convolutions (im2col and GEMMs) in y, dx, dW and db, for
    /// multipliers 1 and 2, strides 1 to 3, padding and 1x1 to 5x5 taps.
    #[test]
    fn depthwise_equals_the_per_group_convolutions() {
        // (batch, groups, multiplier, h, w, kernel, pad, stride)
        let shapes = [
            (2, 3, 1, 7, 6, 3, 1, 1),
            (2, 3, 2, 7, 6, 3, 1, 2),
            (1, 4, 1, 9, 8, 5, 2, 1),
            (2, 2, 1, 9, 9, 3, 0, 3),
            (3, 2, 1, 4, 5, 1, 0, 1),
            (2, 5, 1, 2, 2, 3, 1, 1),
        ];
        for (b, n, m, h, w, k, pad, stride) in shapes {
            let what = format!("{:?}", (b, n, m, h, w, k, pad, stride));
            let g = Geom::sized(b, (1, m), (h, w), (k, k, pad), stride);
            let d = Depthwise::of(g, n).unwrap();
            let (hw, ohw, wlen) = (h * w, g.ohw(), m * k * k);
            let x = values(b * n * hw, 0.37);
            let wt = values(n * wlen, 0.53);
            let bias = values(n * m, 0.71);
            let dy = values(b * n * m * ohw, 0.19);
            let mut y = vec![f32::NAN; b * n * m * ohw];
            d.forward(&x, &wt, &bias, &mut y);
            let (mut dx, mut dw, mut db) = (
                vec![f32::NAN; x.len()],
                vec![f32::NAN; wt.len()],
                vec![f32::NAN; bias.len()],
            );
            d.input_grad(&wt, &dy, &mut dx);
            d.weight_grad(&x, &dy, &mut dw, &mut db);
            // The grouped kernel's way, group by group.
            let pick = |v: &[f32], per: usize, plane: usize, gi: usize| -> Vec<f32> {
                v.chunks(per * plane)
                    .flat_map(|s| s[gi * (per / n) * plane..][..(per / n) * plane].to_vec())
                    .collect()
            };
            for gi in 0..n {
                let (xg, dyg) = (pick(&x, n, hw, gi), pick(&dy, n * m, ohw, gi));
                let wg = &wt[gi * wlen..][..wlen];
                let mut yg = vec![0f32; b * m * ohw];
                g.forward_all(
                    "test",
                    &g.permute_taps(wg, false),
                    &bias[gi * m..][..m],
                    &xg,
                    &mut yg,
                )
                .unwrap();
                close(&format!("{what} y"), &pick(&y, n * m, ohw, gi), &yg);
                let (dwb, dxg) = plain_grads(g, true, &xg, wg, &dyg).unwrap();
                close(&format!("{what} dx"), &pick(&dx, n, hw, gi), &dxg);
                close(
                    &format!("{what} dW"),
                    &dw[gi * wlen..][..wlen],
                    &dwb[..wlen],
                );
                close(&format!("{what} db"), &db[gi * m..][..m], &dwb[wlen..]);
            }
        }
    }
}
