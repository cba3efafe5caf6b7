//! The optimizer arithmetic, written once: [`adam`] and [`sgd`] are generic
//! over [`Arith`], which `f32` implements (the fused CPU loop calls them per
//! element, where they inline to the same instructions as a hand-written
//! loop) and [`Tensor`] implements (the generic path for every other device
//! and dtype, one candle op per step of the formula). Both therefore round in
//! the same order, PyTorch's single-tensor order, and both flush subnormal
//! state to zero (see `optim.rs`).

use std::convert::Infallible;

use candle_core::{DType, Tensor};

use crate::optim::{AdamStep, SgdStep};

/// The operations an update is made of, on one element or a whole tensor.
pub trait Arith: Sized {
    /// `Infallible` for numbers; candle's error for tensors.
    type Error;
    /// A value that changes from step to step (the step size, bias
    /// correction, learning rate): a number for elements, a 0-d tensor on the
    /// parameter's device for tensors, so that a captured step reads it from
    /// device memory instead of baking it in.
    type Scalar;
    /// `self + o`.
    fn add(&self, o: &Self) -> Result<Self, Self::Error>;
    /// `self - o`.
    fn sub(&self, o: &Self) -> Result<Self, Self::Error>;
    /// `self * o`.
    fn mul(&self, o: &Self) -> Result<Self, Self::Error>;
    /// `self / o`.
    fn div(&self, o: &Self) -> Result<Self, Self::Error>;
    /// `self * s`.
    fn scale(&self, s: f32) -> Result<Self, Self::Error>;
    /// `self / s` (a true division, not a multiplication by `1 / s`).
    fn div_by(&self, s: f32) -> Result<Self, Self::Error>;
    /// `self + s`.
    fn offset(&self, s: f32) -> Result<Self, Self::Error>;
    /// The square root.
    fn sqrt(&self) -> Result<Self, Self::Error>;
    /// Zero where the value is subnormal, else the value.
    fn flush(&self) -> Result<Self, Self::Error>;
    /// `self * s` for a per-step value.
    fn mul_s(&self, s: &Self::Scalar) -> Result<Self, Self::Error>;
    /// `self / s` for a per-step value.
    fn div_s(&self, s: &Self::Scalar) -> Result<Self, Self::Error>;
}

impl Arith for f32 {
    type Error = Infallible;
    type Scalar = f32;
    #[inline(always)]
    fn add(&self, o: &Self) -> Result<Self, Infallible> {
        Ok(self + o)
    }
    #[inline(always)]
    fn sub(&self, o: &Self) -> Result<Self, Infallible> {
        Ok(self - o)
    }
    #[inline(always)]
    fn mul(&self, o: &Self) -> Result<Self, Infallible> {
        Ok(self * o)
    }
    #[inline(always)]
    fn div(&self, o: &Self) -> Result<Self, Infallible> {
        Ok(self / o)
    }
    #[inline(always)]
    fn scale(&self, s: f32) -> Result<Self, Infallible> {
        Ok(self * s)
    }
    #[inline(always)]
    fn div_by(&self, s: f32) -> Result<Self, Infallible> {
        Ok(self / s)
    }
    #[inline(always)]
    fn offset(&self, s: f32) -> Result<Self, Infallible> {
        Ok(self + s)
    }
    #[inline(always)]
    fn sqrt(&self) -> Result<Self, Infallible> {
        Ok(f32::sqrt(*self))
    }
    #[inline(always)]
    fn flush(&self) -> Result<Self, Infallible> {
        Ok(if self.abs() < f32::MIN_POSITIVE {
            0.0
        } else {
            *self
        })
    }
    #[inline(always)]
    fn mul_s(&self, s: &f32) -> Result<Self, Infallible> {
        Ok(self * s)
    }
    #[inline(always)]
    fn div_s(&self, s: &f32) -> Result<Self, Infallible> {
        Ok(self / s)
    }
}

/// A scalar `s` as a 0-d tensor shaped to broadcast against `t`.
fn scalar_like(t: &Tensor, s: f32) -> candle_core::Result<Tensor> {
    Tensor::new(s, t.device())?.to_dtype(t.dtype())
}

impl Arith for Tensor {
    type Error = candle_core::Error;
    type Scalar = Tensor;
    fn add(&self, o: &Self) -> candle_core::Result<Self> {
        self + o
    }
    fn sub(&self, o: &Self) -> candle_core::Result<Self> {
        self - o
    }
    fn mul(&self, o: &Self) -> candle_core::Result<Self> {
        self * o
    }
    fn div(&self, o: &Self) -> candle_core::Result<Self> {
        self / o
    }
    fn scale(&self, s: f32) -> candle_core::Result<Self> {
        self.broadcast_mul(&scalar_like(self, s)?)
    }
    fn div_by(&self, s: f32) -> candle_core::Result<Self> {
        self.broadcast_div(&scalar_like(self, s)?)
    }
    fn offset(&self, s: f32) -> candle_core::Result<Self> {
        self.broadcast_add(&scalar_like(self, s)?)
    }
    fn sqrt(&self) -> candle_core::Result<Self> {
        Tensor::sqrt(self)
    }
    fn flush(&self) -> candle_core::Result<Self> {
        // The smallest normal of each dtype; f16's (6e-5) is too coarse to
        // flush moments at, so f16 keeps its subnormals.
        let tiny = match self.dtype() {
            DType::F32 | DType::BF16 => f64::from(f32::MIN_POSITIVE),
            DType::F64 => f64::MIN_POSITIVE,
            _ => return Ok(self.clone()),
        };
        // "Below the smallest normal" rather than "not above it": a NaN
        // compares false and stays a NaN, as in the element form (and in
        // PyTorch, which never flushes): a NaN gradient poisons the moments
        // there, not zeroes them here.
        let tiny_ones = self.abs()?.lt(tiny)?;
        tiny_ones.where_cond(&self.zeros_like()?, self)
    }
    fn mul_s(&self, s: &Tensor) -> candle_core::Result<Self> {
        self.broadcast_mul(s)
    }
    fn div_s(&self, s: &Tensor) -> candle_core::Result<Self> {
        self.broadcast_div(s)
    }
}

/// Adam's constants for one step (in f64, as PyTorch computes them on the
/// host, then rounded once to the parameter's precision). `S` holds the ones
/// that change from step to step: `f32` for the fused loop, a 0-d tensor on
/// the device for the generic path ([`crate::optim::DeviceHyper`]).
#[derive(Debug, Clone, Copy)]
pub struct AdamConsts<S = f32> {
    /// `lr / (1 - beta1^t)`.
    pub(crate) step_size: S,
    /// `sqrt(1 - beta2^t)`.
    pub(crate) bc2_sqrt: S,
    /// AdamW's decoupled factor `1 - lr * wd`; `None` where it is the identity.
    pub(crate) decay: Option<S>,
    pub(crate) w1: f32,
    pub(crate) b2: f32,
    pub(crate) w2: f32,
    pub(crate) eps: f32,
    /// Adam's L2 term (0 for AdamW or no decay).
    pub(crate) l2: f32,
}

impl AdamConsts<f32> {
    /// The constants of step `hp.step`.
    pub fn new(hp: AdamStep) -> Self {
        let t = hp.step.min(i32::MAX as u64) as i32;
        let (b1, _) = hp.betas;
        let decay = (1.0 - hp.lr * hp.weight_decay) as f32;
        AdamConsts::from_parts(
            hp,
            (hp.lr / (1.0 - b1.powi(t))) as f32,
            (1.0 - hp.betas.1.powi(t)).sqrt() as f32,
            (hp.decoupled && decay != 1.0).then_some(decay),
        )
    }
}

impl AdamConsts<f32> {
    /// The same constants with the per-step values as 0-d tensors of `dtype`
    /// on `device`, uploaded from the host (what the generic path used before
    /// [`crate::optim::DeviceHyper`]; kept as its reference in tests).
    pub fn to_tensors(
        &self,
        device: &candle_core::Device,
        dtype: DType,
    ) -> candle_core::Result<AdamConsts<Tensor>> {
        let up = |x: f32| Tensor::new(x, device)?.to_dtype(dtype);
        Ok(AdamConsts {
            step_size: up(self.step_size)?,
            bc2_sqrt: up(self.bc2_sqrt)?,
            decay: self.decay.map(up).transpose()?,
            w1: self.w1,
            b2: self.b2,
            w2: self.w2,
            eps: self.eps,
            l2: self.l2,
        })
    }
}

impl SgdConsts<f32> {
    /// The same constants with the learning rate as a 0-d tensor (see
    /// [`AdamConsts::to_tensors`]).
    pub fn to_tensors(
        &self,
        device: &candle_core::Device,
        dtype: DType,
    ) -> candle_core::Result<SgdConsts<Tensor>> {
        Ok(SgdConsts {
            lr: Tensor::new(self.lr, device)?.to_dtype(dtype)?,
            wd: self.wd,
            mom: self.mom,
            damp: self.damp,
            nesterov: self.nesterov,
        })
    }
}

impl<S> AdamConsts<S> {
    /// The per-step values as given, the fixed ones from `hp`.
    pub(crate) fn from_parts(hp: AdamStep, step_size: S, bc2_sqrt: S, decay: Option<S>) -> Self {
        let (b1, b2) = hp.betas;
        AdamConsts {
            step_size,
            bc2_sqrt,
            decay,
            w1: (1.0 - b1) as f32,
            b2: b2 as f32,
            w2: (1.0 - b2) as f32,
            eps: hp.eps as f32,
            l2: if hp.decoupled {
                0.0
            } else {
                hp.weight_decay as f32
            },
        }
    }
}

/// One Adam/AdamW update of parameter `p` with gradient `g` and moments `m`,
/// `v` (zero before the first step): returns the new `[p, m, v]`.
///
/// PyTorch's order: `g += l2 * p`; `p *= 1 - lr * wd` (AdamW);
/// `m += (g - m) * (1 - b1)`; `v = v * b2 + (1 - b2) * g * g`;
/// `p -= step_size * (m / (sqrt(v) / sqrt(bc2) + eps))`. The decay terms are
/// skipped when they are the identity (`g + 0 * p` and `p * 1` are exact).
#[inline(always)]
pub fn adam<T: Arith>(
    p: &T,
    g: &T,
    m: &T,
    v: &T,
    c: &AdamConsts<T::Scalar>,
) -> Result<[T; 3], T::Error> {
    let decayed_g;
    let g = if c.l2 != 0.0 {
        decayed_g = g.add(&p.scale(c.l2)?)?;
        &decayed_g
    } else {
        g
    };
    let decayed_p;
    let p = match &c.decay {
        Some(d) => {
            decayed_p = p.mul_s(d)?;
            &decayed_p
        }
        None => p,
    };
    let m = m.add(&g.sub(m)?.scale(c.w1)?)?.flush()?;
    let v = v.scale(c.b2)?.add(&g.scale(c.w2)?.mul(g)?)?.flush()?;
    let denom = v.sqrt()?.div_s(&c.bc2_sqrt)?.offset(c.eps)?;
    let p = p.sub(&m.div(&denom)?.mul_s(&c.step_size)?)?;
    Ok([p, m, v])
}

/// SGD's constants, rounded to f32 once; the learning rate as `S` (see
/// [`AdamConsts`]).
#[derive(Debug, Clone, Copy)]
pub struct SgdConsts<S = f32> {
    pub(crate) lr: S,
    pub(crate) wd: f32,
    pub(crate) mom: f32,
    pub(crate) damp: f32,
    pub(crate) nesterov: bool,
}

impl SgdConsts<f32> {
    /// The constants of `hp`.
    pub fn new(hp: SgdStep) -> Self {
        Self::with_lr(hp, hp.lr as f32)
    }
}

impl<S> SgdConsts<S> {
    /// The constants of `hp` with the learning rate `lr`.
    pub(crate) fn with_lr(hp: SgdStep, lr: S) -> Self {
        Self {
            lr,
            wd: hp.weight_decay as f32,
            mom: hp.momentum as f32,
            damp: (1.0 - hp.dampening) as f32,
            nesterov: hp.nesterov,
        }
    }

    /// Whether the update keeps a momentum buffer.
    pub fn momentum(&self) -> bool {
        self.mom != 0.0
    }
}

/// One SGD update of `p` with gradient `g`: returns the new parameter and,
/// with momentum, the new buffer (`buf` is `None` at the first step, where
/// PyTorch starts the buffer as a copy of the gradient).
#[inline(always)]
pub fn sgd<T: Arith + Clone>(
    p: &T,
    g: &T,
    buf: Option<&T>,
    c: &SgdConsts<T::Scalar>,
) -> Result<(T, Option<T>), T::Error> {
    let decayed_g;
    let g = if c.wd != 0.0 {
        decayed_g = g.add(&p.scale(c.wd)?)?;
        &decayed_g
    } else {
        g
    };
    if c.mom == 0.0 {
        return Ok((p.sub(&g.mul_s(&c.lr)?)?, None));
    }
    let b = match buf {
        None => g.clone(),
        Some(b) => b.scale(c.mom)?.add(&g.scale(c.damp)?)?,
    }
    .flush()?;
    let d = if c.nesterov {
        g.add(&b.scale(c.mom)?)?
    } else {
        b.clone()
    };
    Ok((p.sub(&d.mul_s(&c.lr)?)?, Some(b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn hp(decoupled: bool, step: u64) -> AdamStep {
        AdamStep {
            lr: 1e-2,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.05,
            decoupled,
            step,
        }
    }

    /// The tensor form gives the element form's bits, element by element.
    #[test]
    fn tensors_and_elements_round_alike() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let vals =
            |s: f32| -> Vec<f32> { (0..37).map(|i| ((i as f32) * 0.731 + s).sin()).collect() };
        let (p, g, m, v) = (vals(0.0), vals(1.0), vals(2.0), vals(3.0));
        let v: Vec<f32> = v.iter().map(|x| x * x * 1e-3).collect();
        let t = |x: &[f32]| Tensor::new(x, &dev);
        for (decoupled, step) in [(false, 1), (true, 7)] {
            let c = AdamConsts::new(hp(decoupled, step));
            let ct = c.to_tensors(&dev, DType::F32)?;
            let [tp, tm, tv] = adam(&t(&p)?, &t(&g)?, &t(&m)?, &t(&v)?, &ct)?;
            for i in 0..p.len() {
                let Ok([ep, em, ev]) = adam(&p[i], &g[i], &m[i], &v[i], &c);
                assert_eq!(tp.get(i)?.to_scalar::<f32>()?.to_bits(), ep.to_bits());
                assert_eq!(tm.get(i)?.to_scalar::<f32>()?.to_bits(), em.to_bits());
                assert_eq!(tv.get(i)?.to_scalar::<f32>()?.to_bits(), ev.to_bits());
            }
        }
        let sgd_hp = SgdStep {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.1,
            nesterov: false,
            weight_decay: 1e-3,
        };
        let c = SgdConsts::new(sgd_hp);
        let (tp, tb) = sgd(
            &t(&p)?,
            &t(&g)?,
            Some(&t(&m)?),
            &c.to_tensors(&dev, DType::F32)?,
        )?;
        let Some(tb) = tb else {
            panic!("momentum keeps a buffer")
        };
        for i in 0..p.len() {
            let Ok((ep, eb)) = sgd(&p[i], &g[i], Some(&m[i]), &c);
            assert_eq!(tp.get(i)?.to_scalar::<f32>()?.to_bits(), ep.to_bits());
            assert_eq!(Some(tb.get(i)?.to_scalar::<f32>()?), eb);
        }
        Ok(())
    }

    /// Subnormals flushed; normals, infinities and NaNs kept, by both forms,
    /// in f32 and bf16.
    #[test]
    fn tensors_flush_subnormals_like_elements() -> candle_core::Result<()> {
        let x = [
            1e-39f32,
            -1e-40,
            1e-37,
            0.5,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
        ];
        let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
        let e: Vec<f32> = x.iter().map(|v| v.flush().unwrap_or(*v)).collect();
        let mut want = vec![0.0, 0.0, 1e-37, 0.5, f32::MIN_POSITIVE, f32::INFINITY];
        want.extend([f32::NEG_INFINITY, f32::NAN, -f32::NAN]);
        assert_eq!(bits(&e), bits(&want));
        let t = Tensor::new(&x, &Device::Cpu)?.flush()?.to_vec1::<f32>()?;
        assert_eq!(bits(&t), bits(&e));
        let b = Tensor::new(&x, &Device::Cpu)?.to_dtype(DType::BF16)?;
        let got = b.flush()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let want16 = b.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let want16: Vec<f32> = want16.iter().map(|v| v.flush().unwrap_or(*v)).collect();
        assert_eq!(bits(&got), bits(&want16));
        assert!(got[7].is_nan() && got[0] == 0.0);
        Ok(())
    }
}
