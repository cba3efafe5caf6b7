//! Whether Redline's fused GPU kernels replace candle's generic ops in the
//! ops that have one (`--fused-kernels`; docs/gpu-kernels.md). A
//! process-wide switch, as PyTorch's `torch.backends` flags are; off by
//! default, and without effect off a CUDA device or in a build without CUDA.

use std::sync::atomic::{AtomicBool, Ordering};

static ON: AtomicBool = AtomicBool::new(false);

/// Turns the fused GPU kernels on or off for every op that reads the switch.
pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Whether the fused GPU kernels are on.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}
