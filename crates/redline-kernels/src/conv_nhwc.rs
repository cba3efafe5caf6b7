//! Pixel-major convolutions on CPUs with AVX-512, for small output maps:
//! each thread's samples are copied once, padded, into `(H + 2p, W + 2p,
//! Cin)` (channels fastest), and tiles of [`PX`] output pixels x [`CO`]
//! output channels ([`crate::conv_nhwc_simd::tile`]) read every pixel
//! through its own offset. A tile may span rows and samples, so no junk
//! columns are computed: the direct kernels' wide layout
//! ([`crate::conv_direct`]) computes 16 columns per 14 on a 14x14 map and
//! rounds each sample up to whole tiles, and the im2col path of 7x7 maps
//! writes, packs and permutes a 29 MB matrix per convolution.
//!
//! The output is produced pixel-major `(pixels, Cout)` and transposed to
//! `(Cout, pixels)` per sample with the bias added.

use std::ops::Range;

use candle_core::{bail, DType};
use rayon::prelude::*;

use crate::conv::Geom;
use crate::conv_backward::add_row_sums;
use crate::conv_direct::MIN_PIXELS;
use crate::conv_nhwc_simd::{self as simd, Pixels, CO, GR, PX};
use crate::half16::Act;
use crate::transpose16::{channels_to_pixels, pixels_to_channels};

/// Output pixels per channel at or above which the pixel-major path gives
/// way (to the direct kernels).
pub(super) const MAX_PIXELS: usize = 400;

/// Output pixels per channel under which the whole-batch im2col GEMMs
/// stay: on ResNet-18's 2x2 maps at 64 px (4 pixels) they take 1.3 ms
/// forward against 2.1 pixel-major; on 4x4 maps 1.1 against 1.0.
const MIN_NHWC_PIXELS: usize = 16;

/// Im2col rows per block of a panel: 1024 rows of [`CO`] weights, 256 KB,
/// stay in the L2 cache while every tile of the thread's pixels reads them.
const ROWS: usize = 1024;

/// Output pixels per block of the weight gradient's reduction: a block of
/// the output gradient's [`CO`] channels (64 KB) stays in the L1 and L2
/// caches across every tile of rows (ResNet-18's 7x7 stage: 27 ms with
/// blocks of 1024 pixels, 19 with 256, 19.4 with 128).
const GRAD_PIXELS: usize = 256;

/// Pixels per part of the weight gradient's reduction, each part summed by
/// its own units of work: ResNet-18's bf16 stem at 224 px (batch 32) has
/// 150 rows of one panel over 200,704 pixel pairs, and split by rows alone
/// each of four pieces read the whole 51 MB output gradient.
const PART_PIXELS: usize = 16384;

/// Every tile of a pixel-major forward, in the order that keeps each block
/// of a panel's rows in cache across the tiles: for each panel `q` of
/// [`CO`] output channels, each block of `block` of its `rows` (`r`), each
/// tile of [`PX`] pixels of `px` (a short last tile repeats its last
/// pixel), `tile(q, r, (&pixels, valid), y)` with `y` the tile's place in
/// `yt` (`(pixels, cout)`). False as soon as a tile is.
pub(super) fn each_tile(
    (panels, rows, block): (usize, usize, usize),
    px: &[usize],
    (yt, cout): (&mut [f32], usize),
    mut tile: impl FnMut(usize, Range<usize>, (&[usize; PX], usize), &mut [f32]) -> bool,
) -> bool {
    for q in 0..panels {
        for r0 in (0..rows).step_by(block.max(1)) {
            let r = r0..rows.min(r0 + block);
            for (t, pixels) in px.chunks(PX).enumerate() {
                let last = pixels.len();
                let at: [usize; PX] = std::array::from_fn(|j| pixels[j.min(last - 1)]);
                if !tile(q, r.clone(), (&at, last), &mut yt[t * PX * cout + q * CO..]) {
                    return false;
                }
            }
        }
    }
    true
}

impl Geom {
    /// Whether the pixel-major forward runs this convolution: AVX-512, f32
    /// products, more than one tap, output channels a multiple of [`CO`],
    /// output maps of [`MIN_NHWC_PIXELS`] up to [`MAX_PIXELS`] (the measured table:
    /// `examples/conv_paths.rs`, kept in `bench/results`; on ResNet-18's
    /// 28x28 stage the direct forward is 16.5 ms and this one 19.7, on its
    /// 14x14 stage 18.3 against 16.1).
    pub(super) fn nhwc(&self) -> bool {
        self.nhwc_runs() && (MIN_NHWC_PIXELS..MAX_PIXELS).contains(&self.ohw())
    }

    /// Whether the backward runs pixel-major (the weight gradient here, the
    /// input gradient through the transposed convolution where it is one):
    /// as [`Geom::nhwc`], strided ones only under the direct kernels'
    /// [`MIN_PIXELS`] (ResNet-18's 28 -> 14 stride-2 weight gradient: 10.9
    /// ms direct, 12.3 pixel-major; `examples/conv_paths.rs`).
    /// bf16 products: [`Geom::nhwc16_backward`].
    pub(super) fn nhwc_backward(&self) -> bool {
        (self.nhwc() && (self.stride == 1 || self.ohw() < MIN_PIXELS)) || self.nhwc16_backward()
    }

    /// Whether the pixel-major kernels can run this convolution at all
    /// (the map size aside).
    pub(super) fn nhwc_runs(&self) -> bool {
        self.kh * self.kw > 1
            && self.gemm == DType::F32
            && self.cout.is_multiple_of(CO)
            && simd::available()
    }

    /// `(ci, ky, kx)` of the pixel-major kernels' row `r`: `(ky, kx, ci)`
    /// with the channel fastest (consecutive rows read consecutive
    /// addresses), whatever order [`Geom::tap`] gives the GEMM paths.
    fn nhwc_tap(&self, r: usize) -> (usize, usize, usize) {
        (
            r % self.cin,
            r / (self.cin * self.kw),
            (r / self.cin) % self.kw,
        )
    }

    /// Padded width of the pixel-major sample.
    pub(super) fn nhwc_wp(&self) -> usize {
        self.w + 2 * self.pad
    }

    /// Elements of one padded pixel-major sample.
    pub(super) fn nhwc_len(&self) -> usize {
        (self.h + 2 * self.pad) * self.nhwc_wp() * self.cin
    }

    /// Copies one `(Cin, H, W)` sample into the interior of its padded
    /// `(H + 2p, W + 2p, Cin)` buffer (the border stays as it is: zero).
    pub(super) fn pad_nhwc(&self, x: &[f32], xp: &mut [f32]) {
        let (cin, w, wp, pad) = (self.cin, self.w, self.nhwc_wp(), self.pad);
        channels_to_pixels(x, (cin, self.h * w), xp, |p| {
            ((p / w + pad) * wp + p % w + pad) * cin
        });
    }

    /// Each im2col row's offset from its output pixel's base, and the
    /// largest: tap `(ci, ky, kx)` at `(ky * wp + kx) * Cin + ci`.
    pub(super) fn nhwc_offsets(&self) -> (Vec<usize>, usize) {
        let wp = self.nhwc_wp();
        let offs: Vec<usize> = (0..self.k())
            .map(|r| {
                let (ci, ky, kx) = self.nhwc_tap(r);
                (ky * wp + kx) * self.cin + ci
            })
            .collect();
        let max = offs.iter().copied().max().unwrap_or(0);
        (offs, max)
    }

    /// The base offset of every output pixel of `n` samples in their
    /// padded buffers laid one after another.
    pub(super) fn nhwc_pixels(&self, n: usize) -> Vec<usize> {
        let (s, wp, cin, len) = (self.stride, self.nhwc_wp(), self.cin, self.nhwc_len());
        let mut px = Vec::with_capacity(n * self.ohw());
        for b in 0..n {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    px.push(b * len + (oy * s * wp + ox * s) * cin);
                }
            }
        }
        px
    }

    /// The weights as panels of [`CO`] output channels, row-major in
    /// im2col row order: panel `q` holds weight `(q * CO + c, ci, ky, kx)`
    /// at `k * CO + c` for im2col row `k` = `(ky, kx, ci)`; `value(co, ci,
    /// ky, kx)` reads the weight from wherever it lies (one pass, no
    /// intermediate permuted copy).
    pub(super) fn nhwc_panels_from(
        &self,
        value: impl Fn(usize, usize, usize, usize) -> f32 + Sync,
    ) -> Vec<f32> {
        let k = self.k();
        let mut out = vec![0f32; self.cout * k];
        out.par_chunks_mut((k * CO).max(1))
            .enumerate()
            .for_each(|(q, panel)| {
                for (r, row) in panel.chunks_mut(CO).enumerate() {
                    let (ci, ky, kx) = self.nhwc_tap(r);
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = value(q * CO + c, ci, ky, kx);
                    }
                }
            });
        out
    }

    /// [`Geom::nhwc_panels_from`] of weights stored `(Cout, Cin, kh, kw)`:
    /// sixteen output channels at a time, so that the sixteen stored rows
    /// are each read in order and each write is one cache line (a gather
    /// per weight across 18 KB rows was 3% of ResNet-18's 7x7 stage).
    pub(super) fn nhwc_panels_stored(&self, w: &[f32]) -> Vec<f32> {
        const L: usize = 16;
        let (k, cin, taps) = (self.k(), self.cin, self.kh * self.kw);
        let mut out = vec![0f32; self.cout * k];
        out.par_chunks_mut((k * CO).max(1))
            .zip(w.par_chunks((k * CO).max(1)))
            .for_each(|(panel, rows)| {
                for c0 in (0..CO).step_by(L) {
                    for ci in 0..cin {
                        for t in 0..taps {
                            let dst = &mut panel[(t * cin + ci) * CO + c0..][..L];
                            for (j, d) in dst.iter_mut().enumerate() {
                                *d = rows[(c0 + j) * k + ci * taps + t];
                            }
                        }
                    }
                }
            });
        out
    }

    /// The panels of the transposed convolution `t` ([`Geom::transposed`])
    /// from this one's stored weights: flipped, channels swapped (`t`'s
    /// weight `(ci, co, ky, kx)` is `w[co, ci, kh-1-ky, kw-1-kx]`). Sixteen
    /// of `t`'s output channels at a time: each stored `(16, kh*kw)` block
    /// is read whole.
    pub(super) fn nhwc_panels_flipped(&self, w: &[f32]) -> Vec<f32> {
        const L: usize = 16;
        let (cin, cout, taps) = (self.cin, self.cout, self.kh * self.kw);
        let k = cout * taps;
        let mut out = vec![0f32; cin * k];
        out.par_chunks_mut((k * CO).max(1))
            .enumerate()
            .for_each(|(q, panel)| {
                for c0 in (0..CO).step_by(L) {
                    for co in 0..cout {
                        let src = &w[(co * cin + q * CO + c0) * taps..][..L * taps];
                        for t in 0..taps {
                            let dst = &mut panel[(t * cout + co) * CO + c0..][..L];
                            for (j, d) in dst.iter_mut().enumerate() {
                                *d = src[j * taps + taps - 1 - t];
                            }
                        }
                    }
                }
            });
        out
    }

    /// The outputs of all samples of `x` into `out` ([`Geom::nhwc`]), the
    /// weights as [`Geom::nhwc_panels_from`] packs them, the bias added
    /// last; the samples split across the compute threads. bf16 products
    /// take [`Geom::forward_nhwc16`].
    pub(super) fn forward_nhwc(
        &self,
        name: &str,
        panels: &[f32],
        b: &[f32],
        x: &[f32],
        out: &mut [f32],
    ) -> candle_core::Result<()> {
        if self.gemm == DType::BF16 {
            return self.forward_nhwc16(name, panels, b, x, out);
        }
        let offs = self.nhwc_offsets();
        let (k, cout, len) = (self.k(), self.cout, self.nhwc_len());
        let pack = |x: &[f32], n: usize| {
            let mut xp = vec![0f32; n * len];
            for (xs, xb) in x.chunks(self.in_len()).zip(xp.chunks_mut(len)) {
                self.pad_nhwc(xs, xb);
            }
            Ok(xp)
        };
        let tiles = |xp: &[f32], px: &[usize], yt: &mut [f32]| {
            each_tile((cout / CO, k, ROWS), px, (yt, cout), |q, r, at, y| {
                let block = &panels[(q * k + r.start) * CO..];
                let ops = (&offs.0[r.clone()], offs.1);
                simd::tile(block, ops, (xp, at.0), (y, cout), (at.1, r.start > 0))
            })
        };
        let frame = (name, self.per_chunk(), 1);
        self.pixel_major_forward(frame, (x, b, out), pack, tiles)
    }

    /// The frame of the pixel-major forwards (f32 and bf16): the samples
    /// split across the compute threads `per` at a time; each chunk's `n`
    /// samples packed padded and pixel-major by `pack`, in elements of
    /// `scale` f32 values each (1, or 2 for bf16 pairs); every tile of its
    /// output pixels run by `tiles` into a `(pixels, Cout)` buffer, then
    /// transposed into `out` with the bias `b` added. `x` and `out` are
    /// stored f32 or bf16 ([`Act`]): a bf16 sample is widened as `pack`
    /// takes it, and an output sample rounded as it is transposed.
    pub(super) fn pixel_major_forward<X: Act, O: Act, T: Send>(
        &self,
        (name, per, scale): (&str, usize, usize),
        (x, b, out): (&[X], &[f32], &mut [O]),
        pack: impl Fn(&[X], usize) -> candle_core::Result<Vec<T>> + Sync,
        tiles: impl Fn(&[T], &[usize], &mut [f32]) -> bool + Sync,
    ) -> candle_core::Result<()> {
        out.par_chunks_mut(per * self.out_len())
            .zip(x.par_chunks(per * self.in_len()))
            .try_for_each(|(out, x)| {
                let n = x.len() / self.in_len().max(1);
                let xp = pack(x, n)?;
                let px: Vec<usize> = self.nhwc_pixels(n).iter().map(|p| p / scale).collect();
                let mut yt = vec![0f32; px.len() * self.cout];
                if !tiles(&xp, &px, &mut yt) {
                    bail!("{name}: a pixel-major tile left its buffers ({self:?})");
                }
                self.untranspose_out(&yt, b, out);
                Ok(())
            })
    }

    /// `[dW | db]` of the whole batch into `dwb` (overwritten), dW stored
    /// `(Cout, Cin, kh, kw)`: the inputs padded pixel-major and the output
    /// gradient transposed pixel-major once, then the threads take pieces
    /// of rows of panels of [`CO`] output channels (no partial sums to add;
    /// a 64-channel layer's one panel split so that both cores work: its
    /// dW at 16x16 took 1.6 ms on one, the direct kernel 0.8 on two),
    /// reducing over every pixel of the batch in tiles of [`GR`] rows.
    /// bf16 products take [`Geom::weight_grad_nhwc16`].
    pub(super) fn weight_grad_nhwc(
        &self,
        name: &str,
        x: &[f32],
        dy: &[f32],
        dwb: &mut [f32],
    ) -> candle_core::Result<()> {
        if self.gemm == DType::BF16 {
            return self.weight_grad_nhwc16(name, x, dy, dwb);
        }
        let len = self.nhwc_len();
        let mut xp = vec![0f32; self.b * len];
        xp.par_chunks_mut(len.max(1))
            .zip(x.par_chunks(self.in_len().max(1)))
            .for_each(|(xb, xs)| self.pad_nhwc(xs, xb));
        let mut dyt = vec![0f32; dy.len()];
        dyt.par_chunks_mut(self.out_len().max(1))
            .zip(dy.par_chunks(self.out_len().max(1)))
            .for_each(|(t, d)| self.pixel_major(d, t));
        let px = Pixels::new(self.nhwc_pixels(self.b));
        self.weight_grad_frame(name, (&xp, &px, &dyt), simd::grad_tile, dy, dwb)
    }

    /// The frame of the pixel-major weight gradients (f32 and bf16):
    /// `xp` the inputs padded pixel-major with the pixels `px` that the
    /// reduction runs over, `dyt` the output gradient pixel-major at the
    /// same pixels (`(pixels, Cout)`); the threads take pieces of rows of
    /// panels of [`CO`] output channels, each reducing over every pixel in
    /// blocks of [`GRAD_PIXELS`] with `tile` ([`simd::grad_tile`]'s
    /// contract); then dW is stored `(Cout, Cin, kh, kw)` and db summed
    /// from `dy` as it lies.
    pub(super) fn weight_grad_frame<T: Sync, X: Act>(
        &self,
        name: &str,
        (xp, px, dyt): (&[T], &Pixels, &[T]),
        tile: impl Fn(
                (&[T], &Pixels),
                &[usize; GR],
                (usize, usize),
                (&[T], usize),
                (&mut [f32], usize),
            ) -> bool
            + Sync,
        dy: &[X],
        dwb: &mut [f32],
    ) -> candle_core::Result<()> {
        let (k, cout) = (self.k(), self.cout);
        // The rows padded to whole tiles with copies of the last: their sums
        // are computed and dropped.
        let (mut offs, _) = self.nhwc_offsets();
        let last = offs.last().copied().unwrap_or(0);
        offs.resize(k.next_multiple_of(GR), last);
        let (npx, kp) = (px.at().len(), offs.len());
        // The reduction in parts of at most PART_PIXELS pixels (a count
        // that is the shape's, not the thread count's: the same sums in the
        // same order on any machine), each summed into its own buffer and
        // the buffers added in order. Then units of work: each part's
        // panels' rows in pieces, at least two units a thread (ResNet's
        // 64-channel layers have one panel).
        let panels = cout / CO;
        let groups = kp / GR;
        let parts = match npx.div_ceil(PART_PIXELS) {
            0 | 1 => 1,
            n => n.next_multiple_of(4),
        };
        let span = npx.div_ceil(parts).next_multiple_of(GRAD_PIXELS);
        let pieces = (2 * crate::gemm::threads())
            .div_ceil(panels.max(1) * parts)
            .clamp(1, groups.max(1));
        let piece = groups.div_ceil(pieces).max(1) * GR;
        let plen = (kp * CO).max(1);
        let mut local = vec![0f32; parts * panels * plen];
        local
            .par_chunks_mut(panels * plen)
            .enumerate()
            .flat_map(|(p, lp)| {
                lp.par_chunks_mut(plen)
                    .enumerate()
                    .map(move |(q, lq)| (p, q, lq))
            })
            .flat_map(|(p, q, lq)| {
                lq.par_chunks_mut(piece * CO)
                    .enumerate()
                    .map(move |(i, part)| (p, q, i * piece, part))
            })
            .try_for_each(|(p, q, r0, part)| {
                let end = npx.min((p + 1) * span);
                for i0 in (p * span..end).step_by(GRAD_PIXELS) {
                    let n = GRAD_PIXELS.min(end - i0);
                    let g = &dyt[i0 * cout + q * CO..];
                    let rows = offs[r0..].chunks_exact(GR);
                    for (rows, out) in rows.zip(part.chunks_mut(GR * CO)) {
                        let rows: [usize; GR] = std::array::from_fn(|r| rows[r]);
                        if !tile((xp, px), &rows, (i0, n), (g, cout), (out, CO)) {
                            bail!("{name}: a pixel-major weight-gradient tile left its buffers ({self:?})");
                        }
                    }
                }
                Ok(())
            })?;
        let (first, rest) = local.split_at_mut(panels * plen);
        for other in rest.chunks(panels * plen) {
            first
                .par_chunks_mut(plen)
                .zip(other.par_chunks(plen))
                .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, s)| *d += s));
        }
        let local = first;
        let (dw, db) = dwb.split_at_mut(cout * k);
        dw.par_chunks_mut((CO * k).max(1))
            .zip(local.par_chunks((kp * CO).max(1)))
            .for_each(|(dwq, lq)| self.store_weight_grad(lq, dwq));
        db.fill(0.0);
        for d in dy.chunks(self.out_len().max(1)) {
            add_row_sums(db, d, self.ohw());
        }
        Ok(())
    }

    /// A panel's weight gradient `(K, CO)` in im2col row order into its
    /// `CO` rows of the stored `(Cout, Cin, kh, kw)` order: sixteen
    /// channels at a time, so that each read is one cache line and the
    /// sixteen rows are written in order.
    fn store_weight_grad(&self, local: &[f32], dwq: &mut [f32]) {
        const L: usize = 16;
        let (k, cin, taps) = (self.k(), self.cin, self.kh * self.kw);
        for c0 in (0..CO).step_by(L) {
            for ci in 0..cin {
                for t in 0..taps {
                    let src = &local[(t * cin + ci) * CO + c0..][..L];
                    for (j, &v) in src.iter().enumerate() {
                        dwq[(c0 + j) * k + ci * taps + t] = v;
                    }
                }
            }
        }
    }

    /// One sample's `(Cout, oh*ow)` output gradient as `(oh*ow, Cout)`.
    pub(super) fn pixel_major(&self, dy: &[f32], dyt: &mut [f32]) {
        let cout = self.cout;
        channels_to_pixels(dy, (cout, self.ohw()), dyt, |i| i * cout);
    }

    /// `(n * oh*ow, Cout)` pixel-major outputs into `(n, Cout, oh*ow)`, the
    /// bias added.
    pub(super) fn untranspose_out<O: Act>(&self, yt: &[f32], b: &[f32], out: &mut [O]) {
        let (cout, p) = (self.cout, self.ohw());
        let mut scratch = Vec::new();
        for (y, src) in out.chunks_mut(cout * p).zip(yt.chunks(p * cout)) {
            O::write(y, &mut scratch, |y| {
                pixels_to_channels(src, (cout, b), (cout, p), y)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::conv_reference::{close, forward_operands, vals};

    /// Geometries the pixel-major kernel takes: tiles spanning rows and
    /// samples, a last tile cut short, strides 1-3, 1x3 and 5x5 kernels,
    /// several panels.
    fn shapes() -> Vec<Geom> {
        vec![
            Geom::sized(3, (4, 64), (7, 7), (3, 3, 1), 1),
            Geom::sized(2, (16, 64), (5, 6), (3, 3, 1), 1),
            Geom::sized(2, (8, 64), (10, 12), (1, 3, 1), 1),
            Geom::sized(3, (12, 128), (9, 9), (5, 5, 2), 1),
            Geom::sized(2, (4, 64), (13, 13), (3, 3, 1), 2),
            Geom::sized(2, (4, 64), (15, 13), (3, 3, 0), 3),
            Geom::sized(5, (3, 64), (13, 13), (3, 3, 1), 1),
            // More im2col rows than a block of a panel (1170 > 1024).
            Geom::sized(2, (130, 64), (6, 6), (3, 3, 1), 1),
        ]
    }

    /// The pixel-major forward equals the im2col + GEMM forward (to
    /// rounding: both sum the rows in im2col order, the GEMM in blocks).
    #[test]
    fn nhwc_forward_matches_the_im2col_forward() -> candle_core::Result<()> {
        if !simd::available() {
            eprintln!("no AVX-512 here: the pixel-major kernel is not run");
            return Ok(());
        }
        for g in shapes() {
            assert!(g.nhwc(), "{g:?} should take the pixel-major forward");
            let (x, w, b) = forward_operands(&g);
            let mut got = vec![0f32; g.b * g.out_len()];
            let k = g.k();
            let panels =
                g.nhwc_panels_from(|co, ci, ky, kx| w[co * k + (ky * g.kw + kx) * g.cin + ci]);
            // Packed from the stored (Cout, Cin, kh, kw) order: the same panels.
            let stored = g.permute_taps(&w, true);
            assert_eq!(g.nhwc_panels_stored(&stored), panels, "{g:?} stored panels");
            g.forward_nhwc("test", &panels, &b, &x, &mut got)?;
            close(
                &format!("{g:?} forward"),
                &got,
                &g.reference_forward(&w, &b, &x)?,
            );
        }
        Ok(())
    }

    /// The pixel-major weight gradient and bias gradient equal `dy *
    /// cols^T` and the row sums of dy, summed over the samples.
    #[test]
    fn nhwc_weight_grad_matches_the_im2col_product() -> candle_core::Result<()> {
        if !simd::available() {
            eprintln!("no AVX-512 here: the pixel-major kernel is not run");
            return Ok(());
        }
        // Plus one of more pixels than a reduction block (several blocks).
        let big = Geom::sized(24, (4, 64), (7, 7), (3, 3, 1), 1);
        for g in shapes().into_iter().chain([big]) {
            let (x, dy) = (vals(g.b * g.in_len(), 0.29), vals(g.b * g.out_len(), 0.13));
            let mut got = vec![f32::NAN; g.cout * g.k() + g.cout];
            g.weight_grad_nhwc("test", &x, &dy, &mut got)?;
            // The reference in im2col row order, then as stored.
            let mut want = g.reference_weight_grad(&x, &dy)?;
            g.unpermute_weight_grad(&mut want);
            close(&format!("{g:?} dW and db"), &got, &want);
        }
        Ok(())
    }

    /// The pixel-major input gradient (the transposed convolution's
    /// forward, its panels read from the stored weights) equals `w^T * dy`
    /// followed by col2im.
    #[test]
    fn nhwc_input_grad_matches_col2im() -> candle_core::Result<()> {
        if !simd::available() {
            eprintln!("no AVX-512 here: the pixel-major kernel is not run");
            return Ok(());
        }
        let cases = [
            Geom::sized(3, (64, 64), (7, 7), (3, 3, 1), 1),
            Geom::sized(2, (64, 128), (5, 6), (3, 3, 1), 1),
            Geom::sized(2, (128, 64), (9, 9), (5, 5, 2), 1),
        ];
        for g in cases {
            assert!(g.nhwc(), "{g:?} should take the pixel-major backward");
            let t = g.transposed().filter(Geom::nhwc).unwrap();
            let (w, dy) = (vals(g.cout * g.k(), 0.11), vals(g.b * g.out_len(), 0.13));
            let mut got = vec![f32::NAN; g.b * g.in_len()];
            // The pixel-major kernel itself (3x3 ones of this size take
            // Winograd's through `input_grad_as_conv`).
            let zeros = vec![0f32; t.cout];
            t.forward_nhwc("test", &g.nhwc_panels_flipped(&w), &zeros, &dy, &mut got)?;
            let want = g.reference_input_grad(&g.permute_taps(&w, false), &dy)?;
            close(&format!("{g:?} dx"), &got, &want);
        }
        Ok(())
    }

    /// 1x1 kernels, bf16 products, output channels off the tiles and large
    /// maps keep the other paths (bf16 ones: the bf16 pixel-major
    /// backward, [`Geom::nhwc16_backward`]); strided maps of 100+ pixels
    /// keep the direct backward.
    #[test]
    fn other_convolutions_keep_their_paths() {
        let pointwise = Geom::sized(2, (8, 64), (9, 9), (1, 1, 0), 1);
        let bf16 = Geom {
            gemm: DType::BF16,
            ..Geom::sized(2, (8, 64), (9, 9), (3, 3, 1), 1)
        };
        let odd = Geom::sized(2, (8, 48), (9, 9), (3, 3, 1), 1);
        let large = Geom::sized(2, (8, 64), (20, 20), (3, 3, 1), 1);
        for g in [pointwise, bf16, odd, large] {
            assert!(!g.nhwc(), "{g:?}");
            assert_eq!(g.nhwc_backward(), g.nhwc16_backward(), "{g:?}");
        }
        assert_eq!(bf16.nhwc16_backward(), crate::gemm_bf16::enabled());
        // A strided 14x14 output: the forward pixel-major, the backward not
        // (the direct weight gradient); a strided 7x7 one: both.
        let strided = Geom::sized(2, (8, 64), (28, 28), (3, 3, 1), 2);
        assert!(strided.nhwc() || !simd::available());
        assert!(!strided.nhwc_backward());
        let small = Geom::sized(2, (8, 64), (14, 14), (3, 3, 1), 2);
        assert!(small.nhwc_backward() || !simd::available());
    }
}
