//! The part of cuDNN's C API that the GPU convolution uses (`--gpu-conv
//! cudnn`), loaded at run time from `libcudnn.so.9`.
//!
//! Loaded, not linked: candle links the CUDA libraries it uses at build time
//! (cudarc's `dynamic-linking`), and cudarc's cuDNN bindings would then make
//! every CUDA build of Redline need cuDNN to start, where most runs never
//! call it. A run that asks for cuDNN where it is missing gets an error that
//! says so. The declarations follow `cudnn_graph.h`, `cudnn_cnn.h` and
//! `cudnn_ops.h` of cuDNN 9 (the legacy convolution API, which
//! `libcudnn.so.9` still exports and PyTorch still calls); the struct layout
//! and enum values match cudarc 0.19's bindgen output of the same headers.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// `cudnnStatus_t`: 0 is success.
pub type Status = c_int;
/// An opaque cuDNN object (handle or descriptor).
pub type Handle = *mut c_void;

/// `cudnnDataType_t` values.
pub mod data_type {
    /// `CUDNN_DATA_FLOAT`.
    pub const FLOAT: i32 = 0;
    /// `CUDNN_DATA_HALF`.
    pub const HALF: i32 = 2;
    /// `CUDNN_DATA_BFLOAT16`.
    pub const BFLOAT16: i32 = 9;
}

/// `CUDNN_TENSOR_NCHW`.
pub const NCHW: i32 = 0;
/// `CUDNN_CROSS_CORRELATION`: PyTorch's (and candle's) convolution.
pub const CROSS_CORRELATION: i32 = 1;
/// `CUDNN_DETERMINISTIC`.
pub const DETERMINISTIC: i32 = 1;

/// `cudnnMathType_t` values.
pub mod math {
    /// `CUDNN_DEFAULT_MATH`: tensor cores where the data type allows (TF32
    /// for fp32 data).
    pub const DEFAULT: i32 = 0;
    /// `CUDNN_TENSOR_OP_MATH`: tensor cores for 16-bit data.
    pub const TENSOR_OP: i32 = 1;
    /// `CUDNN_FMA_MATH`: no tensor cores, so no TF32: full fp32 products.
    pub const FMA: i32 = 3;
}

/// `cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t` (one layout for the
/// three; `algo` is the pass's algorithm enum).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AlgoPerf {
    /// The algorithm.
    pub algo: c_int,
    /// Whether it can run these descriptors (0: yes).
    pub status: Status,
    /// Measured time (heuristics leave -1).
    pub time: f32,
    /// Workspace bytes it needs.
    pub memory: usize,
    /// [`DETERMINISTIC`] or not.
    pub determinism: c_int,
    /// The math type it runs with.
    pub math_type: c_int,
    reserved: [c_int; 3],
}

type Create = unsafe extern "C" fn(*mut Handle) -> Status;
type Destroy = unsafe extern "C" fn(Handle) -> Status;
type Tensor4d = unsafe extern "C" fn(Handle, c_int, c_int, c_int, c_int, c_int, c_int) -> Status;
type Conv2d =
    unsafe extern "C" fn(Handle, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int) -> Status;
/// `cudnnGetConvolution*Algorithm_v7(handle, in1, in2, conv, out, asked, &found, perf)`.
pub type AlgoV7 = unsafe extern "C" fn(
    Handle,
    Handle,
    Handle,
    Handle,
    Handle,
    c_int,
    *mut c_int,
    *mut AlgoPerf,
) -> Status;
/// `cudnnGetConvolution*WorkspaceSize(handle, in1, in2, conv, out, algo, &bytes)`.
pub type Workspace =
    unsafe extern "C" fn(Handle, Handle, Handle, Handle, Handle, c_int, *mut usize) -> Status;
/// `cudnnConvolution*(handle, alpha, in1_desc, in1, in2_desc, in2, conv, algo, ws, ws_bytes,
/// beta, out_desc, out)`.
pub type Run = unsafe extern "C" fn(
    Handle,
    *const c_void,
    Handle,
    *const c_void,
    Handle,
    *const c_void,
    Handle,
    c_int,
    *mut c_void,
    usize,
    *const c_void,
    Handle,
    *mut c_void,
) -> Status;

/// The entry points, resolved once from the loaded library.
pub struct Api {
    _lib: libloading::Library,
    /// `cudnnGetVersion`.
    pub get_version: unsafe extern "C" fn() -> usize,
    /// `cudnnGetErrorString`.
    pub error_string: unsafe extern "C" fn(Status) -> *const c_char,
    /// `cudnnCreate`.
    pub create: Create,
    /// `cudnnDestroy`.
    pub destroy: Destroy,
    /// `cudnnSetStream(handle, cudaStream_t)`.
    pub set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    /// `cudnnCreateTensorDescriptor`.
    pub create_tensor: Create,
    /// `cudnnSetTensor4dDescriptor(desc, format, dtype, n, c, h, w)`.
    pub set_tensor_4d: Tensor4d,
    /// `cudnnDestroyTensorDescriptor`.
    pub destroy_tensor: Destroy,
    /// `cudnnCreateFilterDescriptor`.
    pub create_filter: Create,
    /// `cudnnSetFilter4dDescriptor(desc, dtype, format, k, c, h, w)`.
    pub set_filter_4d: Tensor4d,
    /// `cudnnDestroyFilterDescriptor`.
    pub destroy_filter: Destroy,
    /// `cudnnCreateConvolutionDescriptor`.
    pub create_conv: Create,
    /// `cudnnSetConvolution2dDescriptor(desc, pad_h, pad_w, u, v, dil_h,
    /// dil_w, mode, compute type)`.
    pub set_conv_2d: Conv2d,
    /// `cudnnSetConvolutionMathType`.
    pub set_math_type: unsafe extern "C" fn(Handle, c_int) -> Status,
    /// `cudnnDestroyConvolutionDescriptor`.
    pub destroy_conv: Destroy,
    /// `cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, conv, y, ...)`.
    pub fwd_algos: AlgoV7,
    /// `cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, dy, conv, dx, ...)`.
    pub bwd_data_algos: AlgoV7,
    /// `cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, dy, conv, dw, ...)`.
    pub bwd_filter_algos: AlgoV7,
    /// `cudnnGetConvolutionForwardWorkspaceSize`.
    pub fwd_workspace: Workspace,
    /// `cudnnGetConvolutionBackwardDataWorkspaceSize`.
    pub bwd_data_workspace: Workspace,
    /// `cudnnGetConvolutionBackwardFilterWorkspaceSize`.
    pub bwd_filter_workspace: Workspace,
    /// `cudnnConvolutionForward(h, alpha, x_desc, x, w_desc, w, conv, algo,
    /// ws, ws_bytes, beta, y_desc, y)`.
    pub forward: Run,
    /// `cudnnConvolutionBackwardData(h, alpha, w_desc, w, dy_desc, dy, conv,
    /// algo, ws, ws_bytes, beta, dx_desc, dx)`.
    pub backward_data: Run,
    /// `cudnnConvolutionBackwardFilter(h, alpha, x_desc, x, dy_desc, dy,
    /// conv, algo, ws, ws_bytes, beta, dw_desc, dw)`.
    pub backward_filter: Run,
    /// `cudnnFindConvolution{Forward,BackwardData,BackwardFilter}Algorithm`
    /// (the `_v7` queries' arguments; each algorithm run and timed on memory
    /// cuDNN allocates), where the library has them: used only to measure
    /// (`cuda::cudnn::algorithm_times`), never by a training step.
    pub find: Option<[AlgoV7; 3]>,
}

/// The library names tried, in order.
pub const LIBRARIES: [&str; 2] = ["libcudnn.so.9", "libcudnn.so"];

/// cuDNN, loaded at the first call; the error says what was missing and what
/// to do, every time it is asked.
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| load(&LIBRARIES))
        .as_ref()
        .map_err(Clone::clone)
}

/// cuDNN from the first of `names` that loads.
pub fn load(names: &[&str]) -> Result<Api, String> {
    let mut tried = Vec::new();
    for name in names {
        // SAFETY: loading cuDNN runs its initialisers, which have no
        // preconditions.
        match unsafe { libloading::Library::new(*name) } {
            Ok(lib) => return resolve(lib, name),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "cuDNN was not found ({}).\nHINT: install cuDNN 9 (`pip install nvidia-cudnn-cu13` puts \
         it under site-packages/nvidia/cudnn/lib) and add its lib folder to LD_LIBRARY_PATH, or \
         leave the convolutions to Redline's kernels (--gpu-conv redline)",
        tried.join("; ")
    ))
}

fn resolve(lib: libloading::Library, name: &str) -> Result<Api, String> {
    macro_rules! sym {
        ($s:literal) => {
            // SAFETY: the symbol's type is its cuDNN 9 declaration (above).
            *unsafe { lib.get(concat!($s, "\0").as_bytes()) }
                .map_err(|e| format!("{name} has no {}: {e} (cuDNN 9 is needed)", $s))?
        };
    }
    Ok(Api {
        get_version: sym!("cudnnGetVersion"),
        error_string: sym!("cudnnGetErrorString"),
        create: sym!("cudnnCreate"),
        destroy: sym!("cudnnDestroy"),
        set_stream: sym!("cudnnSetStream"),
        create_tensor: sym!("cudnnCreateTensorDescriptor"),
        set_tensor_4d: sym!("cudnnSetTensor4dDescriptor"),
        destroy_tensor: sym!("cudnnDestroyTensorDescriptor"),
        create_filter: sym!("cudnnCreateFilterDescriptor"),
        set_filter_4d: sym!("cudnnSetFilter4dDescriptor"),
        destroy_filter: sym!("cudnnDestroyFilterDescriptor"),
        create_conv: sym!("cudnnCreateConvolutionDescriptor"),
        set_conv_2d: sym!("cudnnSetConvolution2dDescriptor"),
        set_math_type: sym!("cudnnSetConvolutionMathType"),
        destroy_conv: sym!("cudnnDestroyConvolutionDescriptor"),
        fwd_algos: sym!("cudnnGetConvolutionForwardAlgorithm_v7"),
        bwd_data_algos: sym!("cudnnGetConvolutionBackwardDataAlgorithm_v7"),
        bwd_filter_algos: sym!("cudnnGetConvolutionBackwardFilterAlgorithm_v7"),
        fwd_workspace: sym!("cudnnGetConvolutionForwardWorkspaceSize"),
        bwd_data_workspace: sym!("cudnnGetConvolutionBackwardDataWorkspaceSize"),
        bwd_filter_workspace: sym!("cudnnGetConvolutionBackwardFilterWorkspaceSize"),
        forward: sym!("cudnnConvolutionForward"),
        backward_data: sym!("cudnnConvolutionBackwardData"),
        backward_filter: sym!("cudnnConvolutionBackwardFilter"),
        find: find(&lib),
        _lib: lib,
    })
}

impl Api {
    /// `status` as a result, with cuDNN's own words for a failure.
    pub fn check(&self, status: Status, what: &str) -> Result<(), String> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: cudnnGetErrorString returns a static C string for any status.
        let text = unsafe { CStr::from_ptr((self.error_string)(status)) };
        Err(format!(
            "cuDNN {what}: {} ({status})",
            text.to_string_lossy()
        ))
    }

    /// The loaded cuDNN's version, e.g. 91300 for 9.13.0.
    pub fn version(&self) -> usize {
        // SAFETY: no arguments, no preconditions.
        unsafe { (self.get_version)() }
    }
}

/// The three `cudnnFind*Algorithm` entry points, or `None` where the
/// library lacks any of them (they are optional: only measuring uses them).
fn find(lib: &libloading::Library) -> Option<[AlgoV7; 3]> {
    let get = |name: &[u8]| {
        // SAFETY: the symbol's type is its cuDNN 9 declaration, the `_v7`
        // queries' (cudnn_cnn.h).
        unsafe { lib.get::<AlgoV7>(name) }.ok().map(|f| *f)
    };
    Some([
        get(b"cudnnFindConvolutionForwardAlgorithm\0")?,
        get(b"cudnnFindConvolutionBackwardDataAlgorithm\0")?,
        get(b"cudnnFindConvolutionBackwardFilterAlgorithm\0")?,
    ])
}

/// The algorithm to run from `perf` (cuDNN's heuristic order, best first):
/// the first that can run these descriptors, is deterministic (so a run
/// repeats bit for bit, as Redline's own kernels do) and fits in
/// `max_workspace` bytes; `None` if none does.
pub fn choose(perf: &[AlgoPerf], max_workspace: usize) -> Option<AlgoPerf> {
    perf.iter()
        .copied()
        .find(|p| p.status == 0 && p.determinism == DETERMINISTIC && p.memory <= max_workspace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_perf_struct_has_cudnns_layout() {
        // cudnn_cnn.h: int, int, float, size_t, int, int, int[3] = 48 bytes
        // on a 64-bit target, `memory` at 16.
        assert_eq!(std::mem::size_of::<AlgoPerf>(), 48);
        assert_eq!(std::mem::offset_of!(AlgoPerf, memory), 16);
        assert_eq!(std::mem::offset_of!(AlgoPerf, math_type), 28);
    }

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let Err(e) = load(&["libcudnn-that-is-not-here.so.9"]) else {
            panic!("a library that does not exist loaded");
        };
        assert!(e.contains("cuDNN was not found"), "{e}");
        assert!(e.contains("libcudnn-that-is-not-here.so.9"), "{e}");
        assert!(e.contains("--gpu-conv redline"), "{e}");
    }

    #[test]
    fn the_choice_is_the_first_runnable_deterministic_algorithm_that_fits() {
        let p = |algo, status, memory, determinism| AlgoPerf {
            algo,
            status,
            memory,
            determinism,
            ..AlgoPerf::default()
        };
        let perf = [
            p(0, 0, 0, 0),       // fastest, but not deterministic
            p(1, 9, 0, 1),       // cannot run these descriptors
            p(2, 0, 1 << 30, 1), // needs too much workspace
            p(3, 0, 4096, 1),
            p(4, 0, 0, 1),
        ];
        assert_eq!(choose(&perf, 1 << 20).map(|a| a.algo), Some(3));
        assert_eq!(choose(&perf, 1 << 31).map(|a| a.algo), Some(2));
        assert_eq!(choose(&perf[..3], 1 << 20).map(|a| a.algo), None);
    }
}
