//! The bf16 GEMM's operands ([`crate::gemm_bf16`]) converted to bf16 pairs
//! along k, each u32 holding `(k, k + 1)` low half first, which is what
//! `vdpbf16ps` multiplies: `a` row- or pair-major (whichever reads its
//! storage contiguously), `b` in panels of [`NR`] columns, zero past its last
//! column. The conversion is `vcvtne2ps2bf16` (round to nearest even) on 32
//! values at a time.
//!
//! A packed operand keeps its buffer, so that one packed once serves many
//! products (a convolution's weights over every sample of a thread's
//! chunk), and one repacked per product allocates nothing: a convolution
//! packs each sample's im2col rows straight from its padded input
//! ([`PackedA::pack_rows`], [`PackedB::pack_rows`]), without the im2col
//! copy in f32 between.

use crate::gemm::Mat;
use crate::gemm_bf16::{available, NR};

/// `a (m x k)` as bf16 pairs along k: pair `p` of row `i` at
/// `data[i * rs + p * ps]`.
#[derive(Debug, Default)]
pub(crate) struct PackedA {
    pub(crate) data: Vec<u32>,
    pub(crate) rs: usize,
    pub(crate) ps: usize,
    pub(crate) m: usize,
    pub(crate) k: usize,
}

impl PackedA {
    /// Packs `a`, read contiguously: row-major pairs when it is stored
    /// `m x k`, pair-major when stored `k x m` (transposed). False (and
    /// nothing packed) without AVX-512 BF16 or when its length disagrees
    /// with its shape.
    pub(crate) fn pack(&mut self, a: Mat<'_>) -> bool {
        if !available() || a.data.len() != a.rows * a.cols {
            return false;
        }
        let (m, k) = a.shape();
        let kp = k.div_ceil(2);
        // A reused buffer keeps its length (the products index it by
        // offsets): only growth is zeroed, and every pair is written below.
        if self.data.len() < m * kp {
            self.data.resize(m * kp, 0);
        }
        (self.m, self.k) = (m, k);
        (self.rs, self.ps) = if a.t { (1, m) } else { (kp, 1) };
        // SAFETY: `available()` said the CPU has AVX-512F/BW and BF16; the
        // slice holds m * kp pairs.
        unsafe { pairs_of_a(&a, m, k, &mut self.data[..m * kp]) };
        true
    }

    /// Packs the `m x k` matrix whose row `r` is the first `k` values of
    /// `row(r)`, row-major. False (and nothing packed) without AVX-512 BF16
    /// or when a row is shorter than `k`.
    pub(crate) fn pack_rows<'s, T: Packable + 's>(
        &mut self,
        m: usize,
        k: usize,
        row: impl Fn(usize) -> &'s [T],
    ) -> bool {
        if !available() || (0..m).any(|r| row(r).len() < k) {
            return false;
        }
        let kp = k.div_ceil(2);
        self.data.resize(m * kp, 0);
        (self.m, self.k, self.rs, self.ps) = (m, k, kp, 1);
        for (r, dst) in self.data.chunks_exact_mut(kp.max(1)).take(m).enumerate() {
            // SAFETY: the features above; `dst` holds the row's kp pairs.
            unsafe { T::pair_row(&row(r)[..k], dst) };
        }
        true
    }
}

/// `b (k x n)` in panels of [`NR`] columns: pair `p` of column `j` at
/// `data[(j / NR) * kp * NR + p * NR + j % NR]`, zero past column `n`.
#[derive(Debug, Default)]
pub(crate) struct PackedB {
    pub(crate) data: Vec<u32>,
    pub(crate) k: usize,
    pub(crate) n: usize,
}

impl PackedB {
    /// Sizes the buffer for `k x n`, the padding past the last column
    /// zeroed unless it held that shape already (whose padding is still
    /// zero): every pack writes exactly the pairs of columns below `n`, so
    /// the rest of a reused buffer needs no zero fill.
    pub(crate) fn shape(&mut self, k: usize, n: usize) {
        let kp = k.div_ceil(2);
        let len = n.div_ceil(NR) * kp * NR;
        if (self.k, self.n) != (k, n) || self.data.len() != len {
            self.data.resize(len, 0);
            let tail = n % NR;
            if tail != 0 {
                let last = (n / NR) * kp * NR;
                for pair in self.data[last..].chunks_exact_mut(NR) {
                    pair[tail..].fill(0);
                }
            }
            (self.k, self.n) = (k, n);
        }
    }

    /// Packs `b`. False (and nothing packed) without AVX-512 BF16 or when
    /// its length disagrees with its shape.
    pub(crate) fn pack(&mut self, b: Mat<'_>) -> bool {
        if !available() || b.data.len() != b.rows * b.cols {
            return false;
        }
        let (k, n) = b.shape();
        self.shape(k, n);
        // SAFETY: the features above; the buffer is shaped for k x n.
        unsafe { panels_of_b(&b, k, n, &mut self.data) };
        true
    }

    /// Packs the `k x n` matrix stored transposed in `src` (`n x k`, f32 or
    /// bf16). False (and nothing packed) without AVX-512 BF16 or when `src`
    /// does not hold `n * k` values.
    pub(crate) fn pack_transposed<T: Packable>(&mut self, k: usize, n: usize, src: &[T]) -> bool {
        if !available() || src.len() != n * k {
            return false;
        }
        self.shape(k, n);
        // SAFETY: the features above; the buffer is shaped for k x n.
        unsafe { panels_of_transposed(src, k, n, &mut self.data) };
        true
    }

    /// Packs the `k x n` matrix whose row `p` is the first `n` values of
    /// `row(p)`. False (and nothing packed) without AVX-512 BF16 or when a
    /// row is shorter than `n`.
    pub(crate) fn pack_rows<'s, T: Packable + 's>(
        &mut self,
        k: usize,
        n: usize,
        row: impl Fn(usize) -> &'s [T],
    ) -> bool {
        if !available() || (0..k).any(|p| row(p).len() < n) {
            return false;
        }
        self.shape(k, n);
        // SAFETY: the features above; the buffer is shaped for k x n.
        unsafe { panels_of_rows(k, n, |p| &row(p)[..n], &mut self.data) };
        true
    }
}

/// A stored value the packers take: f32, rounded to bf16 (to nearest even)
/// as it is packed, or bf16, whose bits are the pairs' halves
/// ([`crate::gemm_bf16_pack16`]).
pub(crate) trait Packable: Copy + Sync {
    /// Pairs `(src[2p], src[2p + 1])` of a contiguous row into `dst` (the
    /// last one `(x, 0)` when its length is odd).
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 BF16 present; `dst` holds
    /// `src.len().div_ceil(2)` pairs.
    unsafe fn pair_row(src: &[Self], dst: &mut [u32]);

    /// `dst[i] = (lo[i], hi[i])` (`hi` missing: 0) for `dst.len()` values.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 BF16 present; `lo` (and `hi`) hold
    /// `dst.len()` values.
    unsafe fn interleave(lo: &[Self], hi: Option<&[Self]>, dst: &mut [u32]);

    /// Pairs `p0..p0 + 16` of 16 stored rows (`src`: row `r` at
    /// `src[r * k..]`, its first 32 values read) transposed into `dst`: pair
    /// `t` of row `r` at `dst[t * NR + r]`.
    ///
    /// # Safety
    /// AVX-512F, AVX-512BW and AVX-512 BF16 present; `src` holds
    /// `15 * k + 32` values and `dst` `15 * NR + 16`.
    unsafe fn transposed_block(src: &[Self], k: usize, dst: &mut [u32]);
}

impl Packable for f32 {
    unsafe fn pair_row(src: &[f32], dst: &mut [u32]) {
        // SAFETY: the caller's.
        unsafe { pair_row(src, dst) }
    }

    unsafe fn interleave(lo: &[f32], hi: Option<&[f32]>, dst: &mut [u32]) {
        // SAFETY: the caller's.
        unsafe { interleave(lo, hi, dst) }
    }

    unsafe fn transposed_block(src: &[f32], k: usize, dst: &mut [u32]) {
        // SAFETY: the caller's.
        unsafe { transposed_block(src, k, dst) }
    }
}

/// Consecutive values of `src` as bf16 pairs into `dst` (`src.len() / 2`
/// of them, rounded to nearest even): the bits of `src` stored in bf16,
/// two to a u32. False (nothing written) without AVX-512 BF16 or when the
/// lengths disagree.
pub(crate) fn pairs(src: &[f32], dst: &mut [u32]) -> bool {
    if !available() || src.len() != 2 * dst.len() {
        return false;
    }
    // SAFETY: `available()` said the CPU has AVX-512F/BW and BF16.
    unsafe { pair_row(src, dst) };
    true
}

/// `dst[i] = (lo[i], hi[i])` as bf16 pairs (rounded to nearest even).
/// False (nothing written) without AVX-512 BF16 or when the lengths
/// disagree.
pub(crate) fn interleaved(lo: &[f32], hi: &[f32], dst: &mut [u32]) -> bool {
    if !available() || lo.len() != dst.len() || hi.len() != dst.len() {
        return false;
    }
    // SAFETY: the features above; both rows hold `dst.len()` values.
    unsafe { interleave(lo, Some(hi), dst) };
    true
}

/// `x` rounded to bf16 (to nearest even; NaN kept a NaN), as its bits.
#[inline(always)]
pub(crate) fn bits(x: f32) -> u16 {
    (crate::half16::bf16_round(x).to_bits() >> 16) as u16
}

/// The bf16 pair `(lo, hi)` as one u32, low half first (`vdpbf16ps`'s order).
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    u32::from(bits(lo)) | (u32::from(bits(hi)) << 16)
}

/// Pairs `(x[2p], x[2p + 1])` of a contiguous row (the last one `(x, 0)`
/// when its length is odd) into `dst`.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pair_row(src: &[f32], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    let (whole, tail) = (src.len() / 32, src.len() % 32);
    for (s, d) in src.chunks_exact(32).zip(dst.chunks_exact_mut(16)) {
        // SAFETY: 32 values read, 16 u32 (64 bytes) written.
        unsafe {
            let v = _mm512_cvtne2ps_pbh(
                _mm512_loadu_ps(s[16..].as_ptr()),
                _mm512_loadu_ps(s.as_ptr()),
            );
            _mm512_storeu_si512(
                d.as_mut_ptr().cast(),
                std::mem::transmute::<__m512bh, __m512i>(v),
            );
        }
    }
    let (s, d) = (&src[whole * 32..], &mut dst[whole * 16..]);
    for (i, o) in d.iter_mut().enumerate().take(tail.div_ceil(2)) {
        *o = pair(s[2 * i], s.get(2 * i + 1).copied().unwrap_or(0.0));
    }
}

/// `dst[i] = (lo[i], hi[i])` (`hi` missing: 0) for `dst.len()` values.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present; `lo` (and `hi`) hold
/// `dst.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn interleave(lo: &[f32], hi: Option<&[f32]>, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    let n = dst.len();
    let whole = n / 16;
    // Lane i of the result: lo[i] then hi[i] (halves 0..16 and 16..32).
    let idx = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    for c in 0..whole {
        // SAFETY: 16 values of each row read, 16 u32 written.
        unsafe {
            let l = _mm512_loadu_ps(lo[16 * c..].as_ptr());
            let h = match hi {
                Some(h) => _mm512_loadu_ps(h[16 * c..].as_ptr()),
                None => _mm512_setzero_ps(),
            };
            let v = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(h, l));
            let v = _mm512_permutexvar_epi16(idx, v);
            _mm512_storeu_si512(dst[16 * c..].as_mut_ptr().cast(), v);
        }
    }
    for i in whole * 16..n {
        dst[i] = pair(lo[i], hi.map_or(0.0, |h| h[i]));
    }
}

/// The logical `a (m x k)` as pairs into `data` (`m * kp` of them):
/// row-major when `a` is stored `m x k`, pair-major when it is stored
/// `k x m` (transposed), so every read of the source is contiguous.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present; `a` is `m x k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pairs_of_a(a: &Mat<'_>, m: usize, k: usize, data: &mut [u32]) {
    let kp = k.div_ceil(2);
    if !a.t {
        for (row, dst) in a.data.chunks_exact(k).zip(data.chunks_exact_mut(kp)) {
            // SAFETY: the caller's features.
            unsafe { pair_row(row, dst) };
        }
        return;
    }
    for (p, dst) in data.chunks_exact_mut(m).enumerate() {
        let lo = &a.data[2 * p * m..][..m];
        let hi = (2 * p + 1 < k).then(|| &a.data[(2 * p + 1) * m..][..m]);
        // SAFETY: the caller's features; both rows hold m values.
        unsafe { interleave(lo, hi, dst) };
    }
}

/// The logical `b (k x n)` into panels of [`NR`] columns (`out`, shaped by
/// [`PackedB`]): rows 2p and 2p + 1 interleaved when `b` is stored `k x n`,
/// each stored row's pairs spread over its column when it is stored `n x k`.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present; `b` is `k x n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn panels_of_b(b: &Mat<'_>, k: usize, n: usize, out: &mut [u32]) {
    if !b.t {
        // SAFETY: the caller's features; row p holds n values.
        unsafe { panels_of_rows(k, n, |p| &b.data[p * n..][..n], out) };
        return;
    }
    // SAFETY: the caller's features; `b` is stored n x k.
    unsafe { panels_of_transposed(b.data, k, n, out) };
}

/// The `k x n` matrix stored transposed in `src` (`n x k`) into panels of
/// [`NR`] columns (`out`, shaped by [`PackedB`]): column `j`'s pairs are
/// row `j`'s, contiguous. Blocks of 16 columns by 16 pairs are packed and
/// transposed in registers ([`Packable::transposed_block`]); the pairs
/// past the last whole block of 32 values, and the columns past the last
/// whole block of 16, a row at a time.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present; `src` holds `n * k`
/// values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn panels_of_transposed<T: Packable>(src: &[T], k: usize, n: usize, out: &mut [u32]) {
    let kp = k.div_ceil(2);
    let (n16, p16) = (n / 16 * 16, k / 32 * 16);
    for j0 in (0..n16).step_by(16) {
        let base = (j0 / NR) * kp * NR + j0 % NR;
        for p0 in (0..p16).step_by(16) {
            // SAFETY: the caller's features; rows j0..j0 + 16 hold k values,
            // of which 2 * p0 + 32 <= k are read; the 16 stores land in
            // pairs p0..p0 + 16 of columns j0..j0 + 16, inside the panel.
            unsafe { T::transposed_block(&src[j0 * k + 2 * p0..], k, &mut out[base + p0 * NR..]) };
        }
    }
    let mut row = vec![0u32; kp];
    for (j, values) in src.chunks_exact(k.max(1)).take(n).enumerate() {
        let first = if j < n16 { p16 } else { 0 };
        let rest = &mut row[..kp - first];
        // SAFETY: the caller's features; `rest` holds the remaining pairs.
        unsafe { T::pair_row(&values[2 * first..], rest) };
        let dst = &mut out[(j / NR) * kp * NR + j % NR..];
        for (p, v) in rest.iter().enumerate() {
            dst[(first + p) * NR] = *v;
        }
    }
}

/// Pairs `p0..p0 + 16` of 16 stored rows (`src`: row `r` at `src[r * k..]`,
/// its first 32 values read) transposed into `dst`: pair `t` of row `r` at
/// `dst[t * NR + r]` ([`transpose_store`]: the 16 x 16 transpose of 32-bit
/// lanes in three rounds, 32-bit and 64-bit unpacks within each 128-bit
/// lane (4 x 4 blocks), then two rounds of 128-bit lane shuffles).
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present; `src` holds
/// `15 * k + 32` values and `dst` `15 * NR + 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn transposed_block(src: &[f32], k: usize, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    debug_assert!(src.len() >= 15 * k + 32 && dst.len() >= 15 * NR + 16);
    let mut r = [_mm512_setzero_si512(); 16];
    for (i, v) in r.iter_mut().enumerate() {
        // SAFETY: row i's 32 values are inside `src` (asserted).
        unsafe {
            let s = src.as_ptr().add(i * k);
            *v = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(
                _mm512_loadu_ps(s.add(16)),
                _mm512_loadu_ps(s),
            ));
        }
    }
    // SAFETY: the caller's features and `dst`'s length.
    unsafe { transpose_store(&r, dst) };
}

/// Sixteen rows of 16 pairs, `r[i]` row `i`, transposed into `dst`: pair
/// `t` of row `i` at `dst[t * NR + i]`.
///
/// # Safety
/// AVX-512F and AVX-512BW present; `dst` holds `15 * NR + 16` pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) unsafe fn transpose_store(r: &[std::arch::x86_64::__m512i; 16], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    debug_assert!(dst.len() >= 15 * NR + 16);
    let mut a = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // b[4i + q], lane L: column 4L + q of rows 4i..4i + 4.
    let mut b = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for q in 0..4 {
        let c0 = _mm512_shuffle_i32x4::<0x88>(b[q], b[4 + q]);
        let c1 = _mm512_shuffle_i32x4::<0xDD>(b[q], b[4 + q]);
        let c2 = _mm512_shuffle_i32x4::<0x88>(b[8 + q], b[12 + q]);
        let c3 = _mm512_shuffle_i32x4::<0xDD>(b[8 + q], b[12 + q]);
        let cols = [
            _mm512_shuffle_i32x4::<0x88>(c0, c2),
            _mm512_shuffle_i32x4::<0x88>(c1, c3),
            _mm512_shuffle_i32x4::<0xDD>(c0, c2),
            _mm512_shuffle_i32x4::<0xDD>(c1, c3),
        ];
        for (l, v) in cols.iter().enumerate() {
            // SAFETY: pair 4l + q's 16 values land inside `dst` (asserted).
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add((4 * l + q) * NR).cast(), *v) };
        }
    }
}

/// The `k x n` matrix whose row `p` is `row(p)` (n values) into panels of
/// [`NR`] columns: rows 2p and 2p + 1 interleaved, NR columns a panel.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present; `out` shaped by
/// [`PackedB`] for `k x n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn panels_of_rows<'s, T: Packable + 's>(
    k: usize,
    n: usize,
    row: impl Fn(usize) -> &'s [T],
    out: &mut [u32],
) {
    let kp = k.div_ceil(2);
    for p in 0..kp {
        let lo = row(2 * p);
        let hi = (2 * p + 1 < k).then(|| row(2 * p + 1));
        for (panel, dst) in out.chunks_exact_mut(kp * NR).enumerate() {
            let (j0, w) = (panel * NR, NR.min(n - panel * NR));
            let dst = &mut dst[p * NR..][..w];
            // SAFETY: the caller's features; w values of each row.
            unsafe { T::interleave(&lo[j0..j0 + w], hi.map(|h| &h[j0..j0 + w]), dst) };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pairs_of_a(_: &Mat<'_>, _: usize, _: usize, _: &mut [u32]) {}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn panels_of_b(_: &Mat<'_>, _: usize, _: usize, _: &mut [u32]) {}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn panels_of_transposed<T: Packable>(_: &[T], _: usize, _: usize, _: &mut [u32]) {}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn transposed_block(_: &[f32], _: usize, _: &mut [u32]) {}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn panels_of_rows<'s, T: Packable + 's>(
    _: usize,
    _: usize,
    _: impl Fn(usize) -> &'s [T],
    _: &mut [u32],
) {
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pair_row(_: &[f32], _: &mut [u32]) {}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn interleave(_: &[f32], _: Option<&[f32]>, _: &mut [u32]) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// `b (k x n)`'s panels one pair at a time, as the layout is defined.
    fn reference(b: &Mat<'_>, k: usize, n: usize) -> Vec<u32> {
        let kp = k.div_ceil(2);
        let at = |p: usize, j: usize| -> f32 {
            match (p < k, b.t) {
                (false, _) => 0.0,
                (true, false) => b.data[p * n + j],
                (true, true) => b.data[j * k + p],
            }
        };
        let mut out = vec![0u32; n.div_ceil(NR) * kp * NR];
        for j in 0..n {
            for p in 0..kp {
                out[(j / NR) * kp * NR + p * NR + j % NR] = pair(at(2 * p, j), at(2 * p + 1, j));
            }
        }
        out
    }

    /// Both stored layouts of `b` pack to the defined panels, bit for bit:
    /// widths around the transposed path's 16-column blocks and the panel's
    /// 32, depths around its 32-value blocks (odd ones included), and a
    /// repack into the same buffer at another shape.
    #[test]
    fn panels_match_the_layout() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let mut packed = PackedB::default();
        for (k, n) in [
            (1, 1),
            (31, 15),
            (32, 16),
            (33, 17),
            (64, 32),
            (95, 48),
            (784, 128),
            (70, 100),
            (3, 40),
        ] {
            let v: Vec<f32> = (0..k * n)
                .map(|i| ((i as f32 + 0.5) * 0.37).sin() * 3.0)
                .collect();
            for b in [Mat::new(&v, k, n), Mat::new(&v, n, k).t()] {
                assert!(packed.pack(b));
                assert_eq!(
                    packed.data,
                    reference(&b, k, n),
                    "k {k}, n {n}, transposed {}",
                    b.t
                );
            }
        }
    }
}
