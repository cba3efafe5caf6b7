//! im2col for strided convolutions through column phases.
//!
//! With stride `s`, an im2col row reads every `s`-th input column: one
//! scalar load and store per element (ResNet-18's 7x7 stride-2 stem at 224
//! px: 59 million a batch of 32, about as long as its GEMM). Here each
//! sample's input is first split once into `s` column phases per channel
//! (phase `p` holds columns `p, p + s, p + 2s, ...` of every row), after
//! which each im2col row segment is one contiguous copy out of a phase.
//! col2im, its adjoint, adds each segment into a zeroed phase buffer and
//! interleaves the phases back into `dx` once.

use crate::conv::Geom;

impl Geom {
    /// Columns of one phase plane row: `ceil(W / s)`.
    fn phase_width(&self) -> usize {
        self.w.div_ceil(self.stride)
    }

    /// `x (Cin, H, W)` split into phases: `(Cin, s, H, ceil(W/s))`, column
    /// `j` of phase `p` being input column `j * s + p` (unused tail zero).
    fn phases(&self, x: &[f32]) -> Vec<f32> {
        let (s, wq, hw) = (self.stride, self.phase_width(), self.h * self.w);
        let plane = self.h * wq;
        let mut out = vec![0f32; self.cin * s * plane];
        for (ci, src) in x.chunks(hw).enumerate().take(self.cin) {
            let dst = &mut out[ci * s * plane..][..s * plane];
            for (iy, row) in src.chunks(self.w).enumerate() {
                // Phase by phase: the row is in L1, each phase's writes
                // are one contiguous run.
                for (p, ph) in dst.chunks_mut(plane).enumerate() {
                    let to = &mut ph[iy * wq..][..wq];
                    let from = row.get(p..).unwrap_or_default();
                    for (j, t) in to.iter_mut().enumerate().take(from.len().div_ceil(s)) {
                        *t = from[j * s];
                    }
                }
            }
        }
        out
    }

    /// [`Geom::im2col`] for `stride > 1`: the same matrix, each row segment
    /// copied from the input's column phase.
    pub(super) fn im2col_strided(&self, x: &[f32], cols: &mut [f32]) {
        let (s, wq) = (self.stride, self.phase_width());
        let plane = self.h * wq;
        let phased = self.phases(x);
        for (r, row) in cols.chunks_mut(self.ohw()).enumerate() {
            let (ci, ky, kx) = self.tap(r);
            let span = self.col_span(kx);
            for (oy, orow) in row.chunks_mut(self.ow).enumerate() {
                match (self.in_row(oy, ky), span) {
                    (Some(iy), Some((lo, hi, ix))) => {
                        let ph = &phased[(ci * s + ix % s) * plane..][..plane];
                        orow[..lo].fill(0.0);
                        orow[lo..hi].copy_from_slice(&ph[iy * wq + ix / s..][..hi - lo]);
                        orow[hi..].fill(0.0);
                    }
                    _ => orow.fill(0.0),
                }
            }
        }
    }
}

impl Geom {
    /// [`Geom::col2im`] for `stride > 1`: each row segment added into its
    /// column phase (contiguous adds), the phases then added into `dx`.
    pub(super) fn col2im_strided(&self, cols: &[f32], dx: &mut [f32]) {
        let (s, wq, hw) = (self.stride, self.phase_width(), self.h * self.w);
        let plane = self.h * wq;
        let mut phased = vec![0f32; self.cin * s * plane];
        for (r, row) in cols.chunks(self.ohw()).enumerate() {
            let (ci, ky, kx) = self.tap(r);
            let Some((lo, hi, ix)) = self.col_span(kx) else {
                continue;
            };
            let ph = &mut phased[(ci * s + ix % s) * plane..][..plane];
            for (oy, orow) in row.chunks(self.ow).enumerate() {
                if let Some(iy) = self.in_row(oy, ky) {
                    let dst = &mut ph[iy * wq + ix / s..][..hi - lo];
                    for (d, v) in dst.iter_mut().zip(&orow[lo..hi]) {
                        *d += v;
                    }
                }
            }
        }
        for (ci, dst) in dx.chunks_mut(hw).enumerate().take(self.cin) {
            let src = &phased[ci * s * plane..][..s * plane];
            for (iy, row) in dst.chunks_mut(self.w).enumerate() {
                for (p, ph) in src.chunks(plane).enumerate() {
                    let from = &ph[iy * wq..][..wq];
                    for (d, &v) in row.iter_mut().skip(p).step_by(s).zip(from) {
                        *d += v;
                    }
                }
            }
        }
    }
}
