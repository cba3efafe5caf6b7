//! A linear layer on the GPU through cuBLASLt: the forward is one GEMM with
//! the bias and ReLU in its epilogue; the backward is one kernel for the
//! ReLU mask and the bias gradient (`cuda/linear.cu`) and the dW and dx
//! GEMMs. The GEMMs are planned by [`crate::gemm_plan`] (tested on the CPU)
//! and computed in full fp32 (`CUBLAS_COMPUTE_32F`, no TF32), as candle's
//! and the goldens' are, unless `--matmul-precision high`
//! ([`redline_core::MatmulPrecision`]) allows TF32 (`CUBLAS_COMPUTE_32F_FAST_TF32`).
//!
//! In a 16-bit type (bf16 or fp16 operands, `--precision bf16-mixed |
//! 16-mixed | bf16-true`) the same three GEMMs run on tensor cores with f32
//! sums (`CUBLAS_COMPUTE_32F`), each result rounded once to the 16-bit type,
//! the bias added in the forward's epilogue before that rounding (as
//! PyTorch's autocast `addmm` through cuBLASLt), and the mask kernel's twin
//! sums the bias gradient in f32.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cublaslt::{result as lt, sys};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, DeviceId};
use candle_core::{bail, CudaStorage, DType, Layout};

use super::function;
use crate::fused_gpu::{MASK_COLS, MASK_THREADS};
use crate::gemm_plan::{
    linear_forward, linear_input_grad, linear_weight_grad, linear_weight_grad_split,
    weight_grad_splits, Epilogue, GemmPlan,
};

/// cuBLASLt's workspace: 32 MiB, NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A GEMM's plan, its operands' alignment (A, B, C), whether TF32 is
/// allowed, and the operands' dtype.
type PlanKey = (GemmPlan, [u32; 3], bool, DType);

/// A cuBLASLt handle, its workspace, and the GEMMs planned on it so far.
struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// Descriptors and the algorithm cuBLASLt chose, per plan, operand
    /// alignment and TF32 setting: made once, so a step pays no heuristic
    /// query (tens of microseconds each).
    plans: Mutex<HashMap<PlanKey, Prepared>>,
}

// SAFETY: a cuBLASLt handle may be used from any thread; Redline's calls on
// it are serialised by the `plans` lock and candle's one stream per device.
unsafe impl Send for Lt {}
// SAFETY: as above.
unsafe impl Sync for Lt {}

static HANDLES: Mutex<Option<HashMap<DeviceId, Arc<Lt>>>> = Mutex::new(None);

fn err(what: &str, e: impl std::fmt::Debug) -> candle_core::Error {
    candle_core::Error::Msg(format!("linear on the GPU: {what}: {e:?}"))
}

fn handle(dev: &CudaDevice) -> candle_core::Result<Arc<Lt>> {
    let mut guard = HANDLES.lock().unwrap_or_else(PoisonError::into_inner);
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(h) = map.get(&dev.id()) {
        return Ok(h.clone());
    }
    let h = Arc::new(Lt {
        handle: lt::create_handle().map_err(|e| err("cuBLASLt handle", e))?,
        workspace: dev.alloc_zeros::<u8>(WORKSPACE_BYTES)?,
        plans: Mutex::new(HashMap::new()),
    });
    map.insert(dev.id(), h.clone());
    Ok(h)
}

/// One plan's descriptors and algorithm, destroyed when dropped.
struct Prepared {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: Vec<sys::cublasLtMatrixLayout_t>,
    pref: Option<sys::cublasLtMatmulPreference_t>,
    algo: Option<sys::cublasLtMatmulAlgo_t>,
}

// SAFETY: plain cuBLASLt descriptors, used under `Lt::plans`' lock.
unsafe impl Send for Prepared {}

impl Drop for Prepared {
    fn drop(&mut self) {
        // SAFETY: each was created by cuBLASLt and is destroyed once.
        unsafe {
            for l in self.layouts.drain(..) {
                let _ = lt::destroy_matrix_layout(l);
            }
            if let Some(p) = self.pref.take() {
                let _ = lt::destroy_matmul_pref(p);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> candle_core::Result<()> {
    // SAFETY: `v` is the attribute's type (cublasLt.h) and outlives the call.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            (v as *const T).cast::<c_void>(),
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| err("matmul attribute", e))
}

/// The alignment an address guarantees, in bytes (a power of two, at most
/// 256, cuBLASLt's default assumption).
fn alignment(address: u64) -> u32 {
    1 << address.trailing_zeros().min(8)
}

/// cuBLASLt's name for a dtype the GEMMs take.
fn data_type(dtype: DType) -> candle_core::Result<sys::cudaDataType_t> {
    match dtype {
        DType::F32 => Ok(sys::cudaDataType_t::CUDA_R_32F),
        DType::BF16 => Ok(sys::cudaDataType_t::CUDA_R_16BF),
        DType::F16 => Ok(sys::cudaDataType_t::CUDA_R_16F),
        other => bail!("linear on the GPU: the fused layer takes f32, bf16 or f16, not {other:?}"),
    }
}

/// Descriptors for `plan` (operands and result of `dtype`, f32 scale and
/// sums: `CUBLAS_COMPUTE_32F`, or `CUBLAS_COMPUTE_32F_FAST_TF32` when `tf32`) and
/// cuBLASLt's algorithm for them, for operands aligned to `align` bytes (A,
/// B, C and D): a view into a larger buffer can start off cuBLASLt's default
/// 256 bytes. A bias epilogue needs a bias address for the query; the call
/// sets the real one.
fn prepare(
    lt_handle: sys::cublasLtHandle_t,
    plan: &GemmPlan,
    bias: Option<u64>,
    (align, tf32, dtype): ([u32; 3], bool, DType),
) -> candle_core::Result<Prepared> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    // The scale (alpha, beta) is f32 for every dtype; the bias has the
    // result's dtype (cuBLASLt's default).
    let f32t = sys::cudaDataType_t::CUDA_R_32F;
    let operands = data_type(dtype)?;
    let compute = if tf32 {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let desc = lt::create_matmul_desc(compute, f32t).map_err(|e| err("matmul descriptor", e))?;
    let mut p = Prepared {
        desc,
        layouts: Vec::new(),
        pref: None,
        algo: None,
    };
    set_desc(
        desc,
        A::CUBLASLT_MATMUL_DESC_TRANSA,
        &i32::from(plan.transa),
    )?;
    set_desc(
        desc,
        A::CUBLASLT_MATMUL_DESC_TRANSB,
        &i32::from(plan.transb),
    )?;
    let epilogue = match plan.epilogue {
        Epilogue::Default => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
        Epilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        Epilogue::Relu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
        Epilogue::ReluBias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
    };
    set_desc(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
    if let Some(bias) = bias {
        set_desc(desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
    }
    let (ar, ac) = plan.a_dims();
    let (br, bc) = plan.b_dims();
    for (rows, cols, ld, stride) in [
        (ar, ac, plan.lda, plan.stride_a),
        (br, bc, plan.ldb, plan.stride_b),
        (plan.m, plan.n, plan.ldc, plan.stride_c),
    ] {
        let l = lt::create_matrix_layout(operands, rows as u64, cols as u64, ld as i64)
            .map_err(|e| err("matrix layout", e))?;
        p.layouts.push(l);
        if plan.batch > 1 {
            batched(l, plan.batch, stride)?;
        }
    }
    let pref = lt::create_matmul_pref().map_err(|e| err("matmul preference", e))?;
    p.pref = Some(pref);
    let ws = WORKSPACE_BYTES;
    // SAFETY: MAX_WORKSPACE_BYTES is a size_t.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&ws as *const usize).cast::<c_void>(),
            std::mem::size_of::<usize>(),
        )
    }
    .map_err(|e| err("workspace size", e))?;
    {
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        for (attr, bytes) in [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]),
        ] {
            // SAFETY: the alignment attributes are uint32_t.
            unsafe {
                lt::set_matmul_pref_attribute(
                    pref,
                    attr,
                    (&bytes as *const u32).cast::<c_void>(),
                    std::mem::size_of::<u32>(),
                )
            }
            .map_err(|e| err("operand alignment", e))?;
        }
    }
    let (la, lb, lc) = (p.layouts[0], p.layouts[1], p.layouts[2]);
    // SAFETY: live descriptors made above.
    let heuristic = unsafe { lt::get_matmul_algo_heuristic(lt_handle, desc, la, lb, lc, lc, pref) }
        .map_err(|e| err("no cuBLASLt algorithm for this shape", e))?;
    p.algo = Some(heuristic.algo);
    Ok(p)
}

/// Makes layout `l` one of `count` matrices `stride` elements apart.
fn batched(l: sys::cublasLtMatrixLayout_t, count: usize, stride: usize) -> candle_core::Result<()> {
    use sys::cublasLtMatrixLayoutAttribute_t as L;
    let count = i32::try_from(count).map_err(|e| err("batch count", e))?;
    let stride = i64::try_from(stride).map_err(|e| err("batch stride", e))?;
    // SAFETY: BATCH_COUNT is an int32_t and STRIDED_BATCH_OFFSET an int64_t
    // (cublasLt.h); `l` was just created.
    unsafe {
        lt::set_matrix_layout_attribute(
            l,
            L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            (&count as *const i32).cast::<c_void>(),
            std::mem::size_of::<i32>(),
        )
        .map_err(|e| err("batch count", e))?;
        lt::set_matrix_layout_attribute(
            l,
            L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            (&stride as *const i64).cast::<c_void>(),
            std::mem::size_of::<i64>(),
        )
        .map_err(|e| err("batch stride", e))
    }
}

/// `C = epilogue(op(A) op(B) [+ bias])` on `dev`'s stream, all device
/// addresses of `dtype` values as `plan` lays them out.
fn gemm(
    dev: &CudaDevice,
    plan: &GemmPlan,
    dtype: DType,
    (a, b, c): (u64, u64, u64),
    bias: Option<u64>,
) -> candle_core::Result<()> {
    let needs_bias = matches!(plan.epilogue, Epilogue::Bias | Epilogue::ReluBias);
    if needs_bias != bias.is_some() {
        bail!("linear on the GPU: the bias and the epilogue do not agree")
    }
    let lt = handle(dev)?;
    let mut plans = lt.plans.lock().unwrap_or_else(PoisonError::into_inner);
    // A batched plan's later products start a stride on: the alignment both keep.
    let size = dtype.size_in_bytes() as u64;
    let align = [
        alignment(a | (plan.stride_a as u64 * size)),
        alignment(b | (plan.stride_b as u64 * size)),
        alignment(c | (plan.stride_c as u64 * size)),
    ];
    // TF32 rounds f32 operands; 16-bit ones are already narrower.
    let tf32 = dtype == DType::F32 && redline_core::matmul_precision().tf32();
    let p = match plans.entry((*plan, align, tf32, dtype)) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(prepare(lt.handle, plan, bias, (align, tf32, dtype))?)
        }
    };
    if let Some(bias) = bias {
        set_desc(
            p.desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            &bias,
        )?;
    }
    let Some(algo) = p.algo.as_ref() else {
        bail!("linear on the GPU: no cuBLASLt algorithm was chosen")
    };
    let stream = dev.cuda_stream();
    let (w, _w_rec) = lt.workspace.device_ptr(&stream);
    let (alpha, beta) = (1f32, 0f32);
    let (la, lb, lc) = (p.layouts[0], p.layouts[1], p.layouts[2]);
    // SAFETY: `a`, `b`, `c` (and the bias) address buffers of `dtype` of
    // the sizes `plan` describes, kept alive by the caller until the stream has run
    // the call; the workspace is the handle's own.
    unsafe {
        lt::matmul(
            lt.handle,
            p.desc,
            (&alpha as *const f32).cast(),
            (&beta as *const f32).cast(),
            a as *const c_void,
            la,
            b as *const c_void,
            lb,
            c as *const c_void,
            lc,
            c as *mut c_void,
            lc,
            algo,
            w as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as *mut _,
        )
    }
    .map_err(|e| err("cublasLtMatmul", e))
}

/// The address of the contiguous data `s` and `l` describe (f32, bf16 or f16).
fn address(s: &CudaStorage, l: &Layout, what: &str) -> candle_core::Result<u64> {
    let Some((start, _)) = l.contiguous_offsets() else {
        bail!("linear on the GPU: {what} is not contiguous")
    };
    let stream = s.device().cuda_stream();
    let ptr = match s.dtype() {
        DType::F32 => s.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
        DType::BF16 => s.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0,
        DType::F16 => s.as_cuda_slice::<half::f16>()?.device_ptr(&stream).0,
        other => {
            data_type(other)?;
            bail!("linear on the GPU: no layer for {other:?}")
        }
    };
    Ok(ptr + (start * s.dtype().size_in_bytes()) as u64)
}

/// A new buffer of `n` values of `dtype` on `dev` and its address; every
/// value is to be written by the caller's kernels before it is read.
fn alloc(dev: &CudaDevice, dtype: DType, n: usize) -> candle_core::Result<(CudaStorage, u64)> {
    let stream = dev.cuda_stream();
    // SAFETY (each arm): the callers write all `n` values before any read.
    let (storage, ptr) = match dtype {
        DType::F32 => {
            let mut b = unsafe { dev.alloc::<f32>(n) }?;
            let p = b.device_ptr_mut(&stream).0;
            (CudaStorage::wrap_cuda_slice(b, dev.clone()), p)
        }
        DType::BF16 => {
            let mut b = unsafe { dev.alloc::<half::bf16>(n) }?;
            let p = b.device_ptr_mut(&stream).0;
            (CudaStorage::wrap_cuda_slice(b, dev.clone()), p)
        }
        DType::F16 => {
            let mut b = unsafe { dev.alloc::<half::f16>(n) }?;
            let p = b.device_ptr_mut(&stream).0;
            (CudaStorage::wrap_cuda_slice(b, dev.clone()), p)
        }
        other => {
            data_type(other)?;
            bail!("linear on the GPU: no layer for {other:?}")
        }
    };
    Ok((storage, ptr))
}

/// `y = x W^T + b`, ReLU when `relu`: one cuBLASLt call, in the operands'
/// dtype (one for all three).
pub(crate) fn forward(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    b: (&CudaStorage, &Layout),
    dims: (usize, usize, usize),
    relu: bool,
) -> candle_core::Result<CudaStorage> {
    let (batch, fan_in, fan_out) = dims;
    let dtype = one_dtype(&[x.0, w.0, b.0])?;
    let plan = linear_forward(batch, fan_in, fan_out, relu)
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let dev = x.0.device().clone();
    let (y, yp) = alloc(&dev, dtype, batch * fan_out)?;
    gemm(
        &dev,
        &plan,
        dtype,
        (
            address(w.0, w.1, "the weight")?,
            address(x.0, x.1, "the input")?,
            yp,
        ),
        Some(address(b.0, b.1, "the bias")?),
    )?;
    Ok(y)
}

/// The one dtype of `operands`, or an error naming them.
fn one_dtype(operands: &[&CudaStorage]) -> candle_core::Result<DType> {
    let dtype = operands.first().map_or(DType::F32, |s| s.dtype());
    if operands.iter().any(|s| s.dtype() != dtype) {
        let all: Vec<DType> = operands.iter().map(|s| s.dtype()).collect();
        bail!("linear on the GPU: operands of dtypes {all:?}; the fused layer takes one")
    }
    data_type(dtype)?;
    Ok(dtype)
}

/// `[dW (out*in) | db (out) | dx (B*in) when input_grad]` from the incoming
/// gradient `g (B, out)`, the input `x`, the weight `w` and, with ReLU, the
/// forward's output `y`, in their dtype (one for all).
pub(crate) fn backward(
    g: (&CudaStorage, &Layout),
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    y: Option<(&CudaStorage, &Layout)>,
    dims: (usize, usize, usize),
    input_grad: bool,
) -> candle_core::Result<CudaStorage> {
    let (batch, fan_in, fan_out) = dims;
    let mut operands = vec![g.0, x.0, w.0];
    operands.extend(y.map(|(s, _)| s));
    let dtype = one_dtype(&operands)?;
    let size = dtype.size_in_bytes();
    let plan_err = |e: crate::Error| candle_core::Error::Msg(e.to_string());
    let dx_plan = linear_input_grad(batch, fan_in, fan_out).map_err(plan_err)?;
    let dev = g.0.device().clone();
    let stream = dev.cuda_stream();
    let (nw, dx_len) = (
        fan_out * fan_in,
        if input_grad { batch * fan_in } else { 0 },
    );
    // Every element is written below (dW and dx by the GEMMs, db and dz by
    // the mask kernel).
    let (out, out_p) = alloc(&dev, dtype, nw + fan_out + dx_len)?;
    let (dz, dz_p) = alloc(&dev, dtype, batch * fan_out)?;
    let (gp, xp, wp) = (
        address(g.0, g.1, "the gradient")?,
        address(x.0, x.1, "the input")?,
        address(w.0, w.1, "the weight")?,
    );
    let yp = match y {
        Some((s, l)) => address(s, l, "the layer output")?,
        None => 0,
    };
    let db_p = out_p + (nw * size) as u64;
    let (rows, cols) = (
        u32::try_from(batch).map_err(|e| err("batch", e))?,
        u32::try_from(fan_out).map_err(|e| err("outputs", e))?,
    );
    let suffix = match dtype {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "f32",
    };
    let func = function(&dev, &format!("redline_relu_mask_bias_grad_{suffix}"))
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let mut l = stream.launch_builder(&func);
    l.arg(&gp)
        .arg(&yp)
        .arg(&dz_p)
        .arg(&db_p)
        .arg(&rows)
        .arg(&cols);
    let cfg = LaunchConfig {
        grid_dim: (cols.div_ceil(MASK_COLS), 1, 1),
        block_dim: (MASK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: pointer arguments as the kernel declares them: g, y (or 0), dz
    // of rows*cols values, db of cols values, all of `dtype`.
    unsafe { l.launch(cfg) }.map_err(|e| err("mask and bias gradient", e))?;
    weight_grad(&dev, dtype, (batch, fan_in, fan_out), (xp, dz_p, out_p))?;
    if input_grad {
        let dx_p = out_p + ((nw + fan_out) * size) as u64;
        gemm(&dev, &dx_plan, dtype, (wp, dz_p, dx_p), None)?;
    }
    drop(dz);
    Ok(out)
}

/// `dW (out, in) = dz^T x` into `dw_p` from `x` at `xp` and `dz` at `dz_p`.
/// In f32, where [`weight_grad_splits`] splits the batch, one strided-batched
/// GEMM writes each chunk's product into an f32 scratch buffer and
/// `redline_sum_splits_f32` adds them in order into `dW`; otherwise (and in
/// 16 bits, whose products are rounded once) one GEMM writes `dW`.
fn weight_grad(
    dev: &CudaDevice,
    dtype: DType,
    (batch, fan_in, fan_out): (usize, usize, usize),
    (xp, dz_p, dw_p): (u64, u64, u64),
) -> candle_core::Result<()> {
    // Shapes whose batched GEMM cuBLASLt refused: computed whole from then
    // on, with no new query per step.
    static UNBATCHED: Mutex<Vec<(usize, usize, usize)>> = Mutex::new(Vec::new());
    let shape = (batch, fan_in, fan_out);
    let plan_err = |e: crate::Error| candle_core::Error::Msg(e.to_string());
    let whole = || -> candle_core::Result<()> {
        let plan = linear_weight_grad(batch, fan_in, fan_out).map_err(plan_err)?;
        gemm(dev, &plan, dtype, (xp, dz_p, dw_p), None)
    };
    let unbatched = || UNBATCHED.lock().unwrap_or_else(PoisonError::into_inner);
    let splits = weight_grad_splits(batch, fan_in, fan_out);
    if dtype != DType::F32 || splits == 1 || unbatched().contains(&shape) {
        return whole();
    }
    let plan = linear_weight_grad_split(batch, fan_in, fan_out, splits).map_err(plan_err)?;
    let count = fan_out * fan_in;
    let stream = dev.cuda_stream();
    // SAFETY: the batched GEMM writes all `splits * count` values.
    let mut partial = unsafe { dev.alloc::<f32>(splits * count) }?;
    let part_p = partial.device_ptr_mut(&stream).0;
    if let Err(e) = gemm(dev, &plan, dtype, (xp, dz_p, part_p), None) {
        // A shape cuBLASLt will not batch: the one GEMM, as without splits.
        eprintln!(
            "warning: the split weight gradient of {shape:?} failed ({e}); computing it whole"
        );
        unbatched().push(shape);
        return whole();
    }
    let (splits32, count32) = (
        u32::try_from(splits).map_err(|e| err("splits", e))?,
        u32::try_from(count).map_err(|e| err("weights", e))?,
    );
    super::sum_splits(dev, "f32", &partial, dw_p, (splits32, count32))
}
