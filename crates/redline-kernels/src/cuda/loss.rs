//! The cross-entropy op's CUDA side (`cuda/loss.cu`): the forward's softmax
//! and mean loss in one launch, the backward's gradient in one more.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use candle_core::{bail, CudaStorage, Layout};

use super::function;

/// Threads of the forward's one block: 32 warps.
const FWD_THREADS: u32 = 1024;
/// Threads per block of the backward.
const BWD_THREADS: u32 = 256;

fn contiguous<'a, T: candle_core::cuda_backend::CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, T>> {
    let Some((start, end)) = l.contiguous_offsets() else {
        bail!("{what}: the fused GPU kernel needs a contiguous tensor")
    };
    Ok(s.as_cuda_slice::<T>()?.slice(start..end))
}

fn u32_of(n: usize, what: &str) -> candle_core::Result<u32> {
    u32::try_from(n).or_else(|_| bail!("{what}: {n} is too large for the fused GPU kernel"))
}

/// Mean cross-entropy of `x (rows, cols)` against `t (rows,)`: the loss (a
/// 0-d f32 storage), the softmax kept for the backward, and the count of
/// rows whose first maximum is the target (one f32).
pub(crate) fn ce_forward(
    x: &CudaStorage,
    lx: &Layout,
    t: &CudaStorage,
    lt: &Layout,
    rows: usize,
    cols: usize,
) -> candle_core::Result<(CudaStorage, CudaSlice<f32>, CudaSlice<f32>)> {
    let dev = x.device().clone();
    let xs = contiguous::<f32>(x, lx, "cross_entropy logits")?;
    let ts = contiguous::<u32>(t, lt, "cross_entropy targets")?;
    let (r, c) = (u32_of(rows, "rows")?, u32_of(cols, "classes")?);
    // SAFETY: both buffers are written in full by the kernel before any read.
    let mut probs = unsafe { dev.alloc::<f32>(rows * cols) }?;
    let mut loss = unsafe { dev.alloc::<f32>(1) }?;
    let mut correct = unsafe { dev.alloc::<f32>(1) }?;
    let func =
        function(&dev, "redline_ce_fwd_f32").map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(&xs)
        .arg(&ts)
        .arg(&mut probs)
        .arg(&mut loss)
        .arg(&mut correct)
        .arg(&r)
        .arg(&c);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (FWD_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments are the kernel's, in order; `xs` holds rows*cols
    // f32, `ts` rows u32, `probs` rows*cols, `loss` and `correct` one f32 each.
    unsafe { b.launch(cfg) }.map_err(|e| candle_core::Error::Msg(format!("cross_entropy: {e}")))?;
    Ok((CudaStorage::wrap_cuda_slice(loss, dev), probs, correct))
}

/// `(softmax - onehot(t)) * g / rows` from the forward's softmax.
pub(crate) fn ce_backward(
    probs: &CudaSlice<f32>,
    t: &CudaStorage,
    lt: &Layout,
    g: &CudaStorage,
    lg: &Layout,
    rows: usize,
    cols: usize,
) -> candle_core::Result<CudaStorage> {
    let dev = t.device().clone();
    let ts = contiguous::<u32>(t, lt, "cross_entropy backward targets")?;
    let gs = contiguous::<f32>(g, lg, "cross_entropy backward gradient")?;
    if probs.len() != rows * cols || ts.len() != rows {
        bail!(
            "cross_entropy backward: {} saved probabilities and {} targets for logits ({rows}, {cols})",
            probs.len(),
            ts.len()
        )
    }
    let (r, c) = (u32_of(rows, "rows")?, u32_of(cols, "classes")?);
    // SAFETY: written in full by the kernel.
    let mut out = unsafe { dev.alloc::<f32>(rows * cols) }?;
    let func =
        function(&dev, "redline_ce_bwd_f32").map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let stream = dev.cuda_stream();
    let blocks = (rows * cols)
        .div_ceil(BWD_THREADS as usize)
        .clamp(1, 65_535) as u32;
    let mut b = stream.launch_builder(&func);
    b.arg(probs).arg(&ts).arg(&gs).arg(&mut out).arg(&r).arg(&c);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BWD_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments are the kernel's, in order, with the sizes checked above.
    unsafe { b.launch(cfg) }
        .map_err(|e| candle_core::Error::Msg(format!("cross_entropy backward: {e}")))?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}
