//! A bf16 GEMM for the CPU's 16-bit products (`bf16-mixed`, `bf16-true`):
//! `dst = [dst +] a * b` with the operands rounded to bf16 and every
//! product accumulated in f32, on AVX-512 BF16's `vdpbf16ps` (Zen 4,
//! Sapphire Rapids and later), which multiplies 32 bf16 pairs per
//! instruction: twice the multiply-adds of an fp32 FMA, on half the bytes.
//!
//! Where the CPU lacks the instruction, or the switch ([`set_enabled`]) is
//! off, [`matmul_in`] takes the fp32 GEMM of the operands instead (they are
//! bf16 values already, so that is the same 16-bit product with fp32
//! accumulation, summed in another order).
//!
//! What differs from the fp32 GEMM: the order of the sums (each
//! instruction adds a pair of products) and subnormal inputs and outputs
//! flushed to zero, as Intel's manual defines `vdpbf16ps` (and AMX's
//! `tdpbf16ps`, which oneDNN's bf16 products use). The same shapes give the
//! same bits on every run and thread count: each output is summed by one
//! thread in a fixed order.
//!
//! Layout: each operand is converted once per product into bf16 pairs
//! along k, each u32 holding `(k, k + 1)` low half first, which is what
//! `vdpbf16ps` multiplies: `a` row- or pair-major (whichever reads its
//! storage contiguously), `b` in panels of [`NR`] columns. The conversion
//! is `vcvtne2ps2bf16` (round to nearest even) on 32 values at a time. The
//! micro-kernel keeps an `MR x NR` tile of f32 sums in 16 registers, over
//! blocks of `KC` pairs and `NC` columns (BLIS's loop order).
//!
//! Measured with `cargo run --release -p redline-kernels --example
//! gemm_bf16` (one thread, the conversions included): 1.45-2.3x the fp32
//! GEMM's speed on the MLP's and the CNN's shapes on a Zen 4 core
//! (`bench/results/2026-11-25-epyc-zen4-gemm-bf16.txt`).

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::DType;
use rayon::prelude::*;

use crate::gemm::{matmul, sizes, threads, Mat, PARALLEL_MIN_FLOPS};

/// Rows of the micro-kernel's tile.
pub const MR: usize = 8;
/// Columns of the micro-kernel's tile: two 16-lane registers.
pub const NR: usize = 32;
/// k pairs per block (512 values of k): a panel's block of `b` is 32 KiB.
const KC: usize = 256;
/// Columns per packed `b` block: 256 KiB of pairs, an L2's share.
const NC: usize = 8 * NR;

static ON: AtomicBool = AtomicBool::new(true);

/// Turns the native bf16 kernel on or off (on by default, where the CPU has
/// AVX-512 BF16); off, bf16 products take the fp32 GEMM. For measurements
/// and for tests of the fp32 route; `--cpu-bf16-gemm` sets it
/// (`redline_train::set_cpu_bf16_gemm`).
pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Whether this CPU has AVX-512 BF16 (and AVX-512F and BW), checked at run
/// time.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether bf16 products run on the native kernel: the CPU has it and the
/// switch is on.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed) && available()
}

/// The dtype a 16-bit op in `dtype` takes its GEMMs in, chosen when the op
/// is built: BF16 (the native kernel) for a bf16 product when [`enabled`],
/// else F32 (the fp32 GEMM of the rounded operands).
pub fn route(dtype: DType) -> DType {
    if dtype == DType::BF16 && enabled() {
        DType::BF16
    } else {
        DType::F32
    }
}

/// What a 16-bit op in `dtype` rounds its GEMM operands to before a product
/// in `gemm` ([`route`]'s): nothing (F32) for the native bf16 kernel, which
/// rounds them to nearest as it packs them (the same values, one pass
/// fewer); `dtype` for the fp32 GEMM.
pub fn pre_rounding(dtype: DType, gemm: DType) -> DType {
    if gemm == DType::BF16 {
        DType::F32
    } else {
        dtype
    }
}

/// `dst (m x n) = [dst +] a (m x k) * b (k x n)` as a product in `dtype`
/// ([`route`]'s): bf16 on the native kernel, every other dtype on the fp32
/// GEMM. False (and `dst` untouched) when shapes or lengths disagree.
#[must_use]
pub fn matmul_in(dtype: DType, dst: &mut [f32], a: Mat<'_>, b: Mat<'_>, accumulate: bool) -> bool {
    if dtype == DType::BF16 {
        matmul_bf16(dst, a, b, accumulate)
    } else {
        matmul(dst, a, b, accumulate)
    }
}

/// [`matmul_in`]'s native bf16 product, the operands rounded to bf16 (to
/// nearest even) as they are packed. Falls back to the fp32 GEMM of the
/// rounded operands off x86-64 or without AVX-512 BF16, so it is correct
/// everywhere.
#[must_use]
pub fn matmul_bf16(dst: &mut [f32], a: Mat<'_>, b: Mat<'_>, accumulate: bool) -> bool {
    let ((m, k), n) = (a.shape(), b.shape().1);
    let par = threads() > 1 && m * k * n >= PARALLEL_MIN_FLOPS && m > MR;
    product(dst, a, b, accumulate, par)
}

/// [`matmul_bf16`], its row blocks split over rayon's threads when `par`.
fn product(dst: &mut [f32], a: Mat<'_>, b: Mat<'_>, accumulate: bool, par: bool) -> bool {
    let (m, k, n) = match sizes(dst, &a, &b, accumulate) {
        Some(Some(mkn)) => mkn,
        Some(None) => return true,
        None => return false,
    };
    if !available() {
        let round = |v: &[f32]| -> Vec<f32> {
            v.iter()
                .map(|x| f32::from_bits(u32::from(bits(*x)) << 16))
                .collect()
        };
        let (ar, br) = (round(a.data), round(b.data));
        let (a2, b2) = (Mat { data: &ar, ..a }, Mat { data: &br, ..b });
        return matmul(dst, a2, b2, accumulate);
    }
    let kp = k.div_ceil(2);
    // SAFETY (both): `available()` said the CPU has AVX-512F/BW and BF16.
    let ap = unsafe { pairs_of_a(&a, m, k) };
    let bp = unsafe { panels_of_b(&b, k, n) };
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..kp).step_by(KC) {
            let block = Block {
                a: &ap,
                m,
                b: &bp,
                kp,
                n,
                jc,
                nc,
                pc,
                kc: KC.min(kp - pc),
                load: accumulate || pc > 0,
            };
            if par {
                dst.par_chunks_mut(MR * n)
                    .enumerate()
                    .for_each(|(ib, c)| block.rows(ib * MR, c));
            } else {
                dst.chunks_mut(MR * n)
                    .enumerate()
                    .for_each(|(ib, c)| block.rows(ib * MR, c));
            }
        }
    }
    true
}

/// `x` rounded to bf16 (to nearest even; NaN kept a NaN), as its bits.
#[inline(always)]
fn bits(x: f32) -> u16 {
    (crate::half16::bf16_round(x).to_bits() >> 16) as u16
}

/// The bf16 pair `(lo, hi)` as one u32, low half first (`vdpbf16ps`'s order).
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    u32::from(bits(lo)) | (u32::from(bits(hi)) << 16)
}

/// `a (m x k)` as bf16 pairs along k: pair `p` of row `i` at
/// `data[i * rs + p * ps]`.
struct Pairs {
    data: Vec<u32>,
    rs: usize,
    ps: usize,
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

/// [`Pairs`] of the logical `a (m x k)`: row-major pairs when `a` is stored
/// `m x k`, pair-major when it is stored `k x m` (transposed), so every
/// read of the source is contiguous.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present; `a` is `m x k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pairs_of_a(a: &Mat<'_>, m: usize, k: usize) -> Pairs {
    let kp = k.div_ceil(2);
    let mut data = vec![0u32; m * kp];
    if !a.t {
        for (row, dst) in a.data.chunks_exact(k).zip(data.chunks_exact_mut(kp)) {
            // SAFETY: the caller's features.
            unsafe { pair_row(row, dst) };
        }
        return Pairs {
            data,
            rs: kp,
            ps: 1,
        };
    }
    for (p, dst) in data.chunks_exact_mut(m).enumerate() {
        let lo = &a.data[2 * p * m..][..m];
        let hi = (2 * p + 1 < k).then(|| &a.data[(2 * p + 1) * m..][..m]);
        // SAFETY: the caller's features; both rows hold m values.
        unsafe { interleave(lo, hi, dst) };
    }
    Pairs { data, rs: 1, ps: m }
}

/// The logical `b (k x n)` packed into panels of [`NR`] columns:
/// `out[panel][p][c]`, zero past its last column.
///
/// # Safety
/// AVX-512F, AVX-512BW and AVX-512 BF16 present; `b` is `k x n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn panels_of_b(b: &Mat<'_>, k: usize, n: usize) -> Vec<u32> {
    let kp = k.div_ceil(2);
    let mut out = vec![0u32; n.div_ceil(NR) * kp * NR];
    if !b.t {
        // Stored k x n: rows 2p and 2p + 1 interleaved, NR columns a panel.
        for p in 0..kp {
            let lo = &b.data[2 * p * n..][..n];
            let hi = (2 * p + 1 < k).then(|| &b.data[(2 * p + 1) * n..][..n]);
            for (panel, dst) in out.chunks_exact_mut(kp * NR).enumerate() {
                let (j0, w) = (panel * NR, NR.min(n - panel * NR));
                let dst = &mut dst[p * NR..][..w];
                // SAFETY: the caller's features; w values of each row.
                unsafe { interleave(&lo[j0..j0 + w], hi.map(|h| &h[j0..j0 + w]), dst) };
            }
        }
        return out;
    }
    // Stored n x k: column j's pairs are row j's, contiguous.
    let mut row = vec![0u32; kp];
    for (j, src) in b.data.chunks_exact(k).enumerate() {
        // SAFETY: the caller's features.
        unsafe { pair_row(src, &mut row) };
        let dst = &mut out[(j / NR) * kp * NR + j % NR..];
        for (p, v) in row.iter().enumerate() {
            dst[p * NR] = *v;
        }
    }
    out
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pairs_of_a(_: &Mat<'_>, _: usize, _: usize) -> Pairs {
    Pairs {
        data: Vec::new(),
        rs: 0,
        ps: 0,
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn panels_of_b(_: &Mat<'_>, _: usize, _: usize) -> Vec<u32> {
    Vec::new()
}

/// One `KC`-pair, `NC`-column block of the product over every row block.
struct Block<'a> {
    a: &'a Pairs,
    /// Rows of `a`.
    m: usize,
    /// `b` in panels ([`panels_of_b`]).
    b: &'a [u32],
    kp: usize,
    /// Columns of `dst`.
    n: usize,
    jc: usize,
    nc: usize,
    pc: usize,
    kc: usize,
    /// Add to `dst` (a later k block, or an accumulating product).
    load: bool,
}

impl Block<'_> {
    /// Rows `i0..` of `dst` (`c`, up to [`MR`] full rows).
    fn rows(&self, i0: usize, c: &mut [f32]) {
        let rows = c.len() / self.n;
        // Rows past `a`'s last repeat it; their sums are never stored.
        let a_rows: [usize; MR] = std::array::from_fn(|r| (i0 + r).min(self.m - 1) * self.a.rs);
        let a_base = self.pc * self.a.ps;
        let panels = (self.jc / NR)..(self.jc + self.nc).div_ceil(NR);
        for panel in panels {
            let j0 = panel * NR;
            let tile = Tile {
                rows,
                cols: NR.min(self.n - j0),
                ldc: self.n,
                load: self.load,
            };
            let b = &self.b[(panel * self.kp + self.pc) * NR..][..self.kc * NR];
            let a = APairs {
                data: &self.a.data[a_base..],
                rows: &a_rows,
                ps: self.a.ps,
            };
            // SAFETY: `available()` held for the product; `rows` full rows
            // of `n` columns start at `c`, and `j0 + cols <= n`; `a` holds
            // `kc` pairs of every row, `b` `kc` pairs of NR columns.
            unsafe { kernel(self.kc, a, b, c[j0..].as_mut_ptr(), tile) };
        }
    }
}

/// The micro-kernel's view of `a`: pair `p` of tile row `r` at
/// `data[rows[r] + p * ps]`.
#[derive(Clone, Copy)]
struct APairs<'a> {
    data: &'a [u32],
    rows: &'a [usize; MR],
    ps: usize,
}

/// Where a micro-kernel's tile lands in `dst`.
#[derive(Clone, Copy)]
struct Tile {
    /// Valid rows (<= MR) and columns (<= NR).
    rows: usize,
    cols: usize,
    /// Row stride of `dst`.
    ldc: usize,
    load: bool,
}

/// `c[r][j] = [c +] sum_p a(r, p) . b[p][j]` over `kc` pairs.
///
/// # Safety
/// AVX-512F and AVX-512 BF16 present; `a` holds pair `kc - 1` of every row,
/// `b` `kc * NR` values; `c` addresses `tile.rows` rows of `tile.ldc` with
/// `tile.cols` writable values each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel(kc: usize, a: APairs<'_>, b: &[u32], c: *mut f32, tile: Tile) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let last = a.rows.iter().max().copied().unwrap_or(0) + (kc.max(1) - 1) * a.ps;
    let ad = &a.data[..=last];
    for (p, bp) in b.chunks_exact(NR).take(kc).enumerate() {
        // SAFETY: each chunk holds 32 u32; 64-byte registers reinterpreted
        // as 32 bf16.
        let (b0, b1): (__m512bh, __m512bh) = unsafe {
            (
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.as_ptr().cast())),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    bp[16..].as_ptr().cast(),
                )),
            )
        };
        let off = p * a.ps;
        for (row, &r) in acc.iter_mut().zip(a.rows) {
            // SAFETY: `r + off <= last`, checked by the slice above.
            let av = unsafe { *ad.get_unchecked(r + off) };
            let a =
                unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(av as i32)) };
            row[0] = _mm512_dpbf16_ps(row[0], a, b0);
            row[1] = _mm512_dpbf16_ps(row[1], a, b1);
        }
    }
    let masks = [
        lanes(tile.cols.min(16)),
        lanes(tile.cols.saturating_sub(16)),
    ];
    for (r, row) in acc.iter().enumerate().take(tile.rows) {
        for (half, (v, &mask)) in row.iter().zip(&masks).enumerate() {
            if mask == 0 {
                continue;
            }
            // SAFETY: the masked lanes are within row r's `cols` values.
            unsafe {
                let p = c.add(r * tile.ldc + 16 * half);
                let v = if tile.load {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), *v)
                } else {
                    *v
                };
                _mm512_mask_storeu_ps(p, mask, v);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel(_: usize, _: APairs<'_>, _: &[u32], _: *mut f32, _: Tile) {}

/// A mask of the first `n` (<= 16) lanes.
#[inline(always)]
fn lanes(n: usize) -> u16 {
    if n >= 16 {
        u16::MAX
    } else {
        (1u16 << n) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::tests::transpose;

    fn vals(n: usize, f: f32) -> Vec<f32> {
        (0..n)
            .map(|i| crate::half16::bf16_round(((i as f32 + 1.0) * f).sin() * 2.0))
            .collect()
    }

    /// Every transpose combination and ragged edge (m, n not multiples of
    /// the tile, k odd and past one packed block) against an f64 product of
    /// the same bf16 values: within f32 summation error. Accumulating adds.
    #[test]
    fn matches_the_exact_product_of_the_bf16_operands() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16 (the fp32 route is tested instead)");
        }
        for (m, k, n) in [
            (1, 1, 1),
            (5, 7, 3),
            (9, 33, 40),
            (64, 784, 128),
            (17, 1031, 70),
        ] {
            let a = vals(m * k, 0.37);
            let b = vals(k * n, 0.11);
            let (at_, bt) = (transpose(&a, m, k), transpose(&b, k, n));
            let mut exact = vec![0f64; m * n];
            let mut scale = vec![0f64; m * n];
            for i in 0..m {
                for j in 0..n {
                    for p in 0..k {
                        let prod = f64::from(a[i * k + p]) * f64::from(b[p * n + j]);
                        exact[i * n + j] += prod;
                        scale[i * n + j] += prod.abs();
                    }
                }
            }
            for (ma, mb) in [
                (Mat::new(&a, m, k), Mat::new(&b, k, n)),
                (Mat::new(&at_, k, m).t(), Mat::new(&b, k, n)),
                (Mat::new(&a, m, k), Mat::new(&bt, n, k).t()),
                (Mat::new(&at_, k, m).t(), Mat::new(&bt, n, k).t()),
            ] {
                let mut c = vec![7.0; m * n];
                assert!(matmul_bf16(&mut c, ma, mb, false));
                let tol = |i: usize| 2.0 * k as f64 * f64::from(f32::EPSILON) * scale[i] + 1e-30;
                for (i, (x, e)) in c.iter().zip(&exact).enumerate() {
                    assert!(
                        (f64::from(*x) - e).abs() <= tol(i),
                        "({m},{k},{n}) [{i}]: {x} vs {e}"
                    );
                }
                assert!(matmul_bf16(&mut c, ma, mb, true));
                for (i, (x, e)) in c.iter().zip(&exact).enumerate() {
                    assert!(
                        (f64::from(*x) - 2.0 * e).abs() <= 2.0 * tol(i),
                        "accumulated ({m},{k},{n}) [{i}]: {x} vs {}",
                        2.0 * e
                    );
                }
            }
        }
    }

    /// The operands are rounded to bf16 as they are packed: f32 inputs give
    /// the product of their bf16 roundings, not of their truncations.
    #[test]
    fn rounds_f32_operands_to_nearest() {
        // 1 + 2^-8 + 2^-9 rounds up to 1 + 2^-7 in bf16 (truncation: 1).
        let x = 1.0 + 2f32.powi(-8) + 2f32.powi(-9);
        let mut c = [0f32];
        assert!(matmul_bf16(
            &mut c,
            Mat::new(&[x], 1, 1),
            Mat::new(&[1.0], 1, 1),
            false
        ));
        assert_eq!(c[0], 1.0 + 2f32.powi(-7));
    }

    /// The same bits on one thread and split over rayon's, run after run.
    #[test]
    fn threads_do_not_change_the_bits() {
        let (m, k, n) = (100, 600, 150);
        let (a, b) = (vals(m * k, 0.3), vals(k * n, 0.7));
        let run = |par: bool| {
            let mut c = vec![0f32; m * n];
            assert!(product(
                &mut c,
                Mat::new(&a, m, k),
                Mat::new(&b, k, n),
                false,
                par
            ));
            c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let one = run(false);
        assert_eq!(one, run(true));
        assert_eq!(one, run(true));
    }

    /// Mismatched shapes are refused, `dst` untouched.
    #[test]
    fn shape_mismatch_is_refused() {
        let mut c = vec![5.0; 4];
        assert!(!matmul_bf16(
            &mut c,
            Mat::new(&[1.0; 6], 2, 3),
            Mat::new(&[1.0; 4], 2, 2),
            false
        ));
        assert_eq!(c, vec![5.0; 4]);
    }
}
