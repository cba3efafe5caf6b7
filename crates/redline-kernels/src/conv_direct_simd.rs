//! The direct convolution's inner loops with AVX-512 ([`crate::conv_direct`]):
//! register tiles whose operands are read straight from the padded input
//! at each tap's offset, so that no im2col matrix is built or packed.
//!
//! - Forward (and the input gradient, a forward of the transposed
//!   convolution): [`MR`] output channels x [`NR`] wide output pixels, 24
//!   `zmm` accumulators; per tap, three pixel vectors loaded and each
//!   channel's weight broadcast.
//! - Weight gradient: taps x output channels ([`GRAD_NARROW`], [`GRAD_WIDE`]), the reduction
//!   over the pixels kept in registers (no horizontal sums); per pixel, each
//!   tap's input value broadcast and the output gradient's channel vector
//!   (from its pixel-major transpose) loaded.
//!
//! Safe wrappers check every index against the slices before the unsafe
//! loops run; `false` means the caller must take its portable path.

/// Output channels of a forward tile.
pub(crate) const MR: usize = 8;
/// Wide output pixels of a forward tile: three 16-lane vectors.
pub(crate) const NR: usize = 48;
/// Output channels of the narrowest weight-gradient tile: its `(taps,
/// vectors)` are [`GRAD_NARROW`]; [`GRAD_WIDE`] takes 64 channels.
pub(crate) const DC: usize = 32;
/// Weight-gradient tile of 12 taps x 2 vectors (32 channels).
pub(crate) const GRAD_NARROW: (usize, usize) = (12, 2);
/// Weight-gradient tile of 6 taps x 4 vectors (64 channels): 10 loads per
/// 24 products where the narrow tile issues 14 (ResNet-18's stem dW 33 ->
/// 26 ms, the 3x3 stages' equal or better).
pub(crate) const GRAD_WIDE: (usize, usize) = (6, 4);

/// Whether AVX-512F is present (checked once).
pub(crate) fn available() -> bool {
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

/// One forward tile: for `m < MR` and `j < n`,
/// `y[m * ldy + j] = sum_k panel[k * MR + m] * x[offs[k] + j]`, the taps
/// summed in order. `max_off` is the largest of `offs` (the caller's, so
/// that the check is O(1)). `false` (nothing written) when AVX-512 is
/// missing or an index would leave a slice.
pub(crate) fn forward_tile(
    panel: &[f32],
    (offs, max_off): (&[usize], usize),
    x: &[f32],
    (y, ldy): (&mut [f32], usize),
    n: usize,
) -> bool {
    let k = offs.len();
    let fits = n > 0
        && n <= NR
        && ldy >= n
        && panel.len() >= k * MR
        && max_off + NR <= x.len()
        && (MR - 1) * ldy + n <= y.len();
    if !available() || !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F is present; every tap's `NR` loads end at or before
    // `max_off + NR <= x.len()`, the panel holds `k * MR` weights, and the
    // stores reach `(MR - 1) * ldy + n <= y.len()`.
    unsafe {
        x86::forward_tile(panel, offs, x, y.as_mut_ptr(), ldy, n);
    }
    true
}

/// One weight-gradient tile of `K` taps and `V` vectors of channels
/// ([`GRAD_NARROW`], [`GRAD_WIDE`]): for `r < K` and `c < 16 * V`,
/// `out[r * ldo + c] += sum_{i < p} x[offs[r] + i] * dyt[i * ldt + c]`.
/// `false` (nothing written) when AVX-512 is missing or an index would
/// leave a slice.
pub(crate) fn weight_grad_tile<const K: usize, const V: usize>(
    x: &[f32],
    offs: &[usize; K],
    (dyt, ldt): (&[f32], usize),
    p: usize,
    (out, ldo): (&mut [f32], usize),
) -> bool {
    let dc = 16 * V;
    let fits = p > 0
        && K > 0
        && ldt >= dc
        && ldo >= dc
        && offs.iter().all(|&o| o + p <= x.len())
        && (p - 1) * ldt + dc <= dyt.len()
        && (K - 1) * ldo + dc <= out.len();
    if !available() || !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F is present; the reads stay below `offs[r] + p <=
    // x.len()` and `(p - 1) * ldt + 16 * V <= dyt.len()`, the
    // read-modify-writes below `(K - 1) * ldo + 16 * V <= out.len()`.
    unsafe {
        x86::weight_grad_tile::<K, V>(x, offs, dyt, ldt, p, out.as_mut_ptr(), ldo);
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::MR;

    /// See [`super::forward_tile`]; the caller checked every bound.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn forward_tile(
        panel: &[f32],
        offs: &[usize],
        x: &[f32],
        y: *mut f32,
        ldy: usize,
        n: usize,
    ) {
        let (a, x) = (panel.as_ptr(), x.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); 3]; MR];
        for (k, &off) in offs.iter().enumerate() {
            let b = x.add(off);
            let v = [
                _mm512_loadu_ps(b),
                _mm512_loadu_ps(b.add(16)),
                _mm512_loadu_ps(b.add(32)),
            ];
            let ak = a.add(k * MR);
            for (m, row) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*ak.add(m));
                for (r, &v) in row.iter_mut().zip(&v) {
                    *r = _mm512_fmadd_ps(w, v, *r);
                }
            }
        }
        for (m, row) in acc.iter().enumerate() {
            let dst = y.add(m * ldy);
            for (j, &v) in row.iter().enumerate() {
                let lo = j * 16;
                if lo + 16 <= n {
                    _mm512_storeu_ps(dst.add(lo), v);
                } else if lo < n {
                    // The tile's last pixels: a masked store of n - lo < 16 lanes.
                    let mask = ((1u32 << (n - lo)) - 1) as __mmask16;
                    _mm512_mask_storeu_ps(dst.add(lo), mask, v);
                }
            }
        }
    }

    /// See [`super::weight_grad_tile`]; the caller checked every bound.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weight_grad_tile<const K: usize, const V: usize>(
        x: &[f32],
        offs: &[usize; K],
        dyt: &[f32],
        ldt: usize,
        p: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        let x = x.as_ptr();
        let rows: [*const f32; K] = std::array::from_fn(|r| x.add(offs[r]));
        let mut acc = [[_mm512_setzero_ps(); V]; K];
        let d = dyt.as_ptr();
        for i in 0..p {
            let g = d.add(i * ldt);
            let v: [__m512; V] = std::array::from_fn(|q| _mm512_loadu_ps(g.add(16 * q)));
            for (row, &src) in acc.iter_mut().zip(&rows) {
                let a = _mm512_set1_ps(*src.add(i));
                for (r, &v) in row.iter_mut().zip(&v) {
                    *r = _mm512_fmadd_ps(a, v, *r);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                let o = out.add(r * ldo + j * 16);
                _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), v));
            }
        }
    }
}
