//! Access to the f32 slices behind candle's CPU storage, for fused kernels.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, Layout, Result};

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
