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
        // On a GPU with the fused kernels: one launch, in place.
        #[cfg(feature = "cuda")]
        if crate::fused_gpu::enabled() && crate::cuda::count_up(self.step.as_tensor())? {
            return Ok(());
        }
        self.step.set(&self.step.as_tensor().affine(1.0, 1.0)?)?;
        Ok(())
    }

    /// Counts one more step unless `found_inf` (an f32 scalar on the device,
    /// 1 or 0) is set: a step the loss scaler skips leaves Adam's count, as
    /// PyTorch's skipped `optimizer.step()` does. Nothing is read back.
    pub fn advance_unless(&self, found_inf: &Tensor) -> Result<()> {
        let taken = found_inf.to_dtype(DType::F64)?.affine(-1.0, 1.0)?;
        self.step.set(&(self.step.as_tensor() + taken)?)?;
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
    adam_tensors_unless(p, g, st, c, None)
}

/// [`adam_tensors`], and when `skip` (a u8 scalar on the device, from
/// [`skip_mask`]) is set, the parameter and moments keep their values: the
/// update is computed and discarded by a select, so a step the loss scaler
/// skips needs no host read (and a captured step replays either way).
pub fn adam_tensors_unless(
    p: &Tensor,
    g: &Tensor,
    st: &mut TensorState,
    c: &AdamConsts<Tensor>,
    skip: Option<&Tensor>,
) -> Result<Tensor> {
    let state = |slot: &Option<Var>| match slot {
        Some(v) => Ok(v.as_tensor().clone()),
        None => p.zeros_like(),
    };
    let (m0, v0) = (state(&st.a)?, state(&st.b)?);
    let [p1, m, v] = optim_math::adam(p, g, &m0, &v0, c)?;
    keep(&mut st.a, &unless(skip, &m0, &m)?)?;
    keep(&mut st.b, &unless(skip, &v0, &v)?)?;
    unless(skip, p, &p1)
}

/// A step's skip flag as the select mask [`adam_tensors_unless`] and
/// [`sgd_tensors_unless`] take: `found_inf` (an f32 scalar, 1 or 0) as u8.
pub fn skip_mask(found_inf: &Tensor) -> Result<Tensor> {
    Ok(found_inf.ne(0f32)?)
}

/// `old` where `skip` is set, else `new` (a select, not arithmetic: `new`
/// holds NaN after an overflowed step, and NaN * 0 is NaN).
fn unless(skip: Option<&Tensor>, old: &Tensor, new: &Tensor) -> Result<Tensor> {
    match skip {
        None => Ok(new.clone()),
        Some(s) => Ok(s.broadcast_as(old.shape())?.where_cond(old, new)?),
    }
}

/// One SGD update from candle tensor ops ([`optim_math::sgd`]); the momentum
/// buffer is updated in place.
pub fn sgd_tensors(
    p: &Tensor,
    g: &Tensor,
    st: &mut TensorState,
    c: &SgdConsts<Tensor>,
) -> Result<Tensor> {
    sgd_tensors_unless(p, g, st, c, None)
}

/// [`sgd_tensors`] that keeps the parameter and momentum buffer where
/// `skip` is set (as [`adam_tensors_unless`]).
pub fn sgd_tensors_unless(
    p: &Tensor,
    g: &Tensor,
    st: &mut TensorState,
    c: &SgdConsts<Tensor>,
    skip: Option<&Tensor>,
) -> Result<Tensor> {
    let buf0 = st.a.as_ref().map(|v| v.as_tensor().clone());
    let (p1, buf) = optim_math::sgd(p, g, buf0.as_ref(), c)?;
    if let Some(b) = buf {
        match (&buf0, skip) {
            (Some(old), _) => keep(&mut st.a, &unless(skip, old, &b)?)?,
            (None, None) => keep(&mut st.a, &b)?,
            // The first step, maybe skipped: the device cannot leave the
            // buffer uncreated, so a skipped one leaves it zero. The next
            // step's `momentum * 0 + (1 - dampening) * g` is PyTorch's fresh
            // `g` exactly when dampening is 0 (its default); with dampening,
            // that one step differs.
            (None, Some(_)) => keep(&mut st.a, &unless(skip, &b.zeros_like()?, &b)?)?,
        }
    }
    unless(skip, p, &p1)
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

    /// A step the scaler skips (flag 1) leaves the parameter, the moments and
    /// the device's step count as they were, even with a NaN gradient; a
    /// step it takes (flag 0) is the plain update, bit for bit; and steps
    /// after a skip use the count without it.
    #[test]
    fn a_skipped_step_changes_nothing_on_the_device() -> Result<()> {
        let dev = Device::Cpu;
        let g = Tensor::new(&[0.5f32, -1.0, 2.0], &dev)?;
        let nan = Tensor::new(&[0.5f32, f32::NAN, f32::INFINITY], &dev)?;
        let p0 = Tensor::new(&[1.0f32, 2.0, 3.0], &dev)?;
        let (yes, no) = (Tensor::new(1f32, &dev)?, Tensor::new(0f32, &dev)?);
        // Plain: two steps with `g`.
        let h = DeviceHyper::new(&dev, 0.1, 0)?;
        let mut st = TensorState::default();
        let mut plain = p0.clone();
        let mut plain_sgd = (p0.clone(), TensorState::default());
        let sgd = SgdStep {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        for step in 1..=2 {
            h.advance()?;
            plain = adam_tensors(
                &plain,
                &g,
                &mut st,
                &h.adam(adam_hp(step, 0.1, false), DType::F32)?,
            )?;
            let c = h.sgd(sgd, DType::F32)?;
            plain_sgd.0 = sgd_tensors(&plain_sgd.0, &g, &mut plain_sgd.1, &c)?;
        }
        // Masked: a skipped NaN step first (at the first step, with no state
        // yet), then two taken steps.
        let h = DeviceHyper::new(&dev, 0.1, 0)?;
        let mut mst = TensorState::default();
        let mut masked = p0.clone();
        let mut msgd = (p0.clone(), TensorState::default());
        for (grad, flag) in [(&nan, &yes), (&g, &no), (&g, &no)] {
            let skip = skip_mask(flag)?;
            h.advance_unless(flag)?;
            let hp = adam_hp(h.steps()?.max(1), 0.1, false);
            masked = adam_tensors_unless(
                &masked,
                grad,
                &mut mst,
                &h.adam(hp, DType::F32)?,
                Some(&skip),
            )?;
            let c = h.sgd(sgd, DType::F32)?;
            msgd.0 = sgd_tensors_unless(&msgd.0, grad, &mut msgd.1, &c, Some(&skip))?;
            if flag.to_scalar::<f32>()? == 1.0 {
                assert_eq!(masked.to_vec1::<f32>()?, p0.to_vec1::<f32>()?);
                assert_eq!(h.steps()?, 0, "a skipped step is not counted");
                let m = mst.a.as_ref().map(|m| m.as_tensor().to_vec1::<f32>());
                assert_eq!(m.transpose()?, Some(vec![0.0; 3]), "moments untouched");
            }
        }
        assert_eq!(h.steps()?, 2);
        assert_eq!(masked.to_vec1::<f32>()?, plain.to_vec1::<f32>()?);
        assert_ne!(masked.to_vec1::<f32>()?, p0.to_vec1::<f32>()?);
        assert_eq!(msgd.0.to_vec1::<f32>()?, plain_sgd.0.to_vec1::<f32>()?);
        Ok(())
    }
}
