//! Access to the f32 slices behind candle's CPU storage, for fused kernels.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, Layout, Result, Shape, Tensor};

/// The contiguous f32 elements a layout addresses, or an error naming `op`.
pub fn f32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("{op}: expected f32 storage, got {:?}", s.dtype())
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("{op}: operand is not contiguous ({:?})", l.shape()),
    }
}

/// `n` zeros (`T::default()`), written by the compute threads when the
/// buffer is large: `vec![0; n]` zeroes reused heap memory on the calling
/// thread alone (glibc's calloc), and a ResNet activation of 25 MB or its
/// gradient took 2-3 ms so while the other cores waited.
pub fn zeros_par<T: Copy + Default + Send + Sync>(n: usize) -> Vec<T> {
    use rayon::prelude::*;
    /// Elements a thread zeroes at a time; smaller buffers are zeroed here.
    const PIECE: usize = 1 << 18;
    if n <= PIECE {
        return vec![T::default(); n];
    }
    let mut v = Vec::with_capacity(n);
    v.spare_capacity_mut()[..n]
        .par_chunks_mut(PIECE)
        .for_each(|c| c.fill(std::mem::MaybeUninit::new(T::default())));
    // SAFETY: the capacity holds `n` elements and all `n` were initialised above.
    unsafe { v.set_len(n) };
    v
}

/// `rows` copies of `row`, one after another, written by the compute
/// threads when the buffer is large (as [`zeros_par`]).
pub fn rows_par<T: Copy + Send + Sync>(row: &[T], rows: usize) -> Vec<T> {
    use rayon::prelude::*;
    // Rows a thread writes at a time: about 256 KiB of f32.
    let per = (1usize << 16).div_ceil(row.len().max(1));
    let n = row.len() * rows;
    if rows <= per {
        return row.repeat(rows);
    }
    let mut v = Vec::with_capacity(n);
    v.spare_capacity_mut()[..n]
        .par_chunks_mut(per * row.len())
        .for_each(|c| {
            for r in c.chunks_exact_mut(row.len()) {
                for (d, s) in r.iter_mut().zip(row) {
                    *d = std::mem::MaybeUninit::new(*s);
                }
            }
        });
    // SAFETY: the capacity holds `n` elements, and the chunks (whole rows,
    // as `n` is a multiple of the row's length) initialised all of them.
    unsafe { v.set_len(n) };
    v
}

/// One channel's planes of a new `(B, C, H, W)` buffer (f32 unless
/// named), yielded in sample order, each zero-filled as it is taken (by
/// the thread that is about to write it, so in cache: no pass of its own
/// over memory). See [`by_channel`].
pub struct Planes<'a, T = f32> {
    rest: std::vec::IntoIter<&'a mut [std::mem::MaybeUninit<T>]>,
}

impl<'a, T: Copy + Default> Iterator for Planes<'a, T> {
    type Item = &'a mut [T];

    fn next(&mut self) -> Option<&'a mut [T]> {
        let p = self.rest.next()?;
        p.fill(std::mem::MaybeUninit::new(T::default()));
        // SAFETY: every element was initialised just above, and
        // `MaybeUninit<T>` has `T`'s layout.
        Some(unsafe { &mut *(std::ptr::from_mut(p) as *mut [T]) })
    }
}

/// A new `(b, c, hw)` f32 buffer written channel by channel on the compute
/// threads: `f(ch, planes)` gets channel `ch`'s `b` planes (plane `i` of
/// the buffer is channel `i % c`'s) and returns a value; the values come
/// back in channel order. Planes `f` leaves untaken are zeros. A batch norm
/// reads a channel's input once from memory this way, its second and third
/// passes hitting the cache, and writes its output without a zero fill.
pub fn by_channel<R: Send>(
    dims: (usize, usize, usize),
    f: impl Fn(usize, &mut Planes<'_>) -> R + Sync,
) -> (Vec<f32>, Vec<R>) {
    by_channel_of(dims, f)
}

/// [`by_channel`] for a buffer of any element type (bf16 for `bf16-true`'s
/// batch norm).
pub fn by_channel_of<T: Copy + Default + Send + Sync, R: Send>(
    dims: (usize, usize, usize),
    f: impl Fn(usize, &mut Planes<'_, T>) -> R + Sync,
) -> (Vec<T>, Vec<R>) {
    by_channel_blocks_of(dims, 1, |chans, planes| f(chans.start, planes))
}

/// [`by_channel_of`] by blocks of `per` channels (the last one shorter):
/// `f(channels, segments)` gets, in sample order, each sample's values of
/// those channels, one contiguous segment of `channels.len() * hw`, and the
/// values come back in block order. On small maps (2x2: a plane is 4
/// values) one loop over a block's segment replaces a loop per plane.
pub fn by_channel_blocks_of<T: Copy + Default + Send + Sync, R: Send>(
    (b, c, hw): (usize, usize, usize),
    per: usize,
    f: impl Fn(std::ops::Range<usize>, &mut Planes<'_, T>) -> R + Sync,
) -> (Vec<T>, Vec<R>) {
    use rayon::prelude::*;
    let n = b * c * hw;
    let per = per.max(1);
    let blocks = c.div_ceil(per);
    let mut v: Vec<T> = Vec::with_capacity(n);
    let mut groups: Vec<Vec<&mut [std::mem::MaybeUninit<T>]>> =
        (0..blocks).map(|_| Vec::with_capacity(b)).collect();
    if hw > 0 && c > 0 {
        for sample in v.spare_capacity_mut()[..n].chunks_mut(c * hw) {
            for (group, seg) in groups.iter_mut().zip(sample.chunks_mut(per * hw)) {
                group.push(seg);
            }
        }
    }
    let out = groups
        .into_par_iter()
        .enumerate()
        .map(|(k, segs)| {
            let mut segs = Planes {
                rest: segs.into_iter(),
            };
            let r = f(k * per..((k + 1) * per).min(c), &mut segs);
            segs.for_each(drop);
            r
        })
        .collect();
    // SAFETY: the capacity holds `n` elements, and every segment (together
    // all `n`) was initialised by `Planes::next`, by `f` or the drain after.
    unsafe { v.set_len(n) };
    (v, out)
}

/// Runs `f` compiled for the machine's widest vector instructions (pulp's
/// dispatch: AVX-512 or AVX2 where the CPU has them), so that the plain
/// loops of a kernel vectorise with them rather than with the baseline's
/// SSE2. `f` must be an `#[inline(always)]` closure, and its helpers
/// `#[inline(always)]` functions, to be compiled so (a closure left
/// uninlined runs the baseline's code).
#[inline(always)]
pub fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    struct Run<F>(F);
    impl<R, F: FnOnce() -> R> pulp::WithSimd for Run<F> {
        type Output = R;

        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _simd: S) -> R {
            (self.0)()
        }
    }
    pulp::Arch::new().dispatch(Run(f))
}

/// Leaves `v` in `slot` for the op's backward (or for whoever takes it next).
pub fn keep<T>(slot: &std::sync::Mutex<Option<T>>, v: T) {
    *slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(v);
}

/// What an op's forward left in `slot` for its backward (a clone), or an
/// error naming `op` when the backward comes first.
pub fn saved<T: Clone>(slot: &std::sync::Mutex<Option<T>>, op: &str) -> Result<T> {
    let held = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    match held {
        Some(v) => Ok(v),
        None => bail!("{op}: backward before forward"),
    }
}

/// Gradients of a three-input op `(x, w, b)`, in `CustomOp3::bwd` order.
pub type Grads3 = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// Splits a fused backward's flat `[dW | db | dx]` buffer into views shaped as
/// `w`, `(w.dims()[0])` and `x`; dx is absent when the input needs no gradient.
/// With `buffered` (dW and db went to the parameters' gradient buffers), the
/// buffer holds dx alone and candle gets no parameter gradients.
pub fn unpack_grads(
    flat: &Tensor,
    w: &Shape,
    x: &Shape,
    input_grad: bool,
    buffered: bool,
) -> Result<Grads3> {
    if buffered {
        let dx = input_grad.then(|| flat.reshape(x)).transpose()?;
        return Ok((dx, None, None));
    }
    let (nw, nb) = (w.elem_count(), w.dims().first().copied().unwrap_or(0));
    let dw = flat.narrow(0, 0, nw)?.reshape(w)?;
    let db = flat.narrow(0, nw, nb)?;
    let dx = if input_grad {
        Some(flat.narrow(0, nw + nb, x.elem_count())?.reshape(x)?)
    } else {
        None
    };
    Ok((dx, Some(dw), Some(db)))
}

/// The contiguous u32 elements a layout addresses, or an error naming `op`.
pub fn u32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [u32]> {
    let CpuStorage::U32(v) = s else {
        bail!("{op}: expected u32 storage, got {:?}", s.dtype())
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("{op}: operand is not contiguous ({:?})", l.shape()),
    }
}

/// The contiguous bf16 elements a layout addresses, or an error naming `op`.
pub(crate) fn bf16s<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [half::bf16]> {
    let CpuStorage::BF16(v) = s else {
        bail!("{op}: expected bf16 storage, got {:?}", s.dtype())
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("{op}: operand is not contiguous ({:?})", l.shape()),
    }
}

/// Mutable contiguous f32 elements of an in-place destination.
pub fn f32s_mut<'a>(s: &'a mut CpuStorage, l: &Layout, op: &str) -> Result<&'a mut [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("{op}: expected f32 storage")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&mut v[a..b]),
        None => bail!("{op}: destination is not contiguous ({:?})", l.shape()),
    }
}

/// Whether the fused CPU kernels cover tensors on this device with this dtype.
pub fn fused_cpu(t: &candle_core::Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == candle_core::DType::F32
}

/// Whether `t` is a 16-bit CPU tensor (`bf16-true`'s activations and
/// parameters), which the fused f32 kernels take between casts.
pub fn half_cpu(t: &candle_core::Tensor) -> bool {
    t.device().is_cpu()
        && matches!(
            t.dtype(),
            candle_core::DType::BF16 | candle_core::DType::F16
        )
}

/// `f` of `x` widened to f32 (exact), its output rounded back to `x`'s
/// dtype once; the gradient passes back through both casts. For ops whose
/// 16-bit CPU form is candle's generic one: PyTorch's CPU kernels compute
/// 16-bit pooling in float too.
pub fn widened(
    x: &candle_core::Tensor,
    f: impl FnOnce(&candle_core::Tensor) -> crate::Result<candle_core::Tensor>,
) -> crate::Result<candle_core::Tensor> {
    let y = f(&crate::cast16::to_dtype(x, candle_core::DType::F32)?)?;
    crate::cast16::to_dtype(&y, x.dtype())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// Zeros of every length around the threaded size, after the heap held
    /// non-zero buffers of those sizes (reused memory must still read 0).
    #[test]
    fn parallel_zeros_are_zeros_at_every_size() {
        for n in [0, 1, (1 << 18) - 1, 1 << 18, (1 << 18) + 1, 3 << 19] {
            drop(vec![7f32; n]);
            let z = zeros_par::<f32>(n);
            assert_eq!(z.len(), n);
            assert!(z.iter().all(|&v| v.to_bits() == 0), "f32, {n}");
            drop(vec![9u32; n]);
            let z = zeros_par::<u32>(n);
            assert!(z.len() == n && z.iter().all(|&v| v == 0), "u32, {n}");
        }
    }

    /// Each channel gets its own planes in sample order, whatever was in
    /// the reused memory before; a plane left untaken is zeros.
    #[test]
    fn by_channel_hands_each_channel_its_planes() {
        let (b, c, hw) = (3, 4, 5);
        drop(vec![7f32; b * c * hw]);
        let (v, got) = by_channel((b, c, hw), |ch, planes| {
            // Channel 2 writes its first plane only.
            let take = if ch == 2 { 1 } else { b };
            for (s, p) in planes.take(take).enumerate() {
                assert!(p.iter().all(|&x| x == 0.0), "handed zeroed");
                p.fill((ch * 10 + s) as f32);
            }
            ch * 100
        });
        assert_eq!(got, vec![0, 100, 200, 300]);
        for s in 0..b {
            for ch in 0..c {
                let want = if ch == 2 && s > 0 {
                    0.0
                } else {
                    (ch * 10 + s) as f32
                };
                let plane = &v[(s * c + ch) * hw..][..hw];
                assert!(plane.iter().all(|&x| x == want), "sample {s} channel {ch}");
            }
        }
        let (empty, per) = by_channel((2, 3, 0), |ch, planes| (ch, planes.count()));
        assert!(empty.is_empty());
        assert_eq!(per, vec![(0, 0), (1, 0), (2, 0)]);
    }
}
