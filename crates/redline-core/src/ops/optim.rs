//! In-place optimizer updates: one pass over each parameter's storage reading
//! its gradient and state, with no temporaries (the generic path allocates
//! about ten tensors per parameter per step). Same arithmetic order as
//! PyTorch's single-tensor CPU code.

use std::cell::RefCell;

use candle_core::{bail, CpuStorage, InplaceOp2, Layout, Tensor};

use super::slices::{f32s, f32s_mut, fused_cpu};
use crate::error::Result;
use crate::trace;

/// Adam / AdamW hyperparameters for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f64,
    /// Running-average coefficients.
    pub betas: (f64, f64),
    /// Denominator epsilon.
    pub eps: f64,
    /// Weight decay: L2 on the gradient (Adam) or decoupled (AdamW).
    pub weight_decay: f64,
    /// AdamW's decoupled decay instead of Adam's L2.
    pub decoupled: bool,
    /// 1-based step count, for bias correction.
    pub step: u64,
}

/// SGD hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: no buffer).
    pub momentum: f64,
    /// Momentum dampening.
    pub dampening: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// L2 penalty.
    pub weight_decay: f64,
}

/// Host-side optimizer state of one parameter for the fused CPU path.
#[derive(Debug, Clone, Default)]
pub struct SlotState {
    /// First moment (Adam) or momentum buffer (SGD); empty until the first step.
    pub a: Vec<f32>,
    /// Second moment (Adam).
    pub b: Vec<f32>,
}

/// Applies one Adam/AdamW update to `param` in place. Returns `Ok(false)`
/// without touching anything when the fused kernel does not cover the device
/// or dtype (the caller then uses the generic path).
pub fn adam_step(
    param: &Tensor,
    grad: &Tensor,
    state: &mut SlotState,
    hp: AdamStep,
) -> Result<bool> {
    if !(fused_cpu(param) && fused_cpu(grad) && param.is_contiguous()) {
        return Ok(false);
    }
    let op = Update {
        state: RefCell::new(state),
        kind: Kind::Adam(hp),
    };
    param.inplace_op2(&grad.contiguous()?, &op)?;
    Ok(true)
}

/// Applies one SGD update in place; `Ok(false)` as for [`adam_step`].
pub fn sgd_step(param: &Tensor, grad: &Tensor, state: &mut SlotState, hp: SgdStep) -> Result<bool> {
    if !(fused_cpu(param) && fused_cpu(grad) && param.is_contiguous()) {
        return Ok(false);
    }
    let op = Update {
        state: RefCell::new(state),
        kind: Kind::Sgd(hp),
    };
    param.inplace_op2(&grad.contiguous()?, &op)?;
    Ok(true)
}

enum Kind {
    Adam(AdamStep),
    Sgd(SgdStep),
}

struct Update<'a> {
    state: RefCell<&'a mut SlotState>,
    kind: Kind,
}

impl InplaceOp2 for Update<'_> {
    fn name(&self) -> &'static str {
        "redline-optimizer-step"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        trace::count("optimizer.update");
        let p = f32s_mut(s1, l1, self.name())?;
        let g = f32s(s2, l2, self.name())?;
        if p.len() != g.len() {
            bail!(
                "optimizer: parameter has {} elements, gradient {}",
                p.len(),
                g.len()
            )
        }
        let mut st = self.state.borrow_mut();
        match self.kind {
            Kind::Adam(hp) => adam(p, g, &mut st, hp),
            Kind::Sgd(hp) => sgd(p, g, &mut st, hp),
        }
        Ok(())
    }
}

fn adam(p: &mut [f32], g: &[f32], st: &mut SlotState, hp: AdamStep) {
    if st.a.len() != p.len() {
        st.a = vec![0.0; p.len()];
        st.b = vec![0.0; p.len()];
    }
    let t = hp.step.min(i32::MAX as u64) as i32;
    let (b1, b2) = hp.betas;
    let step_size = (hp.lr / (1.0 - b1.powi(t))) as f32;
    let bc2_sqrt = (1.0 - b2.powi(t)).sqrt() as f32;
    let (w1, b2f, w2, eps) = (
        (1.0 - b1) as f32,
        b2 as f32,
        (1.0 - b2) as f32,
        hp.eps as f32,
    );
    let wd = hp.weight_decay as f32;
    let decay = (1.0 - hp.lr * hp.weight_decay) as f32;
    let (l2, decoupled) = (wd != 0.0 && !hp.decoupled, wd != 0.0 && hp.decoupled);
    for (((p, &g), m), v) in p
        .iter_mut()
        .zip(g)
        .zip(st.a.iter_mut())
        .zip(st.b.iter_mut())
    {
        let g = if l2 { g + wd * *p } else { g };
        if decoupled {
            *p *= decay;
        }
        *m += (g - *m) * w1;
        *v = *v * b2f + w2 * g * g;
        let denom = v.sqrt() / bc2_sqrt + eps;
        *p -= step_size * (*m / denom);
    }
}

fn sgd(p: &mut [f32], g: &[f32], st: &mut SlotState, hp: SgdStep) {
    let (lr, wd, mom) = (hp.lr as f32, hp.weight_decay as f32, hp.momentum as f32);
    let damp = (1.0 - hp.dampening) as f32;
    let first = hp.momentum != 0.0 && st.a.len() != p.len();
    if first {
        st.a = vec![0.0; p.len()];
    }
    if hp.momentum == 0.0 {
        for (p, &g) in p.iter_mut().zip(g) {
            let g = g + wd * *p;
            *p -= lr * g;
        }
        return;
    }
    for ((p, &g), buf) in p.iter_mut().zip(g).zip(st.a.iter_mut()) {
        let g = if wd != 0.0 { g + wd * *p } else { g };
        // PyTorch: the buffer starts as a copy of the first gradient.
        *buf = if first { g } else { *buf * mom + damp * g };
        let d = if hp.nesterov { g + mom * *buf } else { *buf };
        *p -= lr * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn adam_first_step_moves_by_lr() -> Result<()> {
        let p = Tensor::new(&[1f32, -2.0, 0.5], &Device::Cpu)?;
        let g = Tensor::new(&[0.3f32, -0.1, 2.0], &Device::Cpu)?;
        let mut st = SlotState::default();
        let hp = AdamStep {
            lr: 0.01,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            step: 1,
        };
        assert!(adam_step(&p, &g, &mut st, hp)?);
        let got = p.to_vec1::<f32>()?;
        for (x, want) in got.iter().zip([0.99f32, -1.99, 0.49]) {
            assert!((x - want).abs() < 1e-6, "{got:?}");
        }
        assert_eq!(st.a.len(), 3);
        Ok(())
    }

    #[test]
    fn sgd_momentum_buffer_starts_at_the_gradient() -> Result<()> {
        let p = Tensor::new(&[0f32], &Device::Cpu)?;
        let g = Tensor::new(&[1f32], &Device::Cpu)?;
        let mut st = SlotState::default();
        let hp = SgdStep {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        sgd_step(&p, &g, &mut st, hp)?;
        sgd_step(&p, &g, &mut st, hp)?;
        // buf = 1, then 1.9: p = -0.1 - 0.19
        assert!((p.to_vec1::<f32>()?[0] + 0.29).abs() < 1e-6);
        Ok(())
    }
}
