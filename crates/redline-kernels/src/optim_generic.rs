//! The generic optimizer path: candle tensor ops on any device and dtype, with
//! the arithmetic of [`optim_math`] (the fused CPU loop's, PyTorch's order).
//!
//! It is written so that a whole training step can be captured once as a CUDA
//! graph and replayed: the moments and momentum buffers are updated in place
//! (they keep their device addresses), and everything that changes from step
//! to step (the step count and the learning rate, and the constants derived
//! from them) is read from device memory ([`DeviceHyper`]), never uploaded
//! from the host inside the step.

use candle_core::{DType, Tensor, Var};

use crate::error::Result;
use crate::optim::{AdamStep, SgdStep};
use crate::optim_math::{self, AdamConsts, SgdConsts};

/// The generic (tensor-op) path's state of one parameter. Each buffer is
/// created at the first step and then updated in place (`Var::set`), so it
/// keeps its device address from step to step, as a captured CUDA graph needs.
#[derive(Debug, Clone, Default)]
pub struct TensorState {
    /// First moment (Adam) or momentum buffer (SGD).
    pub a: Option<Var>,
    /// Second moment (Adam).
    pub b: Option<Var>,
}

/// Stores `value` in `slot`: in place when the buffer exists, else a new one.
fn keep(slot: &mut Option<Var>, value: &Tensor) -> Result<()> {
    match slot {
        Some(var) => var.set(value)?,
        None => *slot = Some(Var::from_tensor(&value.copy()?)?),
    }
    Ok(())
}

/// The generic path's per-step hyperparameters, held on the parameters'
/// device: the step count and the learning rate as f64 scalars. The step's
/// constants (Adam's step size and bias correction, AdamW's decay factor,
/// SGD's learning rate) are computed from them by device ops, so a step
/// captured once as a CUDA graph reads them from device memory at every
/// replay. A learning-rate change is one write ([`DeviceHyper::set_lr`]) and
/// needs no new capture.
#[derive(Debug)]
pub struct DeviceHyper {
    step: Var,
    lr: Var,
    lr_host: f64,
}

impl DeviceHyper {
    /// `steps` steps taken so far, learning rate `lr`, on `device`.
    pub fn new(device: &candle_core::Device, lr: f64, steps: u64) -> Result<Self> {
        Ok(Self {
            step: Var::from_tensor(&Tensor::new(steps as f64, device)?)?,
            lr: Var::from_tensor(&Tensor::new(lr, device)?)?,
            lr_host: lr,
        })
    }

    /// Writes a new learning rate (nothing when it is unchanged).
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        if lr.to_bits() != self.lr_host.to_bits() {
            self.lr.set(&Tensor::new(lr, self.lr.device())?)?;
            self.lr_host = lr;
        }
        Ok(())
    }

    /// Counts one more step, on the device.
    pub fn advance(&self) -> Result<()> {
        self.step.set(&self.step.as_tensor().affine(1.0, 1.0)?)?;
        Ok(())
    }

    /// The step count and learning rate as the device holds them (0-d f64),
    /// for kernels that read them at every launch.
    #[cfg(feature = "cuda")]
    pub(crate) fn values(&self) -> (&Tensor, &Tensor) {
        (self.step.as_tensor(), self.lr.as_tensor())
    }

    /// The step count, read back (a device sync; for tests and checkpoints).
    pub fn steps(&self) -> Result<u64> {
        Ok(self.step.as_tensor().to_scalar::<f64>()? as u64)
    }

    /// Adam's constants of the current step for parameters of `dtype`:
    /// computed in f64, rounded to f32 (as the fused loop's), then to `dtype`.
    pub fn adam(&self, hp: AdamStep, dtype: DType) -> Result<AdamConsts<Tensor>> {
        let (b1, b2) = hp.betas;
        let t = self.step.as_tensor();
        let round = |x: Tensor| -> Result<Tensor> { Ok(x.to_dtype(DType::F32)?.to_dtype(dtype)?) };
        // 1 - beta^t as 1 - exp(t ln beta): f64, so the f32 result matches the host's powi.
        let one_minus_pow = |beta: f64| -> Result<Tensor> {
            Ok(t.affine(beta.ln(), 0.0)?.exp()?.affine(-1.0, 1.0)?)
        };
        let step_size = round(self.lr.as_tensor().div(&one_minus_pow(b1)?)?)?;
        let bc2_sqrt = round(one_minus_pow(b2)?.sqrt()?)?;
        let decay = if hp.decoupled && hp.weight_decay != 0.0 {
            Some(round(self.lr.as_tensor().affine(-hp.weight_decay, 1.0)?)?)
        } else {
            None
        };
        Ok(AdamConsts::from_parts(hp, step_size, bc2_sqrt, decay))
    }

    /// SGD's constants for parameters of `dtype` (the learning rate read on the device).
    pub fn sgd(&self, hp: SgdStep, dtype: DType) -> Result<SgdConsts<Tensor>> {
        let lr = self.lr.as_tensor().to_dtype(DType::F32)?.to_dtype(dtype)?;
        Ok(SgdConsts::with_lr(hp, lr))
    }
}

/// One Adam/AdamW update from candle tensor ops, for devices and dtypes the
/// fused kernel does not cover: the same arithmetic ([`optim_math::adam`]).
/// Returns the new parameter; `p` and `g` must be detached. The moments are
/// updated in place.
pub fn adam_tensors(
    p: &Tensor,
    g: &Tensor,
    st: &mut TensorState,
    c: &AdamConsts<Tensor>,
) -> Result<Tensor> {
    let state = |slot: &Option<Var>| match slot {
        Some(v) => Ok(v.as_tensor().clone()),
        None => p.zeros_like(),
    };
    let (m, v) = (state(&st.a)?, state(&st.b)?);
    let [p, m, v] = optim_math::adam(p, g, &m, &v, c)?;
    keep(&mut st.a, &m)?;
    keep(&mut st.b, &v)?;
    Ok(p)
}

/// One SGD update from candle tensor ops ([`optim_math::sgd`]); the momentum
/// buffer is updated in place.
pub fn sgd_tensors(
    p: &Tensor,
    g: &Tensor,
    st: &mut TensorState,
    c: &SgdConsts<Tensor>,
) -> Result<Tensor> {
    let buf = st.a.as_ref().map(|v| v.as_tensor().clone());
    let (p, buf) = optim_math::sgd(p, g, buf.as_ref(), c)?;
    if let Some(b) = buf {
        keep(&mut st.a, &b)?;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad::GradRef;
    use crate::optim::{adam_step, SlotState};
    use candle_core::Device;

    fn adam_hp(step: u64, lr: f64, decoupled: bool) -> AdamStep {
        AdamStep {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.05,
            decoupled,
            step,
        }
    }

    fn bits(t: &Tensor) -> Result<u64> {
        Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?.to_bits())
    }

    /// The constants computed on the device are the host's, rounded alike,
    /// for every step of a long run, both dtypes, and across an lr change.
    #[test]
    fn device_constants_equal_the_hosts() -> Result<()> {
        let dev = Device::Cpu;
        let mut h = DeviceHyper::new(&dev, 1e-3, 0)?;
        for step in 1..=3000u64 {
            let lr = if step < 1500 { 1e-3 } else { 3.7e-4 };
            h.set_lr(lr)?;
            h.advance()?;
            if step % 7 != 1 && step != 1500 {
                continue;
            }
            for dtype in [DType::F32, DType::F64] {
                for decoupled in [false, true] {
                    let hp = adam_hp(step, lr, decoupled);
                    let host = AdamConsts::new(hp).to_tensors(&dev, dtype)?;
                    let got = h.adam(hp, dtype)?;
                    assert_eq!(bits(&got.step_size)?, bits(&host.step_size)?, "step {step}");
                    assert_eq!(bits(&got.bc2_sqrt)?, bits(&host.bc2_sqrt)?, "step {step}");
                    match (&got.decay, &host.decay) {
                        (Some(a), Some(b)) => assert_eq!(bits(a)?, bits(b)?),
                        (None, None) => {}
                        other => panic!("decay differs at step {step}: {other:?}"),
                    }
                }
                let sgd = SgdStep {
                    lr,
                    momentum: 0.9,
                    dampening: 0.0,
                    nesterov: true,
                    weight_decay: 0.0,
                };
                let host = SgdConsts::new(sgd).to_tensors(&dev, dtype)?;
                assert_eq!(bits(&h.sgd(sgd, dtype)?.lr)?, bits(&host.lr)?);
            }
        }
        assert_eq!(h.steps()?, 3000);
        Ok(())
    }

    /// The generic path with device constants gives the fused CPU kernel's
    /// bits, step after step, and keeps its moment buffers in place.
    #[test]
    fn generic_path_matches_the_fused_kernel() -> Result<()> {
        let dev = Device::Cpu;
        let vals = |s: f32| -> Result<Tensor> {
            Ok(Tensor::arange(0f32, 29.0, &dev)?
                .affine(0.37, f64::from(s))?
                .sin()?)
        };
        let fused_p = vals(0.0)?.copy()?;
        let mut fused = SlotState::default();
        let mut generic_p = vals(0.0)?;
        let mut st = TensorState::default();
        let mut h = DeviceHyper::new(&dev, 1e-2, 0)?;
        let mut first_m = None;
        for step in 1..=25u64 {
            let lr = if step <= 10 { 1e-2 } else { 2e-3 };
            let g = vals(step as f32)?;
            let hp = adam_hp(step, lr, true);
            assert!(adam_step(&fused_p, GradRef::Tensor(&g), &mut fused, hp)?);
            h.set_lr(lr)?;
            h.advance()?;
            generic_p = adam_tensors(&generic_p, &g, &mut st, &h.adam(hp, DType::F32)?)?;
            if step == 1 {
                first_m = st.a.clone();
            }
        }
        assert_eq!(generic_p.to_vec1::<f32>()?, fused_p.to_vec1::<f32>()?);
        let (Some(first), Some(now)) = (first_m, &st.a) else {
            panic!("no first moment")
        };
        assert_eq!(first.as_tensor().to_vec1::<f32>()?, fused.a);
        assert_eq!(now.as_tensor().to_vec1::<f32>()?, fused.a);
        Ok(())
    }

    #[test]
    fn a_new_lr_lands_in_the_same_buffer_and_steps_count_on_the_device() -> Result<()> {
        let dev = Device::Cpu;
        let mut h = DeviceHyper::new(&dev, 0.5, 41)?;
        let lr_var = h.lr.clone();
        h.set_lr(0.5)?;
        h.advance()?;
        assert_eq!(h.steps()?, 42);
        h.set_lr(0.25)?;
        // The same buffer holds the new value: a captured graph reading it sees it.
        assert_eq!(lr_var.as_tensor().to_scalar::<f64>()?, 0.25);
        Ok(())
    }
}
