//! bf16-true's update from candle tensor ops, for bf16 parameters the CPU's
//! bf16 loop does not take (a GPU's, without the fused kernels): the loop's
//! arithmetic (`optim_bf16.rs`, PyTorch's single-tensor Adam and SGD on
//! bf16 tensors) as f32 tensor ops, rounded to bf16 at the same points,
//! with the per-step constants in f32 on the device ([`DeviceHyper::adam`]
//! with `DType::F32`), so that nothing is read back and a captured step
//! replays. The generic path's one-op-per-tensor arithmetic
//! ([`crate::optim_math`]) would round every operation to bf16 and its
//! constants too, where PyTorch rounds after each in-place op and passes
//! the constants as f32.
//!
//! [`DeviceHyper::adam`]: crate::optim::DeviceHyper::adam

use candle_core::{DType, Tensor, Var};

use crate::error::Result;
use crate::optim::TensorState;
use crate::optim_math::{AdamConsts, Arith, SgdConsts};

/// `t` rounded to bf16 and widened back (f32 in, f32 out).
fn r(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?)
}

/// A state buffer as f32 (zeros before the first step).
fn state_f32(slot: &Option<Var>, p: &Tensor) -> Result<Tensor> {
    Ok(match slot {
        Some(v) => v.as_tensor().to_dtype(DType::F32)?,
        None => p.zeros_like()?.to_dtype(DType::F32)?,
    })
}

/// Stores the f32 `value` in `slot` as bf16: in place when the buffer exists.
fn keep16(slot: &mut Option<Var>, value: &Tensor) -> Result<()> {
    let v = value.to_dtype(DType::BF16)?;
    match slot {
        Some(var) => var.set(&v)?,
        None => *slot = Some(Var::from_tensor(&v)?),
    }
    Ok(())
}

/// One Adam/AdamW step of the bf16 parameter `p` with its bf16 gradient `g`
/// (both detached), constants `c` in f32 (`DeviceHyper::adam(hp,
/// DType::F32)`); the bf16 moments are updated in place. Returns the new
/// bf16 parameter.
pub fn adam_tensors_bf16(
    p: &Tensor,
    g: &Tensor,
    st: &mut TensorState,
    c: &AdamConsts<Tensor>,
) -> Result<Tensor> {
    // An f32 gradient (all-reduced) is rounded to bf16 first: PyTorch's is bf16.
    let (p32, g32) = (p.to_dtype(DType::F32)?, r(&g.to_dtype(DType::F32)?)?);
    let (m0, v0) = (state_f32(&st.a, p)?, state_f32(&st.b, p)?);
    // grad.add(param, alpha=l2), with an L2 term only (`g + 0 * p` would be
    // NaN at an infinite weight); param.mul_(1 - lr * wd) (AdamW)
    let gi = if c.l2 != 0.0 {
        r(&g32.add(&p32.scale(c.l2)?)?)?
    } else {
        g32
    };
    let pi = match &c.decay {
        Some(d) => r(&p32.mul_s(d)?)?,
        None => p32,
    };
    // exp_avg.lerp_(grad, 1 - beta1)
    let m = r(&m0.add(&gi.sub(&m0)?.scale(c.w1)?)?)?.flush()?;
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    let v = r(&r(&v0.scale(c.b2)?)?.add(&gi.scale(c.w2)?.mul(&gi)?)?)?.flush()?;
    // (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    let denom = r(&r(&r(&v.sqrt()?)?.div_s(&c.bc2_sqrt)?)?.offset(c.eps)?)?;
    // param.addcdiv_(exp_avg, denom, value=-step_size)
    let step = m.mul_s(&c.step_size.neg()?)?.div(&denom)?;
    let p1 = pi.add(&step)?.to_dtype(DType::BF16)?;
    keep16(&mut st.a, &m)?;
    keep16(&mut st.b, &v)?;
    Ok(p1)
}

/// One SGD step of the bf16 `p` with its bf16 gradient `g`, the learning
/// rate in f32 (`DeviceHyper::sgd(hp, DType::F32)`); the bf16 momentum
/// buffer is updated in place (it starts as the gradient). Returns the new
/// bf16 parameter.
pub fn sgd_tensors_bf16(
    p: &Tensor,
    g: &Tensor,
    st: &mut TensorState,
    c: &SgdConsts<Tensor>,
) -> Result<Tensor> {
    let (p32, g32) = (p.to_dtype(DType::F32)?, r(&g.to_dtype(DType::F32)?)?);
    // grad.add(param, alpha=weight_decay), with a weight decay only
    let gi = if c.wd != 0.0 {
        r(&g32.add(&p32.scale(c.wd)?)?)?
    } else {
        g32
    };
    let d = if c.momentum() {
        // buf.mul_(momentum).add_(grad, alpha=1 - dampening), or grad at first
        let b = match &st.a {
            None => gi.clone(),
            Some(buf) => {
                let b0 = buf.as_tensor().to_dtype(DType::F32)?;
                r(&r(&b0.scale(c.mom)?)?.add(&gi.scale(c.damp)?)?)?.flush()?
            }
        };
        keep16(&mut st.a, &b)?;
        if c.nesterov {
            r(&gi.add(&b.scale(c.mom)?)?)?
        } else {
            b
        }
    } else {
        gi
    };
    // param.add_(d, alpha=-lr)
    Ok(p32.add(&d.mul_s(&c.lr.neg()?)?)?.to_dtype(DType::BF16)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad::GradRef;
    use crate::optim::{adam_step, sgd_step, AdamStep, DeviceHyper, SgdStep, SlotState};
    use candle_core::Device;

    fn vals(n: usize, s: f32, scale: f32) -> Result<Tensor> {
        let v: Vec<f32> = (0..n)
            .map(|i| ((i as f32) * 0.61 + s).sin() * scale)
            .collect();
        Ok(Tensor::new(v, &Device::Cpu)?.to_dtype(DType::BF16)?)
    }

    fn bits(t: &Tensor) -> Result<Vec<u16>> {
        Ok(t.to_vec1::<half::bf16>()?
            .iter()
            .map(|x| x.to_bits())
            .collect())
    }

    /// The tensor ops give the CPU bf16 loop's bits, step after step, for
    /// Adam (L2), AdamW and SGD with Nesterov momentum and decay, with the
    /// constants computed on the device across a learning-rate change; and
    /// Adam and SGD without weight decay, with an infinite weight, which
    /// stays infinite (PyTorch adds `wd * p` only with a weight decay).
    #[test]
    fn tensor_ops_give_the_bf16_loops_bits() -> Result<()> {
        let n = 257;
        for (kind, wd) in [
            ("adam", 0.05),
            ("adamw", 0.05),
            ("sgd", 1e-3),
            ("adam", 0.0),
            ("sgd", 0.0),
        ] {
            let mut p0 = vals(n, 0.0, 0.05)?;
            if wd == 0.0 {
                let mut v = p0.to_vec1::<half::bf16>()?;
                v[3] = half::bf16::INFINITY;
                p0 = Tensor::new(v, &Device::Cpu)?;
            }
            let looped = p0.copy()?;
            let mut slot = SlotState::default();
            let mut ops = p0.copy()?;
            let mut st = TensorState::default();
            let mut h = DeviceHyper::new(&Device::Cpu, 1e-2, 0)?;
            for step in 1..=15u64 {
                let lr = if step <= 7 { 1e-2 } else { 2e-3 };
                let g = vals(n, step as f32, 1e-2)?;
                h.set_lr(lr)?;
                h.advance()?;
                let adam = AdamStep {
                    lr,
                    betas: (0.9, 0.999),
                    eps: 1e-8,
                    weight_decay: wd,
                    decoupled: kind == "adamw",
                    step,
                };
                let sgd = SgdStep {
                    lr,
                    momentum: 0.9,
                    dampening: 0.0,
                    nesterov: true,
                    weight_decay: wd,
                };
                if kind == "sgd" {
                    assert!(sgd_step(&looped, GradRef::Tensor(&g), &mut slot, sgd)?);
                    ops = sgd_tensors_bf16(&ops, &g, &mut st, &h.sgd(sgd, DType::F32)?)?;
                } else {
                    assert!(adam_step(&looped, GradRef::Tensor(&g), &mut slot, adam)?);
                    ops = adam_tensors_bf16(&ops, &g, &mut st, &h.adam(adam, DType::F32)?)?;
                }
                assert_eq!(ops.dtype(), DType::BF16);
                assert_eq!(bits(&ops)?, bits(&looped)?, "{kind} (wd {wd}) step {step}");
            }
            let first = st.a.as_ref().map(|v| bits(v.as_tensor())).transpose()?;
            let want: Vec<u16> = slot.half.a.iter().map(|x| x.to_bits()).collect();
            assert_eq!(
                first,
                Some(want),
                "{kind} (wd {wd}): the first state buffer"
            );
            assert_ne!(bits(&ops)?, bits(&p0)?);
            if wd == 0.0 {
                assert_eq!(bits(&ops)?[3], half::bf16::INFINITY.to_bits(), "{kind}");
            }
        }
        Ok(())
    }
}
