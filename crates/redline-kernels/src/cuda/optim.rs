//! The multi-tensor optimizer kernels' host side: every parameter's update
//! in one launch per [`MAX_TENSORS`] parameters (`cuda/optim.cu`), with the
//! step count and learning rate read from [`DeviceHyper`]'s device memory.
//! The arithmetic and rounding are [`crate::optim_math`]'s, as the generic
//! path's one-op-per-kernel update; for bf16 parameters (`bf16-true`), the
//! CPU's bf16 loop's (`optim_bf16.rs`: PyTorch's bf16 rounding, with the
//! per-step constants in f32).

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::{function, Addresses};
use crate::error::{Error, Result};
use crate::multi_tensor::{pack, BLOCK_THREADS, CHUNK, MAX_TENSORS};
use crate::multi_tensor_args::{tensor_list, AdamHyper, SgdHyper, TensorList};
use crate::optim::{AdamStep, DeviceHyper, SgdStep};

// SAFETY: plain `repr(C)` data with the layout of the kernels' structs.
unsafe impl DeviceRepr for TensorList {}
// SAFETY: as above.
unsafe impl DeviceRepr for AdamHyper {}
// SAFETY: as above.
unsafe impl DeviceRepr for SgdHyper {}

/// One parameter's Adam update: the parameter, its gradient and moments,
/// all contiguous f32, or all bf16, on one CUDA device; `m` and `v` zero
/// before the first step.
#[derive(Debug, Clone, Copy)]
pub struct AdamItem<'a> {
    /// Parameter, updated in place.
    pub p: &'a Tensor,
    /// Gradient.
    pub g: &'a Tensor,
    /// First moment, updated in place.
    pub m: &'a Tensor,
    /// Second moment, updated in place.
    pub v: &'a Tensor,
}

/// One parameter's SGD update.
#[derive(Debug, Clone, Copy)]
pub struct SgdItem<'a> {
    /// Parameter, updated in place.
    pub p: &'a Tensor,
    /// Gradient.
    pub g: &'a Tensor,
    /// Momentum buffer, updated in place; required with momentum, else unused.
    pub buf: Option<&'a Tensor>,
}

/// Checks that each item's tensors have the parameter's element count.
fn check_sizes(sizes: &[[usize; 4]], what: &str) -> Result<Vec<usize>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if s.iter().all(|&n| n == s[0]) {
                Ok(s[0])
            } else {
                Err(Error::Shape(format!(
                    "{what}: parameter {i} has {} elements but its gradient/state has {:?}",
                    s[0],
                    &s[1..]
                )))
            }
        })
        .collect()
}

/// The kernel `<name>_f32` or `<name>_bf16` for the first tensor's dtype
/// (every tensor must have it: [`Addresses::lock`] checks).
fn kernel_for(name: &str, tensors: &[&Tensor]) -> Result<(String, DType)> {
    match tensors.first().map(|t| t.dtype()) {
        Some(DType::BF16) => Ok((format!("{name}_bf16"), DType::BF16)),
        Some(DType::F32) | None => Ok((format!("{name}_f32"), DType::F32)),
        Some(other) => Err(Error::Shape(format!(
            "{name}: parameters of {other:?}; the fused kernels take f32 or bf16"
        ))),
    }
}

/// Launches `name`'s kernel for the tensors' dtype once per packed group of
/// items (`tensors` holds `per_item` tensors per item: p, g, then the state
/// buffers).
fn launch_all<H: DeviceRepr>(
    dev: &candle_core::CudaDevice,
    name: &str,
    tensors: &[&Tensor],
    per_item: usize,
    sizes: &[usize],
    hyper: H,
) -> Result<()> {
    let (kernel, dtype) = kernel_for(name, tensors)?;
    let kernel = kernel.as_str();
    let locked = Addresses::lock(tensors, dtype, kernel)?;
    let stream = dev.cuda_stream();
    let ptrs = locked.pointers(&stream)?;
    let func = function(dev, kernel)?;
    let chunk = CHUNK as u64;
    for launch in pack(sizes, CHUNK, MAX_TENSORS)? {
        let list = tensor_list(&launch, &ptrs, per_item, sizes);
        let cfg = LaunchConfig {
            grid_dim: (launch.blocks(), 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&func);
        b.arg(&list).arg(&hyper).arg(&chunk);
        // SAFETY: the argument structs match the kernel's (size-checked
        // above); every address is a live, contiguous buffer of `n`
        // elements of the kernel's dtype, held locked by `locked` until
        // after the launch.
        unsafe { b.launch(cfg) }.map_err(|e| Error::Gpu(format!("{kernel}: {e}")))?;
    }
    drop(locked);
    Ok(())
}

/// The addresses of the device-held step count and learning rate.
fn hyper_addresses(hyper: &DeviceHyper, dev: &candle_core::CudaDevice) -> Result<(u64, u64)> {
    let (step, lr) = hyper.values();
    let locked = Addresses::lock(&[step, lr], DType::F64, "optimizer step count")?;
    let p = locked.pointers(&dev.cuda_stream())?;
    Ok((p[0], p[1]))
}

/// The address of the loss scaler's overflow flag (a one-element f32 on
/// the device), or 0 without one.
fn flag_address(found_inf: Option<&Tensor>, dev: &candle_core::CudaDevice) -> Result<u64> {
    let Some(flag) = found_inf else {
        return Ok(0);
    };
    if flag.elem_count() != 1 {
        return Err(Error::Shape(format!(
            "the overflow flag has shape {:?}; one value is needed",
            flag.dims()
        )));
    }
    let locked = Addresses::lock(&[flag], DType::F32, "the loss scaler's overflow flag")?;
    let p = locked.pointers(&dev.cuda_stream())?;
    Ok(p[0])
}

/// Adam/AdamW on every item in one launch per [`MAX_TENSORS`] items, at the
/// step `hyper` holds (advanced before the call, as the generic path's),
/// changing nothing where `found_inf` (the loss scaler's f32 flag, read on
/// the device) is non-zero.
pub fn multi_adam(
    items: &[AdamItem<'_>],
    hyper: &DeviceHyper,
    hp: AdamStep,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    let Some(first) = items.first() else {
        return Ok(());
    };
    let candle_core::Device::Cuda(dev) = first.p.device() else {
        return Err(Error::Shape("multi_adam runs on a CUDA device".into()));
    };
    let sizes = check_sizes(
        &items
            .iter()
            .map(|i| {
                [
                    i.p.elem_count(),
                    i.g.elem_count(),
                    i.m.elem_count(),
                    i.v.elem_count(),
                ]
            })
            .collect::<Vec<_>>(),
        "multi_adam",
    )?;
    let tensors: Vec<&Tensor> = items.iter().flat_map(|i| [i.p, i.g, i.m, i.v]).collect();
    let (step, lr) = hyper_addresses(hyper, dev)?;
    let skip = flag_address(found_inf, dev)?;
    launch_all(
        dev,
        "redline_multi_adam",
        &tensors,
        4,
        &sizes,
        AdamHyper::new(hp, step, lr).skipping(skip),
    )
}

/// SGD (momentum, dampening, Nesterov, L2) on every item in one launch per
/// [`MAX_TENSORS`] items, skipped as [`multi_adam`] is.
pub fn multi_sgd(
    items: &[SgdItem<'_>],
    hyper: &DeviceHyper,
    hp: SgdStep,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    let Some(first) = items.first() else {
        return Ok(());
    };
    let candle_core::Device::Cuda(dev) = first.p.device() else {
        return Err(Error::Shape("multi_sgd runs on a CUDA device".into()));
    };
    let momentum = hp.momentum != 0.0;
    if momentum && items.iter().any(|i| i.buf.is_none()) {
        return Err(Error::Shape(
            "multi_sgd: SGD with momentum needs every parameter's buffer".into(),
        ));
    }
    let sizes = check_sizes(
        &items
            .iter()
            .map(|i| {
                let n = i.p.elem_count();
                let buf = i.buf.filter(|_| momentum).map_or(n, Tensor::elem_count);
                [n, i.g.elem_count(), buf, n]
            })
            .collect::<Vec<_>>(),
        "multi_sgd",
    )?;
    let tensors: Vec<&Tensor> = items
        .iter()
        .flat_map(|i| [Some(i.p), Some(i.g), i.buf.filter(|_| momentum)])
        .flatten()
        .collect();
    let (step, lr) = hyper_addresses(hyper, dev)?;
    let hyper = SgdHyper::new(hp, step, lr).skipping(flag_address(found_inf, dev)?);
    let per_item = if momentum { 3 } else { 2 };
    launch_all(dev, "redline_multi_sgd", &tensors, per_item, &sizes, hyper)
}
