//! The patch convolution with AVX-512 ([`crate::conv_patch`]) for windows
//! `kw` = 2, 4, 8 or 16 wide: a 16-lane vector holds `16 / kw` whole
//! window rows of neighbouring output pixels, which lie side by side in
//! the input (the windows tile it). So the input is read with plain
//! vector loads, once, and every lane of every product is used:
//! - forward: a tile of 3 vectors (pixel groups) x 8 output channels
//!   accumulates `x * w` over the window rows (`w` repeated once per
//!   pixel of a vector), then each pixel's `kw` lanes are summed;
//! - dW: a tile of 3 window rows x 8 output channels accumulates `x * dy`
//!   over every pixel of the chunk (`dy` spread over its pixel's `kw`
//!   lanes), summed over a vector's pixels once at the end.
//!
//! The ymm kernels of [`crate::conv_patch_simd`] (a broadcast and an
//! 8-lane product per input value) remain for other widths and machines
//! without AVX-512. The safe wrappers check every index before the unsafe
//! loops run; `false` means the caller must take that other path.

pub(crate) use crate::conv_direct_simd::available;

/// Lanes of a vector.
pub(crate) const LANES: usize = 16;
/// Output channels of a tile (a block; the weights and gradients of
/// channels past `Cout` are zero).
pub(crate) const C: usize = 8;
/// One vector.
pub(crate) type Vec16 = [f32; LANES];

/// Whether the kernels take windows `kw` wide.
pub(crate) fn fits(kw: usize) -> bool {
    (2..=LANES).contains(&kw) && kw.is_power_of_two()
}

/// Where one sample's window rows lie: window row `r` (input channel `ci`,
/// kernel row `ky`) of output row `oy` starts at `offs[r] + oy * step`.
pub(crate) struct Rows<'a> {
    /// Each window row's first input value in output row 0.
    pub(crate) offs: &'a [usize],
    /// Input values from one output row to the next (`stride * w`).
    pub(crate) step: usize,
    /// Output rows.
    pub(crate) oh: usize,
    /// Output columns.
    pub(crate) ow: usize,
    /// Window width (the stride).
    pub(crate) kw: usize,
}

impl Rows<'_> {
    /// Vectors per output row: `ceil(ow * kw / 16)`.
    fn segs(&self) -> usize {
        (self.ow * self.kw).div_ceil(LANES)
    }

    /// Whether every input value the loops read lies in `x_len`.
    fn inside(&self, x_len: usize) -> bool {
        let last = self.offs.iter().max().copied().unwrap_or(0)
            + self.oh.saturating_sub(1) * self.step
            + self.ow * self.kw;
        fits(self.kw) && self.oh > 0 && self.ow > 0 && last <= x_len
    }
}

/// `w (Cout, rows * kw)` as the forward's vectors `[block][row][c]`:
/// lane `l` of `(block, r, c)` is `w[block * C + c][r * kw + l % kw]`.
pub(crate) fn spread_weights(w: &[f32], cout: usize, rows: usize, kw: usize) -> Vec<Vec16> {
    let k = rows * kw;
    let blocks = cout.div_ceil(C);
    let mut out = vec![[0f32; LANES]; blocks * rows * C];
    for (co, wr) in w.chunks(k.max(1)).enumerate().take(cout) {
        for r in 0..rows {
            let v = &mut out[((co / C) * rows + r) * C + co % C];
            for (l, o) in v.iter_mut().enumerate() {
                *o = wr[r * kw + l % kw];
            }
        }
    }
    out
}

/// One sample's forward: `y[co][oy][ox] = b[co] + sum_r sum_kx x[offs[r] +
/// oy * step + ox * kw + kx] * w[co][r * kw + kx]` (`ws` from
/// [`spread_weights`]). `false` (nothing written) when AVX-512 is missing
/// or an index would leave a slice.
pub(crate) fn forward_sample(
    x: &[f32],
    (ws, b): (&[Vec16], &[f32]),
    g: &Rows,
    y: &mut [f32],
) -> bool {
    let cout = b.len();
    let blocks = cout.div_ceil(C);
    let ok = available()
        && g.inside(x.len())
        && ws.len() >= blocks * g.offs.len() * C
        && y.len() >= cout * g.oh * g.ow;
    if !ok {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX-512 present; every read and write is inside its slice
        // (checked above; the loops' masks keep loads inside each row's
        // `ow * kw` values).
        unsafe { x86::forward_sample(x, ws, b, g, y) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// One sample's weight gradient added into `acc` (`[block][row][c]`
/// vectors; [`reduce_weight_grad`] sums them into dW): for each output
/// pixel, `acc[block, r, c]` lanes of the pixel's slot gain `x[row values] *
/// dy[co][pixel]`. `dys` is scratch. `false` (nothing added) when AVX-512
/// is missing or an index would leave a slice.
pub(crate) fn weight_grad_sample(
    (x, dy): (&[f32], &[f32]),
    g: &Rows,
    cout: usize,
    acc: &mut [Vec16],
    dys: &mut Vec<Vec16>,
) -> bool {
    let blocks = cout.div_ceil(C);
    let ok = available()
        && g.inside(x.len())
        && dy.len() >= cout * g.oh * g.ow
        && acc.len() >= blocks * g.offs.len() * C;
    if !ok {
        return false;
    }
    // Every vector is written before it is read: only the length matters.
    dys.resize(blocks * g.segs() * C, [0.0; LANES]);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as for `forward_sample`; `dys` holds every block's
        // vectors of one output row.
        unsafe { x86::weight_grad_sample(x, dy, g, cout, acc, dys) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// dW `(Cout, rows * kw)` from [`weight_grad_sample`]'s sums: each tap
/// `(r, kx)` summed over the `16 / kw` pixel slots of its vector, added
/// into `dw`.
pub(crate) fn reduce_weight_grad(acc: &[Vec16], rows: usize, kw: usize, dw: &mut [f32]) {
    let k = rows * kw;
    for (co, dr) in dw.chunks_mut(k.max(1)).enumerate() {
        for r in 0..rows {
            let Some(v) = acc.get(((co / C) * rows + r) * C + co % C) else {
                return;
            };
            for (kx, d) in dr[r * kw..(r + 1) * kw].iter_mut().enumerate() {
                *d += v.iter().skip(kx).step_by(kw).sum::<f32>();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    // Register tiles read as `acc[vector][channel]`: the indices are the
    // tile's coordinates, which iterator chains would hide.
    #![allow(clippy::needless_range_loop)]

    use super::{Rows, Vec16, C, LANES};
    use std::arch::x86_64::*;

    /// Vectors of a forward tile (pixel groups).
    const G: usize = 3;
    /// Window rows of a weight-gradient tile.
    const R: usize = 3;
    /// Window rows ahead that the weight gradient prefetches.
    const PF_ROWS: usize = 6;

    /// The load mask of vector `j` of an output row: its lanes inside the
    /// row's `ow * kw` values.
    fn mask(g: &Rows, j: usize) -> __mmask16 {
        let valid = (g.ow * g.kw).saturating_sub(j * LANES).min(LANES);
        ((1u32 << valid) - 1) as __mmask16
    }

    /// `idx[l] = f(l)` as a permute index.
    #[target_feature(enable = "avx512f")]
    unsafe fn index(f: impl Fn(usize) -> usize) -> __m512i {
        let mut i = [0i32; LANES];
        for (l, v) in i.iter_mut().enumerate() {
            *v = f(l) as i32;
        }
        _mm512_loadu_si512(i.as_ptr().cast())
    }

    /// # Safety
    /// AVX-512 present; `forward_sample`'s checks hold.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn forward_sample(
        x: &[f32],
        ws: &[Vec16],
        b: &[f32],
        g: &Rows,
        y: &mut [f32],
    ) {
        let (cout, rows, segs) = (b.len(), g.offs.len(), g.segs());
        let q = LANES / g.kw;
        // Each pixel's kw lanes summed by exchanging lanes l ^ h.
        let mut swaps = [_mm512_setzero_si512(); 4];
        let mut levels = 0;
        let mut h = 1;
        while h < g.kw {
            swaps[levels] = index(|l| l ^ h);
            levels += 1;
            h *= 2;
        }
        let ohw = g.oh * g.ow;
        let mut out = [[0f32; LANES]; G];
        let ahead = g.step;
        for oy in 0..g.oh {
            let xo = x.as_ptr().add(oy * g.step);
            for blk in 0..cout.div_ceil(C) {
                let wb = ws.as_ptr().add(blk * rows * C).cast::<f32>();
                let mut j0 = 0;
                while j0 < segs {
                    let n = (segs - j0).min(G);
                    let masks: [__mmask16; G] =
                        std::array::from_fn(|i| if i < n { mask(g, j0 + i) } else { 0 });
                    let mut acc = [[_mm512_setzero_ps(); C]; G];
                    for (r, &off) in g.offs.iter().enumerate() {
                        let p = xo.add(off + j0 * LANES);
                        for l in 0..G {
                            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead + l * LANES).cast());
                        }
                        let xv: [__m512; G] = std::array::from_fn(|i| {
                            _mm512_maskz_loadu_ps(masks[i], p.wrapping_add(i * LANES))
                        });
                        let wr = wb.add(r * C * LANES);
                        for c in 0..C {
                            let wv = _mm512_loadu_ps(wr.add(c * LANES));
                            for i in 0..G {
                                acc[i][c] = _mm512_fmadd_ps(xv[i], wv, acc[i][c]);
                            }
                        }
                    }
                    for c in 0..C.min(cout - blk * C) {
                        let co = blk * C + c;
                        for (i, o) in out.iter_mut().enumerate().take(n) {
                            let mut v = acc[i][c];
                            for s in &swaps[..levels] {
                                v = _mm512_add_ps(v, _mm512_permutexvar_ps(*s, v));
                            }
                            _mm512_storeu_ps(o.as_mut_ptr(), v);
                        }
                        let row = y.as_mut_ptr().add(co * ohw + oy * g.ow);
                        for (i, o) in out.iter().enumerate().take(n) {
                            for slot in 0..q {
                                let ox = (j0 + i) * q + slot;
                                if ox < g.ow {
                                    *row.add(ox) = o[slot * g.kw] + b[co];
                                }
                            }
                        }
                    }
                    j0 += n;
                }
            }
        }
    }

    /// # Safety
    /// AVX-512 present; `weight_grad_sample`'s checks hold and `dys` holds
    /// `blocks * segs * C` vectors.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weight_grad_sample(
        x: &[f32],
        dy: &[f32],
        g: &Rows,
        cout: usize,
        acc: &mut [Vec16],
        dys: &mut [Vec16],
    ) {
        let (rows, segs, blocks) = (g.offs.len(), g.segs(), cout.div_ceil(C));
        let q = LANES / g.kw;
        let ohw = g.oh * g.ow;
        // Lane l holds the gradient of the vector's pixel l / kw.
        let spread = index(|l| l / g.kw);
        for oy in 0..g.oh {
            // This row's output gradient spread over its pixels' lanes.
            for co in 0..blocks * C {
                for j in 0..segs {
                    let d = dys.as_mut_ptr().add(((co / C) * segs + j) * C + co % C);
                    let pix = g.ow.saturating_sub(j * q).min(q);
                    if co >= cout || pix == 0 {
                        _mm512_storeu_ps(d.cast(), _mm512_setzero_ps());
                        continue;
                    }
                    let src = dy.as_ptr().add(co * ohw + oy * g.ow + j * q);
                    let v = _mm512_maskz_loadu_ps(((1u32 << pix) - 1) as __mmask16, src);
                    _mm512_storeu_ps(d.cast(), _mm512_permutexvar_ps(spread, v));
                }
            }
            let xo = x.as_ptr().add(oy * g.step);
            for blk in 0..blocks {
                let db = dys.as_ptr().add(blk * segs * C).cast::<f32>();
                let mut r0 = 0;
                while r0 < rows {
                    let n = (rows - r0).min(R);
                    let a = acc.as_mut_ptr().add((blk * rows + r0) * C).cast::<f32>();
                    let mut t = [[_mm512_setzero_ps(); C]; R];
                    for (i, ti) in t.iter_mut().enumerate().take(n) {
                        for (c, v) in ti.iter_mut().enumerate() {
                            *v = _mm512_loadu_ps(a.add((i * C + c) * LANES));
                        }
                    }
                    let p: [*const f32; R] =
                        std::array::from_fn(|i| xo.add(g.offs[r0 + i.min(n - 1)]));
                    // The window rows PF_ROWS on (in the next output row
                    // past the last), fetched while these are summed: a
                    // row is too short for the hardware's stream prefetch.
                    let ahead: [*const f32; R] = std::array::from_fn(|i| {
                        let at = oy * rows + r0 + PF_ROWS + i;
                        let (oy2, r2) = (at / rows, at % rows);
                        x.as_ptr().wrapping_add(oy2 * g.step + g.offs[r2])
                    });
                    for j in 0..segs {
                        let m = mask(g, j);
                        for pi in &ahead {
                            _mm_prefetch::<_MM_HINT_T0>(pi.wrapping_add(j * LANES).cast());
                        }
                        let xv: [__m512; R] =
                            std::array::from_fn(|i| _mm512_maskz_loadu_ps(m, p[i].add(j * LANES)));
                        let dj = db.add(j * C * LANES);
                        for c in 0..C {
                            let d = _mm512_loadu_ps(dj.add(c * LANES));
                            for i in 0..R {
                                t[i][c] = _mm512_fmadd_ps(xv[i], d, t[i][c]);
                            }
                        }
                    }
                    for (i, ti) in t.iter().enumerate().take(n) {
                        for (c, v) in ti.iter().enumerate() {
                            _mm512_storeu_ps(a.add((i * C + c) * LANES), *v);
                        }
                    }
                    r0 += n;
                }
            }
        }
    }
}
