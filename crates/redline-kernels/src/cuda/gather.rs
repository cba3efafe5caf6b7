//! The device cursor's draw in one launch (`cuda/gather.cu`): a batch's rows
//! of a device-resident split, looked up through the epoch's permutation at
//! the batch number the device keeps, where candle's ops take five launches.

use candle_core::backend::BackendDevice;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaStorage;
use candle_core::op::BackpropOp;
use candle_core::{DType, Layout, Storage, Tensor};

use super::{address, function};
use crate::error::{Error, Result};
use crate::fused_gpu::sample_words;

/// Threads per block (one block per batch row).
const THREADS: u32 = 256;

/// A contiguous tensor on a CUDA device: its storage and layout, or `None`.
fn on_gpu<'a>(storage: &'a Storage, layout: &Layout) -> Option<(&'a CudaStorage, usize)> {
    match storage {
        Storage::Cuda(s) if layout.is_contiguous() => Some((s, layout.start_offset())),
        _ => None,
    }
}

/// Rows `perm[counter * batch + (0..batch)]` of `x` and of `y` (both with one
/// sample per index of their first dimension), as new tensors that no
/// backward pass tracks: what `redline_data::DeviceCursor::gather` computes,
/// in one launch. `perm` is the epoch's order (u32, one per sample) and
/// `counter` the batch number (u32, shape (1,)), both read on the device, so a
/// captured step replayed draws the next batch. `Ok(None)` where the kernel
/// does not apply (a tensor off the GPU or not contiguous, a sample that is
/// not a whole number of 32-bit words): the caller takes candle's ops then.
/// Draw at most `perm.len() / batch` times per epoch.
pub fn cursor_gather(
    perm: &Tensor,
    counter: &Tensor,
    batch: usize,
    x: &Tensor,
    y: &Tensor,
) -> Result<Option<(Tensor, Tensor)>> {
    let len = perm.elem_count();
    if perm.dtype() != DType::U32 || counter.dtype() != DType::U32 || counter.elem_count() != 1 {
        return Err(Error::Shape(format!(
            "cursor gather: a u32 permutation and a u32 counter of one, got {:?} {:?} and {:?} {:?}",
            perm.dtype(),
            perm.dims(),
            counter.dtype(),
            counter.dims()
        )));
    }
    for (t, what) in [(x, "inputs"), (y, "targets")] {
        if t.dims().first() != Some(&len) {
            return Err(Error::Shape(format!(
                "cursor gather: {what} of shape {:?} for a permutation of {len} samples",
                t.dims()
            )));
        }
    }
    if batch == 0 || batch > len {
        return Err(Error::Shape(format!(
            "cursor gather: batch {batch} of {len} samples"
        )));
    }
    let (ps, pl) = perm.storage_and_layout();
    let (cs, cl) = counter.storage_and_layout();
    let (xs, xl) = x.storage_and_layout();
    let (ys, yl) = y.storage_and_layout();
    let (Some((ps, po)), Some((cs, co)), Some((xs, xo)), Some((ys, yo))) = (
        on_gpu(&ps, pl),
        on_gpu(&cs, cl),
        on_gpu(&xs, xl),
        on_gpu(&ys, yl),
    ) else {
        return Ok(None);
    };
    let per = |t: &Tensor| t.elem_count() / len;
    let (Some(x_words), Some(y_words)) = (
        sample_words(per(x), x.dtype().size_in_bytes(), xo),
        sample_words(per(y), y.dtype().size_in_bytes(), yo),
    ) else {
        return Ok(None);
    };
    let dev = xs.device.clone();
    let gpu = |e: candle_core::Error| Error::Gpu(format!("cursor gather: {e}"));
    let mut x_dims = x.dims().to_vec();
    x_dims[0] = batch;
    let mut y_dims = y.dims().to_vec();
    y_dims[0] = batch;
    // SAFETY: the kernel writes every element of both before any read.
    let out_x = unsafe { dev.alloc_uninit(&x_dims.as_slice().into(), x.dtype()) }.map_err(gpu)?;
    // SAFETY: as above.
    let out_y = unsafe { dev.alloc_uninit(&y_dims.as_slice().into(), y.dtype()) }.map_err(gpu)?;
    let stream = dev.cuda_stream();
    let args = [
        address(ps, po, &stream),
        address(cs, co, &stream),
        address(xs, xo, &stream),
        address(ys, yo, &stream),
        address(&out_x, 0, &stream),
        address(&out_y, 0, &stream),
    ];
    let batch32 =
        u32::try_from(batch).map_err(|_| Error::Shape(format!("cursor gather: batch {batch}")))?;
    let func = function(&dev, "redline_cursor_gather")?;
    let mut b = stream.launch_builder(&func);
    for a in &args {
        b.arg(a);
    }
    b.arg(&batch32).arg(&x_words).arg(&y_words);
    let cfg = LaunchConfig {
        grid_dim: (batch32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments are the kernel's, in order: six device addresses
    // (the permutation of `len` u32, the counter, x and y of `len` samples
    // of x_words and y_words words, and the two outputs of `batch` samples),
    // then three u32. The storage guards above keep the inputs alive until
    // the launch is queued; the outputs are owned below.
    unsafe { b.launch(cfg) }.map_err(|e| Error::Gpu(format!("cursor gather: {e}")))?;
    let wrap = |s: CudaStorage, dims: Vec<usize>| {
        Tensor::from_storage(Storage::Cuda(s), dims, BackpropOp::none(), false)
    };
    Ok(Some((wrap(out_x, x_dims), wrap(out_y, y_dims))))
}
