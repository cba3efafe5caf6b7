//! A step's scalar bookkeeping in one launch each (`cuda/tally.cu`), where
//! candle's ops take an allocation, a kernel, a copy back into the variable
//! and a free per value: in a captured step, four graph nodes become one.
//! - [`step_sums`]: the running sums of a step, `sum += value * scale`,
//!   with the bits of candle's `sum + value.affine(scale, 0)`;
//! - [`count_up`]: a device counter's `+= 1` (the data cursor's batch
//!   number, the optimizer's step count), with the bits of candle's
//!   `affine(1, 1)`.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::{DType, Device, Tensor};

use super::{function, Addresses};
use crate::error::{Error, Result};
use crate::tally::{SumList, MAX_SUMS};

// SAFETY: plain `repr(C)` data with the layout of the kernel's struct
// (size-checked in crate::tally).
unsafe impl DeviceRepr for SumList {}

/// One thread's work: a warp, the smallest block a kernel takes.
const ONE: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (32, 1, 1),
    shared_mem_bytes: 0,
};

/// The CUDA device of a one-value tensor of `dtype`, or `None` (off the GPU,
/// another dtype, more than one value).
fn scalar_on_gpu(t: &Tensor, dtype: DType) -> Option<&candle_core::CudaDevice> {
    match t.device() {
        Device::Cuda(dev) if t.dtype() == dtype && t.elem_count() == 1 => Some(dev),
        _ => None,
    }
}

/// Adds `value * scale` to `sum` for each `(sum, value, scale)`, in order,
/// in one launch per [`MAX_SUMS`]: each sum is an f32 scalar on a CUDA
/// device, updated in place (its buffer and address stay, so a captured step
/// replayed adds into it). `Ok(false)`, with nothing launched, where a tensor
/// is not an f32 scalar on the first one's CUDA device: the caller takes
/// candle's ops then.
pub fn step_sums(items: &[(&Tensor, &Tensor, f32)]) -> Result<bool> {
    let Some(dev) = items
        .first()
        .and_then(|(s, _, _)| scalar_on_gpu(s, DType::F32))
    else {
        return Ok(items.is_empty());
    };
    let same = |t: &Tensor| scalar_on_gpu(t, DType::F32).is_some_and(|d| d.id() == dev.id());
    if !items.iter().all(|(s, v, _)| same(s) && same(v)) {
        return Ok(false);
    }
    let tensors: Vec<&Tensor> = items.iter().flat_map(|(s, v, _)| [*s, *v]).collect();
    let locked = Addresses::lock(&tensors, DType::F32, "step sums")?;
    let stream = dev.cuda_stream();
    let ptrs = locked.pointers(&stream)?;
    let func = function(dev, "redline_step_sums")?;
    let triples: Vec<(u64, u64, f32)> = items
        .iter()
        .zip(ptrs.chunks_exact(2))
        .map(|((_, _, scale), p)| (p[0], p[1], *scale))
        .collect();
    for chunk in triples.chunks(MAX_SUMS) {
        let list = SumList::new(chunk)?;
        let mut b = stream.launch_builder(&func);
        b.arg(&list);
        // SAFETY: `list` is the kernel's struct by value; its addresses are
        // live f32 scalars on this device, held locked by `locked` until
        // after the launch (and owned by the callers' sums beyond it).
        unsafe { b.launch(ONE) }.map_err(|e| Error::Gpu(format!("step sums: {e}")))?;
    }
    drop(locked);
    Ok(true)
}

/// Adds one to `counter` in place: a u32 or f64 scalar on a CUDA device.
/// `Ok(false)`, with nothing launched, for any other tensor (the caller
/// takes candle's ops then).
pub fn count_up(counter: &Tensor) -> Result<bool> {
    let (dev, kernel) = match (
        scalar_on_gpu(counter, DType::U32),
        scalar_on_gpu(counter, DType::F64),
    ) {
        (Some(dev), _) => (dev, "redline_count_u32"),
        (_, Some(dev)) => (dev, "redline_count_f64"),
        _ => return Ok(false),
    };
    let locked = Addresses::lock(&[counter], counter.dtype(), "a device counter")?;
    let stream = dev.cuda_stream();
    let ptr = locked.pointers(&stream)?[0];
    let func = function(dev, kernel)?;
    let mut b = stream.launch_builder(&func);
    b.arg(&ptr);
    // SAFETY: `ptr` addresses the counter, one value of the kernel's type,
    // held locked until after the launch.
    unsafe { b.launch(ONE) }.map_err(|e| Error::Gpu(format!("{kernel}: {e}")))?;
    drop(locked);
    Ok(true)
}
