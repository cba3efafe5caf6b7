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
        self.data.resize(m * kp, 0);
        (self.m, self.k) = (m, k);
        (self.rs, self.ps) = if a.t { (1, m) } else { (kp, 1) };
        // SAFETY: `available()` said the CPU has AVX-512F/BW and BF16; the
        // buffer holds m * kp pairs.
        unsafe { pairs_of_a(&a, m, k, &mut self.data) };
        true
    }

    /// Packs the `m x k` matrix whose row `r` is the first `k` values of
    /// `row(r)`, row-major. False (and nothing packed) without AVX-512 BF16
    /// or when a row is shorter than `k`.
    pub(crate) fn pack_rows<'s>(
        &mut self,
        m: usize,
        k: usize,
        row: impl Fn(usize) -> &'s [f32],
    ) -> bool {
        if !available() || (0..m).any(|r| row(r).len() < k) {
            return false;
        }
        let kp = k.div_ceil(2);
        self.data.resize(m * kp, 0);
        (self.m, self.k, self.rs, self.ps) = (m, k, kp, 1);
        for (r, dst) in self.data.chunks_exact_mut(kp.max(1)).take(m).enumerate() {
            // SAFETY: the features above; `dst` holds the row's kp pairs.
            unsafe { pair_row(&row(r)[..k], dst) };
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
    /// Sizes the buffer for `k x n`; zeroed (the padding past the last
    /// column) unless it held that shape already, whose padding is still
    /// zero: every pack writes exactly the pairs of columns below `n`.
    fn shape(&mut self, k: usize, n: usize) {
        let len = n.div_ceil(NR) * k.div_ceil(2) * NR;
        if (self.k, self.n) != (k, n) || self.data.len() != len {
            self.data.clear();
            self.data.resize(len, 0);
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

    /// Packs the `k x n` matrix whose row `p` is the first `n` values of
    /// `row(p)`. False (and nothing packed) without AVX-512 BF16 or when a
    /// row is shorter than `n`.
    pub(crate) fn pack_rows<'s>(
        &mut self,
        k: usize,
        n: usize,
        row: impl Fn(usize) -> &'s [f32],
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
    // Stored n x k: column j's pairs are row j's, contiguous.
    let kp = k.div_ceil(2);
    let mut row = vec![0u32; kp];
    for (j, src) in b.data.chunks_exact(k).enumerate() {
        // SAFETY: the caller's features.
        unsafe { pair_row(src, &mut row) };
        let dst = &mut out[(j / NR) * kp * NR + j % NR..];
        for (p, v) in row.iter().enumerate() {
            dst[p * NR] = *v;
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
unsafe fn panels_of_rows<'s>(
    k: usize,
    n: usize,
    row: impl Fn(usize) -> &'s [f32],
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
            unsafe { interleave(&lo[j0..j0 + w], hi.map(|h| &h[j0..j0 + w]), dst) };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pairs_of_a(_: &Mat<'_>, _: usize, _: usize, _: &mut [u32]) {}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn panels_of_b(_: &Mat<'_>, _: usize, _: usize, _: &mut [u32]) {}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn panels_of_rows<'s>(_: usize, _: usize, _: impl Fn(usize) -> &'s [f32], _: &mut [u32]) {}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pair_row(_: &[f32], _: &mut [u32]) {}
