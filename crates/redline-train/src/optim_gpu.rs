//! The optimizer step through Redline's multi-tensor GPU kernel
//! (`redline_kernels::cuda`): every f32 (or, `bf16-true`, every bf16) CUDA
//! parameter the fused CPU kernel declined, updated in place by one launch per 32 parameters, with the
//! state buffers of the generic path ([`TensorState`]) made once and kept.

use candle_core::{DType, Tensor, Var};
use redline_kernels::cuda::{multi_adam, multi_sgd, AdamItem, SgdItem};
use redline_kernels::optim::DeviceHyper;

use crate::error::Result;
use crate::optim::{Slot, StepParams};

/// Updates `pending` (slot, parameter, gradient) with the kernel, unless
/// `found_inf` (the loss scaler's flag, read on the device) is set, and says
/// `true`; says `false`, changing nothing, where the generic path must run
/// instead: parameters not all f32 or all bf16 on a CUDA device, or an SGD momentum
/// buffer that PyTorch would start from this gradient after the first step.
pub(crate) fn step(
    state: &mut [Slot],
    pending: &[(usize, Tensor, Tensor)],
    hyper: &DeviceHyper,
    hp: StepParams,
    step: u64,
    found_inf: Option<&Tensor>,
) -> Result<bool> {
    let dtype = pending.first().map(|(_, p, _)| p.dtype());
    // bf16 (bf16-true): a reduced-precision variant, admitted or not.
    let bf16 = redline_kernels::fused_gpu::reduced_precision();
    let eligible = (dtype == Some(DType::F32) || (bf16 && dtype == Some(DType::BF16)))
        && pending.iter().all(|(_, p, g)| {
            Some(p.dtype()) == dtype && g.dtype() == p.dtype() && p.device().is_cuda()
        });
    let momentum = matches!(hp, StepParams::Sgd(s) if s.momentum != 0.0);
    let fresh_buffers = pending
        .iter()
        .any(|(i, _, _)| state.get(*i).is_some_and(|s| s.generic.a.is_none()));
    if !eligible || (momentum && fresh_buffers && step > 1) {
        return Ok(false);
    }
    // The state buffers, zero before the first step (Adam's moments start
    // at zero; SGD's buffer is set from the gradient by the kernel at step 1).
    let adam = matches!(hp, StepParams::Adam(_));
    let mut buffers: Vec<(Option<Tensor>, Option<Tensor>)> = Vec::with_capacity(pending.len());
    for (i, p, _) in pending {
        let Some(slot) = state.get_mut(*i) else {
            return Ok(false);
        };
        let st = &mut slot.generic;
        let a = (adam || momentum)
            .then(|| ensure(&mut st.a, p))
            .transpose()?;
        let b = adam.then(|| ensure(&mut st.b, p)).transpose()?;
        buffers.push((a, b));
    }
    match hp {
        StepParams::Adam(hp) => {
            let items = pending
                .iter()
                .zip(&buffers)
                .map(|((_, p, g), (m, v))| match (m, v) {
                    (Some(m), Some(v)) => Ok(AdamItem { p, g, m, v }),
                    _ => Err(crate::error::Error::Config(
                        "Adam's moment buffers are missing".into(),
                    )),
                })
                .collect::<Result<Vec<_>>>()?;
            multi_adam(&items, hyper, hp, found_inf)?;
        }
        StepParams::Sgd(hp) => {
            let items: Vec<SgdItem<'_>> = pending
                .iter()
                .zip(&buffers)
                .map(|((_, p, g), (buf, _))| SgdItem {
                    p,
                    g,
                    buf: buf.as_ref(),
                })
                .collect();
            multi_sgd(&items, hyper, hp, found_inf)?;
        }
    }
    Ok(true)
}

/// The buffer in `slot`, made as zeros shaped like `p` when there is none.
fn ensure(slot: &mut Option<Var>, p: &Tensor) -> Result<Tensor> {
    if slot.is_none() {
        *slot = Some(Var::from_tensor(&p.zeros_like()?)?);
    }
    match slot {
        Some(v) => Ok(v.as_tensor().clone()),
        None => Err(crate::error::Error::Config(
            "optimizer state buffer missing".into(),
        )),
    }
}
