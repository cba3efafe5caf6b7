//! `exp` for f32 in plain arithmetic that the compiler vectorises (inside
//! a `pulp` dispatch, where `round` is an instruction, not a libm call):
//! the GELU's tanh and the attention's softmax rows.

/// `exp(x)` for f32 in plain arithmetic (vectorisable): `2^n * p(r)` with
/// `x = n ln 2 + r`, `|r| <= ln 2 / 2`, `p` the Taylor polynomial of degree
/// 7; inputs clamped to `[-87, 88]` (0 and `inf` beyond are not needed here:
/// `tanh` saturates long before).
///
/// `n` is rounded by adding 1.5 * 2^23, which leaves it in the sum's low
/// mantissa bits (to nearest, ties to even), and `2^n` is built from those
/// bits. No float-to-int conversion: Rust's `as i32` saturates, which LLVM
/// cannot vectorise, and it made every lane a scalar conversion and branch
/// (the softmax rows were a fifth of the attention's time; without the
/// conversion the attention is 16-19% faster).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    /// 1.5 * 2^23: `y + SHIFTER` has `round(y)` in its low bits for |y| < 2^22.
    const SHIFTER: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + SHIFTER;
    let n = t - SHIFTER;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r / 5040.0))))));
    // 2^n through the exponent bits: t's bits are SHIFTER's plus n (n in
    // [-126, 127] after the clamp, so n + 127 is a valid biased exponent).
    let biased = t
        .to_bits()
        .wrapping_sub(SHIFTER.to_bits())
        .wrapping_add(127);
    p * f32::from_bits(biased << 23)
}

/// `exp(x)`, with 0 for `x` below -87 (a masked score's `-inf` included),
/// where [`exp`] clamps.
#[inline(always)]
fn exp0(x: f32) -> f32 {
    let e = exp(x);
    if x < -87.0 {
        0.0
    } else {
        e
    }
}

/// Sets each `x` of `row` to `exp(scale x - shift)` (0 where that is below
/// -87) and returns their sum: a softmax row's numerators. Vectorised, with
/// 16 partial sums.
pub(crate) fn exp_row(row: &mut [f32], scale: f32, shift: f32) -> f32 {
    struct Row<'a> {
        row: &'a mut [f32],
        scale: f32,
        shift: f32,
    }
    impl pulp::WithSimd for Row<'_> {
        type Output = f32;
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _simd: S) -> f32 {
            let (scale, shift) = (self.scale, self.shift);
            let mut acc = [0f32; 16];
            let mut chunks = self.row.chunks_exact_mut(16);
            for c in &mut chunks {
                for (a, x) in acc.iter_mut().zip(c.iter_mut()) {
                    *x = exp0(*x * scale - shift);
                    *a += *x;
                }
            }
            let mut sum: f32 = acc.iter().sum();
            for x in chunks.into_remainder() {
                *x = exp0(*x * scale - shift);
                sum += *x;
            }
            sum
        }
    }
    pulp::Arch::new().dispatch(Row { row, scale, shift })
}

/// The largest value of `row` (`-inf` when empty), vectorised with 16
/// partial maxima.
pub(crate) fn row_max(row: &[f32]) -> f32 {
    struct Max<'a>(&'a [f32]);
    impl pulp::WithSimd for Max<'_> {
        type Output = f32;
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _simd: S) -> f32 {
            let mut acc = [f32::NEG_INFINITY; 16];
            let mut chunks = self.0.chunks_exact(16);
            for c in &mut chunks {
                for (a, x) in acc.iter_mut().zip(c) {
                    *a = a.max(*x);
                }
            }
            let max = acc.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x));
            chunks.remainder().iter().fold(max, |m, x| m.max(*x))
        }
    }
    pulp::Arch::new().dispatch(Max(row))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_match_libm_and_masked_scores_give_zero() {
        let mut row: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 6.0).collect();
        row[5] = f32::NEG_INFINITY;
        let want: Vec<f32> = row.iter().map(|&x| (0.5 * x - 1.0).exp()).collect();
        let sum = exp_row(&mut row, 0.5, 1.0);
        for (a, b) in row.iter().zip(&want) {
            assert!((a - b).abs() <= 2.5e-7 * b.abs(), "{a} vs {b}");
        }
        assert_eq!(row[5], 0.0);
        let total: f32 = want.iter().sum();
        assert!((sum - total).abs() < 1e-5 * total, "{sum} vs {total}");
    }

    #[test]
    fn exp_matches_libm_over_the_whole_clamped_range() {
        // Every exponent 2^n from n = -125 to 127, and the halfway points
        // where n's rounding turns over.
        let mut x = -87.0f32;
        while x <= 88.0 {
            for y in [x, (x + std::f32::consts::LN_2 / 2.0).min(88.0)] {
                let (a, b) = (exp(y), y.exp());
                assert!((a - b).abs() <= 3e-7 * b, "exp({y}) = {a}, libm {b}");
            }
            x += 0.173;
        }
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn row_max_takes_the_largest_across_lanes_and_the_tail() {
        assert_eq!(row_max(&[]), f32::NEG_INFINITY);
        for n in [1usize, 15, 16, 17, 40] {
            for at in 0..n {
                let mut row: Vec<f32> = (0..n).map(|i| -(i as f32) - 1.0).collect();
                row[at] = 3.5;
                assert_eq!(row_max(&row), 3.5, "n {n}, largest at {at}");
            }
        }
    }
}
