//! Direct convolutions on CPUs with AVX-512: the products read the input
//! at each tap's offset, so no im2col matrix is written, read back and
//! packed. The input is laid out once per sample so that every tap reads
//! consecutive addresses for consecutive output pixels: padded, and for a
//! stride `s` split into `s * s` phase planes (padded pixel `(r, c)` in
//! plane `(r % s, c % s)`); the outputs are computed over the plane's full
//! width (the wide layout of [`crate::conv_wide`]) and the junk columns
//! dropped.
//!
//! On ResNet-18's 3x3 stages at 224 px, batch 32, 2 threads of the 2-core
//! VM, the im2col + `gemm` path spent a sixth of the step in im2col and
//! the GEMM's packing and ran at 330-370 GFLOP/s; these loops run the
//! 56x56 and 28x28 stages' forward at about 430 GFLOP/s and their
//! backward at about 400 (`examples/conv_shapes.rs`).
//!
//! - Forward: tiles of [`MR`] output channels x [`NR`] wide pixels
//!   ([`crate::conv_direct_simd::forward_tile`]), the taps in im2col row
//!   order; the input gradient of a stride-1 convolution is the forward of
//!   its transposed convolution ([`crate::conv_dx`]) and takes it too.
//! - Weight gradient: the output gradient transposed pixel-major once per
//!   sample, then tiles of taps x channels (6 x 64 or 12 x 32) reducing over
//!   all the sample's pixels in registers.
//!
//! Output maps under [`MIN_PIXELS`] take the pixel-major kernels
//! ([`crate::conv_nhwc`]) or the im2col path: a sample's few pixels leave
//! the wide tiles mostly junk and reread large weights for each one
//! (ResNet-18's 7x7 stage: 29.8 ms direct, 20.1 im2col, 16.2 pixel-major;
//! `examples/conv_paths.rs`).

use candle_core::{bail, DType};
use rayon::prelude::*;

use crate::conv::Geom;
use crate::conv_direct_simd::{self as simd, DC, GRAD_NARROW, GRAD_WIDE, MR, NR};
use crate::transpose16::channels_to_pixels;

/// Output pixels per channel below which the im2col path stays.
pub(super) const MIN_PIXELS: usize = 100;

/// Output pixels per block of the weight gradient's reduction.
const GRAD_PIXELS: usize = 1024;

/// The largest stride the direct kernels take (a stride-`s` input is
/// split into `s * s` phase planes).
const MAX_STRIDE: usize = 4;

impl Geom {
    /// Whether the direct forward runs this convolution: AVX-512, more
    /// than one tap (a 1x1 convolution's product reads its input as it
    /// lies or from one strided copy, and measured no faster direct),
    /// stride up to [`MAX_STRIDE`], f32 products, output channels a
    /// multiple of [`MR`], maps of at least [`MIN_PIXELS`].
    pub(super) fn direct(&self) -> bool {
        self.direct_with_tiles(MR)
    }

    /// Whether the direct weight gradient runs: as [`Geom::direct`], with
    /// output channels a multiple of [`DC`].
    pub(super) fn direct_weight_grad(&self) -> bool {
        self.direct_with_tiles(DC)
    }

    /// [`Geom::direct`]'s rule for tiles of `channels` output channels.
    fn direct_with_tiles(&self, channels: usize) -> bool {
        self.direct_runs(channels) && self.ohw() >= MIN_PIXELS
    }

    /// Whether the direct kernels can run this convolution at all, with
    /// tiles of `channels` output channels (the map size aside).
    pub(super) fn direct_runs(&self, channels: usize) -> bool {
        self.kh * self.kw > 1
            && self.stride <= MAX_STRIDE
            && self.gemm == DType::F32
            && self.cout.is_multiple_of(channels)
            && simd::available()
    }

    /// Each im2col row's offset in the padded sample, and the largest.
    fn direct_offsets(&self) -> (Vec<usize>, usize) {
        let offs: Vec<usize> = (0..self.k()).map(|r| self.tap_offset(r)).collect();
        let max = offs.iter().copied().max().unwrap_or(0);
        (offs, max)
    }

    /// A zeroed padded-sample buffer, with a tile's slack for the last
    /// tile's junk reads.
    fn direct_padded(&self) -> Vec<f32> {
        vec![0f32; self.padded_len() + NR]
    }

    /// Weights `(Cout, K)` in im2col row order as panels of [`MR`] output
    /// channels, tap-major: panel `q` holds `w[q * MR + m][k]` at `k * MR + m`.
    fn direct_panels(&self, w: &[f32]) -> Vec<f32> {
        let k = self.k();
        let mut out = vec![0f32; w.len()];
        out.par_chunks_mut(k * MR)
            .zip(w.par_chunks(k * MR))
            .for_each(|(panel, rows)| {
                for (m, row) in rows.chunks(k).enumerate() {
                    for (kk, &v) in row.iter().enumerate() {
                        panel[kk * MR + m] = v;
                    }
                }
            });
        out
    }

    /// The outputs of all samples of `x` into `out` ([`Geom::direct`]),
    /// `w` in im2col row order, the bias added last; the samples split
    /// across the compute threads.
    pub(super) fn forward_direct(
        &self,
        name: &str,
        w: &[f32],
        b: &[f32],
        x: &[f32],
        out: &mut [f32],
    ) -> candle_core::Result<()> {
        let panels = self.direct_panels(w);
        let offs = self.direct_offsets();
        let (p, wq, ow) = (self.ohw_wide(), self.wp(), self.ow);
        let per = self.per_chunk();
        out.par_chunks_mut(per * self.out_len())
            .zip(x.par_chunks(per * self.in_len()))
            .try_for_each(|(out, x)| {
                let mut xp = self.direct_padded();
                let mut yw = vec![0f32; self.cout * p];
                let samples = out.chunks_mut(self.out_len()).zip(x.chunks(self.in_len()));
                for (y, x) in samples {
                    self.pad_into(x, &mut xp);
                    self.direct_tiles(name, &panels, (&offs.0, offs.1), &xp, &mut yw)?;
                    // (Cout, oh, wp) -> (Cout, oh, ow), junk columns dropped.
                    let planes = y.chunks_mut(self.ohw()).zip(yw.chunks(p)).zip(b);
                    for ((plane, wide), &bias) in planes {
                        for (row, src) in plane.chunks_mut(ow).zip(wide.chunks(wq)) {
                            for (o, &v) in row.iter_mut().zip(src) {
                                *o = v + bias;
                            }
                        }
                    }
                }
                Ok(())
            })
    }

    /// One padded sample's wide output `yw (Cout, oh*wp)`: for each tile of
    /// pixels, every panel of output channels (the pixels' input stays in
    /// cache across the panels).
    fn direct_tiles(
        &self,
        name: &str,
        panels: &[f32],
        offs: (&[usize], usize),
        xp: &[f32],
        yw: &mut [f32],
    ) -> candle_core::Result<()> {
        let (p, k) = (self.ohw_wide(), self.k());
        for p0 in (0..p).step_by(NR) {
            let n = NR.min(p - p0);
            for (q, panel) in panels.chunks(k * MR).enumerate() {
                let y = &mut yw[q * MR * p + p0..];
                if !simd::forward_tile(panel, offs, &xp[p0..], (y, p), n) {
                    bail!("{name}: a direct tile left its buffers ({self:?})");
                }
            }
        }
        Ok(())
    }

    /// One sample's output gradient `dy (Cout, oh, ow)` pixel-major into
    /// `dyt (oh*wq, Cout)` (junk pixels left as they are: zero), in 16 x 16
    /// blocks ([`crate::transpose16`]; one value per channel per pixel
    /// scattered across a `Cout`-float stride was 4% of ResNet-18's step).
    fn transpose_grad(&self, dy: &[f32], dyt: &mut [f32]) {
        let (cout, ow, wq) = (self.cout, self.ow, self.wp());
        channels_to_pixels(dy, (cout, self.ohw()), dyt, |p| {
            ((p / ow) * wq + p % ow) * cout
        });
    }

    /// `[dW | db]` of a chunk of samples ([`Geom::direct_weight_grad`]),
    /// dW in im2col row order: per sample, the output gradient transposed
    /// to `(oh*wp, Cout)` (junk pixels zero), then every tile of taps and
    /// channels over all its pixels.
    pub(super) fn weight_grad_direct(
        &self,
        name: &str,
        x: &[f32],
        dys: &[f32],
    ) -> candle_core::Result<Vec<f32>> {
        let (k, cout) = (self.k(), self.cout);
        let (dwt, db) = if cout.is_multiple_of(16 * GRAD_WIDE.1) {
            const T: (usize, usize) = GRAD_WIDE;
            self.weight_grad_tiles::<{ T.0 }, { T.1 }>(name, x, dys)?
        } else {
            const T: (usize, usize) = GRAD_NARROW;
            self.weight_grad_tiles::<{ T.0 }, { T.1 }>(name, x, dys)?
        };
        let mut acc = vec![0f32; cout * k + cout];
        for (kk, row) in dwt.chunks(cout).take(k).enumerate() {
            for (co, &v) in row.iter().enumerate() {
                acc[co * k + kk] = v;
            }
        }
        acc[cout * k..].copy_from_slice(&db);
        Ok(acc)
    }

    /// dW transposed `(K, Cout)` (taps padded to whole tiles of `T` rows;
    /// those rows' sums computed and dropped) and db, in tiles of `T` taps x
    /// `V` vectors of channels ([`Geom::weight_grad_direct`]).
    fn weight_grad_tiles<const T: usize, const V: usize>(
        &self,
        name: &str,
        x: &[f32],
        dys: &[f32],
    ) -> candle_core::Result<(Vec<f32>, Vec<f32>)> {
        let (p, cout, k, dc) = (self.ohw_wide(), self.cout, self.k(), 16 * V);
        let (mut offs, _) = self.direct_offsets();
        let last = offs.last().copied().unwrap_or(0);
        offs.resize(k.next_multiple_of(T), last);
        let mut xp = self.direct_padded();
        let mut dyt = vec![0f32; p * cout];
        let mut dwt = vec![0f32; offs.len() * cout];
        let mut db = vec![0f32; cout];
        for (x, dy) in x.chunks(self.in_len()).zip(dys.chunks(self.out_len())) {
            self.pad_into(x, &mut xp);
            self.transpose_grad(dy, &mut dyt);
            // Pixels in blocks, so that a block of dyt stays in cache across
            // every tile of taps (the stem's 112x112 map: 3.3 MB of dyt).
            for p0 in (0..p).step_by(GRAD_PIXELS) {
                let n = GRAD_PIXELS.min(p - p0);
                let (xb, gb) = (&xp[p0..], &dyt[p0 * cout..]);
                for (kb, taps) in offs.chunks_exact(T).enumerate() {
                    let taps: [usize; T] = std::array::from_fn(|r| taps[r]);
                    for cb in 0..cout / dc {
                        let out = &mut dwt[kb * T * cout + cb * dc..];
                        let dy = (&gb[cb * dc..], cout);
                        if !simd::weight_grad_tile::<T, V>(xb, &taps, dy, n, (out, cout)) {
                            bail!(
                                "{name}: a direct weight-gradient tile left its buffers ({self:?})"
                            );
                        }
                    }
                }
            }
            crate::conv_backward::add_row_sums(&mut db, dy, self.ohw());
        }
        Ok((dwt, db))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::conv_reference::{close, forward_operands, vals};

    fn geom(
        b: usize,
        (cin, cout): (usize, usize),
        (h, w): (usize, usize),
        (kh, kw, pad): (usize, usize, usize),
    ) -> Geom {
        Geom::sized(b, (cin, cout), (h, w), (kh, kw, pad), 1)
    }

    /// Geometries the direct kernels take: the last pixel tile cut short
    /// (masked stores; with a 3x1 kernel and no padding, a real pixel last), 1x3 and 5x5
    /// kernels, more panels and weight tiles
    /// than one, two samples per thread chunk.
    fn shapes() -> Vec<Geom> {
        vec![
            geom(3, (4, 32), (11, 11), (3, 3, 1)),
            geom(2, (8, 16), (10, 12), (1, 3, 1)),
            geom(2, (4, 32), (10, 13), (3, 1, 0)),
            geom(4, (12, 64), (13, 9), (5, 5, 2)),
            geom(2, (24, 8), (12, 12), (3, 3, 0)),
            // Strides 2 and 3 through phase planes: ResNet's strided 3x3
            // and its 7x7 stem (147 taps: a last weight-gradient tile of 3),
            // odd and even input sides; one of over 1024 wide pixels (two
            // blocks of the weight gradient's reduction).
            Geom::sized(2, (4, 32), (21, 21), (3, 3, 1), 2),
            Geom::sized(2, (4, 32), (22, 20), (3, 3, 1), 2),
            Geom::sized(2, (3, 32), (23, 23), (7, 7, 3), 2),
            Geom::sized(2, (4, 32), (33, 34), (3, 3, 0), 3),
            geom(1, (2, 32), (40, 30), (3, 3, 1)),
        ]
    }

    /// The direct forward equals the im2col + GEMM forward (to rounding:
    /// the products sum the taps in the same order, the GEMM in blocks).
    #[test]
    fn direct_forward_matches_the_im2col_forward() -> candle_core::Result<()> {
        if !simd::available() {
            eprintln!("no AVX-512 here: the direct kernels are not run");
            return Ok(());
        }
        for g in shapes() {
            assert!(g.direct(), "{g:?} should take the direct forward");
            let (x, w, b) = forward_operands(&g);
            let mut got = vec![0f32; g.b * g.out_len()];
            g.forward_direct("test", &w, &b, &x, &mut got)?;
            close(
                &format!("{g:?} forward"),
                &got,
                &g.reference_forward(&w, &b, &x)?,
            );
        }
        Ok(())
    }

    /// The direct weight gradient and bias gradient equal `dy * cols^T`
    /// and the row sums of dy, summed over the samples.
    #[test]
    fn direct_weight_grad_matches_the_im2col_product() -> candle_core::Result<()> {
        if !simd::available() {
            eprintln!("no AVX-512 here: the direct kernels are not run");
            return Ok(());
        }
        for g in shapes().into_iter().filter(Geom::direct_weight_grad) {
            let (x, dy) = (vals(g.b * g.in_len(), 0.29), vals(g.b * g.out_len(), 0.13));
            let got = g.weight_grad_direct("test", &x, &dy)?;
            let want = g.reference_weight_grad(&x, &dy)?;
            close(&format!("{g:?} dW and db"), &got, &want);
        }
        let taken = shapes().iter().filter(|g| g.direct_weight_grad()).count();
        assert!(
            taken >= 6,
            "only {taken} shapes take the direct weight gradient"
        );
        Ok(())
    }

    /// Small maps, strides over 4, 1x1 kernels, bf16 products and output
    /// channels off the tiles keep the im2col path.
    #[test]
    fn other_convolutions_keep_the_im2col_path() {
        let small = geom(2, (8, 32), (9, 9), (3, 3, 1));
        let wide_stride = Geom::sized(2, (8, 32), (60, 60), (3, 3, 1), 5);
        let bf16 = Geom {
            gemm: DType::BF16,
            ..geom(2, (8, 32), (11, 11), (3, 3, 1))
        };
        let odd_channels = geom(2, (8, 12), (11, 11), (3, 3, 1));
        let pointwise = Geom::sized(3, (12, 32), (21, 22), (1, 1, 0), 2);
        for g in [small, wide_stride, bf16, odd_channels, pointwise] {
            assert!(!g.direct() && !g.direct_weight_grad(), "{g:?}");
        }
        assert!(geom(2, (8, 16), (11, 11), (3, 3, 1)).direct() || !simd::available());
        assert!(!geom(2, (8, 16), (11, 11), (3, 3, 1)).direct_weight_grad());
    }
}
