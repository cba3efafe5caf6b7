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
//! Layout (`gemm_bf16_pack`): each operand is converted into bf16 pairs
//! along k, each u32 holding `(k, k + 1)` low half first, which is what
//! `vdpbf16ps` multiplies: `a` row- or pair-major (whichever reads its
//! storage contiguously), `b` in panels of [`NR`] columns; once per
//! product, or once for many (a convolution's weights). The conversion
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
use crate::gemm_bf16_pack::{bits, PackedA, PackedB};

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

thread_local! {
    /// A thread's packing buffers, kept between products: a fresh buffer
    /// is zeroed before it is written, and each product packed both
    /// operands (ResNet-18's 512 x 4608 weights, and each sample's
    /// columns in a loop of per-sample products). [`PackedA::pack`]
    /// writes every pair; [`PackedB`] zeroes its padding when its shape
    /// changes.
    static PACKED: std::cell::Cell<(PackedA, PackedB)> = std::cell::Cell::default();
}

/// [`matmul_bf16`], its row blocks split over rayon's threads when `par`.
fn product(dst: &mut [f32], a: Mat<'_>, b: Mat<'_>, accumulate: bool, par: bool) -> bool {
    if sizes(dst, &a, &b, accumulate).is_none() {
        return false;
    }
    let (mut ap, mut bp) = PACKED.take();
    if ap.pack(a) && bp.pack(b) {
        let done = packed_product(dst, &ap, &bp, accumulate, par);
        PACKED.set((ap, bp));
        return done;
    }
    let round = |v: &[f32]| -> Vec<f32> {
        v.iter()
            .map(|x| f32::from_bits(u32::from(bits(*x)) << 16))
            .collect()
    };
    let (ar, br) = (round(a.data), round(b.data));
    let (a2, b2) = (Mat { data: &ar, ..a }, Mat { data: &br, ..b });
    matmul(dst, a2, b2, accumulate)
}

/// `dst (m x n) = [dst +] a * b` of operands packed beforehand
/// ([`PackedA`], [`PackedB`]; each can serve many products), split over
/// rayon's threads as [`matmul_bf16`] would split it. The same bits as
/// [`matmul_bf16`] of the unpacked operands. False (and `dst` untouched)
/// when the shapes disagree.
#[must_use]
pub(crate) fn matmul_packed(dst: &mut [f32], a: &PackedA, b: &PackedB, accumulate: bool) -> bool {
    let (m, k, n) = (a.m, a.k, b.n);
    let par = threads() > 1 && m * k * n >= PARALLEL_MIN_FLOPS && m > MR;
    packed_product(dst, a, b, accumulate, par)
}

/// [`matmul_packed`], split when `par`.
fn packed_product(dst: &mut [f32], a: &PackedA, b: &PackedB, accumulate: bool, par: bool) -> bool {
    let (m, k, n) = (a.m, a.k, b.n);
    if b.k != k || dst.len() != m * n {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return true;
    }
    let kp = k.div_ceil(2);
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..kp).step_by(KC) {
            let block = Block {
                a,
                b: &b.data,
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

/// One `KC`-pair, `NC`-column block of the product over every row block.
struct Block<'a> {
    a: &'a PackedA,
    /// `b` in panels ([`PackedB`]).
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
        let a_rows: [usize; MR] = std::array::from_fn(|r| (i0 + r).min(self.a.m - 1) * self.a.rs);
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

/// A mask of the first `n` (<= 16) lanes (an AVX-512 `__mmask16`).
#[inline(always)]
pub(crate) fn lanes(n: usize) -> u16 {
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
