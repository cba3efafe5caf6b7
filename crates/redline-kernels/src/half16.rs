//! 16-bit storage for the CPU kernels of `bf16-mixed` and `16-mixed`: a
//! tensor of bf16 or fp16 widened to f32 for a kernel's arithmetic, f32
//! rounded to the 16-bit type (round to nearest even, as candle's
//! `to_dtype` and PyTorch's casts; fp16 overflows to inf above 65504), and
//! f32 results stored as 16-bit tensors. The widening is exact, so a kernel
//! fed 16-bit operands computes a 16-bit product with fp32 accumulation.

use std::borrow::Cow;
use std::mem::MaybeUninit;

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, Layout, Result};
use half::{bf16, f16, slice::HalfFloatSliceExt};

/// The contiguous elements a layout addresses as f32: borrowed for f32
/// storage, widened (exactly) for bf16 and fp16.
pub(crate) fn widen<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<Cow<'a, [f32]>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("{op}: operand is not contiguous ({:?})", l.shape())
    };
    Ok(match s {
        CpuStorage::F32(v) => Cow::Borrowed(&v[a..b]),
        CpuStorage::BF16(v) => Cow::Owned(written(&v[a..b], |src, out| {
            pulp::Arch::new().dispatch(Bf16Widen(src, out))
        })),
        CpuStorage::F16(v) => {
            let mut out = vec![0f32; b - a];
            f16_to_f32(&v[a..b], &mut out);
            Cow::Owned(out)
        }
        other => bail!(
            "{op}: expected f32, bf16 or f16 storage, got {:?}",
            other.dtype()
        ),
    })
}

/// `x` rounded to bf16 and widened: round to nearest even on the bits (a
/// loop the compiler vectorizes), NaN kept a NaN; `half`'s `from_f32` bit
/// for bit (the test checks against candle's cast).
#[inline(always)]
pub(crate) fn bf16_round(x: f32) -> f32 {
    let b = x.to_bits();
    let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    if x.is_nan() {
        f32::from_bits((b | 0x0040_0000) & 0xFFFF_0000)
    } else {
        f32::from_bits(r)
    }
}

/// `x` rounded to bf16 (to nearest even, a NaN kept a NaN) and stored.
#[inline(always)]
pub(crate) fn bf16_store(x: f32) -> bf16 {
    bf16::from_bits((bf16_round(x).to_bits() >> 16) as u16)
}

/// `x` widened to f32: the bits shifted up (exact), a NaN quieted, as
/// `half`'s `to_f32`.
#[inline(always)]
pub(crate) fn bf16_widen(x: bf16) -> f32 {
    let b = x.to_bits();
    let quiet = if b & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
    f32::from_bits(u32::from(b | quiet) << 16)
}

/// Rounds `v` to `dtype` in place, staying f32 (a no-op for f32).
pub(crate) fn round_in_place(v: &mut [f32], dtype: DType) {
    match dtype {
        DType::BF16 => pulp::Arch::new().dispatch(Bf16Round(v)),
        DType::F16 => round_f16(v),
        _ => {}
    }
}

// The bf16 loops compiled for the best instruction set present (`pulp`):
// the build targets baseline x86-64, where they vectorize four lanes wide
// (SSE2); AVX-512 takes sixteen. They were a twentieth of a bf16-mixed CNN
// step on the 2-core VM (perf), mostly rounding each conv block's output.

/// [`bf16_round`] over a slice, in place.
struct Bf16Round<'a>(&'a mut [f32]);

impl pulp::WithSimd for Bf16Round<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        self.0.iter_mut().for_each(|x| *x = bf16_round(*x));
    }
}

/// Values a thread converts at a time.
const PIECE: usize = 1 << 15;

/// A new vector of one value per value of `src`, written by `fill` (a loop
/// over a piece of `src` and as many slots, returning how many it wrote;
/// slots it leaves are `T::default()`), with no zero fill first: the bf16
/// CNN step spent about 3% of its time (perf) zeroing buffers that the
/// widening and storing loops then overwrote. A large `src` is split
/// across the compute threads (a ResNet activation at 224 px is 25-100
/// MB, cast on each side of every layer in 16-bit precisions).
fn written<S: Sync, T: Send + Default>(
    src: &[S],
    fill: impl Fn(&[S], &mut [MaybeUninit<T>]) -> usize + Sync,
) -> Vec<T> {
    use rayon::prelude::*;
    let n = src.len();
    let mut v = Vec::with_capacity(n);
    let piece = |(d, s): (&mut [MaybeUninit<T>], &[S])| {
        let done = fill(s, d).min(d.len());
        d[done..].fill_with(|| MaybeUninit::new(T::default()));
    };
    let out = &mut v.spare_capacity_mut()[..n];
    if n < 2 * PIECE {
        piece((out, src));
    } else {
        out.par_chunks_mut(PIECE)
            .zip(src.par_chunks(PIECE))
            .for_each(piece);
    }
    // SAFETY: the capacity holds `n` values, and every one of them was
    // written, by `fill` or by the fill after it.
    unsafe { v.set_len(n) };
    v
}

/// f32 values rounded to bf16 and kept in f32 ([`bf16_round`]); returns
/// how many it wrote.
struct Bf16RoundInto<'a>(&'a [f32], &'a mut [MaybeUninit<f32>]);

impl pulp::WithSimd for Bf16RoundInto<'_> {
    type Output = usize;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> usize {
        let n = self.0.len().min(self.1.len());
        for (d, x) in self.1[..n].iter_mut().zip(&self.0[..n]) {
            d.write(bf16_round(*x));
        }
        n
    }
}

/// f32 values rounded into bf16 storage ([`bf16_round`]'s bits); returns
/// how many it wrote.
struct Bf16Store<'a>(&'a [f32], &'a mut [MaybeUninit<bf16>]);

impl pulp::WithSimd for Bf16Store<'_> {
    type Output = usize;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> usize {
        let n = self.0.len().min(self.1.len());
        for (d, x) in self.1[..n].iter_mut().zip(&self.0[..n]) {
            d.write(bf16_store(*x));
        }
        n
    }
}

/// bf16 values widened to f32: the bits shifted up (exact), a NaN quieted,
/// as `half`'s `to_f32`; returns how many it wrote.
struct Bf16Widen<'a>(&'a [bf16], &'a mut [MaybeUninit<f32>]);

impl pulp::WithSimd for Bf16Widen<'_> {
    type Output = usize;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> usize {
        let n = self.0.len().min(self.1.len());
        for (d, x) in self.1[..n].iter_mut().zip(&self.0[..n]) {
            d.write(bf16_widen(*x));
        }
        n
    }
}

/// How a kernel's activations are stored: f32, read in place and written
/// directly, or bf16, widened into scratch on the way in and rounded to
/// nearest even on the way out, a sample at a time while it is in cache
/// (a cast op on each side of a convolution wrote and read a whole f32
/// copy of every activation and gradient: 7% of a bf16-true ResNet-18
/// step at 224 px).
pub(crate) trait Act: Copy + Send + Sync {
    /// The value as f32: itself, or widened ([`bf16_widen`]), for the loops
    /// that read either storage value by value.
    fn widen(self) -> f32;

    /// `v` stored: itself, or rounded to nearest even ([`bf16_store`]).
    fn narrow(v: f32) -> Self;

    /// `src` widened into `dst` (equal lengths): a copy for f32.
    fn widen_into(src: &[Self], dst: &mut [f32]);

    /// `src` as f32 values: itself, or widened into `scratch`.
    fn read<'a>(src: &'a [Self], scratch: &'a mut Vec<f32>) -> &'a [f32];

    /// `dst` written by `fill` as f32 values: directly, or filled in
    /// `scratch` and rounded into `dst`. `fill` writes every value (what it
    /// is handed holds stale ones: no zero fill per sample).
    fn write(dst: &mut [Self], scratch: &mut Vec<f32>, fill: impl FnOnce(&mut [f32]));
}

impl Act for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    #[inline(always)]
    fn narrow(v: f32) -> f32 {
        v
    }

    fn widen_into(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    fn read<'a>(src: &'a [f32], _scratch: &'a mut Vec<f32>) -> &'a [f32] {
        src
    }

    fn write(dst: &mut [f32], _scratch: &mut Vec<f32>, fill: impl FnOnce(&mut [f32])) {
        fill(dst)
    }
}

impl Act for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_widen(self)
    }

    #[inline(always)]
    fn narrow(v: f32) -> bf16 {
        bf16_store(v)
    }

    fn widen_into(src: &[bf16], dst: &mut [f32]) {
        pulp::Arch::new().dispatch(WidenInto(src, dst));
    }

    fn read<'a>(src: &'a [bf16], scratch: &'a mut Vec<f32>) -> &'a [f32] {
        // Every value is overwritten: only a length change writes zeros.
        scratch.resize(src.len(), 0.0);
        Self::widen_into(src, scratch);
        scratch
    }

    fn write(dst: &mut [bf16], scratch: &mut Vec<f32>, fill: impl FnOnce(&mut [f32])) {
        scratch.resize(dst.len(), 0.0);
        fill(scratch);
        pulp::Arch::new().dispatch(StoreInto(scratch, dst));
    }
}

/// [`bf16_widen`] of each value of `.0` into `.1`.
struct WidenInto<'a>(&'a [bf16], &'a mut [f32]);

impl pulp::WithSimd for WidenInto<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        for (d, x) in self.1.iter_mut().zip(self.0) {
            *d = bf16_widen(*x);
        }
    }
}

/// [`bf16_store`] of each value of `.0` into `.1`.
struct StoreInto<'a>(&'a [f32], &'a mut [bf16]);

impl pulp::WithSimd for StoreInto<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        for (d, x) in self.1.iter_mut().zip(self.0) {
            *d = bf16_store(*x);
        }
    }
}

/// Whether this CPU converts between f32 and f16 sixteen at a time
/// (AVX-512F's `vcvtps2ph` and `vcvtph2ps`), checked once.
#[cfg(target_arch = "x86_64")]
fn avx512_f16() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
}

/// `v` rounded to fp16 (nearest even; inf above 65504) and widened back, in
/// place: one pass of AVX-512F conversions where the CPU has them (the
/// 16-mixed CPU step spent about a seventh of its time in `half`'s
/// eight-wide slice conversions, two passes through a buffer), else
/// `half`'s conversions.
fn round_f16(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512_f16() {
        // SAFETY: the CPU has AVX-512F (checked above).
        unsafe { avx512::round(v) };
        return;
    }
    let mut tmp = [f16::ZERO; 1024];
    for chunk in v.chunks_mut(1024) {
        let t = &mut tmp[..chunk.len()];
        t.convert_from_f32_slice(chunk);
        t.convert_to_f32_slice(chunk);
    }
}

/// `src` widened to f32 into `dst` (of the same length; exact).
fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512_f16() {
        // SAFETY: the CPU has AVX-512F (checked above).
        unsafe { avx512::widen(src, dst) };
        return;
    }
    src.convert_to_f32_slice(dst);
}

/// `src` rounded to fp16 into `dst` (of the same length).
fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    #[cfg(target_arch = "x86_64")]
    if avx512_f16() {
        // SAFETY: the CPU has AVX-512F (checked above).
        unsafe { avx512::narrow(src, dst) };
        return;
    }
    dst.convert_from_f32_slice(src);
}

/// The f16 conversions sixteen lanes at a time; the last few values go
/// through `half` one by one (the same rounding: IEEE nearest even).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use half::f16;
    use std::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_storeu_si256, _mm512_cvtph_ps, _mm512_cvtps_ph,
        _mm512_loadu_ps, _mm512_storeu_ps, _MM_FROUND_NO_EXC, _MM_FROUND_TO_NEAREST_INT,
    };

    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn round(v: &mut [f32]) {
        let mut chunks = v.chunks_exact_mut(16);
        for c in &mut chunks {
            // SAFETY: `c` holds 16 f32 (unaligned loads and stores).
            unsafe {
                let h = _mm512_cvtps_ph::<NEAREST>(_mm512_loadu_ps(c.as_ptr()));
                _mm512_storeu_ps(c.as_mut_ptr(), _mm512_cvtph_ps(h));
            }
        }
        for x in chunks.into_remainder() {
            *x = f16::from_f32(*x).to_f32();
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let full = n / 16 * 16;
        for i in (0..full).step_by(16) {
            // SAFETY: i + 16 <= n for both slices; f16 is 2 bytes (repr(transparent) u16).
            unsafe {
                let h = _mm256_loadu_si256(src.as_ptr().add(i).cast::<__m256i>());
                _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
        }
        for i in full..n {
            dst[i] = src[i].to_f32();
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        let full = n / 16 * 16;
        for i in (0..full).step_by(16) {
            // SAFETY: as in `widen`.
            unsafe {
                let h = _mm512_cvtps_ph::<NEAREST>(_mm512_loadu_ps(src.as_ptr().add(i)));
                _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast::<__m256i>(), h);
            }
        }
        for i in full..n {
            dst[i] = f16::from_f32(src[i]);
        }
    }
}

/// `v` rounded to bf16 values (to nearest even) and kept in f32, in one
/// pass (each value read, rounded and written once), split across the
/// threads when long.
pub(crate) fn bf16_rounded(v: &[f32]) -> Vec<f32> {
    written(v, |src, out| {
        pulp::Arch::new().dispatch(Bf16RoundInto(src, out))
    })
}

/// An operand as f32 values already rounded to `dtype`: widened when it
/// is stored in 16 bits (already representable), rounded when it is f32.
pub(crate) fn rounded<'a>(
    s: &'a CpuStorage,
    l: &Layout,
    dtype: DType,
    op: &str,
) -> Result<Cow<'a, [f32]>> {
    let v = widen(s, l, op)?;
    if s.dtype() != DType::F32 || dtype == DType::F32 {
        return Ok(v);
    }
    if dtype == DType::BF16 {
        return Ok(Cow::Owned(bf16_rounded(&v)));
    }
    let mut owned = v.into_owned();
    round_in_place(&mut owned, dtype);
    Ok(Cow::Owned(owned))
}

/// f32 values stored as `dtype` (rounded; f32 kept as is).
pub(crate) fn store(v: Vec<f32>, dtype: DType) -> Result<CpuStorage> {
    match dtype {
        DType::F32 => Ok(CpuStorage::F32(v)),
        _ => narrow(&v, dtype),
    }
}

/// f32 values stored as a 16-bit `dtype`, rounded (f32: copied).
pub(crate) fn narrow(v: &[f32], dtype: DType) -> Result<CpuStorage> {
    Ok(match dtype {
        DType::F32 => CpuStorage::F32(v.to_vec()),
        // The rounding on the bits, a loop that vectorizes (`half`'s slice
        // conversion for bf16 does not).
        DType::BF16 => CpuStorage::BF16(written(v, |src, out| {
            pulp::Arch::new().dispatch(Bf16Store(src, out))
        })),
        DType::F16 => {
            let mut out = vec![f16::ZERO; v.len()];
            f32_to_f16(v, &mut out);
            CpuStorage::F16(out)
        }
        other => bail!("16-bit store: {other:?} is not f32, bf16 or f16"),
    })
}

/// f32 values as a CPU tensor of `dtype` and `shape` (rounded as [`store`]).
pub(crate) fn tensor(
    v: Vec<f32>,
    shape: impl Into<candle_core::Shape>,
    dtype: DType,
) -> Result<candle_core::Tensor> {
    let cpu = &candle_core::Device::Cpu;
    match store(v, dtype)? {
        CpuStorage::BF16(v) => candle_core::Tensor::from_vec(v, shape, cpu),
        CpuStorage::F16(v) => candle_core::Tensor::from_vec(v, shape, cpu),
        CpuStorage::F32(v) => candle_core::Tensor::from_vec(v, shape, cpu),
        other => bail!("16-bit tensor: {:?}", other.dtype()),
    }
}

/// A CPU tensor's values (f32, bf16 or f16) rounded to `round_to` and stored
/// as `dtype`: one vectorized pass over the storage. candle's casts of
/// tensors of 64K values and more split over its own spinning thread pool,
/// which on a small machine waited for a descheduled worker (a tenth of a
/// bf16 CNN step, measured with perf).
pub(crate) fn cast(
    t: &candle_core::Tensor,
    round_to: DType,
    dtype: DType,
) -> Result<candle_core::Tensor> {
    let t = t.contiguous()?;
    let v = {
        let (s, l) = t.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*s else {
            bail!("16-bit cast: the tensor is not on the CPU")
        };
        rounded(cpu, l, round_to, "16-bit cast")?.into_owned()
    };
    tensor(v, t.shape(), dtype)
}

/// A tensor's values as f32 bits, for bit-for-bit comparisons in tests.
#[cfg(test)]
pub(crate) fn bits(t: &candle_core::Tensor) -> Result<Vec<u32>> {
    Ok(t.to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?
        .iter()
        .map(|v| v.to_bits())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// The f16 conversions (AVX-512F where the CPU has it, as here) against
    /// `half`'s one value at a time: every f16 widened, and about a million
    /// f32 bit patterns (every sign, exponent and tie) rounded and narrowed,
    /// bit for bit but for NaN payloads; lengths that leave a tail.
    #[test]
    fn f16_conversions_are_halfs_bit_for_bit() {
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut wide = vec![0f32; all.len() - 3];
        f16_to_f32(&all[..wide.len()], &mut wide);
        for (h, w) in all.iter().zip(&wide) {
            assert!(same(*w, h.to_f32()), "widen {:#06x}: {w}", h.to_bits());
        }
        let vals: Vec<f32> = (0..1_000_003u64)
            .map(|i| f32::from_bits((i * 4295) as u32))
            .chain([65504.0, 65519.99, 65520.0, 5.96e-8, 2.98e-8, 2.99e-8, -0.0])
            .collect();
        let mut round = vals.clone();
        round_f16(&mut round);
        let mut narrow = vec![f16::ZERO; vals.len()];
        f32_to_f16(&vals, &mut narrow);
        for ((v, r), n) in vals.iter().zip(&round).zip(&narrow) {
            let want = f16::from_f32(*v);
            assert!(
                same(*r, want.to_f32()),
                "round {v:e} ({:#010x}): {r:e}",
                v.to_bits()
            );
            assert!(
                n.to_bits() == want.to_bits() || (n.is_nan() && want.is_nan()),
                "narrow {v:e}: {:#06x} against {:#06x}",
                n.to_bits(),
                want.to_bits()
            );
        }
    }

    /// The bf16 loops (compiled for AVX-512 here) against `half`'s one value
    /// at a time, bit for bit, NaN payloads included: every bf16 widened,
    /// about a million f32 bit patterns rounded and stored; lengths that
    /// leave a tail.
    #[test]
    fn bf16_loops_are_halfs_bit_for_bit() -> Result<()> {
        let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        let storage = CpuStorage::BF16(all.clone());
        let wide = widen(&storage, &Layout::contiguous(all.len()), "t")?;
        for (h, w) in all.iter().zip(wide.iter()) {
            assert_eq!(
                w.to_bits(),
                h.to_f32().to_bits(),
                "widen {:#06x}",
                h.to_bits()
            );
        }
        let vals: Vec<f32> = (0..1_000_003u64)
            .map(|i| f32::from_bits((i * 4295) as u32))
            .chain([
                f32::NAN,
                -f32::NAN,
                f32::from_bits(0x7F80_0001),
                -0.0,
                1e-40,
            ])
            .collect();
        let mut round = vals.clone();
        round_in_place(&mut round, DType::BF16);
        let CpuStorage::BF16(stored) = store(vals.clone(), DType::BF16)? else {
            panic!("not stored as bf16")
        };
        for ((v, r), st) in vals.iter().zip(&round).zip(&stored) {
            let want = bf16::from_f32(*v);
            assert_eq!(
                r.to_bits(),
                want.to_f32().to_bits(),
                "round {:#010x}",
                v.to_bits()
            );
            assert_eq!(st.to_bits(), want.to_bits(), "store {:#010x}", v.to_bits());
        }
        Ok(())
    }

    /// Rounding and storing agree with candle's own casts, bit for bit,
    /// fp16's overflow to inf and subnormals included.
    #[test]
    fn rounding_is_candles_cast() -> Result<()> {
        let vals: Vec<f32> = (0..2000)
            .map(|i| ((i as f32) * 0.37).sin() * 10f32.powi(i % 13 - 6))
            .chain([
                70000.0,
                -65520.0,
                65519.0,
                1e-8,
                f32::INFINITY,
                f32::NAN,
                -f32::NAN,
                3.4e38,
            ])
            .collect();
        let t = Tensor::new(vals.as_slice(), &Device::Cpu)?;
        for dtype in [DType::BF16, DType::F16] {
            let want: Vec<u32> = t
                .to_dtype(dtype)?
                .to_dtype(DType::F32)?
                .to_vec1::<f32>()?
                .iter()
                .map(|x| x.to_bits())
                .collect();
            let mut got = vals.clone();
            round_in_place(&mut got, dtype);
            let nan_safe = |v: &[f32]| -> Vec<u32> {
                v.iter()
                    .map(|x| if x.is_nan() { 0x7FC0_0000 } else { x.to_bits() })
                    .collect()
            };
            assert_eq!(
                nan_safe(&got),
                nan_safe(&want.iter().map(|b| f32::from_bits(*b)).collect::<Vec<_>>()),
                "{dtype:?}"
            );
            assert!(got.iter().zip(&vals).all(|(g, v)| g.is_nan() == v.is_nan()));
            let back: Vec<f32> = match store(vals.clone(), dtype)? {
                CpuStorage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
                CpuStorage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
                other => panic!("stored as {:?}", other.dtype()),
            };
            assert_eq!(back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
            let stored = t.to_dtype(dtype)?;
            let (s, l) = stored.storage_and_layout();
            let candle_core::Storage::Cpu(cpu) = &*s else {
                panic!("not a CPU tensor")
            };
            let wide = widen(cpu, l, "test")?;
            assert_eq!(wide.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
            let same = rounded(cpu, l, dtype, "test")?;
            assert!(matches!(same, Cow::Owned(_)) && same.len() == want.len());
        }
        Ok(())
    }
}
