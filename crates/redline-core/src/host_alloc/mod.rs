//! The host allocator's policy for training: freed memory stays in the
//! process for the next step instead of going back to the kernel.
//!
//! glibc's malloc serves each allocation over its mmap threshold (at most
//! 32 MiB by its own rule) with a fresh `mmap` and unmaps it on free. A
//! training step allocates the same large activations and gradients every
//! step (ResNet-18 at batch 32, 224 px: 100 MiB tensors), so each step
//! faults every page of them in again and the kernel zeroes each page: on
//! the 2-core VM the stem's max-pool backward spent 130 of its 160 ms so
//! (bench/results/2026-11-28-vm-resnet-cpu.md). PyTorch's CUDA caching
//! allocator keeps freed blocks for the same reason.
//!
//! [`reuse_freed_memory`] raises the mmap and trim thresholds to 1 GiB
//! (glibc only; a no-op elsewhere). The process's resident memory then
//! stays at its peak rather than falling between steps.
//! `REDLINE_HOST_ALLOC=system` leaves glibc's defaults (for comparisons).
//!
//! That is not enough for blocks allocated on other threads: glibc gives
//! each thread an arena of heaps of at most 64 MiB and unmaps a heap as
//! soon as it is wholly free, so the loader's 38 MiB batch (64 x 3 x 224 x
//! 224 fp32), allocated on its prefetch thread, was faulted in page by page
//! every step (a fifth of the patch row's CPU time). [`HostAlloc`], the
//! binaries' global allocator, serves every block of [`BIG`] bytes or
//! more from its own mapping, with transparent huge pages, and keeps it
//! on free for the next block of the same size.

/// Allocations at or above this many bytes still get their own mapping.
pub const THRESHOLD: usize = 1 << 30;

/// What [`reuse_freed_memory`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The thresholds were raised.
    Reuse,
    /// `REDLINE_HOST_ALLOC=system`: glibc's defaults kept.
    System,
    /// Not glibc, or glibc refused the setting: the defaults stand.
    Unsupported,
}

/// Keeps freed host memory in the process for reuse (see the module docs).
/// Call once, early in `main`.
pub fn reuse_freed_memory() -> Policy {
    if std::env::var("REDLINE_HOST_ALLOC").is_ok_and(|v| v == "system") {
        blocks::keep_freed_blocks(false);
        return Policy::System;
    }
    set_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> Policy {
    let Ok(t) = libc::c_int::try_from(THRESHOLD) else {
        return Policy::Unsupported;
    };
    // SAFETY: mallopt only sets allocator parameters; it is called with
    // valid option constants and returns 0 when it refuses a value.
    let ok = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, t) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, t) == 1
    };
    if ok {
        Policy::Reuse
    } else {
        Policy::Unsupported
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> Policy {
    Policy::Unsupported
}

mod blocks;
pub use blocks::{release_cached, HostAlloc, BIG};
