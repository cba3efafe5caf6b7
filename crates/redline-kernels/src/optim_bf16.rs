//! `bf16-true`'s optimizer updates on the CPU: the parameter, its gradient
//! and the state (Adam's moments, SGD's momentum buffer) all bf16, updated
//! in one pass with no temporaries. Each element is computed in f32 and
//! rounded to bf16 where PyTorch's single-tensor Adam and SGD round on bf16
//! tensors: after each in-place op (`lerp_`, `mul_`, `addcmul_`, `sqrt`,
//! `/`, `add_`, `addcdiv_`), whose CPU kernels compute in f32 and store
//! bf16. The constants are the fp32 path's ([`AdamConsts`], [`SgdConsts`]:
//! f64 rounded once to f32, as PyTorch passes Python floats to the ops).
//!
//! The state is held as bf16 on the host ([`Bf16State`]): with bf16
//! parameters and gradients, a parameter costs 8 bytes in training instead
//! of fp32's 16. Moments below f32's smallest normal are flushed to zero,
//! as on the fp32 path (`optim.rs` says why).

use std::cell::RefCell;

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, InplaceOp1, InplaceOp2, Layout, Tensor};
use half::bf16;
use pulp::{Simd, WithSimd};

use crate::error::Result;
use crate::grad::GradRef;
use crate::half16::bf16_round;
use crate::optim::{AdamStep, SgdStep};
use crate::optim_chunks::for_chunks;
use crate::optim_math::{AdamConsts, SgdConsts};
use redline_core::trace;

/// The bf16 state of one parameter: Adam's first and second moments, or
/// SGD's momentum buffer in `a`; empty until the first step.
#[derive(Debug, Clone, Default)]
pub struct Bf16State {
    /// First moment (Adam) or momentum buffer (SGD).
    pub a: Vec<bf16>,
    /// Second moment (Adam).
    pub b: Vec<bf16>,
}

impl Bf16State {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        ((self.a.len() + self.b.len()) * 2) as u64
    }
}

/// Whether the bf16 update covers `param`: a contiguous bf16 CPU tensor.
pub fn bf16_covers(param: &Tensor) -> bool {
    param.device().is_cpu() && param.dtype() == DType::BF16 && param.is_contiguous()
}

/// One step's kind and hyperparameters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bf16Kind {
    Adam(AdamStep),
    Sgd(SgdStep),
}

/// Updates the bf16 `param` in place from `grad` (bf16, or f32 rounded to
/// bf16 first); `Ok(false)` without touching anything when it is not
/// covered ([`bf16_covers`], or a gradient on another device).
pub(crate) fn update(
    param: &Tensor,
    grad: GradRef<'_>,
    state: &mut Bf16State,
    kind: Bf16Kind,
) -> Result<bool> {
    if !bf16_covers(param) {
        return Ok(false);
    }
    let op = Update {
        state: RefCell::new(state),
        kind,
    };
    match grad {
        GradRef::Tensor(g)
            if g.device().is_cpu() && matches!(g.dtype(), DType::BF16 | DType::F32) =>
        {
            param.inplace_op2(&g.contiguous()?, &op)?
        }
        GradRef::Tensor(_) => return Ok(false),
        GradRef::Host(g) => param.inplace_op1(&FromSlice { g, op })?,
    }
    Ok(true)
}

/// A gradient's elements as f32 values already rounded to bf16.
#[derive(Clone, Copy)]
enum Grad<'a> {
    Bf16(&'a [bf16]),
    F32(&'a [f32]),
}

impl Grad<'_> {
    fn len(&self) -> usize {
        match self {
            Grad::Bf16(g) => g.len(),
            Grad::F32(g) => g.len(),
        }
    }
}

/// bf16 widened (exact).
#[inline(always)]
fn up(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// f32 rounded to bf16 (to nearest even).
#[inline(always)]
fn down(x: f32) -> bf16 {
    bf16::from_bits((bf16_round(x).to_bits() >> 16) as u16)
}

/// [`bf16_round`] for a value the loop's arithmetic produced from bf16
/// values and finite constants, with no NaN case: such a NaN has its low 16
/// bits zero (an operation's NaN carries an operand's payload, quieted, or
/// the default NaN, whose low bits are zero; the operands here are bf16
/// values widened, with zero low bits, and finite constants), so adding the
/// rounding bias cannot carry into its upper bits and the masked sum is the
/// quiet NaN `bf16_round` gives. Two of its seven vector operations; the
/// loop rounds ten times an element.
#[inline(always)]
fn round_op(x: f32) -> f32 {
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000)
}

/// [`round_op`]'s bf16.
#[inline(always)]
fn down_op(x: f32) -> bf16 {
    bf16::from_bits((round_op(x).to_bits() >> 16) as u16)
}

/// Zero for a value below f32's smallest normal.
#[inline(always)]
fn flush(x: f32) -> f32 {
    if x.abs() < f32::MIN_POSITIVE {
        0.0
    } else {
        x
    }
}

struct Update<'a> {
    state: RefCell<&'a mut Bf16State>,
    kind: Bf16Kind,
}

impl Update<'_> {
    fn apply(&self, p: &mut [bf16], g: Grad<'_>) -> candle_core::Result<()> {
        trace::count("optimizer.update");
        if p.len() != g.len() {
            bail!(
                "optimizer (bf16): parameter has {} elements, gradient {}",
                p.len(),
                g.len()
            )
        }
        let mut st = self.state.borrow_mut();
        match self.kind {
            Bf16Kind::Adam(hp) => adam(p, g, &mut st, hp),
            Bf16Kind::Sgd(hp) => sgd(p, g, &mut st, hp),
        }
        Ok(())
    }
}

/// The parameter's bf16 elements.
fn bf16s_mut<'a>(s: &'a mut CpuStorage, l: &Layout) -> candle_core::Result<&'a mut [bf16]> {
    let CpuStorage::BF16(v) = s else {
        bail!(
            "optimizer (bf16): expected bf16 storage, got {:?}",
            s.dtype()
        )
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&mut v[a..b]),
        None => bail!("optimizer (bf16): parameter is not contiguous"),
    }
}

impl InplaceOp2 for Update<'_> {
    fn name(&self) -> &'static str {
        "redline-optimizer-step-bf16"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let Some((a, b)) = l2.contiguous_offsets() else {
            bail!("optimizer (bf16): gradient is not contiguous")
        };
        let g = match s2 {
            CpuStorage::BF16(g) => Grad::Bf16(&g[a..b]),
            CpuStorage::F32(g) => Grad::F32(&g[a..b]),
            other => bail!("optimizer (bf16): gradient of {:?}", other.dtype()),
        };
        self.apply(bf16s_mut(s1, l1)?, g)
    }
}

/// The update with its gradient from a host f32 slice.
struct FromSlice<'a> {
    g: &'a [f32],
    op: Update<'a>,
}

impl InplaceOp1 for FromSlice<'_> {
    fn name(&self) -> &'static str {
        "redline-optimizer-step-bf16"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout) -> candle_core::Result<()> {
        self.op.apply(bf16s_mut(s1, l1)?, Grad::F32(self.g))
    }
}

/// The gradient as bf16: as it is, or an f32 host gradient rounded.
fn as_bf16(g: Grad<'_>) -> std::borrow::Cow<'_, [bf16]> {
    match g {
        Grad::Bf16(g) => std::borrow::Cow::Borrowed(g),
        Grad::F32(g) => std::borrow::Cow::Owned(g.iter().map(|x| down(*x)).collect()),
    }
}

/// PyTorch's `_single_tensor_adam` on bf16 tensors, element by element:
/// `g = g + l2 * p`; `p *= 1 - lr * wd` (AdamW); `m.lerp_(g, 1 - b1)`;
/// `v.mul_(b2).addcmul_(g, g, 1 - b2)`;
/// `denom = (v.sqrt() / sqrt(bc2)).add_(eps)`;
/// `p.addcdiv_(m, denom, -step_size)`, rounding to bf16 after each.
fn adam(p: &mut [bf16], g: Grad<'_>, st: &mut Bf16State, hp: AdamStep) {
    if st.a.len() != p.len() {
        st.a = vec![bf16::ZERO; p.len()];
        st.b = vec![bf16::ZERO; p.len()];
    }
    let c = AdamConsts::new(hp);
    for_chunks(p, &as_bf16(g), &mut st.a, &mut st.b, |p, g, m, v| {
        pulp::Arch::new().dispatch(AdamLoop { p, g, m, v, c })
    });
}

/// One Adam pass, compiled per instruction set so that it vectorizes (the
/// constants are a field, copied into registers).
struct AdamLoop<'a> {
    p: &'a mut [bf16],
    g: &'a [bf16],
    m: &'a mut [bf16],
    v: &'a mut [bf16],
    c: AdamConsts,
}

impl WithSimd for AdamLoop<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        // PyTorch runs the decay ops only with a weight decay; a loop
        // without them skips two roundings an element.
        match (self.c.l2 != 0.0, self.c.decay.is_some()) {
            (false, false) => self.run::<false, false>(),
            (true, false) => self.run::<true, false>(),
            (false, true) => self.run::<false, true>(),
            (true, true) => self.run::<true, true>(),
        }
    }
}

impl AdamLoop<'_> {
    /// The pass with Adam's L2 term (`L2`) and AdamW's decay (`DECAY`) or
    /// without.
    #[inline(always)]
    fn run<const L2: bool, const DECAY: bool>(self) {
        let Self { p, g, m, v, c } = self;
        let r = round_op;
        let (l2, decay) = (c.l2, c.decay.unwrap_or(1.0));
        let n = p.len().min(g.len()).min(m.len()).min(v.len());
        let (p, g, m, v) = (&mut p[..n], &g[..n], &mut m[..n], &mut v[..n]);
        for i in 0..n {
            let mut pi = up(p[i]);
            let mut gi = up(g[i]);
            if L2 {
                gi = r(gi + l2 * pi);
            }
            if DECAY {
                pi = r(pi * decay);
            }
            let mi = up(m[i]);
            let mi = flush(r(mi + c.w1 * (gi - mi)));
            let vi = flush(r(r(up(v[i]) * c.b2) + c.w2 * gi * gi));
            let denom = r(r(r(vi.sqrt()) / c.bc2_sqrt) + c.eps);
            p[i] = down_op(pi + (-c.step_size * mi) / denom);
            m[i] = down_op(mi);
            v[i] = down_op(vi);
        }
    }
}

/// PyTorch's `_single_tensor_sgd` on bf16 tensors: `g = g + wd * p`;
/// momentum `buf = g` at the first step, then `buf.mul_(mom).add_(g,
/// alpha=1 - dampening)`; Nesterov `g = g + mom * buf`; `p.add_(d,
/// alpha=-lr)`, rounding to bf16 after each.
fn sgd(p: &mut [bf16], g: Grad<'_>, st: &mut Bf16State, hp: SgdStep) {
    let c = SgdConsts::new(hp);
    let first = c.momentum() && st.a.len() != p.len();
    if first {
        st.a = vec![bf16::ZERO; p.len()];
    }
    for_chunks(p, &as_bf16(g), &mut st.a, &mut [], |p, g, buf, _| {
        sgd_chunk(p, g, buf, c, first)
    });
}

/// [`sgd`] over one chunk: `buf` empty without momentum.
fn sgd_chunk(p: &mut [bf16], g: &[bf16], buf: &mut [bf16], c: SgdConsts, first: bool) {
    let r = bf16_round;
    for (i, (pe, ge)) in p.iter_mut().zip(g.iter()).enumerate() {
        let pi = up(*pe);
        // An exact no-op without decay (`g + 0 * p`).
        let gi = r(up(*ge) + c.wd * pi);
        let d = match buf.get_mut(i) {
            Some(be) if c.momentum() => {
                let b = if first {
                    gi
                } else {
                    flush(r(r(up(*be) * c.mom) + c.damp * gi))
                };
                *be = down(b);
                if c.nesterov {
                    r(gi + c.mom * b)
                } else {
                    b
                }
            }
            _ => gi,
        };
        *pe = down(pi + -c.lr * d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn hp(step: u64, decoupled: bool, wd: f64) -> AdamStep {
        AdamStep {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: wd,
            decoupled,
            step,
        }
    }

    /// The reference: each PyTorch op as its own bf16 tensor op (candle's
    /// bf16 ops compute in f32 and round), fused ops (`lerp_`, `addcmul_`,
    /// `addcdiv_`) computed in f32 and rounded once, as PyTorch's CPU
    /// kernels do. The fused loop gives its bits, step after step.
    #[test]
    fn adam_rounds_where_pytorchs_bf16_ops_round() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let n = 53;
        let vals = |s: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * 0.77 + s).sin()).collect() };
        let bf = |v: Vec<f32>| Tensor::new(v, &dev)?.to_dtype(DType::BF16);
        let f = |t: &Tensor| t.to_dtype(DType::F32);
        // AdamW's factor at wd 0.05 (1 - 5e-5) rounds most bf16 weights back
        // to themselves; at 20 (0.98) it moves every one.
        for (decoupled, wd) in [(false, 0.0), (false, 0.01), (true, 0.05), (true, 20.0)] {
            let p = bf(vals(0.0).iter().map(|x| x * 0.05).collect())?;
            let mut st = Bf16State::default();
            let (mut rp, mut rm, mut rv) = (p.copy()?, p.zeros_like()?, p.zeros_like()?);
            for step in 1..=12u64 {
                let g = bf(vals(step as f32).iter().map(|x| x * 1e-2).collect())?;
                assert!(update(
                    &p,
                    GradRef::Tensor(&g),
                    &mut st,
                    Bf16Kind::Adam(hp(step, decoupled, wd))
                )
                .map_err(candle_core::Error::wrap)?);
                let c = AdamConsts::new(hp(step, decoupled, wd));
                let s = |x: f32| Tensor::new(x, &dev);
                let mut gr = g.clone();
                if c.l2 != 0.0 {
                    gr = (f(&g)? + f(&rp)?.broadcast_mul(&s(c.l2)?)?)?.to_dtype(DType::BF16)?;
                }
                if let Some(d) = c.decay {
                    rp = f(&rp)?.broadcast_mul(&s(d)?)?.to_dtype(DType::BF16)?;
                }
                let g32 = f(&gr)?;
                rm = (f(&rm)? + (&g32 - f(&rm)?)?.broadcast_mul(&s(c.w1)?)?)?
                    .to_dtype(DType::BF16)?;
                let vb = f(&rv)?.broadcast_mul(&s(c.b2)?)?.to_dtype(DType::BF16)?;
                rv = (f(&vb)? + g32.broadcast_mul(&s(c.w2)?)?.mul(&g32)?)?.to_dtype(DType::BF16)?;
                let denom = f(&rv.sqrt()?)?
                    .broadcast_div(&s(c.bc2_sqrt)?)?
                    .to_dtype(DType::BF16)?;
                let denom = f(&denom)?
                    .broadcast_add(&s(c.eps)?)?
                    .to_dtype(DType::BF16)?;
                let upd = f(&rm)?.broadcast_mul(&s(-c.step_size)?)?.div(&f(&denom)?)?;
                rp = (f(&rp)? + upd)?.to_dtype(DType::BF16)?;
                let case = format!("decoupled {decoupled} wd {wd} step {step}");
                assert_eq!(
                    f(&p)?.to_vec1::<f32>()?,
                    f(&rp)?.to_vec1::<f32>()?,
                    "{case}"
                );
                let m: Vec<f32> = st.a.iter().map(|x| x.to_f32()).collect();
                assert_eq!(m, f(&rm)?.to_vec1::<f32>()?, "m {case}");
                let v: Vec<f32> = st.b.iter().map(|x| x.to_f32()).collect();
                assert_eq!(v, f(&rv)?.to_vec1::<f32>()?, "v {case}");
            }
            assert_eq!(st.bytes(), (2 * n * 2) as u64);
        }
        Ok(())
    }

    /// SGD with Nesterov momentum and weight decay, against the ops one by
    /// one; the buffer starts as the (decayed) gradient.
    #[test]
    fn sgd_rounds_where_pytorchs_bf16_ops_round() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let vals =
            |s: f32| -> Vec<f32> { (0..31).map(|i| ((i as f32) * 0.41 + s).cos()).collect() };
        let bf = |v: Vec<f32>| Tensor::new(v, &dev)?.to_dtype(DType::BF16);
        let f = |t: &Tensor| t.to_dtype(DType::F32);
        let hp = SgdStep {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: true,
            weight_decay: 1e-3,
        };
        let c = SgdConsts::new(hp);
        let s = |x: f32| Tensor::new(x, &dev);
        let p = bf(vals(0.0))?;
        let mut st = Bf16State::default();
        let (mut rp, mut rb): (Tensor, Option<Tensor>) = (p.copy()?, None);
        for step in 1..=6 {
            let g = bf(vals(step as f32))?;
            assert!(update(&p, GradRef::Tensor(&g), &mut st, Bf16Kind::Sgd(hp))
                .map_err(candle_core::Error::wrap)?);
            let gd = (f(&g)? + f(&rp)?.broadcast_mul(&s(c.wd)?)?)?.to_dtype(DType::BF16)?;
            let b = match &rb {
                None => gd.clone(),
                Some(b) => {
                    let m = f(b)?.broadcast_mul(&s(c.mom)?)?.to_dtype(DType::BF16)?;
                    (f(&m)? + f(&gd)?.broadcast_mul(&s(c.damp)?)?)?.to_dtype(DType::BF16)?
                }
            };
            let d = (f(&gd)? + f(&b)?.broadcast_mul(&s(c.mom)?)?)?.to_dtype(DType::BF16)?;
            rp = (f(&rp)? + f(&d)?.broadcast_mul(&s(-c.lr)?)?)?.to_dtype(DType::BF16)?;
            rb = Some(b);
            assert_eq!(
                f(&p)?.to_vec1::<f32>()?,
                f(&rp)?.to_vec1::<f32>()?,
                "step {step}"
            );
        }
        Ok(())
    }

    /// `round_op` is `bf16_round` on every value whose low 16 bits are zero
    /// (every bf16 widened, quiet NaNs and infinities among them) and on every
    /// non-NaN f32 (about a million patterns: each sign, exponent and tie);
    /// only a NaN with low bits set, which the loop never makes, differs.
    #[test]
    fn round_op_is_bf16_round_on_the_loops_values() {
        let same = |x: f32| round_op(x).to_bits() == bf16_round(x).to_bits();
        for b in 0..=u16::MAX {
            let x = f32::from_bits(u32::from(b) << 16);
            // A signalling NaN stays one (every operation quiets it first).
            let signalling = x.is_nan() && b & 0x40 == 0;
            assert!(same(x) != signalling, "{:#010x}", x.to_bits());
        }
        for i in 0..1_000_003u64 {
            let x = f32::from_bits((i * 4295) as u32);
            assert!(x.is_nan() || same(x), "{:#010x}", x.to_bits());
        }
        assert!(!same(f32::from_bits(0x7FFF_FFFF)));
    }

    /// The Adam loop on NaNs (quiet, signalling, every payload bit set, both
    /// signs), infinities, zeros of both signs and the largest bf16, in the
    /// parameter, the gradient (bf16, and f32 with payload bits below bf16's)
    /// and the state, against the same formula with `bf16_round`: the same
    /// bits, or a quiet NaN where it gives a NaN (which of two NaN operands an
    /// operation passes on is not fixed).
    #[test]
    fn adam_on_nans_and_infinities_gives_bf16_rounds_results() -> candle_core::Result<()> {
        let specials: Vec<bf16> = [
            0x7FC0u16, 0xFFC0, 0x7F81, 0x7FFF, 0xFFFF, 0x7F80, 0xFF80, 0, 0x8000,
        ]
        .into_iter()
        .map(bf16::from_bits)
        .chain([
            bf16::MAX,
            bf16::MIN,
            bf16::from_f32(0.02),
            bf16::from_f32(-3.0),
        ])
        .collect();
        let k = specials.len();
        // Every pairing of a parameter with a gradient, and with a state.
        let n = k * k * k;
        let pick = |i: usize, d: usize| specials[(i / d) % k];
        let p0: Vec<bf16> = (0..n).map(|i| pick(i, 1)).collect();
        let g: Vec<bf16> = (0..n).map(|i| pick(i, k)).collect();
        let s0: Vec<bf16> = (0..n).map(|i| pick(i, k * k)).collect();
        let g32: Vec<f32> = g
            .iter()
            .map(|x| {
                if x.is_nan() {
                    f32::from_bits(x.to_f32().to_bits() | 0xFFFF)
                } else {
                    x.to_f32()
                }
            })
            .collect();
        for (decoupled, wd, host) in [
            (false, 0.01, false),
            (true, 20.0, false),
            (false, 0.0, true),
        ] {
            let h = hp(3, decoupled, wd);
            let c = AdamConsts::new(h);
            let mut st = Bf16State {
                a: s0.clone(),
                b: s0
                    .iter()
                    .map(|x| {
                        if x.is_nan() {
                            *x
                        } else {
                            bf16::from_f32(x.to_f32().abs())
                        }
                    })
                    .collect(),
            };
            let (ra, rb) = (st.a.clone(), st.b.clone());
            let p = Tensor::new(p0.clone(), &Device::Cpu)?;
            let gt = Tensor::new(g.clone(), &Device::Cpu)?;
            let grad = if host {
                GradRef::Host(&g32)
            } else {
                GradRef::Tensor(&gt)
            };
            assert!(update(&p, grad, &mut st, Bf16Kind::Adam(h)).map_err(candle_core::Error::wrap)?);
            let got = p.to_vec1::<bf16>()?;
            let r = bf16_round;
            for i in 0..n {
                let mut pi = up(p0[i]);
                let mut gi = if host { r(g32[i]) } else { up(g[i]) };
                if c.l2 != 0.0 {
                    gi = r(gi + c.l2 * pi);
                }
                if let Some(d) = c.decay {
                    pi = r(pi * d);
                }
                let mi = up(ra[i]);
                let mi = flush(r(mi + c.w1 * (gi - mi)));
                let vi = flush(r(r(up(rb[i]) * c.b2) + c.w2 * gi * gi));
                let denom = r(r(r(vi.sqrt()) / c.bc2_sqrt) + c.eps);
                let want = [down(pi + (-c.step_size * mi) / denom), down(mi), down(vi)];
                for (what, got, want) in [
                    ("p", got[i], want[0]),
                    ("m", st.a[i], want[1]),
                    ("v", st.b[i], want[2]),
                ] {
                    let ok = got.to_bits() == want.to_bits()
                        || (want.is_nan() && got.is_nan() && got.to_bits() & 0x40 != 0);
                    assert!(
                        ok,
                        "{what} at p {:#06x} g {:#06x} state {:#06x} (wd {wd}, host {host}): {:#06x} against {:#06x}",
                        p0[i].to_bits(),
                        g[i].to_bits(),
                        s0[i].to_bits(),
                        got.to_bits(),
                        want.to_bits()
                    );
                }
            }
        }
        Ok(())
    }

    #[test]
    fn other_dtypes_and_devices_are_declined() -> candle_core::Result<()> {
        let p = Tensor::zeros(4, DType::F32, &Device::Cpu)?;
        let g = p.clone();
        let mut st = Bf16State::default();
        let kind = Bf16Kind::Adam(hp(1, false, 0.0));
        let done = update(&p, GradRef::Tensor(&g), &mut st, kind);
        assert!(matches!(done, Ok(false)));
        assert!(st.a.is_empty());
        Ok(())
    }
}
