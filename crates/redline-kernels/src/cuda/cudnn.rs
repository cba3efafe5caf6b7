//! The convolution's three passes through cuDNN (`--gpu-conv cudnn`), as
//! PyTorch runs them: `cudnnConvolutionForward`, `...BackwardData` (only when
//! the input needs a gradient) and `...BackwardFilter`, on candle's stream.
//!
//! Each shape, dtype, pass and TF32 setting is planned once: descriptors,
//! the algorithm (cuDNN's heuristic order, the first deterministic one that
//! fits [`MAX_WORKSPACE`], so a run repeats bit for bit) and its workspace,
//! allocated then and kept. A captured step (graph mode) therefore neither
//! plans nor allocates: its eager warm-up steps did both.
//!
//! Math: fp32 in full fp32 (`CUDNN_FMA_MATH`: no tensor cores, so no TF32)
//! unless `--matmul-precision high` allows TF32 (`CUDNN_DEFAULT_MATH`);
//! bf16 and fp16 on tensor cores with fp32 accumulation, each output
//! rounded once, as the tensor-core kernels of `cuda/conv_mma.cu`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};
use candle_core::cuda_backend::{CudaDType, CudaDevice, DeviceId};
use candle_core::{CudaStorage, DType, WithDType};

use super::conv::Pass;
use crate::conv_igemm::ConvDims;
use crate::cudnn_ffi::{self as ffi, AlgoPerf, Api, Handle};

/// The most workspace one convolution's algorithm may take.
pub const MAX_WORKSPACE: usize = 256 << 20;

fn msg(e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("conv2d on the GPU through cuDNN: {e}"))
}

/// The loaded cuDNN, or why it is not there.
pub fn api() -> candle_core::Result<&'static Api> {
    ffi::api().map_err(candle_core::Error::Msg)
}

/// Whether cuDNN loads in this process, and its version (e.g. 91300).
pub fn version() -> std::result::Result<usize, String> {
    ffi::api().map(Api::version)
}

/// One shape's descriptors, algorithm and workspace, destroyed when dropped.
struct Plan {
    api: &'static Api,
    /// The input's (`x`) and the output's (`y`) tensor descriptors.
    x: Handle,
    y: Handle,
    /// The weight's filter descriptor.
    w: Handle,
    conv: Handle,
    algo: c_int,
    workspace: Option<CudaSlice<u8>>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        let api = self.api;
        // SAFETY: each descriptor was created by cuDNN and is destroyed once;
        // one that a failed plan never created is null and left alone.
        unsafe {
            for (d, destroy) in [
                (self.x, api.destroy_tensor),
                (self.y, api.destroy_tensor),
                (self.w, api.destroy_filter),
                (self.conv, api.destroy_conv),
            ] {
                if !d.is_null() {
                    destroy(d);
                }
            }
        }
    }
}

/// The sizes, dtype, pass and TF32 setting a plan was made for.
type Key = (ConvDims, DType, Pass, bool);

/// A cuDNN handle on a device's stream and the plans made on it.
struct Dnn {
    api: &'static Api,
    handle: Handle,
    plans: Mutex<HashMap<Key, Plan>>,
}

// SAFETY: a cuDNN handle may be used from any thread with its context
// current; Redline's calls on it are serialised by the `plans` lock and
// candle's one stream per device. The descriptors are plain host objects.
unsafe impl Send for Dnn {}
// SAFETY: as above.
unsafe impl Sync for Dnn {}

static HANDLES: Mutex<Option<HashMap<DeviceId, Arc<Dnn>>>> = Mutex::new(None);

fn handle(dev: &CudaDevice) -> candle_core::Result<Arc<Dnn>> {
    let mut guard = HANDLES.lock().unwrap_or_else(PoisonError::into_inner);
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(h) = map.get(&dev.id()) {
        return Ok(h.clone());
    }
    let api = api()?;
    let stream = dev.cuda_stream();
    stream.context().bind_to_thread().map_err(msg)?;
    let mut h: Handle = std::ptr::null_mut();
    // SAFETY: `h` receives a new handle; the stream is candle's, alive for
    // the device's life, which the handle's entry in HANDLES does not outlive
    // in practice (devices live for the process).
    unsafe {
        api.check((api.create)(&mut h), "cudnnCreate")
            .map_err(msg)?;
        api.check(
            (api.set_stream)(h, stream.cu_stream() as *mut c_void),
            "cudnnSetStream",
        )
        .map_err(msg)?;
    }
    let dnn = Arc::new(Dnn {
        api,
        handle: h,
        plans: Mutex::new(HashMap::new()),
    });
    map.insert(dev.id(), dnn.clone());
    Ok(dnn)
}

/// cuDNN's name for `dtype`.
fn data_type(dtype: DType) -> candle_core::Result<c_int> {
    match dtype {
        DType::F32 => Ok(ffi::data_type::FLOAT),
        DType::BF16 => Ok(ffi::data_type::BFLOAT16),
        DType::F16 => Ok(ffi::data_type::HALF),
        other => Err(msg(format!("no cuDNN convolution for {other:?}"))),
    }
}

fn dim(v: usize) -> candle_core::Result<c_int> {
    c_int::try_from(v).map_err(msg)
}

/// A pass's cuDNN entry points and its name, with the plan's descriptors in
/// the order all three take them: first operand, second operand, output.
/// cuDNN names them forward `(x, w) -> y`, backward data `(w, dy) -> dx`,
/// backward filter `(x, dy) -> dw`.
struct Entry {
    name: &'static str,
    algos: ffi::AlgoV7,
    workspace: ffi::Workspace,
    run: ffi::Run,
    descs: [Handle; 3],
}

impl Plan {
    fn entry(&self, pass: Pass) -> Entry {
        let (api, x, y, w) = (self.api, self.x, self.y, self.w);
        match pass {
            Pass::Forward => Entry {
                name: "cudnnConvolutionForward",
                algos: api.fwd_algos,
                workspace: api.fwd_workspace,
                run: api.forward,
                descs: [x, w, y],
            },
            Pass::InputGrad => Entry {
                name: "cudnnConvolutionBackwardData",
                algos: api.bwd_data_algos,
                workspace: api.bwd_data_workspace,
                run: api.backward_data,
                descs: [w, y, x],
            },
            Pass::WeightGrad => Entry {
                name: "cudnnConvolutionBackwardFilter",
                algos: api.bwd_filter_algos,
                workspace: api.bwd_filter_workspace,
                run: api.backward_filter,
                descs: [x, y, w],
            },
        }
    }
}

impl Dnn {
    /// The algorithms `query` (the heuristics, or `cudnnFind*Algorithm`,
    /// which runs and times them) offers for `pass` of `plan`'s descriptors,
    /// best first, up to 16.
    fn algorithms(
        &self,
        query: ffi::AlgoV7,
        plan: &Plan,
        pass: Pass,
        what: &str,
    ) -> candle_core::Result<Vec<AlgoPerf>> {
        let [in1, in2, out] = plan.entry(pass).descs;
        let mut perf = [AlgoPerf::default(); 16];
        let mut found: c_int = 0;
        let asked = perf.len() as c_int;
        // SAFETY: `perf` holds `asked` results; the plan's descriptors are set.
        let status = unsafe {
            query(
                self.handle,
                in1,
                in2,
                plan.conv,
                out,
                asked,
                &mut found,
                perf.as_mut_ptr(),
            )
        };
        self.api.check(status, what).map_err(msg)?;
        let found = usize::try_from(found).unwrap_or(0).min(perf.len());
        Ok(perf[..found].to_vec())
    }

    /// The plan of `key`, made now if this is its first call.
    fn plan(&self, dev: &CudaDevice, key: Key) -> candle_core::Result<Plan> {
        let api = self.api;
        let (d, dtype, pass, tf32) = key;
        let dt = data_type(dtype)?;
        let check = |s, what| api.check(s, what).map_err(msg);
        let mut plan = Plan {
            api,
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: 0,
            workspace: None,
        };
        let mut sizes = [0 as c_int; 10];
        for (s, v) in sizes.iter_mut().zip([
            d.n,
            d.cin,
            d.h,
            d.w,
            d.cout,
            d.kh,
            d.kw,
            d.pad,
            d.oh(),
            d.ow(),
        ]) {
            *s = dim(v)?;
        }
        let [n, cin, h, w, cout, kh, kw, pad, oh, ow] = sizes;
        let math = match (dtype, tf32) {
            (DType::F32, false) => ffi::math::FMA,
            (DType::F32, true) => ffi::math::DEFAULT,
            _ => ffi::math::TENSOR_OP,
        };
        // SAFETY: each create fills its out-pointer; the setters take the
        // descriptors just created and plain integers (cudnn_graph.h,
        // cudnn_cnn.h). A descriptor created before an error is destroyed by
        // the plan's drop.
        unsafe {
            check((api.create_tensor)(&mut plan.x), "tensor descriptor")?;
            check((api.create_tensor)(&mut plan.y), "tensor descriptor")?;
            check((api.create_filter)(&mut plan.w), "filter descriptor")?;
            check((api.create_conv)(&mut plan.conv), "convolution descriptor")?;
            check(
                (api.set_tensor_4d)(plan.x, ffi::NCHW, dt, n, cin, h, w),
                "input descriptor",
            )?;
            check(
                (api.set_tensor_4d)(plan.y, ffi::NCHW, dt, n, cout, oh, ow),
                "output descriptor",
            )?;
            check(
                (api.set_filter_4d)(plan.w, dt, ffi::NCHW, cout, cin, kh, kw),
                "filter descriptor",
            )?;
            check(
                (api.set_conv_2d)(
                    plan.conv,
                    pad,
                    pad,
                    1,
                    1,
                    1,
                    1,
                    ffi::CROSS_CORRELATION,
                    ffi::data_type::FLOAT,
                ),
                "convolution descriptor",
            )?;
            check((api.set_math_type)(plan.conv, math), "math type")?;
        }
        let e = plan.entry(pass);
        let [in1, in2, out] = e.descs;
        let perf = self.algorithms(e.algos, &plan, pass, "algorithm heuristics")?;
        let found = perf.len();
        let Some(best) = ffi::choose(&perf, MAX_WORKSPACE) else {
            return Err(msg(format!(
                "no deterministic algorithm for {pass:?} of {d:?} in {dtype:?} within {} MiB of \
                 workspace ({found} offered)\nHINT: --gpu-conv redline runs Redline's own kernels",
                MAX_WORKSPACE >> 20
            )));
        };
        if dtype != DType::F32 || tf32 {
            // As PyTorch does: the chosen algorithm's math type. fp32 without
            // TF32 keeps FMA math whatever the heuristics offered.
            // SAFETY: the descriptor is set and the value is cuDNN's own.
            check(
                unsafe { (api.set_math_type)(plan.conv, best.math_type) },
                "math type",
            )?;
        }
        let mut bytes = 0usize;
        // SAFETY: the descriptors and algorithm as for the call itself.
        let status =
            unsafe { (e.workspace)(self.handle, in1, in2, plan.conv, out, best.algo, &mut bytes) };
        check(status, "workspace size")?;
        plan.algo = best.algo;
        if bytes > 0 {
            plan.workspace = Some(dev.alloc_zeros::<u8>(bytes)?);
        }
        Ok(plan)
    }
}

/// `pass` of the convolution of sizes `d` over operands `a` and `b` of
/// element type `T` into `out` (as `cuda::conv`'s kernels take them:
/// forward `(x, w) -> y`, input gradient `(dy, w) -> dx`, weight gradient
/// `(dy, x) -> dw`), each a contiguous range of its storage.
pub(crate) fn run<T: CudaDType + DeviceRepr + WithDType>(
    dev: &CudaDevice,
    (pass, d, tf32): (Pass, ConvDims, bool),
    (s1, r1): (&CudaStorage, (usize, usize)),
    (s2, r2): (&CudaStorage, (usize, usize)),
    out: &mut CudaSlice<T>,
) -> candle_core::Result<()> {
    let dnn = handle(dev)?;
    let api = dnn.api;
    let key = (d, T::DTYPE, pass, tf32 && T::DTYPE == DType::F32);
    let mut plans = dnn.plans.lock().unwrap_or_else(PoisonError::into_inner);
    let plan = match plans.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => e.insert(dnn.plan(dev, key)?),
    };
    let e = plan.entry(pass);
    let [d1, d2, d_out] = e.descs;
    let (conv, algo) = (plan.conv, plan.algo);
    let stream = dev.cuda_stream();
    let a = s1.as_cuda_slice::<T>()?.slice(r1.0..r1.1);
    let b = s2.as_cuda_slice::<T>()?.slice(r2.0..r2.1);
    let (pa, _ga) = a.device_ptr(&stream);
    let (pb, _gb) = b.device_ptr(&stream);
    let (po, _go) = out.device_ptr_mut(&stream);
    let ws_bytes = plan.workspace.as_ref().map_or(0, CudaSlice::len);
    let (pw, _gw) = match plan.workspace.as_mut() {
        Some(ws) => {
            let (p, g) = ws.device_ptr_mut(&stream);
            (p as *mut c_void, Some(g))
        }
        None => (std::ptr::null_mut(), None),
    };
    // The scaling factors are f32 for f32, bf16 and f16 data alike.
    let (alpha, beta) = (1f32, 0f32);
    let (one, zero) = (
        (&alpha as *const f32).cast::<c_void>(),
        (&beta as *const f32).cast::<c_void>(),
    );
    // Forward takes its operands in the op's order (x, w); the gradients
    // take the op's second operand first (w or x, then dy).
    let (p1, p2) = match pass {
        Pass::Forward => (pa, pb),
        Pass::InputGrad | Pass::WeightGrad => (pb, pa),
    };
    // SAFETY: the operands were checked against `d`'s shapes by the caller
    // and match the plan's descriptors (same sizes and dtype); `out` holds
    // the result's elements; the workspace is the plan's own, of `ws_bytes`.
    let status = unsafe {
        (e.run)(
            dnn.handle,
            one,
            d1,
            p1 as *const c_void,
            d2,
            p2 as *const c_void,
            conv,
            algo,
            pw,
            ws_bytes,
            zero,
            d_out,
            po as *mut c_void,
        )
    };
    api.check(status, e.name).map_err(msg)
}

/// One pass's algorithms as `cudnnFind*Algorithm` ran and timed them.
#[derive(Debug, Clone)]
pub struct PassTimes {
    /// `cudnnConvolutionForward`, `...BackwardData` or `...BackwardFilter`.
    pub pass: &'static str,
    /// The algorithm a training step runs: the heuristics' first
    /// deterministic one within [`MAX_WORKSPACE`].
    pub chosen: i32,
    /// Every algorithm cuDNN tried, fastest first (`status` 0: it ran;
    /// `time` in milliseconds).
    pub measured: Vec<AlgoPerf>,
}

/// cuDNN's algorithms for the three passes of the convolution `d` in
/// `dtype` (fp32 in full fp32 math unless `tf32`), each run and timed by
/// `cudnnFind*Algorithm` on memory cuDNN allocates, beside the algorithm a
/// training step runs. For measuring (tests and benchmarks): it synchronises
/// the device, so never call it inside a captured step.
pub fn algorithm_times(
    dev: &CudaDevice,
    d: ConvDims,
    dtype: DType,
    tf32: bool,
) -> candle_core::Result<Vec<PassTimes>> {
    let dnn = handle(dev)?;
    let Some(find) = dnn.api.find else {
        return Err(msg(
            "this cuDNN has no cudnnFind*Algorithm to time algorithms with",
        ));
    };
    let tf32 = tf32 && dtype == DType::F32;
    let passes = [Pass::Forward, Pass::InputGrad, Pass::WeightGrad];
    let mut out = Vec::new();
    for (pass, find) in passes.into_iter().zip(find) {
        let plan = dnn.plan(dev, (d, dtype, pass, tf32))?;
        let measured = dnn.algorithms(find, &plan, pass, "cudnnFind*Algorithm")?;
        out.push(PassTimes {
            pass: plan.entry(pass).name,
            chosen: plan.algo,
            measured,
        });
    }
    Ok(out)
}
