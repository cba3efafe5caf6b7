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

use std::sync::atomic::{AtomicBool, Ordering};

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
static CUDNN: AtomicBool = AtomicBool::new(false);

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
/// block's) to cuDNN instead of Redline's implicit-GEMM kernels
/// (`--gpu-conv cudnn`): forward, input and weight gradients alike, in every
/// dtype the kernels take. The bias, pooling and ReLU stay Redline's.
pub fn set_conv_cudnn(on: bool) {
    CUDNN.store(on, Ordering::Relaxed);
}

/// Whether the fused path's convolutions run on cuDNN ([`set_conv_cudnn`]).
pub fn conv_cudnn() -> bool {
    CUDNN.load(Ordering::Relaxed)
}
