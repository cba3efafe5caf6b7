//! The pixel-major convolution's inner loop with AVX-512
//! ([`crate::conv_nhwc`]): a register tile of [`PX`] output pixels x [`CO`]
//! output channels whose pixels are read through one offset each, so that
//! a tile may take any pixels (the end of one row and the start of the
//! next, or of the next sample): no junk columns on small maps.
//!
//! Per im2col row (one tap of one input channel), the tile loads the
//! channels' two weight vectors and broadcasts each pixel's input value:
//! 28 `zmm` accumulators, 2 weights, 1 broadcast.
//!
//! The safe wrapper checks every index against the slices before the
//! unsafe loop runs; `false` means the caller must take another path.

pub(crate) use crate::conv_direct_simd::available;

/// Output pixels of a tile.
pub(crate) const PX: usize = 6;
/// Vectors of output channels of a tile.
const NV: usize = 4;
/// Output channels of a tile: [`NV`] 16-lane vectors.
pub(crate) const CO: usize = 16 * NV;

/// Rows (im2col rows) of a weight-gradient tile.
pub(crate) const GR: usize = 6;

/// Pixel offsets into a pixel-major buffer, with their largest (so that
/// the kernels' bounds checks are O(1) per tile).
pub(crate) struct Pixels {
    at: Vec<usize>,
    max: usize,
}

impl Pixels {
    /// The offsets `at`, checked once.
    pub(crate) fn new(at: Vec<usize>) -> Self {
        let max = at.iter().copied().max().unwrap_or(0);
        Self { at, max }
    }

    /// The offsets.
    pub(crate) fn at(&self) -> &[usize] {
        &self.at
    }

    /// The largest offset (0 when there are none).
    pub(crate) fn max(&self) -> usize {
        self.max
    }
}

/// One weight-gradient tile over pixels `i0..i0 + n` of `px`: for `r < GR`
/// and `c < CO`, `out[r * ldo + c] += sum_i x[px[i] + offs[r]] * dyt[(i -
/// i0) * ldt + c]`. `false` (nothing written) when AVX-512 is missing or
/// an index would leave a slice.
pub(crate) fn grad_tile(
    (x, px): (&[f32], &Pixels),
    offs: &[usize; GR],
    (i0, n): (usize, usize),
    (dyt, ldt): (&[f32], usize),
    (out, ldo): (&mut [f32], usize),
) -> bool {
    let max_off = offs.iter().copied().max().unwrap_or(0);
    let fits = n > 0
        && i0 + n <= px.at.len()
        && px.max + max_off < x.len()
        && ldt >= CO
        && ldo >= CO
        && (n - 1) * ldt + CO <= dyt.len()
        && (GR - 1) * ldo + CO <= out.len();
    if !available() || !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F is present; every read `px[i] + offs[r] <= px.max +
    // max_off < x.len()`, `(n - 1) * ldt + CO <= dyt.len()`, and the
    // read-modify-writes reach `(GR - 1) * ldo + CO <= out.len()`.
    unsafe {
        x86::grad_tile(
            x,
            offs,
            &px.at[i0..i0 + n],
            (dyt, ldt),
            (out.as_mut_ptr(), ldo),
        );
    }
    true
}

/// One tile: for `j < n` and `c < CO`,
/// `y[j * ldy + c] (+)= sum_k panel[k * CO + c] * x[px[j] + offs[k]]`, the
/// rows summed in order, added to what `y` holds when `acc`. Every `px[j]` must be in bounds, those past `n`
/// included (the caller repeats the last pixel). `max_off` is the largest
/// of `offs`. `false` (nothing written) when AVX-512 is missing or an index
/// would leave a slice.
pub(crate) fn tile(
    panel: &[f32],
    (offs, max_off): (&[usize], usize),
    (x, px): (&[f32], &[usize; PX]),
    (y, ldy): (&mut [f32], usize),
    (n, acc): (usize, bool),
) -> bool {
    let k = offs.len();
    let fits = n > 0
        && n <= PX
        && ldy >= CO
        && panel.len() >= k * CO
        && px.iter().all(|&p| p + max_off < x.len())
        && (n - 1) * ldy + CO <= y.len();
    if !available() || !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F is present; every read `px[j] + offs[k] <= px[j] +
    // max_off < x.len()`, the panel holds `k * CO` weights, and the stores
    // reach `(n - 1) * ldy + CO <= y.len()`.
    unsafe {
        x86::tile(panel, offs, x, px, (y.as_mut_ptr(), ldy), (n, acc));
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{CO, GR, NV, PX};

    /// See [`super::grad_tile`]; the caller checked every bound.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn grad_tile(
        x: &[f32],
        offs: &[usize; GR],
        px: &[usize],
        (dyt, ldt): (&[f32], usize),
        (out, ldo): (*mut f32, usize),
    ) {
        let x = x.as_ptr();
        let rows: [*const f32; GR] = std::array::from_fn(|r| x.add(offs[r]));
        let mut acc = [[_mm512_setzero_ps(); NV]; GR];
        let d = dyt.as_ptr();
        for (i, &p) in px.iter().enumerate() {
            let g = d.add(i * ldt);
            let v: [__m512; NV] = std::array::from_fn(|q| _mm512_loadu_ps(g.add(16 * q)));
            for (row, &src) in acc.iter_mut().zip(&rows) {
                let a = _mm512_set1_ps(*src.add(p));
                for (r, &v) in row.iter_mut().zip(&v) {
                    *r = _mm512_fmadd_ps(a, v, *r);
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

    /// See [`super::tile`]; the caller checked every bound.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile(
        panel: &[f32],
        offs: &[usize],
        x: &[f32],
        px: &[usize; PX],
        (y, ldy): (*mut f32, usize),
        (n, add): (usize, bool),
    ) {
        let (a, x) = (panel.as_ptr(), x.as_ptr());
        let rows: [*const f32; PX] = std::array::from_fn(|j| x.add(px[j]));
        let mut acc = [[_mm512_setzero_ps(); NV]; PX];
        if add {
            for (j, row) in acc.iter_mut().enumerate().take(n) {
                let src = y.add(j * ldy);
                for (v, r) in row.iter_mut().enumerate() {
                    *r = _mm512_loadu_ps(src.add(16 * v));
                }
            }
        }
        for (k, &off) in offs.iter().enumerate() {
            let w: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(a.add(k * CO + 16 * v)));
            for (row, &src) in acc.iter_mut().zip(&rows) {
                let b = _mm512_set1_ps(*src.add(off));
                for (r, &w) in row.iter_mut().zip(&w) {
                    *r = _mm512_fmadd_ps(b, w, *r);
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
