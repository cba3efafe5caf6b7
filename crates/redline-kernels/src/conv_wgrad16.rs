//! The weight gradient of a bf16 convolution, pixel-major (`bf16-mixed`,
//! `bf16-true`; AVX-512 BF16).
//!
//! `dW[co, (tap, ci)] = sum over samples and output pixels of dy[co, p] *
//! x[ci, p + tap]`: the reduction runs over pixels, and `vdpbf16ps` sums
//! pairs. Pairs of neighbouring pixels would need the pixel lists to pair
//! up (a row's end, junk columns, strides); pairs of *samples* always do,
//! since two samples share every offset. So each pair of samples is
//! packed pixel-major as one buffer of bf16 pairs, element `(pixel, ci)`
//! holding both samples' value, and the output gradient likewise as
//! `(pixel, Cout)`. The f32 kernel's tile ([`crate::conv_nhwc_simd::grad_tile`])
//! then runs as is, on pairs: one broadcast of an input pair against four
//! vectors of sixteen output channels' pairs, 24 `zmm` sums, 32
//! multiply-adds an instruction.
//!
//! The im2col route it replaces wrote each sample's `(Cin * kh * kw, oh *
//! ow)` matrix in f32 and packed it into bf16 pairs for the GEMM: on
//! ResNet-18's 56x56 stage at 224 px the weight gradient ran at half the
//! forward's GFLOP/s.
//!
//! The products are exact in f32 and summed in f32 (one thread per output,
//! in a fixed order: the same bits on every run and thread count).

use candle_core::DType;
use rayon::prelude::*;

use crate::conv::Geom;
use crate::conv_nhwc16::MIN_PIXELS;
use crate::conv_nhwc_simd::{Pixels, CO, GR};
use crate::gemm_bf16_pack::interleaved;
use crate::half16::Act;

impl Geom {
    /// Whether this convolution's weight gradient runs here: bf16 products
    /// on a CPU with AVX-512 BF16, more than one tap, output channels a
    /// multiple of [`CO`] and output maps of at least [`MIN_PIXELS`]; any
    /// stride and input channels (the pairs are of samples, so ResNet's
    /// 7x7 stride-2 stem over 3 channels too).
    pub(super) fn nhwc16_backward(&self) -> bool {
        self.gemm == DType::BF16
            && self.kh * self.kw > 1
            && self.cout.is_multiple_of(CO)
            && self.ohw() >= MIN_PIXELS
            && crate::gemm_bf16::enabled()
    }

    /// `[dW | db]` of the whole batch into `dwb` (overwritten), dW stored
    /// `(Cout, Cin, kh, kw)`, on bf16 products: the samples padded
    /// pixel-major in pairs and the output gradient likewise, then
    /// [`Geom::weight_grad_frame`]'s tiles on the pairs.
    pub(super) fn weight_grad_nhwc16<X: Act>(
        &self,
        name: &str,
        x: &[X],
        dy: &[X],
        dwb: &mut [f32],
    ) -> candle_core::Result<()> {
        let fail = || candle_core::Error::Msg(format!("{name}: bf16 sample pairs ({self:?})"));
        let xq = self
            .sample_pairs(x, (self.in_len(), self.nhwc_len()), |s, d| {
                self.pad_nhwc(s, d)
            })
            .ok_or_else(fail)?;
        let dyq = self
            .sample_pairs(dy, (self.out_len(), self.out_len()), |s, d| {
                self.pixel_major(s, d)
            })
            .ok_or_else(fail)?;
        let px = Pixels::new(self.nhwc_pixels(self.b.div_ceil(2)));
        self.weight_grad_frame(name, (&xq, &px, &dyq), grad_tile16, dy, dwb)
    }

    /// Samples `2i` and `2i + 1` of `src` (`len` values each, f32 or bf16;
    /// the second zero past the last sample) laid out by `lay` into `out_len` values
    /// each (`lay` writes what it lays out and leaves the rest zero), then
    /// as bf16 pairs, pair `i` at `i * out_len`. `None` without AVX-512
    /// BF16.
    fn sample_pairs<X: Act>(
        &self,
        src: &[X],
        (len, out_len): (usize, usize),
        lay: impl Fn(&[f32], &mut [f32]) + Sync,
    ) -> Option<Vec<u32>> {
        let (len, out_len) = (len.max(1), out_len.max(1));
        let mut out = vec![0u32; self.b.div_ceil(2) * out_len];
        let scratch = || (vec![0f32; out_len], vec![0f32; out_len], Vec::new());
        out.par_chunks_mut(out_len)
            .zip(src.par_chunks(2 * len))
            .map_init(scratch, |(lo, hi, wide), (dst, two)| {
                let (first, second) = two.split_at(len.min(two.len()));
                lay(X::read(first, wide), lo);
                if second.is_empty() {
                    hi.fill(0.0);
                } else {
                    lay(X::read(second, wide), hi);
                }
                interleaved(lo, hi, dst)
            })
            .all(|ok| ok)
            .then_some(out)
    }
}

/// [`crate::conv_nhwc_simd::grad_tile`] on bf16 pairs: for `r < GR` and
/// `c < CO`, `out[r * ldo + c] += sum_i x[px[i] + offs[r]] . dyq[(i - i0) *
/// ldt + c]` over `i0..i0 + n` (each term the dot product of two pairs).
/// `false` (nothing written) without AVX-512 BF16 or when an index would
/// leave a slice.
fn grad_tile16(
    (x, px): (&[u32], &Pixels),
    offs: &[usize; GR],
    (i0, n): (usize, usize),
    (dyq, ldt): (&[u32], usize),
    (out, ldo): (&mut [f32], usize),
) -> bool {
    let max_off = offs.iter().copied().max().unwrap_or(0);
    let Some(at) = px.at().get(i0..i0 + n) else {
        return false;
    };
    let fits = n > 0
        && px.max() + max_off < x.len()
        && ldt >= CO
        && ldo >= CO
        && (n - 1) * ldt + CO <= dyq.len()
        && (GR - 1) * ldo + CO <= out.len();
    if !crate::gemm_bf16::available() || !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F and BF16 are present; every read `px[i] + offs[r] <=
    // px.max + max_off < x.len()`, `(n - 1) * ldt + CO <= dyq.len()`, and
    // the read-modify-writes reach `(GR - 1) * ldo + CO <= out.len()`.
    unsafe {
        x86::grad_tile16(x, offs, at, (dyq, ldt), (out.as_mut_ptr(), ldo));
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{CO, GR};

    /// Vectors of output channels of a tile.
    const NV: usize = CO / 16;

    /// See [`super::grad_tile16`]; the caller checked every bound.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn grad_tile16(
        x: &[u32],
        offs: &[usize; GR],
        px: &[usize],
        (dyq, ldt): (&[u32], usize),
        (out, ldo): (*mut f32, usize),
    ) {
        let x = x.as_ptr();
        let rows: [*const u32; GR] = std::array::from_fn(|r| x.add(offs[r]));
        let mut acc = [[_mm512_setzero_ps(); NV]; GR];
        let d = dyq.as_ptr();
        for (i, &p) in px.iter().enumerate() {
            let g = d.add(i * ldt);
            let v: [__m512bh; NV] = std::array::from_fn(|q| {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(g.add(16 * q).cast()))
            });
            for (row, &src) in acc.iter_mut().zip(&rows) {
                let a =
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*src.add(p) as i32));
                for (r, &v) in row.iter_mut().zip(&v) {
                    *r = _mm512_dpbf16_ps(*r, a, v);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (q, &v) in row.iter().enumerate() {
                let o = out.add(r * ldo + 16 * q);
                _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::conv::Path;
    use crate::conv_reference::{close, vals};
    use crate::half16::bf16_round;

    fn rounded(v: &[f32]) -> Vec<f32> {
        v.iter().map(|x| bf16_round(*x)).collect()
    }

    /// The bf16 weight gradient equals the fp32 pixel-major one of the
    /// operands rounded to bf16 (the same exact products, summed in
    /// another order), on an odd batch (a last pair with one sample),
    /// tiles across rows and samples, 1x3 and 5x5 kernels, rows not a
    /// multiple of a tile's, several panels and a reduction in parts; and the fp32 one of the
    /// unrounded operands differs (the operands were rounded).
    #[test]
    fn weight_grad_is_the_fp32_one_of_rounded_operands() -> candle_core::Result<()> {
        if !crate::gemm_bf16::enabled() {
            eprintln!("no AVX-512 BF16 here: the bf16 weight gradient is not run");
            return Ok(());
        }
        for g in [
            Geom::sized(3, (4, 64), (7, 7), (3, 3, 1), 1),
            Geom::sized(2, (16, 64), (6, 7), (3, 3, 1), 1),
            Geom::sized(5, (8, 128), (10, 12), (1, 3, 1), 1),
            Geom::sized(1, (12, 64), (9, 9), (5, 5, 2), 1),
            Geom::sized(4, (6, 192), (17, 16), (3, 3, 0), 1),
            // 18,432 pixel pairs: the reduction in parts.
            Geom::sized(4, (2, 64), (96, 96), (3, 3, 1), 1),
        ] {
            let g16 = Geom {
                gemm: DType::BF16,
                ..g
            };
            assert!(g16.nhwc16_backward(), "{g16:?}");
            assert_eq!(g16.weight_grad_path(), Path::PixelMajor);
            let (x, dy) = (vals(g.b * g.in_len(), 0.37), vals(g.b * g.out_len(), 0.29));
            let wlen = g.cout * g.k() + g.cout;
            let mut got = vec![f32::NAN; wlen];
            g16.weight_grad_nhwc("test", &x, &dy, &mut got)?;
            let mut want = vec![f32::NAN; wlen];
            g.weight_grad_nhwc("test", &rounded(&x), &rounded(&dy), &mut want)?;
            // db is summed from dy as it lies (f32), dW from rounded values.
            let dwlen = g.cout * g.k();
            want[dwlen..].fill(0.0);
            for d in dy.chunks(g.out_len()) {
                crate::conv_backward::add_row_sums(&mut want[dwlen..], d, g.ohw());
            }
            close(&format!("{g16:?} dW, db"), &got, &want);
            let mut exact = vec![f32::NAN; wlen];
            g.weight_grad_nhwc("test", &x, &dy, &mut exact)?;
            assert_ne!(
                exact[..dwlen],
                want[..dwlen],
                "{g:?}: rounding should change dW"
            );
        }
        Ok(())
    }

    /// The whole bf16 backward (dW, db, dx) of convolutions whose weight
    /// gradient runs here equals the fp32 backward of the same (bf16)
    /// values: a strided one on a large map (dx per sample), a strided one
    /// on a small map (dx of the whole batch), a 3-channel 7x7 stride-2
    /// stem, and stride 1 (dx as the transposed convolution).
    #[test]
    fn backward_is_the_fp32_one_of_the_same_values() -> candle_core::Result<()> {
        if !crate::gemm_bf16::enabled() {
            eprintln!("no AVX-512 BF16 here: the bf16 weight gradient is not run");
            return Ok(());
        }
        for g in [
            Geom::sized(3, (4, 64), (16, 16), (3, 3, 1), 2),
            Geom::sized(3, (8, 128), (14, 14), (3, 3, 1), 2),
            Geom::sized(2, (3, 64), (22, 22), (7, 7, 3), 2),
            Geom::sized(3, (6, 64), (12, 12), (3, 3, 1), 1),
        ] {
            let g16 = Geom {
                gemm: DType::BF16,
                ..g
            };
            assert_eq!(g16.weight_grad_path(), Path::PixelMajor, "{g16:?}");
            let (x, w, dy) = (
                rounded(&vals(g.b * g.in_len(), 0.37)),
                rounded(&vals(g.cout * g.k(), 0.11)),
                rounded(&vals(g.b * g.out_len(), 0.29)),
            );
            let (dwb, dx) = crate::conv_backward::plain_grads(g16, true, &x, &w, &dy)?;
            let (want_dwb, want_dx) = crate::conv_backward::plain_grads(g, true, &x, &w, &dy)?;
            close(&format!("{g16:?} dW, db"), &dwb, &want_dwb);
            close(&format!("{g16:?} dx"), &dx, &want_dx);
        }
        Ok(())
    }
}
