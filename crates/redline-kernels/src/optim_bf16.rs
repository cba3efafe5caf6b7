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
use crate::optim::{sgd_passes, AdamStep, SgdLoop, SgdStep};
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

/// `g + k * p` rounded (PyTorch's `grad.add(param, alpha=k)`) where the
/// term is on, else `g` as it is: PyTorch runs the op only with a nonzero
/// decay, and `g + 0 * p` is NaN at an infinite weight.
#[inline(always)]
fn decayed<const ON: bool>(g: f32, p: f32, k: f32) -> f32 {
    if ON {
        round_op(g + k * p)
    } else {
        g
    }
}

/// `$pass.run::<A, B>()` for the flags `$a` and `$b`: each combination is
/// its own loop, with the branches on the flags compiled out.
macro_rules! run_variants {
    ($pass:expr, $a:expr, $b:expr) => {
        match ($a, $b) {
            (false, false) => $pass.run::<false, false>(),
            (true, false) => $pass.run::<true, false>(),
            (false, true) => $pass.run::<false, true>(),
            (true, true) => $pass.run::<true, true>(),
        }
    };
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
        run_variants!(self, self.c.l2 != 0.0, self.c.decay.is_some())
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
            let gi = decayed::<L2>(up(g[i]), pi, l2);
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

/// PyTorch's `_single_tensor_sgd` on bf16 tensors: `g = g + wd * p` (with a
/// weight decay only); momentum `buf = g` at the first step, then
/// `buf.mul_(mom).add_(g, alpha=1 - dampening)`; Nesterov `g = g + mom *
/// buf`; `p.add_(d, alpha=-lr)`, rounding to bf16 after each.
fn sgd(p: &mut [bf16], g: Grad<'_>, st: &mut Bf16State, hp: SgdStep) {
    sgd_passes(p, &as_bf16(g), &mut st.a, SgdConsts::new(hp));
}

/// The bf16 pass of the shared SGD chunk loop (`optim::sgd_passes`).
impl WithSimd for SgdLoop<'_, bf16> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        // As in Adam's loop: PyTorch adds `wd * p` only with a weight decay
        // (`g + 0 * p` would turn an infinite weight's gradient into NaN).
        run_variants!(self, self.c.wd != 0.0, self.c.momentum())
    }
}

impl SgdLoop<'_, bf16> {
    /// The pass with the weight decay (`DECAY`) and momentum (`MOM`) or
    /// without.
    #[inline(always)]
    fn run<const DECAY: bool, const MOM: bool>(self) {
        let Self {
            p,
            g,
            buf,
            c,
            first,
        } = self;
        let r = round_op;
        let n = p.len().min(g.len());
        let (p, g) = (&mut p[..n], &g[..n]);
        if !MOM {
            for i in 0..n {
                let pi = up(p[i]);
                let gi = decayed::<DECAY>(up(g[i]), pi, c.wd);
                p[i] = down_op(pi + -c.lr * gi);
            }
            return;
        }
        let n = n.min(buf.len());
        let (p, g, buf) = (&mut p[..n], &g[..n], &mut buf[..n]);
        for i in 0..n {
            let pi = up(p[i]);
            let gi = decayed::<DECAY>(up(g[i]), pi, c.wd);
            let b = if first {
                gi
            } else {
                flush(r(r(up(buf[i]) * c.mom) + c.damp * gi))
            };
            buf[i] = down_op(b);
            let d = if c.nesterov { r(gi + c.mom * b) } else { b };
            p[i] = down_op(pi + -c.lr * d);
        }
    }
}

#[cfg(test)]
mod tests;
