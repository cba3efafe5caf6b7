//! Optimizers with PyTorch's update rules (the single-tensor CPU code paths of
//! `torch.optim.Adam`, `AdamW` and `SGD`), over candle variables.
//!
//! State (moments, momentum buffers) lives on the parameters' device and is
//! created lazily at the first step, as PyTorch does. On the generic path the
//! state is updated in place and the step count and learning rate live on
//! the device ([`DeviceHyper`]), so a step can be captured once and replayed.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use redline_kernels::grad::{GradRef, Param};
use redline_kernels::optim::{
    adam_step, adam_tensors_bf16, adam_tensors_unless, sgd_step, sgd_tensors_bf16,
    sgd_tensors_unless, AdamStep, DeviceHyper, SgdStep, SlotState, TensorState,
};
use redline_kernels::optim_math::{AdamConsts, SgdConsts};

use crate::error::{Error, Result};

/// Optimizer choice and hyperparameters (PyTorch's defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "lowercase")]
pub enum OptimizerConfig {
    /// Adam; `weight_decay` is L2 added to the gradient.
    Adam {
        /// Learning rate.
        lr: f64,
        /// Coefficients of the running averages.
        betas: (f64, f64),
        /// Added to the denominator.
        eps: f64,
        /// L2 penalty.
        weight_decay: f64,
    },
    /// AdamW: decoupled weight decay.
    AdamW {
        /// Learning rate.
        lr: f64,
        /// Coefficients of the running averages.
        betas: (f64, f64),
        /// Added to the denominator.
        eps: f64,
        /// Decoupled decay (PyTorch default 0.01).
        weight_decay: f64,
    },
    /// Stochastic gradient descent with optional (Nesterov) momentum.
    Sgd {
        /// Learning rate.
        lr: f64,
        /// Momentum factor (0 disables the buffer).
        momentum: f64,
        /// Dampening for momentum.
        dampening: f64,
        /// Nesterov momentum (needs momentum > 0 and dampening 0).
        nesterov: bool,
        /// L2 penalty.
        weight_decay: f64,
    },
}

impl OptimizerConfig {
    /// PyTorch's defaults for `name` (`adam`, `adamw`, `sgd`) at learning rate `lr`.
    pub fn by_name(name: &str, lr: f64) -> Result<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "adam" => Ok(Self::Adam {
                lr,
                betas: (0.9, 0.999),
                eps: 1e-8,
                weight_decay: 0.0,
            }),
            "adamw" => Ok(Self::AdamW {
                lr,
                betas: (0.9, 0.999),
                eps: 1e-8,
                weight_decay: 0.01,
            }),
            "sgd" => Ok(Self::Sgd {
                lr,
                momentum: 0.0,
                dampening: 0.0,
                nesterov: false,
                weight_decay: 0.0,
            }),
            other => Err(Error::Config(format!(
                "--optimizer {other:?}: unknown; available: adam, adamw, sgd"
            ))),
        }
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            Self::Adam { lr, .. } | Self::AdamW { lr, .. } | Self::Sgd { lr, .. } => *lr,
        }
    }

    /// Checks ranges, then builds the optimizer over `params` (shared
    /// handles: it reads their gradients and updates their variables).
    pub fn build(&self, params: Vec<Param>) -> Result<Optimizer> {
        self.check()?;
        Ok(Optimizer {
            cfg: self.clone(),
            state: params
                .into_iter()
                .map(|param| Slot {
                    param,
                    fused: SlotState::default(),
                    generic: TensorState::default(),
                })
                .collect(),
            step: 0,
            hyper: None,
        })
    }

    /// Refuses settings that cannot work (negative or non-finite rates and
    /// decays, betas outside [0, 1), Nesterov without momentum).
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if !(self.lr().is_finite() && self.lr() >= 0.0) {
            return bad(format!("--lr {}: must be a finite number >= 0", self.lr()));
        }
        let wd = match self {
            Self::Adam { weight_decay, .. }
            | Self::AdamW { weight_decay, .. }
            | Self::Sgd { weight_decay, .. } => *weight_decay,
        };
        if !(wd.is_finite() && wd >= 0.0) {
            return bad(format!("--weight-decay {wd}: must be a finite number >= 0"));
        }
        match self {
            Self::Adam { betas, eps, .. } | Self::AdamW { betas, eps, .. } => {
                for b in [betas.0, betas.1] {
                    if !(0.0..1.0).contains(&b) {
                        return bad(format!("Adam beta {b}: must be in [0, 1)"));
                    }
                }
                if !(eps.is_finite() && *eps >= 0.0) {
                    return bad(format!("--eps {eps}: must be a finite number >= 0"));
                }
            }
            Self::Sgd {
                momentum,
                dampening,
                nesterov,
                ..
            } => {
                if !(momentum.is_finite() && *momentum >= 0.0) {
                    return bad(format!(
                        "--momentum {momentum}: must be a finite number >= 0"
                    ));
                }
                if *nesterov && (*momentum <= 0.0 || *dampening != 0.0) {
                    return bad("--nesterov needs --momentum > 0 and zero dampening".into());
                }
            }
        }
        Ok(())
    }
}

/// One parameter and its state: host vectors for the fused CPU kernel, or
/// tensors (Adam: m, v; SGD: momentum buffer) for the generic path.
pub(crate) struct Slot {
    pub(crate) param: Param,
    fused: SlotState,
    pub(crate) generic: TensorState,
}

/// A built optimizer.
pub struct Optimizer {
    cfg: OptimizerConfig,
    state: Vec<Slot>,
    step: u64,
    /// The generic path's step count and learning rate on the device, made
    /// at the first step that takes that path.
    hyper: Option<DeviceHyper>,
}

/// One step's constants for the generic path, per parameter dtype.
enum Generic {
    Adam(AdamConsts<Tensor>),
    Sgd(SgdConsts<Tensor>),
}

impl Optimizer {
    /// Current learning rate.
    pub fn lr(&self) -> f64 {
        self.cfg.lr()
    }

    /// Sets the learning rate of the next steps (what a schedule calls). On
    /// the generic path it is written to device memory at the next step.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(Error::Config(format!(
                "learning rate {lr} is not a finite number >= 0"
            )));
        }
        match &mut self.cfg {
            OptimizerConfig::Adam { lr: l, .. }
            | OptimizerConfig::AdamW { lr: l, .. }
            | OptimizerConfig::Sgd { lr: l, .. } => *l = lr,
        }
        Ok(())
    }

    /// The configuration, at the current learning rate.
    pub fn config(&self) -> &OptimizerConfig {
        &self.cfg
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the CUDA graph driver
    /// Before a replay of a captured step: counts the step on the host (the
    /// replay counts it on the device) and writes a changed learning rate to
    /// the device, where the replayed update reads it.
    pub(crate) fn before_replay(&mut self) -> Result<()> {
        self.step += 1;
        self.sync_lr()
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the CUDA graph driver
    /// Writes a changed learning rate to the device now, so that a step
    /// captured next records no write of it (a replay would repeat the write).
    pub(crate) fn sync_lr(&mut self) -> Result<()> {
        if let Some(h) = &mut self.hyper {
            h.set_lr(self.cfg.lr())?;
        }
        Ok(())
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the CUDA graph driver
    /// Sets the host step count back to `steps`, after a step whose device
    /// work never ran (a failed capture), and drops its gradients.
    pub(crate) fn rewind(&mut self, steps: u64) {
        self.step = steps;
        self.zero_grad();
    }

    /// The parameters it updates, in order.
    pub fn params(&self) -> impl Iterator<Item = &Param> {
        self.state.iter().map(|s| &s.param)
    }

    /// Applies one update from each parameter's gradient ([`Param::grad`]:
    /// everything the backward passes since the last step accumulated) and
    /// takes the gradients (PyTorch's `step()` then `zero_grad()`);
    /// parameters without a gradient are skipped. The fused in-place kernel
    /// runs where it covers the device; otherwise the generic tensor path
    /// (same arithmetic) does.
    pub fn step(&mut self) -> Result<()> {
        self.step_unless(None)
    }

    /// [`Optimizer::step`] unless `found_inf` (an f32 scalar, 1 or 0, from
    /// the loss scaler's unscale) is set; a skipped step takes the gradients
    /// and changes nothing else, its count included (PyTorch's
    /// `GradScaler.step` not calling `optimizer.step()`). On the CPU the flag
    /// is read where it lies (no device to wait for); on a device the
    /// update is computed and discarded by a select, so nothing is read
    /// back and the step stays capturable.
    pub fn step_skipping(&mut self, found_inf: &Tensor) -> Result<()> {
        if found_inf.device().is_cpu() {
            if found_inf.to_dtype(DType::F32)?.to_scalar::<f32>()? != 0.0 {
                self.zero_grad();
                return Ok(());
            }
            return self.step();
        }
        self.step_unless(Some(found_inf))
    }

    /// The update; with `found_inf` on a device, masked by it (the fused
    /// GPU kernel reads it and returns; the fused CPU loop steps aside).
    pub(crate) fn step_unless(&mut self, found_inf: Option<&Tensor>) -> Result<()> {
        // With a device flag the host count may run ahead of the device's
        // (which [`Optimizer::state`] reads); only the fused CPU loop, which
        // such a step never takes, uses the host count.
        self.step += 1;
        let hp = self.step_params();
        let lr = self.cfg.lr();
        if let Some(h) = &mut self.hyper {
            h.set_lr(lr)?;
            match found_inf {
                Some(f) => h.advance_unless(f)?,
                None => h.advance()?,
            }
        }
        // Parameters the fused CPU kernel declined: (slot, parameter, gradient).
        let mut pending: Vec<(usize, Tensor, Tensor)> = Vec::new();
        for (i, slot) in self.state.iter_mut().enumerate() {
            let p = slot.param.as_tensor().clone();
            let fused = &mut slot.fused;
            // `None`: the kernel updated `p` in place; else the gradient for
            // the generic path.
            let declined = slot.param.grad().take_with(|g| -> Result<Option<Tensor>> {
                let done = match hp {
                    _ if found_inf.is_some() => false,
                    StepParams::Adam(hp) => adam_step(&p, g, fused, hp)?,
                    StepParams::Sgd(hp) => sgd_step(&p, g, fused, hp)?,
                };
                Ok(match (done, g) {
                    (true, _) => None,
                    (false, GradRef::Host(g)) => {
                        Some(Tensor::from_slice(g, p.shape(), p.device())?)
                    }
                    (false, GradRef::Tensor(g)) => Some(g.clone()),
                })
            });
            if let Some(g) = declined.transpose()?.flatten() {
                pending.push((i, p.detach(), g.detach()));
            }
        }
        let Some((_, first, _)) = pending.first() else {
            return Ok(());
        };
        let hyper = match &mut self.hyper {
            Some(h) => h,
            // Made now, at this step's count (already advanced on the
            // host; with a flag, advanced on the device unless skipped).
            h => {
                let before = self.step - u64::from(found_inf.is_some());
                let made = h.insert(DeviceHyper::new(first.device(), lr, before)?);
                if let Some(f) = found_inf {
                    made.advance_unless(f)?;
                }
                made
            }
        };
        #[cfg(feature = "cuda")]
        // The same switch as the ops' fused kernels (`--fused-kernels`); the
        // kernel reads the scaler's flag on the device (a variant admitted
        // with the reduced-precision ones).
        if redline_kernels::fused_gpu::enabled()
            && (found_inf.is_none() || redline_kernels::fused_gpu::reduced_precision())
            && crate::optim_gpu::step(&mut self.state, &pending, hyper, hp, self.step, found_inf)?
        {
            return Ok(());
        }
        // The generic path's mask of a flagged step (made only when it runs).
        let skip = found_inf
            .map(redline_kernels::optim::skip_mask)
            .transpose()?;
        let mut consts: Vec<(DType, Generic)> = Vec::new();
        for (i, p, g) in pending {
            // bf16 parameters (bf16-true) round as PyTorch's bf16 ops do,
            // with f32 constants; others take the one-op-per-tensor path
            // in their own dtype.
            let true16 = p.dtype() == DType::BF16 && skip.is_none();
            let dtype = if true16 { DType::F32 } else { p.dtype() };
            if !consts.iter().any(|(d, _)| *d == dtype) {
                let c = match hp {
                    StepParams::Adam(hp) => Generic::Adam(hyper.adam(hp, dtype)?),
                    StepParams::Sgd(hp) => Generic::Sgd(hyper.sgd(hp, dtype)?),
                };
                consts.push((dtype, c));
            }
            let Some(slot) = self.state.get_mut(i) else {
                continue;
            };
            let st = &mut slot.generic;
            let skip = skip.as_ref();
            let new_p = match (consts.iter().find(|(d, _)| *d == dtype), true16) {
                (Some((_, Generic::Adam(c))), true) => adam_tensors_bf16(&p, &g, st, c)?,
                (Some((_, Generic::Sgd(c))), true) => sgd_tensors_bf16(&p, &g, st, c)?,
                (Some((_, Generic::Adam(c))), false) => adam_tensors_unless(&p, &g, st, c, skip)?,
                (Some((_, Generic::Sgd(c))), false) => sgd_tensors_unless(&p, &g, st, c, skip)?,
                (None, _) => continue,
            };
            slot.param.var().set(&new_p)?;
        }
        Ok(())
    }

    /// Drops every parameter's accumulated gradient (PyTorch's `zero_grad`).
    pub fn zero_grad(&self) {
        for s in &self.state {
            s.param.grad().clear();
        }
    }

    /// This step's hyperparameters (for the fused kernel and the generic path).
    fn step_params(&self) -> StepParams {
        let t = self.step;
        match &self.cfg {
            OptimizerConfig::Adam {
                lr,
                betas,
                eps,
                weight_decay,
            }
            | OptimizerConfig::AdamW {
                lr,
                betas,
                eps,
                weight_decay,
            } => StepParams::Adam(AdamStep {
                lr: *lr,
                betas: *betas,
                eps: *eps,
                weight_decay: *weight_decay,
                decoupled: matches!(self.cfg, OptimizerConfig::AdamW { .. }),
                step: t,
            }),
            OptimizerConfig::Sgd {
                lr,
                momentum,
                dampening,
                nesterov,
                weight_decay,
            } => StepParams::Sgd(SgdStep {
                lr: *lr,
                momentum: *momentum,
                dampening: *dampening,
                nesterov: *nesterov,
                weight_decay: *weight_decay,
            }),
        }
    }
}

/// An optimizer's state on the host: what a checkpoint saves and
/// [`Optimizer::load_state`] restores (PyTorch's `optimizer.state_dict()`:
/// per parameter index, `exp_avg`/`exp_avg_sq` for Adam and AdamW,
/// `momentum_buffer` for SGD).
#[derive(Debug, Clone)]
pub struct OptimizerState {
    /// Steps taken.
    pub steps: u64,
    /// The learning rate of the last step.
    pub lr: f64,
    /// `("{index}.{buffer}", tensor on the CPU)`, parameters in order.
    pub buffers: Vec<(String, Tensor)>,
}

impl Optimizer {
    /// The state as host tensors (a copy; a device sync on a GPU).
    pub fn state(&self) -> Result<OptimizerState> {
        let names = self.buffer_names();
        let mut buffers = Vec::new();
        for (i, slot) in self.state.iter().enumerate() {
            let shape = slot.param.as_tensor().shape().clone();
            let host = [&slot.fused.a, &slot.fused.b];
            let half = [&slot.fused.half.a, &slot.fused.half.b];
            let generic = [&slot.generic.a, &slot.generic.b];
            for (k, name) in names.iter().enumerate() {
                let t = match (host[k], generic[k]) {
                    (h, _) if !h.is_empty() => {
                        Tensor::from_slice(h, shape.clone(), &candle_core::Device::Cpu)?
                    }
                    // bf16 state, widened (exact) as the rest is saved.
                    _ if !half[k].is_empty() => {
                        Tensor::from_slice(half[k], shape.clone(), &candle_core::Device::Cpu)?
                            .to_dtype(DType::F32)?
                    }
                    (_, Some(v)) => v
                        .as_tensor()
                        .to_device(&candle_core::Device::Cpu)?
                        .to_dtype(DType::F32)?,
                    // No step yet: PyTorch's state is empty too.
                    _ => continue,
                };
                buffers.push((format!("{i}.{name}"), t));
            }
        }
        Ok(OptimizerState {
            // The device's count where it keeps one: the host's runs ahead
            // of it after steps the loss scaler skipped there.
            steps: match &self.hyper {
                Some(h) => h.steps()?,
                None => self.step,
            },
            lr: self.lr(),
            buffers,
        })
    }

    /// Restores a [`Optimizer::state`] of an optimizer of the same kind over
    /// parameters of the same shapes; a buffer that does not fit is an error
    /// naming it, and nothing is changed then.
    pub fn load_state(&mut self, st: &OptimizerState) -> Result<()> {
        let names = self.buffer_names();
        let mut staged: Vec<(usize, usize, Tensor)> = Vec::new();
        for (key, t) in &st.buffers {
            let bad = |why: String| Error::Config(format!("optimizer state `{key}`: {why}"));
            let (i, name) = key
                .split_once('.')
                .ok_or_else(|| bad("not <index>.<buffer>".into()))?;
            let i: usize = i.parse().map_err(|_| bad("not <index>.<buffer>".into()))?;
            let k = names
                .iter()
                .position(|n| *n == name)
                .ok_or_else(|| bad(format!("this optimizer keeps {}", names.join(", "))))?;
            let slot = self
                .state
                .get(i)
                .ok_or_else(|| bad(format!("there are {} parameters", self.state.len())))?;
            let p = slot.param.as_tensor();
            if t.dims() != p.dims() {
                return Err(bad(format!(
                    "shape {:?}, but parameter {i} is {:?}",
                    t.dims(),
                    p.dims()
                )));
            }
            staged.push((i, k, t.clone()));
        }
        for slot in &mut self.state {
            slot.fused = SlotState::default();
            slot.generic = TensorState::default();
        }
        for (i, k, t) in staged {
            let Some(slot) = self.state.get_mut(i) else {
                continue;
            };
            let p = slot.param.as_tensor();
            if redline_kernels::optim::bf16_covers(p) {
                // Saved from bf16, so the narrowing is exact.
                let v = t
                    .flatten_all()?
                    .to_dtype(DType::BF16)?
                    .to_vec1::<half::bf16>()?;
                match k {
                    0 => slot.fused.half.a = v,
                    _ => slot.fused.half.b = v,
                }
            } else if redline_kernels::optim::fused_covers(p) {
                let v = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                match k {
                    0 => slot.fused.a = v,
                    _ => slot.fused.b = v,
                }
            } else {
                let v =
                    candle_core::Var::from_tensor(&t.to_device(p.device())?.to_dtype(p.dtype())?)?;
                match k {
                    0 => slot.generic.a = Some(v),
                    _ => slot.generic.b = Some(v),
                }
            }
        }
        self.step = st.steps;
        // Made again at the next step, at the restored count.
        self.hyper = None;
        self.set_lr(st.lr)
    }

    /// Bytes of the state held now (moments, momentum buffers, on the host
    /// for the fused CPU loop or as device tensors).
    pub fn state_bytes(&self) -> u64 {
        let tensor = |v: &Option<candle_core::Var>| {
            v.as_ref().map_or(0, |v| {
                (v.as_tensor().elem_count() * v.as_tensor().dtype().size_in_bytes()) as u64
            })
        };
        self.state
            .iter()
            .map(|s| s.fused.bytes() + tensor(&s.generic.a) + tensor(&s.generic.b))
            .sum()
    }

    /// The state buffers of this optimizer kind, PyTorch's names.
    fn buffer_names(&self) -> Vec<&'static str> {
        match self.cfg {
            OptimizerConfig::Adam { .. } | OptimizerConfig::AdamW { .. } => {
                vec!["exp_avg", "exp_avg_sq"]
            }
            OptimizerConfig::Sgd { .. } => vec!["momentum_buffer"],
        }
    }
}

/// A step's hyperparameters.
#[derive(Clone, Copy)]
pub(crate) enum StepParams {
    Adam(AdamStep),
    Sgd(SgdStep),
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// Back-propagates `loss` into `params`' gradients.
    fn backward(loss: &Tensor, params: &[&Param]) -> Result<()> {
        let mut grads = loss.backward()?;
        for p in params {
            p.absorb(&mut grads)?;
        }
        Ok(())
    }

    /// Minimises (x - 3)^2 from 0; each optimizer must get close.
    fn converges(cfg: OptimizerConfig, steps: usize) -> Result<f32> {
        let x = Param::new(Var::zeros(1, DType::F32, &Device::Cpu)?);
        let mut opt = cfg.build(vec![x.clone()])?;
        for _ in 0..steps {
            let loss = (x.as_tensor() - 3.0)?.sqr()?.sum_all()?;
            backward(&loss, &[&x])?;
            opt.step()?;
        }
        Ok(x.as_tensor().to_vec1::<f32>()?[0])
    }

    #[test]
    fn all_optimizers_descend() -> Result<()> {
        assert!((converges(OptimizerConfig::by_name("adam", 0.1)?, 300)? - 3.0).abs() < 0.05);
        assert!((converges(OptimizerConfig::by_name("adamw", 0.1)?, 300)? - 3.0).abs() < 0.1);
        let sgd = OptimizerConfig::Sgd {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: true,
            weight_decay: 0.0,
        };
        assert!((converges(sgd, 200)? - 3.0).abs() < 0.01);
        Ok(())
    }

    #[test]
    fn adam_first_step_is_lr_times_sign() -> Result<()> {
        // With bias correction the first Adam step is lr * g/(|g| + eps').
        let x = converges(OptimizerConfig::by_name("adam", 0.01)?, 1)?;
        assert!((x - 0.01).abs() < 1e-6, "{x}");
        Ok(())
    }

    #[test]
    fn generic_path_state_holds_no_graph_and_stays_in_place() -> Result<()> {
        // f64 parameters take the generic (tensor-op) path. The gradient of `w`
        // flows through an activation, so candle hands it over still attached
        // to the forward graph; the optimizer state must not keep that graph.
        // The state buffers are the same from step to step (updated in place,
        // as a captured graph needs): a clone taken after the first step sees
        // the later values.
        for name in ["adam", "adamw", "sgd"] {
            let w = Param::new(Var::new(&[0.5f64, -1.5, 2.0], &Device::Cpu)?);
            let mut cfg = OptimizerConfig::by_name(name, 0.1)?;
            if let OptimizerConfig::Sgd { momentum, .. } = &mut cfg {
                *momentum = 0.9;
            }
            let mut opt = cfg.build(vec![w.clone()])?;
            let mut first = None;
            let mut after_first = Vec::new();
            for i in 0..3 {
                let act = w.as_tensor().affine(2.0, 0.0)?.tanh()?;
                backward(&(act * w.as_tensor())?.sum_all()?, &[&w])?;
                opt.step()?;
                if i == 0 {
                    let a = opt.state[0].generic.a.clone();
                    after_first = match &a {
                        Some(a) => a.as_tensor().to_vec1::<f64>()?,
                        None => panic!("{name}: no state after a step"),
                    };
                    first = a;
                }
            }
            let (Some(first), Some(now)) = (&first, &opt.state[0].generic.a) else {
                panic!("{name}: state missing");
            };
            let now = now.as_tensor().to_vec1::<f64>()?;
            assert_eq!(
                first.as_tensor().to_vec1::<f64>()?,
                now,
                "{name}: not in place"
            );
            assert_ne!(after_first, now, "{name}: state did not change");
            for slot in &opt.state {
                for t in [&slot.generic.a, &slot.generic.b].into_iter().flatten() {
                    // A variable of its own: no backprop op links it to the forward graph.
                    assert!(
                        t.as_tensor().is_variable(),
                        "{name}: state is not its own buffer"
                    );
                }
                assert!(
                    slot.fused.a.is_empty(),
                    "{name}: f64 must take the generic path"
                );
            }
        }
        Ok(())
    }

    /// A step of a linear layer from gradients the fused kernel wrote into
    /// the parameters' buffers and one from candle's `GradStore` gradients
    /// (the plain op, absorbed) give the same weights; the step takes them.
    #[test]
    fn fused_and_store_gradients_give_the_same_step() -> Result<()> {
        use redline_kernels::{linear, linear_param};
        let dev = Device::Cpu;
        let x = Tensor::arange(0f32, 12.0, &dev)?.reshape((3, 4))?.sin()?;
        let up = Tensor::arange(0f32, 6.0, &dev)?.reshape((3, 2))?.cos()?;
        let fresh = || -> Result<(Param, Param)> {
            let w = Tensor::arange(0f32, 8.0, &dev)?
                .reshape((2, 4))?
                .affine(0.1, -0.3)?;
            Ok((
                Param::new(Var::from_tensor(&w)?),
                Param::new(Var::zeros(2, DType::F32, &dev)?),
            ))
        };
        for name in ["adam", "adamw", "sgd"] {
            let cfg = OptimizerConfig::by_name(name, 0.1)?;
            let (w1, b1) = fresh()?;
            let mut fused = cfg.build(vec![w1.clone(), b1.clone()])?;
            let y = linear_param(&x, &w1, &b1, true)?;
            let grads = (y * &up)?.sum_all()?.backward()?;
            assert!(grads.get(w1.as_tensor()).is_none() && !w1.grad().is_empty());
            fused.step()?;
            assert!(w1.grad().is_empty() && b1.grad().is_empty());

            let (w2, b2) = fresh()?;
            let y = linear(&x, w2.as_tensor(), b2.as_tensor(), true)?;
            backward(&(y * &up)?.sum_all()?, &[&w2, &b2])?;
            cfg.build(vec![w2.clone(), b2.clone()])?.step()?;

            for (a, b) in [(&w1, &w2), (&b1, &b2)] {
                let d = (a.as_tensor() - b.as_tensor())?.abs()?.max_all()?;
                assert_eq!(d.to_scalar::<f32>()?, 0.0, "{name}");
            }
            let moved = (w1.as_tensor() - fresh()?.0.as_tensor())?
                .abs()?
                .sum_all()?;
            assert!(moved.to_scalar::<f32>()? > 0.0, "{name}: no update");
        }
        Ok(())
    }

    #[test]
    fn zero_grad_drops_accumulated_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let w = Param::new(Var::from_tensor(&Tensor::ones((2, 3), DType::F32, &dev)?)?);
        let b = Param::new(Var::zeros(2, DType::F32, &dev)?);
        let mut opt = OptimizerConfig::by_name("sgd", 1.0)?.build(vec![w.clone(), b.clone()])?;
        let x = Tensor::ones((1, 3), DType::F32, &dev)?;
        let y = redline_kernels::linear_param(&x, &w, &b, false)?;
        y.sum_all()?.backward()?;
        let g = b.grad().to_tensor(b.as_tensor())?;
        assert_eq!(
            g.map(|g| g.to_vec1::<f32>()).transpose()?,
            Some(vec![1.0, 1.0])
        );
        opt.zero_grad();
        opt.step()?;
        assert_eq!(w.as_tensor().sum_all()?.to_scalar::<f32>()?, 6.0);
        Ok(())
    }

    /// A learning-rate change reaches both paths at the next step: the fused
    /// f32 loop and the generic f64 path (its rate held on the device) land on
    /// the same weights, and both differ from a run without the change.
    #[test]
    fn set_lr_reaches_both_paths() -> Result<()> {
        let run = |dtype: DType, change: bool| -> Result<Vec<f64>> {
            let w = Param::new(Var::from_tensor(
                &Tensor::new(&[0.5f64, -1.5, 2.0], &Device::Cpu)?.to_dtype(dtype)?,
            )?);
            let mut opt = OptimizerConfig::by_name("adamw", 0.1)?.build(vec![w.clone()])?;
            for i in 0..6 {
                if change && i == 3 {
                    opt.set_lr(0.01)?;
                }
                let loss = w.as_tensor().sqr()?.sum_all()?;
                backward(&loss, &[&w])?;
                opt.step()?;
            }
            assert_eq!(opt.hyper.is_some(), dtype == DType::F64, "{dtype:?}");
            Ok(w.as_tensor().to_dtype(DType::F64)?.to_vec1::<f64>()?)
        };
        let (fused, generic) = (run(DType::F32, true)?, run(DType::F64, true)?);
        let unchanged = run(DType::F64, false)?;
        for ((f, g), u) in fused.iter().zip(&generic).zip(&unchanged) {
            assert!((f - g).abs() < 1e-6, "{fused:?} vs {generic:?}");
            assert!(
                (g - u).abs() > 1e-3,
                "the change had no effect: {generic:?}"
            );
        }
        let mut opt = OptimizerConfig::by_name("sgd", 0.1)?.build(Vec::new())?;
        assert!(opt.set_lr(f64::NAN).is_err() && opt.set_lr(-1.0).is_err());
        assert_eq!(opt.lr(), 0.1);
        Ok(())
    }

    /// The fused GPU kernel's switch changes nothing off a CUDA device: the
    /// generic path (f64 here) and the fused CPU loop (f32) give the same
    /// weights with it on or off, for every optimizer.
    #[test]
    fn the_gpu_kernel_switch_leaves_the_cpu_alone() -> Result<()> {
        let run = |name: &str, dtype: DType, gpu: bool| -> Result<Vec<f64>> {
            let dev = Device::Cpu;
            let w = Param::new(Var::from_tensor(
                &Tensor::new(&[0.5f64, -1.5, 2.0, 0.25], &dev)?.to_dtype(dtype)?,
            )?);
            let b = Param::new(Var::from_tensor(
                &Tensor::new(&[0.1f64, -0.2], &dev)?.to_dtype(dtype)?,
            )?);
            let mut opt =
                OptimizerConfig::by_name(name, 0.05)?.build(vec![w.clone(), b.clone()])?;
            redline_kernels::fused_gpu::set_enabled(gpu);
            for _ in 0..5 {
                let loss = (w.as_tensor().sqr()?.sum_all()? + b.as_tensor().sum_all()?)?;
                backward(&loss, &[&w, &b])?;
                opt.step()?;
            }
            let mut out = w.as_tensor().to_dtype(DType::F64)?.to_vec1::<f64>()?;
            out.extend(b.as_tensor().to_dtype(DType::F64)?.to_vec1::<f64>()?);
            Ok(out)
        };
        for name in ["adam", "adamw", "sgd"] {
            for dtype in [DType::F32, DType::F64] {
                let (off, on) = (run(name, dtype, false)?, run(name, dtype, true)?);
                assert_eq!(off, on, "{name} {dtype:?}");
                assert!(off
                    .iter()
                    .zip([0.5, -1.5, 2.0, 0.25, 0.1, -0.2])
                    .all(|(a, b)| a != &b));
            }
        }
        redline_kernels::fused_gpu::set_enabled(false);
        Ok(())
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(OptimizerConfig::by_name("lion", 0.1).is_err());
        let nest = OptimizerConfig::Sgd {
            lr: 0.1,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: true,
            weight_decay: 0.0,
        };
        assert!(nest.build(vec![]).is_err());
        assert!(OptimizerConfig::by_name("adam", f64::NAN)
            .and_then(|c| c.build(vec![]).map(|_| ()))
            .is_err());
    }
}
