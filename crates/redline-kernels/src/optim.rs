//! In-place optimizer updates: one pass over each parameter's storage reading
//! its gradient and state, with no temporaries (the generic path allocates
//! about ten tensors per parameter per step). The arithmetic is written once,
//! in [`optim_math`](crate::optim_math), for these loops and for the generic
//! path ([`adam_tensors`], [`sgd_tensors`]): PyTorch's single-tensor order.
//!
//! The loops are compiled once per instruction set and picked at run time
//! (`pulp`: AVX-512 where present, else AVX2, else SSE2); no FMA contraction,
//! so every version gives the same bits.
//!
//! State that decays below `f32::MIN_POSITIVE` is flushed to zero. A weight
//! whose gradient stays zero (a dead ReLU unit) has its first moment shrink by
//! `beta1` every step until it sticks at the smallest subnormal, where
//! `x * 0.9` rounds back to `x`; from then on every step takes the CPU's slow
//! subnormal path. On the tutorial MLP that tripled the optimizer's time from
//! the second epoch on (0.11 -> 0.38 ms/step, `bench/NOTES.md`). A moment below
//! 1e-38 moves a weight by less than 1e-30 * lr, so flushing changes nothing
//! that training can see.

use std::cell::RefCell;

use candle_core::{bail, CpuStorage, InplaceOp1, InplaceOp2, Layout, Tensor};
use pulp::{Simd, WithSimd};

use crate::error::Result;
use crate::grad::GradRef;
pub use crate::optim_bf16::{bf16_covers, Bf16State};
use crate::optim_chunks::for_chunks;
pub use crate::optim_generic::{
    adam_tensors, adam_tensors_unless, sgd_tensors, sgd_tensors_unless, skip_mask, DeviceHyper,
    TensorState,
};
pub use crate::optim_generic_bf16::{adam_tensors_bf16, sgd_tensors_bf16};
use crate::optim_math::{self, AdamConsts, SgdConsts};
use crate::slices::{f32s, f32s_mut, fused_cpu};
use redline_core::trace;

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
    /// The state of a bf16 parameter (`bf16-true`), kept in bf16.
    pub half: Bf16State,
}

impl SlotState {
    /// Bytes held (f32 and bf16 state).
    pub fn bytes(&self) -> u64 {
        ((self.a.len() + self.b.len()) * 4) as u64 + self.half.bytes()
    }
}

/// Applies one Adam/AdamW update to `param` in place. Returns `Ok(false)`
/// without touching anything when the fused kernel does not cover the device
/// or dtype (the caller then uses the generic path, [`adam_tensors`]).
pub fn adam_step(
    param: &Tensor,
    grad: GradRef<'_>,
    state: &mut SlotState,
    hp: AdamStep,
) -> Result<bool> {
    update(param, grad, state, Kind::Adam(hp))
}

/// Applies one SGD update in place; `Ok(false)` as for [`adam_step`].
pub fn sgd_step(
    param: &Tensor,
    grad: GradRef<'_>,
    state: &mut SlotState,
    hp: SgdStep,
) -> Result<bool> {
    update(param, grad, state, Kind::Sgd(hp))
}

/// Whether the fused in-place update covers `param` (its state then lives
/// in a [`SlotState`]; otherwise in a [`TensorState`]): an f32 or (the
/// bf16 loop, `bf16-true`) bf16 contiguous CPU tensor.
pub fn fused_covers(param: &Tensor) -> bool {
    (fused_cpu(param) && param.is_contiguous()) || bf16_covers(param)
}

fn update(param: &Tensor, grad: GradRef<'_>, state: &mut SlotState, kind: Kind) -> Result<bool> {
    if bf16_covers(param) {
        let kind = match kind {
            Kind::Adam(hp) => crate::optim_bf16::Bf16Kind::Adam(hp),
            Kind::Sgd(hp) => crate::optim_bf16::Bf16Kind::Sgd(hp),
        };
        return crate::optim_bf16::update(param, grad, &mut state.half, kind);
    }
    if !fused_covers(param) {
        return Ok(false);
    }
    let op = Update {
        state: RefCell::new(state),
        kind,
    };
    match grad {
        GradRef::Tensor(g) if fused_cpu(g) => param.inplace_op2(&g.contiguous()?, &op)?,
        GradRef::Tensor(_) => return Ok(false),
        GradRef::Host(g) => param.inplace_op1(&FromSlice { g, op })?,
    }
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

impl Update<'_> {
    fn apply(&self, p: &mut [f32], g: &[f32]) -> candle_core::Result<()> {
        trace::count("optimizer.update");
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
        let p = f32s_mut(s1, l1, self.name())?;
        self.apply(p, f32s(s2, l2, self.name())?)
    }
}

/// The update with its gradient from a host slice.
struct FromSlice<'a> {
    g: &'a [f32],
    op: Update<'a>,
}

impl InplaceOp1 for FromSlice<'_> {
    fn name(&self) -> &'static str {
        "redline-optimizer-step"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout) -> candle_core::Result<()> {
        self.op.apply(f32s_mut(s1, l1, self.name())?, self.g)
    }
}

fn adam(p: &mut [f32], g: &[f32], st: &mut SlotState, hp: AdamStep) {
    if st.a.len() != p.len() {
        st.a = vec![0.0; p.len()];
        st.b = vec![0.0; p.len()];
    }
    let c = AdamConsts::new(hp);
    for_chunks(p, g, &mut st.a, &mut st.b, |p, g, m, v| {
        pulp::Arch::new().dispatch(AdamLoop { p, g, m, v, c })
    });
}

/// One Adam/AdamW pass; the constants are a field (copied into registers) so
/// that the compiler can vectorize the loop without aliasing worries.
struct AdamLoop<'a> {
    p: &'a mut [f32],
    g: &'a [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
    c: AdamConsts,
}

impl WithSimd for AdamLoop<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        let Self { p, g, m, v, c } = self;
        let n = p.len().min(g.len()).min(m.len()).min(v.len());
        let (p, g, m, v) = (&mut p[..n], &g[..n], &mut m[..n], &mut v[..n]);
        for i in 0..n {
            let Ok([pi, mi, vi]) = optim_math::adam(&p[i], &g[i], &m[i], &v[i], &c);
            p[i] = pi;
            m[i] = mi;
            v[i] = vi;
        }
    }
}

fn sgd(p: &mut [f32], g: &[f32], st: &mut SlotState, hp: SgdStep) {
    sgd_passes(p, g, &mut st.a, SgdConsts::new(hp));
}

/// One SGD step over `p` in chunks, for an element type whose pass
/// [`SgdLoop`] implements (f32 here, bf16 in `optim_bf16`): the momentum
/// buffer `buf` starts as zeros at the first step with momentum.
pub(crate) fn sgd_passes<T>(p: &mut [T], g: &[T], buf: &mut Vec<T>, c: SgdConsts)
where
    T: Copy + Default + Send + Sync,
    for<'a> SgdLoop<'a, T>: WithSimd<Output = ()>,
{
    let first = c.momentum() && buf.len() != p.len();
    if first {
        *buf = vec![T::default(); p.len()];
    }
    for_chunks(p, g, buf, &mut [], |p, g, buf, _| {
        pulp::Arch::new().dispatch(SgdLoop {
            p,
            g,
            buf,
            c,
            first,
        })
    });
}

/// One SGD pass over a chunk of `T`s (see [`AdamLoop`] for why the
/// constants are a field).
pub(crate) struct SgdLoop<'a, T> {
    pub(crate) p: &'a mut [T],
    pub(crate) g: &'a [T],
    /// Momentum buffer; empty without momentum.
    pub(crate) buf: &'a mut [T],
    pub(crate) c: SgdConsts,
    /// The first step with momentum: the buffer starts as the gradient.
    pub(crate) first: bool,
}

impl WithSimd for SgdLoop<'_, f32> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _simd: S) {
        let Self {
            p,
            g,
            buf,
            c,
            first,
        } = self;
        let n = p.len().min(g.len());
        let (p, g) = (&mut p[..n], &g[..n]);
        if !c.momentum() {
            for i in 0..n {
                let Ok((pi, _)) = optim_math::sgd(&p[i], &g[i], None, &c);
                p[i] = pi;
            }
            return;
        }
        let n = n.min(buf.len());
        let (p, g, buf) = (&mut p[..n], &g[..n], &mut buf[..n]);
        for i in 0..n {
            let prev = (!first).then_some(&buf[i]);
            let Ok((pi, bi)) = optim_math::sgd(&p[i], &g[i], prev, &c);
            p[i] = pi;
            buf[i] = bi.unwrap_or(0.0);
        }
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
        assert!(adam_step(&p, GradRef::Tensor(&g), &mut st, hp)?);
        let got = p.to_vec1::<f32>()?;
        for (x, want) in got.iter().zip([0.99f32, -1.99, 0.49]) {
            assert!((x - want).abs() < 1e-6, "{got:?}");
        }
        assert_eq!(st.a.len(), 3);
        Ok(())
    }

    fn adam_hp(step: u64) -> AdamStep {
        AdamStep {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            step,
        }
    }

    /// A weight whose gradient turns zero has its moments shrink towards
    /// zero; they must reach zero, not stick at a subnormal value.
    #[test]
    fn moments_of_a_silent_weight_reach_zero_not_a_subnormal() -> Result<()> {
        let p = Tensor::new(&[1f32, 1.0], &Device::Cpu)?;
        let mut st = SlotState::default();
        assert!(adam_step(
            &p,
            GradRef::Tensor(&Tensor::new(&[0.5f32, 0.5], &Device::Cpu)?),
            &mut st,
            adam_hp(1)
        )?);
        let zero = Tensor::new(&[0f32, 0.5], &Device::Cpu)?;
        for step in 2..=2000 {
            adam_step(&p, GradRef::Tensor(&zero), &mut st, adam_hp(step))?;
            for x in st.a.iter().chain(&st.b) {
                assert!(!x.is_subnormal(), "step {step}: {:?} {:?}", st.a, st.b);
            }
        }
        // 0.9^1999 * 0.05 is far below f32's smallest subnormal.
        assert_eq!(st.a[0], 0.0);
        assert!(st.a[1] > 0.0 && st.b[0] > 0.0);

        let mut sgd = SlotState::default();
        let hp = SgdStep {
            lr: 0.1,
            momentum: 0.5,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        let one = Tensor::new(&[1f32, 1.0], &Device::Cpu)?;
        sgd_step(&p, GradRef::Tensor(&one), &mut sgd, hp)?;
        for _ in 0..200 {
            sgd_step(&p, GradRef::Tensor(&zero), &mut sgd, hp)?;
            assert!(!sgd.a[0].is_subnormal(), "{:?}", sgd.a);
        }
        assert_eq!(sgd.a[0], 0.0);
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
        sgd_step(&p, GradRef::Tensor(&g), &mut st, hp)?;
        sgd_step(&p, GradRef::Tensor(&g), &mut st, hp)?;
        // buf = 1, then 1.9: p = -0.1 - 0.19
        assert!((p.to_vec1::<f32>()?[0] + 0.29).abs() < 1e-6);
        Ok(())
    }

    /// An update split over the compute threads gives the bits of one
    /// thread's pass: fp32 and bf16 parameters, Adam (with L2, AdamW's
    /// decay and neither) and SGD with momentum, over steps that carry
    /// state, on a parameter that splits into ragged chunks.
    #[test]
    fn updates_split_over_threads_change_no_bits() -> Result<()> {
        let n = 3 * crate::optim_chunks::CHUNK_MIN + 77;
        let vals = |s: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * 0.37 + s).sin()).collect() };
        let run = |threads: usize, dtype: candle_core::DType, kind: u8| -> Result<Vec<f32>> {
            let _t = redline_core::threads::scoped(threads);
            let p = Tensor::new(vals(0.0), &Device::Cpu)?.to_dtype(dtype)?;
            let mut st = SlotState::default();
            for step in 1..=3u64 {
                let g = Tensor::new(vals(step as f32), &Device::Cpu)?.to_dtype(dtype)?;
                let g = GradRef::Tensor(&g);
                let (wd, decoupled) = [(0.0, false), (0.01, false), (0.1, true)][kind as usize % 3];
                let done = if kind < 3 {
                    let hp = AdamStep {
                        weight_decay: wd,
                        decoupled,
                        ..adam_hp(step)
                    };
                    adam_step(&p, g, &mut st, hp)?
                } else {
                    let hp = SgdStep {
                        lr: 0.1,
                        momentum: 0.9,
                        dampening: 0.0,
                        nesterov: true,
                        weight_decay: wd,
                    };
                    sgd_step(&p, g, &mut st, hp)?
                };
                assert!(done);
            }
            let mut out = p.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?;
            out.extend(st.a.iter().chain(&st.b));
            out.extend(st.half.a.iter().chain(&st.half.b).map(|x| x.to_f32()));
            Ok(out)
        };
        for dtype in [candle_core::DType::F32, candle_core::DType::BF16] {
            for kind in 0..4 {
                let one = run(1, dtype, kind)?;
                assert!(one.len() > n, "{dtype:?} {kind}: state kept");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for threads in [2, 3] {
                    assert_eq!(
                        bits(&one),
                        bits(&run(threads, dtype, kind)?),
                        "{dtype:?} kind {kind} threads {threads}"
                    );
                }
            }
        }
        Ok(())
    }
}
