//! Whether Redline's fused GPU kernels replace candle's generic ops in the
//! ops that have one (`--fused-kernels`; docs/gpu-kernels.md). A
//! process-wide switch, as PyTorch's `torch.backends` flags are; without
//! effect off a CUDA device or in a build without CUDA.
//!
//! A second switch, [`reduced_precision`], admits the kernels'
//! reduced-precision variants: the tensor-core convolutions (bf16, fp16,
//! TF32), the 16-bit linear layer and CNN block, the bf16 optimizer and the
//! optimizer's skip on the loss scaler's flag. `--fused-kernels on` and
//! `auto` turn them on (`auto` since their first GPU run:
//! `redline_train::graph::AUTO_FUSES_REDUCED`).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Output columns per block of the linear backward's mask + bias-gradient
/// kernel (`cuda/linear.cu`'s `MASK_COLS`).
pub const MASK_COLS: u32 = 32;

/// Threads per block of that kernel: `MASK_COLS` columns times its 16 row
/// groups (`MASK_GROUPS`).
pub const MASK_THREADS: u32 = 512;

/// The kernel's row groups: group `k` sums rows `k, k + MASK_GROUPS, ...` of
/// a column in order, then the groups' sums are added in group order.
pub const MASK_GROUPS: usize = (MASK_THREADS / MASK_COLS) as usize;

static ON: AtomicBool = AtomicBool::new(false);
static REDUCED: AtomicBool = AtomicBool::new(false);
static CONV: AtomicU8 = AtomicU8::new(ConvBackend::Redline as u8);
static RAN_CUDNN: AtomicBool = AtomicBool::new(false);
static RAN_REDLINE: AtomicBool = AtomicBool::new(false);

/// Where the fused path's convolutions run (`--gpu-conv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvBackend {
    /// Redline's implicit-GEMM kernels (`cuda/conv.cu`, `cuda/conv_mma.cu`).
    Redline = 0,
    /// NVIDIA's cuDNN, which must load.
    Cudnn = 1,
    /// cuDNN where it loads in this process, Redline's kernels where not.
    CudnnWhereItLoads = 2,
}

/// Turns the fused GPU kernels on or off for every op that reads the switch.
pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Whether the fused GPU kernels are on.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Admits (or not) the fused kernels' reduced-precision variants, while the
/// kernels are [`enabled`].
pub fn set_reduced_precision(on: bool) {
    REDUCED.store(on, Ordering::Relaxed);
}

/// Whether the fused kernels are on with their reduced-precision variants
/// (16-bit and TF32 tensor-core kernels, the bf16 optimizer, the scaler's
/// skip).
pub fn reduced_precision() -> bool {
    enabled() && REDUCED.load(Ordering::Relaxed)
}

/// Whether a fused GPU kernel takes operands of `dtype` now: f32 while the
/// kernels are [`enabled`]; bf16 and f16 (the tensor-core kernels) with the
/// [`reduced_precision`] variants admitted; nothing else.
pub fn takes(dtype: candle_core::DType) -> bool {
    match dtype {
        candle_core::DType::F32 => enabled(),
        candle_core::DType::BF16 | candle_core::DType::F16 => reduced_precision(),
        _ => false,
    }
}

/// Routes the fused path's convolutions (the plain convolution and the CNN
/// block's) to cuDNN instead of Redline's implicit-GEMM kernels, or back
/// (`--gpu-conv cudnn | redline`): forward, input and weight gradients
/// alike, in every dtype the kernels take. The bias, pooling and ReLU stay
/// Redline's.
pub fn set_conv_cudnn(on: bool) {
    set_conv_backend(if on {
        ConvBackend::Cudnn
    } else {
        ConvBackend::Redline
    });
}

/// Sets where the fused path's convolutions run ([`ConvBackend`]).
pub fn set_conv_backend(backend: ConvBackend) {
    CONV.store(backend as u8, Ordering::Relaxed);
}

/// Where the fused path's convolutions are set to run ([`set_conv_backend`]).
pub fn conv_backend() -> ConvBackend {
    match CONV.load(Ordering::Relaxed) {
        1 => ConvBackend::Cudnn,
        2 => ConvBackend::CudnnWhereItLoads,
        _ => ConvBackend::Redline,
    }
}

/// Notes that a convolution of the fused path ran on cuDNN (`true`) or on
/// Redline's kernels, for [`take_conv_ran`].
pub fn note_conv_ran(cudnn: bool) {
    if cudnn {
        RAN_CUDNN.store(true, Ordering::Relaxed);
    } else {
        RAN_REDLINE.store(true, Ordering::Relaxed);
    }
}

/// Which backends ran the fused path's convolutions since the last call, as
/// (cuDNN, Redline's kernels), and forgets it: a fit takes it at its start
/// and end to say which ran its steps.
pub fn take_conv_ran() -> (bool, bool) {
    (
        RAN_CUDNN.swap(false, Ordering::Relaxed),
        RAN_REDLINE.swap(false, Ordering::Relaxed),
    )
}

/// 32-bit words per sample of a tensor whose first dimension counts samples
/// with `elems` elements of `size` bytes each, stored from element `offset`:
/// `None` unless the samples are whole, aligned words (the kernel's unit).
pub fn sample_words(elems: usize, size: usize, offset: usize) -> Option<u32> {
    let bytes = elems.checked_mul(size)?;
    if !bytes.is_multiple_of(4) || !(offset * size).is_multiple_of(4) {
        return None;
    }
    u32::try_from(bytes / 4).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conv_backend_round_trips_and_the_record_is_taken_once() {
        let before = conv_backend();
        for b in [
            ConvBackend::Cudnn,
            ConvBackend::CudnnWhereItLoads,
            ConvBackend::Redline,
        ] {
            set_conv_backend(b);
            assert_eq!(conv_backend(), b);
        }
        set_conv_cudnn(true);
        assert_eq!(conv_backend(), ConvBackend::Cudnn);
        set_conv_backend(before);
        take_conv_ran();
        note_conv_ran(true);
        assert_eq!(take_conv_ran(), (true, false));
        assert_eq!(take_conv_ran(), (false, false), "taken, so forgotten");
    }

    #[test]
    fn cursor_samples_must_be_whole_aligned_words() {
        // An MNIST image as f32 and as u8, a class index as u32 and i64.
        assert_eq!(sample_words(784, 4, 0), Some(784));
        assert_eq!(sample_words(784, 1, 0), Some(196));
        assert_eq!(sample_words(1, 4, 7), Some(1));
        assert_eq!(sample_words(1, 8, 0), Some(2));
        // A u8 label, three u8 values, a bf16 scalar: not whole words.
        assert_eq!(sample_words(1, 1, 0), None);
        assert_eq!(sample_words(3, 1, 0), None);
        assert_eq!(sample_words(1, 2, 0), None);
        // Whole words, but the tensor starts mid-word.
        assert_eq!(sample_words(4, 1, 2), None);
        assert_eq!(sample_words(2, 2, 1), None);
    }
}
