//! The conv block's 2x2 max pool and ReLU over one pair of rows, sixteen
//! windows at a time on AVX-512F: each window's first maximum (a NaN counts
//! as one) ReLU'd, and where its gradient goes. The scalar loop
//! (`first_max4` and [`relu`] per window, kept for CPUs without it) took about ten
//! cycles a window: its stride-2 reads kept the compiler from vectorising
//! it, and pooling was a twelfth of a CNN step on the CPU (perf, 2-core
//! Zen 4). The same values and positions, bit for bit (tested against it).

use crate::conv_backward::NO_GRAD;
use crate::pool::first_max4;

/// ReLU of a window maximum: the value and where its gradient goes. NaN
/// stays NaN (PyTorch) but passes no gradient (`NaN > 0` is false there too).
/// Selects, not branches: the sign of a conv output is a coin toss, and a
/// mispredicted branch per window cost a third of the pooling time.
#[inline(always)]
pub(super) fn relu(m: f32, pos: u8) -> (f32, u8) {
    let keep = m > 0.0;
    let v = if keep || m.is_nan() { m } else { 0.0 };
    (v, if keep { pos } else { NO_GRAD })
}

/// Whether [`pool_rows`] runs sixteen windows at a time here (AVX-512F,
/// checked once).
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Pools the windows `(r0[2x], r0[2x + 1], r1[2x], r1[2x + 1])`, `x` below
/// `out.len()` (and within both rows and `at`), into `out` (the ReLU'd
/// first maximum) and `at` (its position 0..4 in row-major order, or
/// [`NO_GRAD`]): sixteen windows at a time where [`available`], else one at
/// a time ([`first_max4`], [`relu`]).
pub(super) fn pool_rows(r0: &[f32], r1: &[f32], out: &mut [f32], at: &mut [u8]) {
    let n = out.len();
    #[cfg(target_arch = "x86_64")]
    if available() && r0.len() >= 2 * n && r1.len() >= 2 * n && at.len() >= n {
        // SAFETY: AVX-512F present and the lengths checked above.
        unsafe { avx512::pool_rows(r0, r1, out, at) };
        return;
    }
    let wins = r0.chunks_exact(2).zip(r1.chunks_exact(2));
    for ((o, a), (t, u)) in out.iter_mut().zip(at.iter_mut()).zip(wins) {
        let (m, first) = first_max4([t[0], t[1], u[0], u[1]]);
        let pos = u8::from(first[1]) + 2 * u8::from(first[2]) + 3 * u8::from(first[3]);
        (*o, *a) = relu(m, pos);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use crate::conv_backward::NO_GRAD;
    use crate::gemm_bf16::lanes;

    /// The even and the odd values of the first `2 * w` (<= 32) at `p`,
    /// deinterleaved into sixteen lanes each (those past `w` zero).
    ///
    /// # Safety
    /// AVX-512F present; `p` addresses `2 * w` readable values.
    #[inline(always)]
    unsafe fn halves(p: *const f32, w: usize) -> (__m512, __m512) {
        let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        let odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
        // SAFETY: masked loads touch only the lanes below 2 * w (no fault
        // past them); the second pointer is formed without being read when
        // its mask is empty.
        let (lo, hi) = unsafe {
            (
                _mm512_maskz_loadu_ps(lanes((2 * w).min(16)), p),
                _mm512_maskz_loadu_ps(lanes((2 * w).saturating_sub(16)), p.wrapping_add(16)),
            )
        };
        (
            _mm512_permutex2var_ps(lo, even, hi),
            _mm512_permutex2var_ps(lo, odd, hi),
        )
    }

    /// [`super::pool_rows`] on AVX-512F.
    ///
    /// # Safety
    /// AVX-512F present; `r0` and `r1` hold `2 * out.len()` values and `at`
    /// `out.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pool_rows(r0: &[f32], r1: &[f32], out: &mut [f32], at: &mut [u8]) {
        let n = out.len();
        let zero = _mm512_setzero_ps();
        // `best` is beaten by `x` where x > best (ordered) or x is NaN.
        let wins = |best: __m512, x: __m512| {
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, best) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x)
        };
        for x in (0..n).step_by(16) {
            let w = (n - x).min(16);
            // SAFETY: 2 * w values of each row from 2 * x on (the caller's
            // lengths); w outputs from x on.
            unsafe {
                let (v0, v1) = halves(r0.as_ptr().add(2 * x), w);
                let (v2, v3) = halves(r1.as_ptr().add(2 * x), w);
                let t1 = wins(v0, v1);
                let m1 = _mm512_mask_blend_ps(t1, v0, v1);
                let t2 = wins(m1, v2);
                let m2 = _mm512_mask_blend_ps(t2, m1, v2);
                let t3 = wins(m2, v3);
                let m = _mm512_mask_blend_ps(t3, m2, v3);
                let mut pos = _mm512_setzero_si512();
                pos = _mm512_mask_mov_epi32(pos, t1 & !t2 & !t3, _mm512_set1_epi32(1));
                pos = _mm512_mask_mov_epi32(pos, t2 & !t3, _mm512_set1_epi32(2));
                pos = _mm512_mask_mov_epi32(pos, t3, _mm512_set1_epi32(3));
                let keep = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(m, zero);
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(m, m);
                let v = _mm512_mask_blend_ps(keep | nan, zero, m);
                let pos = _mm512_mask_blend_epi32(keep, _mm512_set1_epi32(i32::from(NO_GRAD)), pos);
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(x), lanes(w), v);
                _mm512_mask_cvtepi32_storeu_epi8(at.as_mut_ptr().add(x).cast(), lanes(w), pos);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the scalar window (`first_max4`, [`relu`]) over widths that
    /// leave every tail of the sixteen lanes, values drawn from a few (ties
    /// everywhere), negatives, zeros of both signs and NaNs: values and
    /// positions bit for bit, nothing written past the row.
    #[test]
    fn pools_as_the_scalar_window() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512F");
            return;
        }
        let pick = [1.0, -1.0, 0.0, -0.0, 2.0, f32::NAN, 0.5, -3.0];
        let mut state = 0x9E37_79B9_u32;
        let mut draw = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            pick[(state >> 8) as usize % pick.len()]
        };
        for n in (1..40).chain([48, 64]) {
            for _ in 0..20 {
                let r0: Vec<f32> = (0..2 * n + 3).map(|_| draw()).collect();
                let r1: Vec<f32> = (0..2 * n + 3).map(|_| draw()).collect();
                let (mut out, mut at) = (vec![7.0f32; n + 1], vec![9u8; n + 1]);
                pool_rows(&r0, &r1, &mut out[..n], &mut at[..n]);
                for x in 0..n {
                    let (m, first) =
                        first_max4([r0[2 * x], r0[2 * x + 1], r1[2 * x], r1[2 * x + 1]]);
                    let pos = u8::from(first[1]) + 2 * u8::from(first[2]) + 3 * u8::from(first[3]);
                    let (v, a) = relu(m, pos);
                    assert_eq!(
                        (out[x].to_bits(), at[x]),
                        (v.to_bits(), a),
                        "n {n}, window {x}"
                    );
                }
                assert_eq!((out[n], at[n]), (7.0, 9), "written past the row");
            }
        }
    }
}
