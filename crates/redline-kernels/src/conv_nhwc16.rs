//! Pixel-major convolutions on bf16 products (`bf16-mixed`, `bf16-true`;
//! AVX-512 BF16): the forward, and the input gradient of a stride-1
//! convolution through its transposed convolution ([`crate::conv_dx`]).
//!
//! The fp32 pixel-major kernels' layout ([`crate::conv_nhwc`]), in pairs:
//! each sample is copied once, padded, into `(H + 2p, W + 2p, Cin)` and
//! rounded to bf16, so that two consecutive input channels of a pixel are
//! one u32, the pair `vdpbf16ps` multiplies; the weights are packed as the
//! same pairs of input channels by [`CO`] output channels. A tile of
//! [`PX`] pixels x [`CO`] channels then takes each pixel's pair with one
//! broadcast and multiplies it against four weight vectors: 24 `zmm` sums,
//! 32 multiply-adds an instruction.
//!
//! The im2col route it replaces (`conv2d_strided_in`'s GEMM) wrote each
//! sample's `(Cin * kh * kw, oh * ow)` matrix in f32 and packed it into
//! bf16 pairs again: nine copies of a 3x3 convolution's input each way, at
//! ResNet-18's sizes more time than the products.
//!
//! The products are the bf16 GEMM's: the operands rounded to nearest even,
//! the sums in f32 (each output summed by one thread in a fixed order, so
//! the same bits on every run and thread count).

use std::ops::Range;

use candle_core::{bail, DType};
use rayon::prelude::*;

use crate::conv::Geom;
use crate::conv_nhwc::each_tile;
use crate::conv_nhwc_simd::{Pixels, CO, PX};
use crate::gemm_bf16_pack::{interleaved, pairs};
use crate::half16::Act;

/// Pairs of input rows per block of a panel: 512 pairs of [`CO`] weights,
/// 128 KB, stay in the L2 cache while every tile of the group reads them.
const PAIRS: usize = 512;

/// Output pixels per group of samples taken together: whole samples, at
/// least this many pixels (one 56x56 sample; twenty-one 7x7 ones), so that
/// a group's padded input and output stay in the L2 cache, and at most a
/// thread's share of the batch ([`Geom::per_chunk`]), so that every core
/// has a group.
const GROUP_PIXELS: usize = 1024;

/// Output pixels per channel under which the im2col GEMMs stay: on
/// ResNet-18's 4x4 maps at 64 px (batch 16) the whole-batch GEMMs took 0.8
/// ms forward against 1.0-1.1 here; on its 7x7 maps at 224 px (batch 32)
/// 15 against 13.5 here (`examples/conv_shapes.rs --bf16`, the threshold
/// at 16, 32 and 100 in turn).
pub(super) const MIN_PIXELS: usize = 32;

impl Geom {
    /// Whether the bf16 pixel-major kernels run this convolution's forward:
    /// bf16 products on a CPU with AVX-512 BF16, more than one tap, input
    /// channels in pairs, output channels a multiple of [`CO`], and output
    /// maps of at least [`MIN_PIXELS`].
    pub(super) fn nhwc16(&self) -> bool {
        self.gemm == DType::BF16
            && self.kh * self.kw > 1
            && self.cin.is_multiple_of(2)
            && self.cout.is_multiple_of(CO)
            && self.ohw() >= MIN_PIXELS
            && crate::gemm_bf16::enabled()
    }

    /// The fp32 twin whose direct kernels run this bf16 convolution's
    /// forward, on its operands rounded to bf16 (a product of two bf16
    /// values is exact in f32, so these are the bf16 products), where
    /// the bf16 pixel-major kernel cannot pair its input channels (odd: a
    /// stem's 3) and the fp32 forward is direct: ResNet-18's 7x7 stem at
    /// 224 px (batch 32) took 28-31 ms on the bf16 GEMM's im2col (147 rows
    /// of 12544 pixels a sample, written and packed) against 24-25 direct.
    pub(super) fn direct16(&self) -> Option<Geom> {
        let fp32 = Geom {
            gemm: DType::F32,
            ..*self
        };
        (self.gemm == DType::BF16
            && !self.cin.is_multiple_of(2)
            && fp32.forward_path() == crate::conv::Path::Direct)
            .then_some(fp32)
    }

    /// The outputs of all samples of `x` into `out` on bf16 products
    /// ([`Geom::nhwc16`]), the weights in f32 as
    /// [`Geom::nhwc_panels_from`] lays them out, the bias added last; the
    /// samples split across the compute threads. `x` and `out` stored f32
    /// or bf16 ([`Act`]).
    pub(super) fn forward_nhwc16<X: Act, O: Act>(
        &self,
        name: &str,
        panels: &[f32],
        b: &[f32],
        x: &[X],
        out: &mut [O],
    ) -> candle_core::Result<()> {
        let (k, cout) = (self.k(), self.cout);
        let kp = k / 2;
        let wpanels = pair_panels(panels, k)
            .ok_or_else(|| candle_core::Error::Msg(format!("{name}: bf16 panels ({self:?})")))?;
        // Pair p's offset from a pixel's base, in pairs: row 2p's.
        let (offs, _) = self.nhwc_offsets();
        let offs = Pixels::new(offs.iter().step_by(2).map(|o| o / 2).collect());
        // At most a thread's share of the batch: 16 samples of 8x8 are one
        // group of 1024 pixels, which left the other cores idle (ResNet's
        // 8x8 3x3 forward ran at half the 16x16 one's rate).
        let group = GROUP_PIXELS
            .div_ceil(self.ohw().max(1))
            .clamp(1, self.per_chunk());
        let len = self.nhwc_len();
        let pack = |x: &[X], n: usize| {
            let mut padded = vec![0f32; len];
            let mut xp = vec![0u32; n * len / 2];
            let mut scratch = Vec::new();
            for (xs, xb) in x.chunks(self.in_len()).zip(xp.chunks_mut(len / 2)) {
                self.pad_nhwc(X::read(xs, &mut scratch), &mut padded);
                if !pairs(&padded, xb) {
                    bail!("{name}: bf16 pairs of the padded input ({self:?})");
                }
            }
            Ok(xp)
        };
        let tiles = |xp: &[u32], px: &[usize], yt: &mut [f32]| {
            each_tile((cout / CO, kp, PAIRS), px, (yt, cout), |q, r, at, y| {
                let block = &wpanels[(q * kp + r.start) * CO..];
                let acc = r.start > 0;
                tile16(block, (&offs, r), (xp, at.0), (y, cout), (at.1, acc))
            })
        };
        self.pixel_major_forward((name, group, 2), (x, b, out), pack, tiles)
    }
}

/// f32 panels of [`CO`] output channels by `k` rows (row-major, as
/// [`Geom::nhwc_panels_from`] packs them) as bf16 pairs of rows: pair `p`
/// of channel `c` at `p * CO + c` of its panel. `None` without AVX-512
/// BF16 or when `k` is odd or the length disagrees.
fn pair_panels(panels: &[f32], k: usize) -> Option<Vec<u32>> {
    if !k.is_multiple_of(2) || !panels.len().is_multiple_of((k * CO).max(1)) {
        return None;
    }
    let mut out = vec![0u32; panels.len() / 2];
    let ok = out
        .par_chunks_mut((k / 2 * CO).max(1))
        .zip(panels.par_chunks((k * CO).max(1)))
        .all(|(dst, src)| {
            dst.chunks_exact_mut(CO)
                .zip(src.chunks_exact(2 * CO))
                .all(|(d, s)| interleaved(&s[..CO], &s[CO..], d))
        });
    ok.then_some(out)
}

/// One tile of bf16 products over the pairs `rows` of `offs`: for `j < n`
/// and `c < CO`, `y[j * ldy + c] (+)= sum_p panel[p * CO + c] . x[px[j] +
/// offs[rows.start + p]]` (each a pair), the pairs summed in order, added
/// to what `y` holds when `acc`. Every `px[j]` must be in bounds, those
/// past `n` included (checked against the largest offset of all `offs`,
/// found once when they were made). `false` (nothing written) without
/// AVX-512 BF16 or when an index would leave a slice.
fn tile16(
    panel: &[u32],
    (offs, rows): (&Pixels, Range<usize>),
    (x, px): (&[u32], &[usize; PX]),
    (y, ldy): (&mut [f32], usize),
    (n, acc): (usize, bool),
) -> bool {
    let max_off = offs.max();
    let Some(offs) = offs.at().get(rows) else {
        return false;
    };
    let fits = n > 0
        && n <= PX
        && ldy >= CO
        && panel.len() >= offs.len() * CO
        && px.iter().all(|&p| p + max_off < x.len())
        && (n - 1) * ldy + CO <= y.len();
    if !crate::gemm_bf16::available() || !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F and BF16 are present; every read `px[j] + offs[p] <=
    // px[j] + max_off < x.len()` (`Pixels` keeps the largest offset), the
    // panel holds `offs.len() * CO` pairs, and the stores reach
    // `(n - 1) * ldy + CO <= y.len()`.
    unsafe {
        x86::tile16(panel, offs, x, px, (y.as_mut_ptr(), ldy), (n, acc));
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{CO, PX};

    /// Vectors of output channels of a tile.
    const NV: usize = CO / 16;

    /// See [`super::tile16`]; the caller checked every bound.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn tile16(
        panel: &[u32],
        offs: &[usize],
        x: &[u32],
        px: &[usize; PX],
        (y, ldy): (*mut f32, usize),
        (n, add): (usize, bool),
    ) {
        let (a, x) = (panel.as_ptr(), x.as_ptr());
        let rows: [*const u32; PX] = std::array::from_fn(|j| x.add(px[j]));
        let mut acc = [[_mm512_setzero_ps(); NV]; PX];
        if add {
            for (j, row) in acc.iter_mut().enumerate().take(n) {
                let src = y.add(j * ldy);
                for (v, r) in row.iter_mut().enumerate() {
                    *r = _mm512_loadu_ps(src.add(16 * v));
                }
            }
        }
        for (p, &off) in offs.iter().enumerate() {
            let w: [__m512bh; NV] = std::array::from_fn(|v| {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    a.add(p * CO + 16 * v).cast(),
                ))
            });
            for (row, &src) in acc.iter_mut().zip(&rows) {
                let b = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                    *src.add(off) as i32
                ));
                for (r, &w) in row.iter_mut().zip(&w) {
                    *r = _mm512_dpbf16_ps(*r, b, w);
                }
            }
        }
        for (j, row) in acc.iter().enumerate().take(n) {
            let dst = y.add(j * ldy);
            for (v, &r) in row.iter().enumerate() {
                _mm512_storeu_ps(dst.add(16 * v), r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::conv_reference::{close, forward_operands, vals};
    use crate::half16::bf16_round;

    fn rounded(v: &[f32]) -> Vec<f32> {
        v.iter().map(|x| bf16_round(*x)).collect()
    }

    fn bf16(g: Geom) -> Geom {
        Geom {
            gemm: DType::BF16,
            ..g
        }
    }

    /// Geometries the bf16 kernel takes: tiles spanning rows and samples
    /// (groups of many small samples), a last tile cut short, strides 1-3,
    /// 1x3 and 5x5 kernels, several panels, more pairs than a block of a
    /// panel (585 > 512), and a map past a group's pixels (one sample a
    /// group).
    fn shapes() -> Vec<Geom> {
        [
            Geom::sized(3, (4, 64), (7, 7), (3, 3, 1), 1),
            Geom::sized(2, (16, 64), (6, 7), (3, 3, 1), 1),
            Geom::sized(2, (8, 64), (10, 12), (1, 3, 1), 1),
            Geom::sized(3, (12, 128), (9, 9), (5, 5, 2), 1),
            Geom::sized(2, (4, 64), (13, 13), (3, 3, 1), 2),
            Geom::sized(2, (4, 64), (21, 19), (3, 3, 0), 3),
            Geom::sized(2, (130, 64), (6, 6), (3, 3, 1), 1),
            Geom::sized(3, (6, 64), (34, 35), (3, 3, 1), 1),
        ]
        .into_iter()
        .map(bf16)
        .collect()
    }

    /// The bf16 forward equals the fp32 pixel-major forward of the
    /// operands rounded to bf16 (to f32 rounding: the same products, each
    /// pair summed by the instruction), with or without them rounded
    /// beforehand.
    #[test]
    fn forward_is_the_fp32_convolution_of_rounded_operands() -> candle_core::Result<()> {
        if !crate::gemm_bf16::enabled() {
            eprintln!("no AVX-512 BF16 here: the bf16 pixel-major kernel is not run");
            return Ok(());
        }
        for g in shapes() {
            assert!(g.nhwc16(), "{g:?} should take the bf16 pixel-major forward");
            assert_eq!(g.forward_path(), crate::conv::Path::PixelMajor);
            let (x, w, b) = forward_operands(&g);
            let k = g.k();
            let at = |w: &[f32], co, ci, ky, kx| w[co * k + (ky * g.kw + kx) * g.cin + ci];
            let mut got = vec![f32::NAN; g.b * g.out_len()];
            g.forward_nhwc(
                "test",
                &g.nhwc_panels_from(|co, ci, ky, kx| at(&w, co, ci, ky, kx)),
                &b,
                &x,
                &mut got,
            )?;
            let (xr, wr) = (rounded(&x), rounded(&w));
            let f = Geom {
                gemm: DType::F32,
                ..g
            };
            let mut want = vec![0f32; got.len()];
            f.forward_nhwc(
                "test",
                &f.nhwc_panels_from(|co, ci, ky, kx| at(&wr, co, ci, ky, kx)),
                &b,
                &xr,
                &mut want,
            )?;
            close(&format!("{g:?} forward"), &got, &want);
            assert_ne!(
                want,
                f.reference_forward(&w, &b, &x)?,
                "{g:?}: the operands should lose bits to bf16"
            );
        }
        Ok(())
    }

    /// The input gradient of a stride-1 bf16 convolution runs as its
    /// transposed convolution on this kernel, and equals the fp32 one of
    /// the rounded weights and output gradient.
    #[test]
    fn input_grad_is_the_fp32_one_of_rounded_operands() -> candle_core::Result<()> {
        if !crate::gemm_bf16::enabled() {
            eprintln!("no AVX-512 BF16 here: the bf16 pixel-major kernel is not run");
            return Ok(());
        }
        for g in [
            Geom::sized(3, (64, 64), (9, 9), (3, 3, 1), 1),
            Geom::sized(2, (64, 128), (6, 7), (3, 3, 1), 1),
            Geom::sized(2, (128, 64), (9, 9), (5, 5, 2), 1),
        ]
        .map(bf16)
        {
            let t = g.transposed().filter(Geom::nhwc16).unwrap();
            let (w, dy) = (vals(g.cout * g.k(), 0.11), vals(g.b * g.out_len(), 0.13));
            let mut got = vec![f32::NAN; g.b * g.in_len()];
            g.input_grad_as_conv(&t, "test", &w, &dy, &mut got)?;
            let f = Geom {
                gemm: DType::F32,
                ..g
            };
            let tf = f.transposed().unwrap();
            let mut want = vec![f32::NAN; got.len()];
            f.input_grad_as_conv(&tf, "test", &rounded(&w), &rounded(&dy), &mut want)?;
            close(&format!("{g:?} dx"), &got, &want);
        }
        Ok(())
    }

    /// Shapes the kernel cannot take keep their paths: fp32 products, odd
    /// input channels (the stem's 3), output channels not a multiple of
    /// [`CO`], 1x1 kernels (a GEMM without im2col), maps under
    /// [`MIN_PIXELS`].
    #[test]
    fn other_convolutions_keep_their_paths() {
        let ok = Geom::sized(2, (64, 64), (8, 8), (3, 3, 1), 1);
        assert_eq!(bf16(ok).nhwc16(), crate::gemm_bf16::enabled());
        for g in [
            ok,
            bf16(Geom::sized(2, (3, 64), (32, 32), (7, 7, 3), 2)),
            bf16(Geom::sized(2, (64, 32), (8, 8), (3, 3, 1), 1)),
            bf16(Geom::sized(2, (64, 64), (8, 8), (1, 1, 0), 1)),
            bf16(Geom::sized(2, (64, 64), (5, 5), (3, 3, 1), 1)),
        ] {
            assert!(!g.nhwc16(), "{g:?}");
        }
    }
}
