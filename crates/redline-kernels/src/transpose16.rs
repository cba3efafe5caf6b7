//! Channel-major `(C, P)` <-> pixel-major `(P, C)` copies in 16 x 16
//! blocks transposed in AVX-512 registers: the pixel-major convolutions'
//! layout changes ([`crate::conv_nhwc`]), which element by element were 7%
//! of ResNet-18's 14x14 stage. Blocks that do not fill 16 x 16 (and CPUs
//! without AVX-512) take the element loop.

use crate::conv_direct_simd::available;

/// Block side.
const B: usize = 16;

/// `dst[at(p) + c] = src[c * pixels + p]` for `c < channels`, `p <
/// pixels`: channel-major planes into pixel rows placed by `at` (each row's
/// `channels` values consecutive). Panics (an indexing bug) if a row
/// leaves `dst`.
pub(crate) fn channels_to_pixels(
    src: &[f32],
    (channels, pixels): (usize, usize),
    dst: &mut [f32],
    at: impl Fn(usize) -> usize,
) {
    let simd = available();
    for c0 in (0..channels).step_by(B) {
        let lanes = B.min(channels - c0);
        let mut p0 = 0;
        while p0 < pixels {
            let n = B.min(pixels - p0);
            let rows: [usize; B] = std::array::from_fn(|j| at(p0 + j.min(n - 1)) + c0);
            let cols: [usize; B] = std::array::from_fn(|i| (c0 + i.min(lanes - 1)) * pixels + p0);
            if !(simd && lanes == B && n == B && block(src, &cols, dst, &rows, None)) {
                for (j, &r) in rows.iter().enumerate().take(n) {
                    for (i, d) in dst[r..r + lanes].iter_mut().enumerate() {
                        *d = src[cols[i] + j];
                    }
                }
            }
            p0 += n;
        }
    }
}

/// `dst[c * pixels + p] = src[p * ld + c] + bias[c]` for `c < channels`,
/// `p < pixels`: pixel rows `ld` apart into channel-major planes, the
/// bias added.
pub(crate) fn pixels_to_channels(
    src: &[f32],
    (ld, bias): (usize, &[f32]),
    (channels, pixels): (usize, usize),
    dst: &mut [f32],
) {
    let simd = available();
    for c0 in (0..channels).step_by(B) {
        let lanes = B.min(channels - c0);
        let add: [f32; B] = std::array::from_fn(|j| bias.get(c0 + j).copied().unwrap_or(0.0));
        let mut p0 = 0;
        while p0 < pixels {
            let n = B.min(pixels - p0);
            let rows: [usize; B] = std::array::from_fn(|i| (p0 + i.min(n - 1)) * ld + c0);
            let cols: [usize; B] = std::array::from_fn(|j| (c0 + j.min(lanes - 1)) * pixels + p0);
            if !(simd && lanes == B && n == B && block(src, &rows, dst, &cols, Some(&add))) {
                for (j, &col) in cols.iter().enumerate().take(lanes) {
                    for (i, d) in dst[col..col + n].iter_mut().enumerate() {
                        *d = src[rows[i] + j] + add[j];
                    }
                }
            }
            p0 += n;
        }
    }
}

/// One block: `dst[out[j] + i] = src[inp[i] + j] (+ add[j])` for `i, j <
/// 16`. `false` (nothing written) when AVX-512 is missing or an index
/// would leave a slice.
fn block(
    src: &[f32],
    inp: &[usize; B],
    dst: &mut [f32],
    out: &[usize; B],
    add: Option<&[f32; B]>,
) -> bool {
    let fits = inp.iter().all(|&o| o + B <= src.len()) && out.iter().all(|&o| o + B <= dst.len());
    if !available() || !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F is present; every load reads `inp[i]..inp[i] + 16`
    // inside `src` and every store writes `out[j]..out[j] + 16` inside `dst`.
    unsafe {
        x86::block(src.as_ptr(), inp, dst.as_mut_ptr(), out, add);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = add;
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::B;

    /// See [`super::block`]; the caller checked every bound.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn block(
        src: *const f32,
        inp: &[usize; B],
        dst: *mut f32,
        out: &[usize; B],
        add: Option<&[f32; B]>,
    ) {
        let r: [__m512; B] = std::array::from_fn(|i| _mm512_loadu_ps(src.add(inp[i])));
        let cols = transpose(r);
        for (j, &c) in cols.iter().enumerate() {
            let v = match add {
                Some(a) => _mm512_add_ps(c, _mm512_set1_ps(a[j])),
                None => c,
            };
            _mm512_storeu_ps(dst.add(out[j]), v);
        }
    }

    /// The columns of the 16 x 16 matrix whose rows are `r`: pairs of rows
    /// interleaved (ps, then pd), then 128-bit blocks gathered in two
    /// rounds of `shuffle_f32x4`.
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose(r: [__m512; B]) -> [__m512; B] {
        let pd = _mm512_castps_pd;
        let ps = _mm512_castpd_ps;
        // u[g][k]: rows 4g..4g+4 of columns k, k+4, k+8, k+12 (one per block).
        let mut u = [[_mm512_setzero_ps(); 4]; 4];
        for (g, ug) in u.iter_mut().enumerate() {
            let t0 = _mm512_unpacklo_ps(r[4 * g], r[4 * g + 1]);
            let t1 = _mm512_unpackhi_ps(r[4 * g], r[4 * g + 1]);
            let t2 = _mm512_unpacklo_ps(r[4 * g + 2], r[4 * g + 3]);
            let t3 = _mm512_unpackhi_ps(r[4 * g + 2], r[4 * g + 3]);
            ug[0] = ps(_mm512_unpacklo_pd(pd(t0), pd(t2)));
            ug[1] = ps(_mm512_unpackhi_pd(pd(t0), pd(t2)));
            ug[2] = ps(_mm512_unpacklo_pd(pd(t1), pd(t3)));
            ug[3] = ps(_mm512_unpackhi_pd(pd(t1), pd(t3)));
        }
        let mut c = [_mm512_setzero_ps(); B];
        for k in 0..4 {
            // Groups (0, 1) and (2, 3): columns k and k + 8 (lo), k + 4 and k + 12 (hi).
            let lo0 = _mm512_shuffle_f32x4::<0x88>(u[0][k], u[1][k]);
            let hi0 = _mm512_shuffle_f32x4::<0xdd>(u[0][k], u[1][k]);
            let lo1 = _mm512_shuffle_f32x4::<0x88>(u[2][k], u[3][k]);
            let hi1 = _mm512_shuffle_f32x4::<0xdd>(u[2][k], u[3][k]);
            c[k] = _mm512_shuffle_f32x4::<0x88>(lo0, lo1);
            c[k + 8] = _mm512_shuffle_f32x4::<0xdd>(lo0, lo1);
            c[k + 4] = _mm512_shuffle_f32x4::<0x88>(hi0, hi1);
            c[k + 12] = _mm512_shuffle_f32x4::<0xdd>(hi0, hi1);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// Both directions against the element loops, on sizes with whole
    /// blocks and with cut ones (channels and pixels off 16), rows placed
    /// with gaps, and the bias added.
    #[test]
    fn transposes_match_the_element_loops() {
        for (channels, pixels) in [(16, 16), (32, 49), (64, 196), (20, 7), (3, 40)] {
            let src: Vec<f32> = (0..channels * pixels)
                .map(|i| i as f32 * 0.5 - 3.0)
                .collect();
            // Channel-major -> pixel rows of `channels + 5` (a gap after each).
            let ld = channels + 5;
            let mut got = vec![-1f32; pixels * ld];
            channels_to_pixels(&src, (channels, pixels), &mut got, |p| p * ld);
            for p in 0..pixels {
                for c in 0..channels {
                    assert_eq!(
                        got[p * ld + c],
                        src[c * pixels + p],
                        "{channels}x{pixels} ({p}, {c})"
                    );
                }
                assert!(got[p * ld + channels..(p + 1) * ld]
                    .iter()
                    .all(|&v| v == -1.0));
            }
            // And back, with a bias.
            let bias: Vec<f32> = (0..channels).map(|c| c as f32 * 10.0).collect();
            let mut back = vec![0f32; channels * pixels];
            pixels_to_channels(&got, (ld, &bias), (channels, pixels), &mut back);
            for c in 0..channels {
                for p in 0..pixels {
                    let want = src[c * pixels + p] + bias[c];
                    assert_eq!(
                        back[c * pixels + p],
                        want,
                        "{channels}x{pixels} back ({c}, {p})"
                    );
                }
            }
        }
    }
}
