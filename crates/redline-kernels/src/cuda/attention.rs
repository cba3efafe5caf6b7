//! The fused causal attention's CUDA side (`cuda/attention.cu`): the
//! forward in one launch (output and each row's log-sum-exp), the backward
//! in three (`D = dO . O`, then dK and dV per key block, dQ per query
//! block), on `(B*H, T, D)` inputs in f32, bf16 or f16 with `D` up to
//! [`MAX_HEAD_DIM`]. For 16-bit heads 32 or 64 wide the forward and the
//! dK/dV and dQ kernels run on tensor cores (`cuda/attention_mma.cu`) unless
//! `REDLINE_ATTENTION_SIMT=1` (for measuring one against the other).

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use candle_core::{bail, CudaStorage, DType, Layout};

use super::{address, function};
use crate::attention::DropDraw;

/// The widest head the kernels take (their shared tiles hold rows of 64).
pub const MAX_HEAD_DIM: usize = 64;
/// The most heads (`B * H`) a launch takes: the grid's second dimension.
pub const MAX_HEADS: usize = 65_535;
const THREADS: u32 = 128;
/// Queries per forward block; queries or keys per backward block.
const FWD_Q: usize = 64;
const BLOCK: usize = 32;
/// Keys or queries per block of the tensor-core backward.
const MMA_BLOCK: usize = 64;

fn gpu(what: &str, e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("attention on the GPU: {what}: {e}"))
}

/// The kernels' name suffix for `dtype`.
fn suffix(dtype: DType) -> candle_core::Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        other => bail!("attention on the GPU: {other:?} inputs (f32, bf16 or f16 only)"),
    })
}

/// The device address of a contiguous operand of `dtype` holding `n`
/// elements, or an error naming it.
fn operand(
    (s, l): (&CudaStorage, &Layout),
    dtype: DType,
    n: usize,
    what: &str,
    stream: &Arc<CudaStream>,
) -> candle_core::Result<u64> {
    if s.dtype() != dtype {
        bail!(
            "attention on the GPU: {what} is {:?}, the queries {dtype:?}",
            s.dtype()
        )
    }
    match l.contiguous_offsets() {
        Some((a, b)) if b - a == n => Ok(address(s, a, stream)),
        _ => bail!(
            "attention on the GPU: {what} ({:?}) is not a contiguous {n} elements",
            l.shape()
        ),
    }
}

/// A new device buffer of `n` elements of `dtype`, every one written by the
/// kernels before it is read.
fn alloc(
    dev: &candle_core::CudaDevice,
    dtype: DType,
    n: usize,
) -> candle_core::Result<CudaStorage> {
    // SAFETY (each arm): the kernels write all `n` elements before any read.
    Ok(match dtype {
        DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(n) }?, dev.clone()),
        DType::BF16 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(n) }?, dev.clone())
        }
        DType::F16 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::f16>(n) }?, dev.clone())
        }
        other => bail!("attention on the GPU: {other:?} output"),
    })
}

fn u32_of(n: usize, what: &str) -> candle_core::Result<u32> {
    u32::try_from(n).map_err(|_| gpu(what, format!("{n} is too large")))
}

fn config(grid: (usize, usize)) -> candle_core::Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (u32_of(grid.0, "grid")?, u32_of(grid.1, "heads")?, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Checks the shape the kernels take.
fn check((heads, t, d): (usize, usize, usize)) -> candle_core::Result<()> {
    if d == 0 || d > MAX_HEAD_DIM || t == 0 || heads == 0 || heads > MAX_HEADS {
        bail!(
            "attention on the GPU: {heads} heads of {t} x {d} (the kernels take heads of 1 to \
             {MAX_HEAD_DIM} and at most {MAX_HEADS} of them)"
        )
    }
    Ok(())
}

/// Whether the kernels on tensor cores take heads of `d` in `dtype`: 16-bit
/// heads of 32 or 64, unless `REDLINE_ATTENTION_SIMT=1`.
fn tensor_cores(dtype: DType, d: usize) -> bool {
    matches!(dtype, DType::BF16 | DType::F16) && matches!(d, 32 | 64) && !simt_only()
}

/// Whether `REDLINE_ATTENTION_SIMT=1` keeps 16-bit forwards off the tensor
/// cores (read once).
fn simt_only() -> bool {
    static SIMT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SIMT.get_or_init(|| std::env::var("REDLINE_ATTENTION_SIMT").is_ok_and(|v| v == "1"))
}

/// Dropout's probability and seed as the kernels take them (`p = 0`: none).
fn drop_args(drop: Option<DropDraw>) -> (f32, u64) {
    drop.map_or((0.0, 0), |d| (d.p, d.seed))
}

/// `softmax(q k^T / sqrt(D) + causal mask) v` for `(heads, t, d)` operands:
/// the output (the queries' dtype) and each row's log-sum-exp (f32).
pub(crate) fn forward(
    q: (&CudaStorage, &Layout),
    k: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
    dims: (usize, usize, usize),
    drop: Option<DropDraw>,
) -> candle_core::Result<(CudaStorage, CudaSlice<f32>)> {
    check(dims)?;
    let (heads, t, d) = dims;
    let n = heads * t * d;
    let dtype = q.0.dtype();
    let dev = q.0.device().clone();
    let stream = dev.cuda_stream();
    let mma = tensor_cores(dtype, d);
    let name = match mma {
        true => format!("redline_attn_fwd_mma_{}_d{d}", suffix(dtype)?),
        false => format!("redline_attn_fwd_{}", suffix(dtype)?),
    };
    let func = function(&dev, &name).map_err(|e| gpu("kernel", e))?;
    let (pq, pk, pv) = (
        operand(q, dtype, n, "the queries", &stream)?,
        operand(k, dtype, n, "the keys", &stream)?,
        operand(v, dtype, n, "the values", &stream)?,
    );
    let o = alloc(&dev, dtype, n)?;
    let po = address(&o, 0, &stream);
    // SAFETY: written in full by the kernel (every row's first thread).
    let mut lse = unsafe { dev.alloc::<f32>(heads * t) }?;
    let (t32, d32) = (u32_of(t, "t")?, u32_of(d, "d")?);
    let scale = 1.0 / (d as f32).sqrt();
    let (p, seed) = drop_args(drop);
    let mut b = stream.launch_builder(&func);
    b.arg(&pq)
        .arg(&pk)
        .arg(&pv)
        .arg(&po)
        .arg(&mut lse)
        .arg(&t32);
    if !mma {
        // The tensor-core kernels take the width as a template parameter.
        b.arg(&d32);
    }
    b.arg(&scale).arg(&p).arg(&seed);
    // SAFETY: the arguments are the kernel's, in order; q, k, v and o hold
    // heads * t * d elements of the suffix's type (checked, allocated), lse
    // heads * t f32; the grid covers every query block (64 queries, both
    // kernels) of every head.
    unsafe { b.launch(config((t.div_ceil(FWD_Q), heads))?) }.map_err(|e| gpu("forward", e))?;
    Ok((o, lse))
}

/// The gradients `[dq | dk | dv]` (flat, the queries' dtype) of the
/// forward's output `o` (with its log-sum-exp `lse`) for its gradient `go`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    go: (&CudaStorage, &Layout),
    q: (&CudaStorage, &Layout),
    k: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
    o: (&CudaStorage, &Layout),
    lse: &CudaSlice<f32>,
    dims: (usize, usize, usize),
    drop: Option<DropDraw>,
) -> candle_core::Result<CudaStorage> {
    check(dims)?;
    let (heads, t, d) = dims;
    let n = heads * t * d;
    if lse.len() != heads * t {
        bail!(
            "attention backward on the GPU: {} log-sum-exps for {heads} heads of {t}",
            lse.len()
        )
    }
    let dtype = q.0.dtype();
    let sfx = suffix(dtype)?;
    let dev = q.0.device().clone();
    let stream = dev.cuda_stream();
    let mma = tensor_cores(dtype, d);
    // The tensor-core kernels' names end in their width (a template
    // parameter there).
    let kernel = |name: &str| {
        let full = match (mma, name) {
            (true, "dkdv" | "dq") => format!("redline_attn_{name}_mma_{sfx}_d{d}"),
            _ => format!("redline_attn_{name}_{sfx}"),
        };
        function(&dev, &full).map_err(|e| gpu("kernel", e))
    };
    let (pgo, pq, pk, pv, po) = (
        operand(go, dtype, n, "the output's gradient", &stream)?,
        operand(q, dtype, n, "the queries", &stream)?,
        operand(k, dtype, n, "the keys", &stream)?,
        operand(v, dtype, n, "the values", &stream)?,
        operand(o, dtype, n, "the output", &stream)?,
    );
    let out = alloc(&dev, dtype, 3 * n)?;
    let size = dtype.size_in_bytes() as u64;
    let pdq = address(&out, 0, &stream);
    let (pdk, pdv) = (pdq + n as u64 * size, pdq + 2 * n as u64 * size);
    // SAFETY: written in full by the first kernel.
    let mut dvec = unsafe { dev.alloc::<f32>(heads * t) }?;
    let (t32, d32, rows) = (u32_of(t, "t")?, u32_of(d, "d")?, u32_of(heads * t, "rows")?);
    let scale = 1.0 / (d as f32).sqrt();
    let (p, seed) = drop_args(drop);

    let f = kernel("dot")?;
    let mut b = stream.launch_builder(&f);
    b.arg(&po).arg(&pgo).arg(&mut dvec).arg(&rows).arg(&d32);
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(THREADS), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: o and go hold heads * t rows of d, dvec heads * t f32.
    unsafe { b.launch(cfg) }.map_err(|e| gpu("backward (D)", e))?;

    // The tensor-core kernels take 64 keys or queries a block and the width
    // in their name; the others 32 a block and the width as an argument.
    let rows_per_block = if mma { MMA_BLOCK } else { BLOCK };
    let grid = config((t.div_ceil(rows_per_block), heads))?;

    // dK and dV, then dQ: the same inputs, their outputs, the same sizes.
    let run = |name: &str, outputs: &[&u64], what: &str| -> candle_core::Result<()> {
        let f = kernel(name)?;
        let mut b = stream.launch_builder(&f);
        b.arg(&pq).arg(&pk).arg(&pv).arg(&pgo).arg(lse).arg(&dvec);
        for o in outputs {
            b.arg(*o);
        }
        b.arg(&t32);
        if !mma {
            b.arg(&d32);
        }
        b.arg(&scale).arg(&p).arg(&seed);
        // SAFETY: the kernel's arguments in order; dq, dk and dv are the
        // first, second and third n elements of `out` (3 n); the grid covers
        // every block of keys (dK, dV) or queries (dQ).
        unsafe { b.launch(grid) }.map_err(|e| gpu(what, e))?;
        Ok(())
    };
    run("dkdv", &[&pdk, &pdv], "backward (dK, dV)")?;
    run("dq", &[&pdq], "backward (dQ)")?;
    Ok(out)
}
