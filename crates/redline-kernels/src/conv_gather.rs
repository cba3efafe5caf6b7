//! im2col and col2im on short output rows, through a table of where each
//! tap reads.
//!
//! The row-by-row copies of [`Geom::im2col`] pay a call, a span and two
//! fills per output row: on maps of a few pixels a side (ResNet-18's 4x4
//! and 2x2 stages at 64 px) that is a copy of one to four values each.
//! im2col and col2im took 19% of a bf16-true ResNet-18 step at 64 px
//! (perf, 2026-11-28, the 2-core Zen 4 VM), two thirds of it on those
//! stages' whole-batch matrices.
//! Here each convolution finds once, for each tap and output pixel, the
//! input pixel it reads (or none, in the padding); every row of every
//! sample is then one pass of loads through that table, any stride.

use crate::conv::Geom;

/// Output rows shorter than this many pixels gather through the table.
/// `examples/conv_shapes.rs --bf16`, ResNet-18's convolutions (ms backward,
/// row copies -> table, 2-core Zen 4 VM): batch 16 at 64 px, the 4x4 maps
/// 3.1 -> 2.4 and the 2x2 ones 4.0 -> 3.4-3.7; batch 32 at 224 px, 28x28
/// and 14x14 maps no faster (43.0 -> 50.3 and 44.7 -> 47.8 at 32).
const SHORT_ROW: usize = 8;

/// A strided convolution's output rows shorter than this gather through the
/// table: the 1x1 stride-2 downsampling of ResNet-18 at 224 px, backward,
/// 9.5-12.5 -> 6.1-6.6 ms (28x28 output) and 5.9-6.8 -> 5.0-5.1 (14x14).
const STRIDED_ROW: usize = 32;

/// A table entry for a tap that reads the padding.
const PAD: u32 = u32::MAX;

impl Geom {
    /// Whether im2col and col2im go through [`Geom::gather_table`]: output
    /// rows of under [`SHORT_ROW`] pixels, or of under [`STRIDED_ROW`] for
    /// a strided convolution (whose row copies go through column phases).
    pub(super) fn gathers(&self) -> bool {
        let short = self.ow < SHORT_ROW || (self.stride > 1 && self.ow < STRIDED_ROW);
        short && u32::try_from(self.h * self.w).is_ok_and(|n| n < PAD)
    }

    /// For tap `(ky, kx)` and output pixel `j`, at `(ky * kw + kx) * oh*ow
    /// + j`: the index in its input plane of the pixel it reads, or
    /// [`PAD`] where the window hangs over the padding.
    pub(super) fn gather_table(&self) -> Vec<u32> {
        let mut table = Vec::with_capacity(self.kh * self.kw * self.ohw());
        for ky in 0..self.kh {
            for kx in 0..self.kw {
                for oy in 0..self.oh {
                    let iy = self.in_row(oy, ky);
                    for ox in 0..self.ow {
                        let ix = (ox * self.stride + kx)
                            .checked_sub(self.pad)
                            .filter(|&ix| ix < self.w);
                        let at = iy.zip(ix).map(|(iy, ix)| iy * self.w + ix);
                        table.push(at.and_then(|i| u32::try_from(i).ok()).unwrap_or(PAD));
                    }
                }
            }
        }
        table
    }

    /// Tap `(ky, kx)`'s row of `table`.
    pub(super) fn taps<'a>(&self, table: &'a [u32], ky: usize, kx: usize) -> &'a [u32] {
        let p = self.ohw();
        &table[(ky * self.kw + kx) * p..][..p]
    }

    /// One sample's im2col matrix ([`Geom::im2col`]) through the table.
    pub(super) fn im2col_gather(&self, x: &[f32], cols: &mut [f32]) {
        let (table, hw) = (self.gather_table(), self.h * self.w);
        for (r, row) in cols.chunks_mut(self.ohw()).enumerate() {
            let (ci, ky, kx) = self.tap(r);
            gather(&x[ci * hw..][..hw], self.taps(&table, ky, kx), row);
        }
    }

    /// [`Geom::col2im`] through `table` ([`Geom::gather_table`]): sample
    /// `s`'s columns of `cols`, `(K, n * oh*ow)` with the `n` samples side
    /// by side (`n = 1`: one sample's matrix), added into its input
    /// gradient `dx`.
    pub(super) fn col2im_gather(
        &self,
        table: &[u32],
        cols: &[f32],
        (s, n): (usize, usize),
        dx: &mut [f32],
    ) {
        let (hw, p) = (self.h * self.w, self.ohw());
        for r in 0..self.k() {
            let (ci, ky, kx) = self.tap(r);
            let src = &cols[(r * n + s) * p..][..p];
            scatter(src, self.taps(table, ky, kx), &mut dx[ci * hw..][..hw]);
        }
    }
}

/// `out[j] = plane[taps[j]]`, zero where `taps[j]` is [`PAD`].
pub(super) fn gather(plane: &[f32], taps: &[u32], out: &mut [f32]) {
    for (o, &i) in out.iter_mut().zip(taps) {
        *o = plane.get(i as usize).copied().unwrap_or(0.0);
    }
}

/// `plane[taps[j]] += src[j]`, skipping [`PAD`].
fn scatter(src: &[f32], taps: &[u32], plane: &mut [f32]) {
    for (&v, &i) in src.iter().zip(taps) {
        if let Some(d) = plane.get_mut(i as usize) {
            *d += v;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// (batch, cin, h, w, kernel, pad, stride)
    const SHAPES: [(usize, usize, usize, usize, usize, usize, usize); 7] = [
        (3, 5, 2, 2, 3, 1, 1),
        (2, 4, 4, 4, 3, 1, 1),
        (2, 3, 7, 5, 3, 1, 2),
        (2, 2, 8, 8, 1, 0, 2),
        (1, 3, 9, 9, 7, 3, 2),
        (2, 2, 5, 6, 5, 2, 1),
        (2, 3, 6, 6, 2, 0, 3),
    ];

    fn values(n: usize, f: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + 1.0) * f).sin()).collect()
    }

    fn geom(
        (b, cin, h, w, k, pad, stride): (usize, usize, usize, usize, usize, usize, usize),
    ) -> Geom {
        Geom::sized(b, (cin, 4), (h, w), (k, k, pad), stride)
    }

    /// The table's im2col is the row copies' ([`Geom::im2col_row`] and the
    /// strided phases), value for value, padding zeros included.
    #[test]
    fn gathered_columns_equal_the_copied_ones() {
        for shape in SHAPES {
            let g = geom(shape);
            let x = values(g.in_len(), 0.37);
            let mut copied = vec![f32::NAN; g.k() * g.ohw()];
            g.im2col_copies(&x, &mut copied);
            let mut gathered = vec![f32::NAN; copied.len()];
            g.im2col_gather(&x, &mut gathered);
            assert_eq!(gathered, copied, "{shape:?}");
        }
    }

    /// col2im through the table adds each column entry where the copies'
    /// col2im adds it, from one sample's matrix and from a sample's place
    /// among others side by side.
    #[test]
    fn gathered_col2im_equals_the_copied_one() {
        for shape in SHAPES {
            let g = geom(shape);
            let (k, p, n) = (g.k(), g.ohw(), 3);
            let all = values(k * n * p, 0.53);
            for s in 0..n {
                let mut one = vec![0f32; k * p];
                g.take_sample(&all, s, &mut one);
                let mut want = vec![0f32; g.in_len()];
                g.col2im_copies(&one, &mut want);
                let mut got = vec![0f32; g.in_len()];
                g.col2im_gather(&g.gather_table(), &all, (s, n), &mut got);
                assert_eq!(got, want, "{shape:?} sample {s}");
            }
        }
    }
}
