//! Redline core: the one place that talks to candle's device APIs.
//!
//! * [`Device`] / [`DeviceSpec`]: which accelerator a run uses (`auto | cpu | cuda:N`).
//! * [`Precision`]: the dtype policy (one place picks parameter and compute dtypes).
//! * [`MatmulPrecision`]: fp32 or TF32 matrix products on a GPU (`--matmul-precision`).
//! * [`files`]: inputs read only from regular files within a limit, outputs written whole
//!   only to regular files, safe path components from names.
//! * [`host`]: every read of a tensor back to the host goes through here and is counted.
//! * [`threads`]: the process's one thread policy (compute threads = free cores).
//! * [`memory`]: device memory stats, pool trim (`empty_cache`), out-of-memory recognition.
//! * [`peak`]: a device's peak FLOP/s (GPU data sheets, `--peak-flops`), MFU's denominator.
//! * [`system`]: discovery of the machine's devices for `redline devices`.
//! * [`text`]: user and file text clipped to a width before it is printed.
//! * [`trace`]: detailed spans and per-op counts for `--profiler detailed`.

#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
mod dtype;
mod error;
pub mod files;
pub mod host;
pub mod host_alloc;
mod matmul;
pub mod memory;
pub mod peak;
pub mod system;
pub mod text;
pub mod threads;
pub mod time;
pub mod trace;

pub use device::{select, Device, DeviceSpec, GpuAvailability, CUDA_BUILD_HINT};
pub use dtype::Precision;
pub use error::{Error, Result};
pub use matmul::{matmul_precision, set_matmul_precision, MatmulPrecision};

/// Re-export of candle's tensor types so downstream crates name one version.
pub use candle_core::{DType, Tensor};
