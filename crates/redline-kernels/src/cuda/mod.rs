//! Redline's own GPU kernels (the `cuda` feature): `cuda/*.cu`, compiled by
//! nvcc at build time into one fatbin (machine code for `CUDA_COMPUTE_CAP`
//! and its PTX), embedded here and loaded once per device, so no run
//! compiles them.

pub(crate) mod attention;
pub(crate) mod conv;
pub mod cudnn;
mod gather;
mod graph;
pub(crate) mod linear;
pub(crate) mod loss;
mod optim;
pub(crate) mod pool;
mod tally;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice, DeviceId};
use candle_core::{DType, Storage, Tensor};

pub use gather::cursor_gather;
pub use graph::graph_node_kinds;
pub use optim::{multi_adam, multi_sgd, AdamItem, SgdItem};
pub use tally::{count_up, step_sums};

use crate::error::{Error, Result};

static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/redline_kernels.fatbin"));

/// The loaded fatbin of each device that used it.
static MODULES: Mutex<Option<HashMap<DeviceId, Arc<CudaModule>>>> = Mutex::new(None);

/// Kernel `name` of the fatbin, loaded on `dev` at first use.
pub(crate) fn function(dev: &CudaDevice, name: &str) -> Result<CudaFunction> {
    let module = {
        let mut guard = MODULES.lock().unwrap_or_else(PoisonError::into_inner);
        let map = guard.get_or_insert_with(HashMap::new);
        match map.get(&dev.id()) {
            Some(m) => m.clone(),
            None => {
                let m = dev
                    .cuda_stream()
                    .context()
                    .load_module(Ptx::from_binary(FATBIN.to_vec()))
                    .map_err(|e| Error::Gpu(format!("loading Redline's kernels: {e}")))?;
                map.insert(dev.id(), m.clone());
                m
            }
        }
    };
    module
        .load_function(name)
        .map_err(|e| Error::Gpu(format!("kernel {name}: {e}")))
}

/// Adds `splits` f32 partial sums of `count` values each (split `z` at
/// `partial[z * count..]`) in order into the `count` values at device address
/// `out`, with `redline_sum_splits_{suffix}`: `f32`, or `bf16` / `f16` (each
/// sum rounded once). The split weight gradients (convolution, linear layer)
/// and the CNN block's bias gradient end with it; the order of the sums, so
/// their bits, is fixed.
pub(crate) fn sum_splits(
    dev: &CudaDevice,
    suffix: &str,
    partial: &CudaSlice<f32>,
    out: u64,
    (splits, count): (u32, u32),
) -> candle_core::Result<()> {
    let gpu = |e: &dyn std::fmt::Display| candle_core::Error::Msg(format!("sum of splits: {e}"));
    if partial.len() != splits as usize * count as usize {
        return Err(gpu(&format!(
            "{} partial values for {splits} splits of {count}",
            partial.len()
        )));
    }
    let func = function(dev, &format!("redline_sum_splits_{suffix}")).map_err(|e| gpu(&e))?;
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    b.arg(partial).arg(&out).arg(&splits).arg(&count);
    let cfg = LaunchConfig {
        grid_dim: (count.div_ceil(256).clamp(1, 65_535), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `partial` holds splits * count f32 (checked); `out` addresses
    // `count` values of the suffix's type, kept alive by the caller until the
    // stream has run this.
    unsafe { b.launch(cfg) }.map_err(|e| gpu(&e))?;
    Ok(())
}

/// The address of `s`'s element `offset`, in stream order on `stream`.
pub(crate) fn address(s: &CudaStorage, offset: usize, stream: &Arc<CudaStream>) -> u64 {
    let (ptr, size) = match &s.slice {
        CudaStorageSlice::U8(v) => (v.device_ptr(stream).0, 1),
        CudaStorageSlice::U32(v) => (v.device_ptr(stream).0, 4),
        CudaStorageSlice::I16(v) => (v.device_ptr(stream).0, 2),
        CudaStorageSlice::I32(v) => (v.device_ptr(stream).0, 4),
        CudaStorageSlice::I64(v) => (v.device_ptr(stream).0, 8),
        CudaStorageSlice::BF16(v) => (v.device_ptr(stream).0, 2),
        CudaStorageSlice::F16(v) => (v.device_ptr(stream).0, 2),
        CudaStorageSlice::F32(v) => (v.device_ptr(stream).0, 4),
        CudaStorageSlice::F64(v) => (v.device_ptr(stream).0, 8),
        CudaStorageSlice::F8E4M3(v) => (v.device_ptr(stream).0, 1),
        CudaStorageSlice::F6E2M3(v)
        | CudaStorageSlice::F6E3M2(v)
        | CudaStorageSlice::F4(v)
        | CudaStorageSlice::F8E8M0(v) => (v.device_ptr(stream).0, 1),
    };
    ptr + (offset * size) as u64
}

/// Device addresses of tensors, valid while the value lives: it holds the
/// tensors' storage locks.
pub(crate) struct Addresses<'t> {
    /// candle's storage read guards (their lock type is candle's own).
    guards: Vec<(Guard<'t>, &'t candle_core::Layout)>,
}

type Guard<'t> = Box<dyn std::ops::Deref<Target = Storage> + 't>;

impl<'t> Addresses<'t> {
    /// Locks the storage of `tensors`, each contiguous, of `dtype` (f32 or
    /// f64), on a CUDA device.
    pub(crate) fn lock(tensors: &[&'t Tensor], dtype: DType, what: &str) -> Result<Self> {
        let mut guards = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if t.dtype() != dtype {
                return Err(Error::Shape(format!(
                    "{what}: tensor {i} is {:?}; the fused kernel takes {dtype:?}",
                    t.dtype()
                )));
            }
            let (storage, layout) = t.storage_and_layout();
            if !layout.is_contiguous() {
                return Err(Error::Shape(format!(
                    "{what}: tensor {i} ({:?}) is not contiguous",
                    t.dims()
                )));
            }
            guards.push((Box::new(storage) as Guard<'t>, layout));
        }
        Ok(Self { guards })
    }

    /// The address of each tensor's first element, read in stream order on
    /// `stream`.
    pub(crate) fn pointers(&self, stream: &Arc<CudaStream>) -> Result<Vec<u64>> {
        self.guards
            .iter()
            .map(|(storage, layout)| {
                let Storage::Cuda(cs) = &***storage else {
                    return Err(Error::Shape(
                        "a fused GPU kernel got a tensor off the GPU".into(),
                    ));
                };
                // The records cudarc keeps for other streams are not needed:
                // the kernels run on the stream candle's ops use.
                Ok(address(cs, layout.start_offset(), stream))
            })
            .collect()
    }
}
