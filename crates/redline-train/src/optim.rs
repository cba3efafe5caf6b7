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
        self.build_groups(params.into_iter().map(|p| (p, true)).collect())
    }

    /// [`OptimizerConfig::build`] over two groups: parameters paired with
    /// `false` take no weight decay (PyTorch's param group with
    /// `weight_decay=0`, as nanoGPT makes for biases and norms).
    pub fn build_groups(&self, params: Vec<(Param, bool)>) -> Result<Optimizer> {
        self.check()?;
        Ok(Optimizer {
            cfg: self.clone(),
            state: params
                .into_iter()
                .map(|(param, decay)| Slot {
                    param,
                    decay,
                    fused: SlotState::default(),
                    generic: TensorState::default(),
                })
                .collect(),
            step: 0,
            hyper: None,
        })
    }

    /// The weight decay (L2 for Adam and SGD, decoupled for AdamW).
    pub fn weight_decay(&self) -> f64 {
        match self {
            Self::Adam { weight_decay, .. }
            | Self::AdamW { weight_decay, .. }
            | Self::Sgd { weight_decay, .. } => *weight_decay,
        }
    }

    /// Refuses settings that cannot work (negative or non-finite rates and
    /// decays, betas outside [0, 1), Nesterov without momentum).
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if !(self.lr().is_finite() && self.lr() >= 0.0) {
            return bad(format!("--lr {}: must be a finite number >= 0", self.lr()));
        }
        let wd = self.weight_decay();
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
    /// Whether weight decay applies to it.
    pub(crate) decay: bool,
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
            let hp = hp.decaying(slot.decay);
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
        // with the reduced-precision ones). One launch set per group.
        if redline_kernels::fused_gpu::enabled()
            && (found_inf.is_none() || redline_kernels::fused_gpu::reduced_precision())
        {
            let mut rest = Vec::new();
            for decay in [true, false] {
                let (group, others): (Vec<_>, Vec<_>) = pending
                    .into_iter()
                    .partition(|(i, _, _)| self.state.get(*i).is_some_and(|s| s.decay == decay));
                pending = others;
                if group.is_empty() {
                    continue;
                }
                let hp = hp.decaying(decay);
                if !crate::optim_gpu::step(
                    &mut self.state,
                    &group,
                    hyper,
                    hp,
                    self.step,
                    found_inf,
                )? {
                    rest.extend(group);
                }
            }
            pending = rest;
            if pending.is_empty() {
                return Ok(());
            }
        }
        // The generic path's mask of a flagged step (made only when it runs).
        let skip = found_inf
            .map(redline_kernels::optim::skip_mask)
            .transpose()?;
        let mut consts: Vec<((DType, bool), Generic)> = Vec::new();
        for (i, p, g) in pending {
            let Some(slot) = self.state.get_mut(i) else {
                continue;
            };
            // bf16 parameters (bf16-true) round as PyTorch's bf16 ops do,
            // with f32 constants; others take the one-op-per-tensor path
            // in their own dtype.
            let true16 = p.dtype() == DType::BF16 && skip.is_none();
            let dtype = if true16 { DType::F32 } else { p.dtype() };
            let key = (dtype, slot.decay);
            if !consts.iter().any(|(k, _)| *k == key) {
                let c = match hp.decaying(slot.decay) {
                    StepParams::Adam(hp) => Generic::Adam(hyper.adam(hp, dtype)?),
                    StepParams::Sgd(hp) => Generic::Sgd(hyper.sgd(hp, dtype)?),
                };
                consts.push((key, c));
            }
            let st = &mut slot.generic;
            let skip = skip.as_ref();
            let new_p = match (consts.iter().find(|(k, _)| *k == key), true16) {
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

impl StepParams {
    /// These, with weight decay off unless `decay`.
    fn decaying(self, decay: bool) -> Self {
        match (self, decay) {
            (s, true) => s,
            (Self::Adam(a), false) => Self::Adam(AdamStep {
                weight_decay: 0.0,
                ..a
            }),
            (Self::Sgd(s), false) => Self::Sgd(SgdStep {
                weight_decay: 0.0,
                ..s
            }),
        }
    }
}

#[cfg(test)]
mod tests;
