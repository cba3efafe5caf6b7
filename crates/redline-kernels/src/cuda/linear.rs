//! A linear layer on the GPU through cuBLASLt: the forward is one GEMM with
//! the bias and ReLU in its epilogue; the backward is one kernel for the
//! ReLU mask and the bias gradient (`cuda/linear.cu`) and the dW and dx
//! GEMMs. The GEMMs are planned by [`crate::gemm_plan`] (tested on the CPU)
//! and computed in full fp32 (`CUBLAS_COMPUTE_32F`, no TF32), as candle's
//! and the goldens' are, unless `--matmul-precision high`
//! ([`redline_core::MatmulPrecision`]) allows TF32 (`CUBLAS_COMPUTE_32F_FAST_TF32`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cublaslt::{result as lt, sys};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, DeviceId};
use candle_core::{bail, CudaStorage, Layout};

use super::function;
use crate::gemm_plan::{linear_forward, linear_input_grad, linear_weight_grad, Epilogue, GemmPlan};

/// cuBLASLt's workspace: 32 MiB, NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A GEMM's plan, its operands' alignment (A, B, C) and whether TF32 is allowed.
type PlanKey = (GemmPlan, [u32; 3], bool);

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

/// Descriptors for `plan` (f32 in, f32 out, `CUBLAS_COMPUTE_32F`, or
/// `CUBLAS_COMPUTE_32F_FAST_TF32` when `tf32`) and
/// cuBLASLt's algorithm for them, for operands aligned to `align` bytes (A,
/// B, C and D): a view into a larger buffer can start off cuBLASLt's default
/// 256 bytes. A bias epilogue needs a bias address for the query; the call
/// sets the real one.
fn prepare(
    lt_handle: sys::cublasLtHandle_t,
    plan: &GemmPlan,
    bias: Option<u64>,
    align: [u32; 3],
    tf32: bool,
) -> candle_core::Result<Prepared> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let f32t = sys::cudaDataType_t::CUDA_R_32F;
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
    for (rows, cols, ld) in [
        (ar, ac, plan.lda),
        (br, bc, plan.ldb),
        (plan.m, plan.n, plan.ldc),
    ] {
        let l = lt::create_matrix_layout(f32t, rows as u64, cols as u64, ld as i64)
            .map_err(|e| err("matrix layout", e))?;
        p.layouts.push(l);
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

/// `C = epilogue(op(A) op(B) [+ bias])` on `dev`'s stream, all f32 device
/// addresses as `plan` lays them out.
fn gemm(
    dev: &CudaDevice,
    plan: &GemmPlan,
    a: u64,
    b: u64,
    c: u64,
    bias: Option<u64>,
) -> candle_core::Result<()> {
    let needs_bias = matches!(plan.epilogue, Epilogue::Bias | Epilogue::ReluBias);
    if needs_bias != bias.is_some() {
        bail!("linear on the GPU: the bias and the epilogue do not agree")
    }
    let lt = handle(dev)?;
    let mut plans = lt.plans.lock().unwrap_or_else(PoisonError::into_inner);
    let align = [alignment(a), alignment(b), alignment(c)];
    let tf32 = redline_core::matmul_precision().tf32();
    let p = match plans.entry((*plan, align, tf32)) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(prepare(lt.handle, plan, bias, align, tf32)?)
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
    // SAFETY: `a`, `b`, `c` (and the bias) address f32 buffers of the sizes
    // `plan` describes, kept alive by the caller until the stream has run
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

/// The address of the contiguous f32 data `s` and `l` describe.
fn address(s: &CudaStorage, l: &Layout, what: &str) -> candle_core::Result<u64> {
    let Some((start, _)) = l.contiguous_offsets() else {
        bail!("linear on the GPU: {what} is not contiguous")
    };
    let stream = s.device().cuda_stream();
    let (ptr, _rec) = s.as_cuda_slice::<f32>()?.device_ptr(&stream);
    Ok(ptr + (start * std::mem::size_of::<f32>()) as u64)
}

/// `y = x W^T + b`, ReLU when `relu`: one cuBLASLt call.
pub(crate) fn forward(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    b: (&CudaStorage, &Layout),
    dims: (usize, usize, usize),
    relu: bool,
) -> candle_core::Result<CudaStorage> {
    let (batch, fan_in, fan_out) = dims;
    let plan = linear_forward(batch, fan_in, fan_out, relu)
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let dev = x.0.device().clone();
    // SAFETY: written in full by the GEMM.
    let mut y = unsafe { dev.alloc::<f32>(batch * fan_out) }?;
    let stream = dev.cuda_stream();
    let yp = y.device_ptr_mut(&stream).0;
    gemm(
        &dev,
        &plan,
        address(w.0, w.1, "the weight")?,
        address(x.0, x.1, "the input")?,
        yp,
        Some(address(b.0, b.1, "the bias")?),
    )?;
    Ok(CudaStorage::wrap_cuda_slice(y, dev))
}

/// `[dW (out*in) | db (out) | dx (B*in) when input_grad]` from the incoming
/// gradient `g (B, out)`, the input `x`, the weight `w` and, with ReLU, the
/// forward's output `y`.
pub(crate) fn backward(
    g: (&CudaStorage, &Layout),
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    y: Option<(&CudaStorage, &Layout)>,
    dims: (usize, usize, usize),
    input_grad: bool,
) -> candle_core::Result<CudaStorage> {
    let (batch, fan_in, fan_out) = dims;
    let plan_err = |e: crate::Error| candle_core::Error::Msg(e.to_string());
    let dw_plan = linear_weight_grad(batch, fan_in, fan_out).map_err(plan_err)?;
    let dx_plan = linear_input_grad(batch, fan_in, fan_out).map_err(plan_err)?;
    let dev = g.0.device().clone();
    let stream = dev.cuda_stream();
    let (nw, dx_len) = (
        fan_out * fan_in,
        if input_grad { batch * fan_in } else { 0 },
    );
    // SAFETY: every element is written below (dW and dx by the GEMMs, db by
    // the mask kernel).
    let mut out = unsafe { dev.alloc::<f32>(nw + fan_out + dx_len) }?;
    let mut dz = unsafe { dev.alloc::<f32>(batch * fan_out) }?;
    let out_p = out.device_ptr_mut(&stream).0;
    let dz_p = dz.device_ptr_mut(&stream).0;
    let (gp, xp, wp) = (
        address(g.0, g.1, "the gradient")?,
        address(x.0, x.1, "the input")?,
        address(w.0, w.1, "the weight")?,
    );
    let yp = match y {
        Some((s, l)) => address(s, l, "the layer output")?,
        None => 0,
    };
    let db_p = out_p + (nw * 4) as u64;
    let (rows, cols) = (
        u32::try_from(batch).map_err(|e| err("batch", e))?,
        u32::try_from(fan_out).map_err(|e| err("outputs", e))?,
    );
    let func = function(&dev, "redline_relu_mask_bias_grad_f32")
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let mut l = stream.launch_builder(&func);
    l.arg(&gp)
        .arg(&yp)
        .arg(&dz_p)
        .arg(&db_p)
        .arg(&rows)
        .arg(&cols);
    let cfg = LaunchConfig {
        grid_dim: (cols.div_ceil(128), 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: pointer arguments as the kernel declares them: g, y (or 0), dz
    // of rows*cols f32, db of cols f32.
    unsafe { l.launch(cfg) }.map_err(|e| err("mask and bias gradient", e))?;
    gemm(&dev, &dw_plan, xp, dz_p, out_p, None)?;
    if input_grad {
        gemm(
            &dev,
            &dx_plan,
            wp,
            dz_p,
            out_p + ((nw + fan_out) * 4) as u64,
            None,
        )?;
    }
    drop(dz);
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}
