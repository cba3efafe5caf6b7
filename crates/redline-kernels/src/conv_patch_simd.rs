//! The patch convolution's inner loops with AVX2 and FMA
//! ([`crate::conv_patch`]): eight output channels a `ymm` register, input
//! values broadcast from memory. LLVM's own vectorisation of the portable
//! loops permutes lanes and keeps bounds checks in the innermost loop
//! (about 3x slower on the patch row); the portable loops remain the
//! fallback and the reference in the tests.

/// Eight lanes: one output channel each.
pub(crate) type Lanes = [f32; 8];

/// Whether AVX2 and FMA are present (checked once).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Forward lanes of `N` (4 or 8) output pixels: for each window row `r`
/// (its first input value at `x[rows[r]]`), each pixel `p` and tap `kx`,
/// `acc[p] += x[rows[r] + p * s + kx] * wb[r * kw + kx]`. `None` when
/// AVX2/FMA are missing, `N` is another count, or an index would leave `x`
/// or `wb` (the caller falls back).
pub(crate) fn pixels<const N: usize>(
    wb: &[Lanes],
    x: &[f32],
    rows: &[usize],
    (s, kw): (usize, usize),
) -> Option<[Lanes; N]> {
    let last = rows.iter().max().map_or(0, |&r| r + (N - 1) * s + kw);
    if !available() || !matches!(N, 4 | 8) || last > x.len() || wb.len() < rows.len() * kw {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX2 and FMA present; every read is inside `x` and `wb`
        // (checked above).
        Some(unsafe { x86::pixels::<N>(wb, x, rows, s, kw) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// dW lanes of eight taps `kx0..kx0 + 8` of a window row over a sample's
/// output pixels: `a[kx] += x[rows[oy] + ox * s + kx] * dyb[oy * ow + ox]`.
/// `None` when AVX2/FMA are missing or an index would leave `x` or `dyb`.
pub(crate) fn taps8(
    x: &[f32],
    dyb: &[Lanes],
    rows: &[usize],
    (s, ow): (usize, usize),
) -> Option<[Lanes; 8]> {
    let last = rows
        .iter()
        .max()
        .map_or(0, |&r| r + ow.saturating_sub(1) * s + 8);
    if !available() || last > x.len() || dyb.len() < rows.len() * ow {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as for `pixels`.
        Some(unsafe { x86::taps8(x, dyb, rows, s, ow) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Lanes;
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 and FMA present; `rows[r] + (N - 1) * s + kw <= x.len()` for
    /// every `r`, and `wb.len() >= rows.len() * kw`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pixels<const N: usize>(
        wb: &[Lanes],
        x: &[f32],
        rows: &[usize],
        s: usize,
        kw: usize,
    ) -> [Lanes; N] {
        // N independent sums: at 8, enough to cover the FMA's latency.
        let mut acc = [_mm256_setzero_ps(); N];
        let mut w = wb.as_ptr().cast::<f32>();
        for &r in rows {
            let src = x.as_ptr().add(r);
            for kx in 0..kw {
                let wv = _mm256_loadu_ps(w);
                w = w.add(8);
                for (p, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&*src.add(p * s + kx)), wv, *a);
                }
            }
        }
        let mut out = [[0f32; 8]; N];
        for (o, a) in out.iter_mut().zip(acc) {
            _mm256_storeu_ps(o.as_mut_ptr(), a);
        }
        out
    }

    /// # Safety
    /// AVX2 and FMA present; `rows[oy] + (ow - 1) * s + 8 <= x.len()` for
    /// every `oy`, and `dyb.len() >= rows.len() * ow`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn taps8(
        x: &[f32],
        dyb: &[Lanes],
        rows: &[usize],
        s: usize,
        ow: usize,
    ) -> [Lanes; 8] {
        let mut a = [_mm256_setzero_ps(); 8];
        let mut d = dyb.as_ptr().cast::<f32>();
        for &r in rows {
            let mut src = x.as_ptr().add(r);
            for _ in 0..ow {
                let dv = _mm256_loadu_ps(d);
                d = d.add(8);
                for (kx, acc) in a.iter_mut().enumerate() {
                    *acc = _mm256_fmadd_ps(_mm256_broadcast_ss(&*src.add(kx)), dv, *acc);
                }
                src = src.add(s);
            }
        }
        let mut out = [[0f32; 8]; 8];
        for (o, acc) in out.iter_mut().zip(a) {
            _mm256_storeu_ps(o.as_mut_ptr(), acc);
        }
        out
    }
}
