//! The bf16 GEMM's operands ([`crate::gemm_bf16`]) packed from bf16
//! storage (`PackedA::pack_rows` and `PackedB::pack_rows` of bf16 rows,
//! `PackedB::pack_transposed`): the layouts of
//! [`crate::gemm_bf16_pack`], whose pairs here are the stored values
//! themselves (no conversion, half the bytes read), for
//! the convolutions whose activations stay bf16 ([`crate::conv_pointwise16`]).
//! A value packed from bf16 storage is the bits the f32 packers give the same
//! value widened, so a product is the same to the bit either way.

use half::bf16;

use crate::gemm_bf16::NR;
use crate::gemm_bf16_pack::Packable;

/// The bf16 pair `(lo, hi)` as one u32, low half first.
#[inline(always)]
fn pair16(lo: bf16, hi: bf16) -> u32 {
    u32::from(lo.to_bits()) | (u32::from(hi.to_bits()) << 16)
}

impl Packable for bf16 {
    unsafe fn pair_row(src: &[bf16], dst: &mut [u32]) {
        let mut pairs = src.chunks_exact(2);
        for (d, s) in dst.iter_mut().zip(&mut pairs) {
            *d = pair16(s[0], s[1]);
        }
        if let (Some(&last), Some(d)) = (pairs.remainder().first(), dst.get_mut(src.len() / 2)) {
            *d = pair16(last, bf16::ZERO);
        }
    }

    unsafe fn interleave(lo: &[bf16], hi: Option<&[bf16]>, dst: &mut [u32]) {
        // SAFETY: the caller's.
        unsafe { interleave16(lo, hi, dst) }
    }

    unsafe fn transposed_block(src: &[bf16], k: usize, dst: &mut [u32]) {
        // SAFETY: the caller's.
        unsafe { transposed_block16(src, k, dst) }
    }
}

/// `dst[i] = (lo[i], hi[i])` (`hi` missing: 0) for `dst.len()` values.
///
/// # Safety
/// AVX-512F and AVX-512BW present; `lo` (and `hi`) hold `dst.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn interleave16(lo: &[bf16], hi: Option<&[bf16]>, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    let n = dst.len();
    let whole = n / 16;
    for c in 0..whole {
        // SAFETY: 16 values of each row read, 16 u32 written.
        unsafe {
            let l = _mm512_cvtepu16_epi32(_mm256_loadu_si256(lo[16 * c..].as_ptr().cast()));
            let v = match hi {
                Some(h) => {
                    let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(h[16 * c..].as_ptr().cast()));
                    _mm512_or_si512(l, _mm512_slli_epi32::<16>(h))
                }
                None => l,
            };
            _mm512_storeu_si512(dst[16 * c..].as_mut_ptr().cast(), v);
        }
    }
    for i in whole * 16..n {
        dst[i] = pair16(lo[i], hi.map_or(half::bf16::ZERO, |h| h[i]));
    }
}

/// Pairs `p0..p0 + 16` of 16 stored bf16 rows (`src`: row `r` at
/// `src[r * k..]`, its first 32 values read) transposed into `dst`: pair
/// `t` of row `r` at `dst[t * NR + r]`.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present; `src` holds `15 * k + 32`
/// values and `dst` `15 * NR + 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn transposed_block16(src: &[bf16], k: usize, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    debug_assert!(src.len() >= 15 * k + 32 && dst.len() >= 15 * NR + 16);
    let mut r = [_mm512_setzero_si512(); 16];
    for (i, v) in r.iter_mut().enumerate() {
        // SAFETY: row i's 32 values are inside `src` (asserted).
        *v = unsafe { _mm512_loadu_si512(src.as_ptr().add(i * k).cast()) };
    }
    // SAFETY: the caller's features and `dst`'s length.
    unsafe { crate::gemm_bf16_pack::transpose_store(&r, dst) };
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn interleave16(_: &[bf16], _: Option<&[bf16]>, _: &mut [u32]) {}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn transposed_block16(_: &[bf16], _: usize, _: &mut [u32]) {}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::gemm::Mat;
    use crate::gemm_bf16::available;
    use crate::gemm_bf16_pack::{PackedA, PackedB};

    fn values(n: usize, seed: f32) -> (Vec<bf16>, Vec<f32>) {
        let v: Vec<bf16> = (0..n)
            .map(|i| bf16::from_f32(((i as f32 + seed) * 0.37).sin() * 3.0))
            .collect();
        let w = v.iter().map(|x| x.to_f32()).collect();
        (v, w)
    }

    /// Each bf16 packer gives the bits of its f32 twin on the widened
    /// values: depths and widths around the 16- and 32-value blocks and
    /// the panel's 32 columns, odd ones included, repacked into one buffer.
    #[test]
    fn bf16_packs_equal_the_f32_packs_of_the_same_values() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let (mut a16, mut a32) = (PackedA::default(), PackedA::default());
        let (mut b16, mut b32) = (PackedB::default(), PackedB::default());
        for (k, n) in [
            (1, 1),
            (31, 15),
            (32, 16),
            (33, 17),
            (64, 32),
            (95, 48),
            (70, 100),
            (3, 40),
        ] {
            let (v16, v32) = values(k * n, k as f32);
            let what = format!("k {k}, n {n}");
            // b (k x n) stored k x n, and stored n x k (transposed).
            assert!(b16.pack_rows(k, n, |p| &v16[p * n..][..n]));
            assert!(b32.pack(Mat::new(&v32, k, n)));
            assert_eq!(b16.data, b32.data, "{what}: rows");
            assert!(b16.pack_transposed(k, n, &v16));
            assert!(b32.pack(Mat::new(&v32, n, k).t()));
            assert_eq!(b16.data, b32.data, "{what}: transposed");
            // a (n x k) row-major.
            assert!(a16.pack_rows(n, k, |r| &v16[r * k..][..k]));
            assert!(a32.pack(Mat::new(&v32, n, k)));
            let len = n * k.div_ceil(2);
            assert_eq!(a16.data[..len], a32.data[..len], "{what}: a");
            assert_eq!((a16.rs, a16.ps), (a32.rs, a32.ps), "{what}: a's strides");
        }
    }

    /// Short rows and a transposed source of the wrong length are refused.
    #[test]
    fn wrong_lengths_are_refused() {
        if !available() {
            return;
        }
        let (v, _) = values(10, 0.0);
        assert!(!PackedB::default().pack_rows(2, 6, |p| &v[p * 5..][..5]));
        assert!(!PackedB::default().pack_transposed(3, 4, &v));
        assert!(!PackedA::default().pack_rows(2, 6, |r| &v[r * 5..][..5]));
    }
}
