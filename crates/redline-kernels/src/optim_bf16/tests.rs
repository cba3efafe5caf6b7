//! Tests of the bf16 optimizer loops: against PyTorch's op sequence with
//! `bf16_round`, on NaNs and infinities, and split over threads.
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
            rm = (f(&rm)? + (&g32 - f(&rm)?)?.broadcast_mul(&s(c.w1)?)?)?.to_dtype(DType::BF16)?;
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
    let vals = |s: f32| -> Vec<f32> { (0..31).map(|i| ((i as f32) * 0.41 + s).cos()).collect() };
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

/// NaNs (quiet, signalling, every payload bit set, both signs),
/// infinities, zeros of both signs, the largest bf16 and two plain values.
fn specials() -> Vec<bf16> {
    [
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
    .collect()
}

/// Parameters, gradients and states pairing every one of [`specials`] with
/// every other: element `i` of each, in turn.
fn pairings() -> [Vec<bf16>; 3] {
    let specials = specials();
    let k = specials.len();
    let pick = |d: usize| (0..k * k * k).map(|i| specials[(i / d) % k]).collect();
    [pick(1), pick(k), pick(k * k)]
}

/// The same bits, or a quiet NaN where `want` is a NaN (which of two NaN
/// operands an operation passes on is not fixed).
fn same_or_quiet_nan(got: bf16, want: bf16) -> bool {
    got.to_bits() == want.to_bits() || (want.is_nan() && got.is_nan() && got.to_bits() & 0x40 != 0)
}

/// PyTorch adds `wd * p` only with a weight decay: an infinite weight
/// with a finite gradient stays infinite at weight decay 0, in Adam and
/// SGD (`g + 0 * inf` would be NaN). PyTorch 2.15 on the CPU:
/// ```python
/// for opt in (torch.optim.SGD, torch.optim.Adam):
///     p = torch.tensor([float("inf"), -float("inf"), 1.0], dtype=torch.bfloat16, requires_grad=True)
///     p.grad = torch.tensor([1.0, 1.0, 1.0], dtype=torch.bfloat16)
///     opt([p], lr=0.1, foreach=False).step()
///     print(p.tolist())  # SGD and Adam: [inf, -inf, 0.8984375]
/// ```
#[test]
fn infinite_weights_stay_infinite_without_weight_decay() -> candle_core::Result<()> {
    let hps = [
        Bf16Kind::Sgd(SgdStep {
            lr: 0.1,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }),
        Bf16Kind::Adam(AdamStep {
            lr: 0.1,
            ..hp(1, false, 0.0)
        }),
    ];
    for kind in hps {
        let p = Tensor::new(&[f32::INFINITY, f32::NEG_INFINITY, 1.0], &Device::Cpu)?
            .to_dtype(DType::BF16)?;
        let g = Tensor::new(&[1.0f32, 1.0, 1.0], &Device::Cpu)?.to_dtype(DType::BF16)?;
        let mut st = Bf16State::default();
        assert!(update(&p, GradRef::Tensor(&g), &mut st, kind).map_err(candle_core::Error::wrap)?);
        let got = p.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        assert_eq!(
            got,
            [f32::INFINITY, f32::NEG_INFINITY, 0.8984375],
            "{kind:?}"
        );
    }
    Ok(())
}

/// The SGD loop on [`specials`] in the parameter, the gradient and the
/// momentum buffer, with and without weight decay, momentum and
/// Nesterov, against PyTorch's op sequence with `bf16_round`.
#[test]
fn sgd_on_nans_and_infinities_gives_bf16_rounds_results() -> candle_core::Result<()> {
    let [p0, g, b0] = pairings();
    let n = p0.len();
    let r = bf16_round;
    for (wd, momentum, nesterov, first) in [
        (0.0, 0.0, false, false),
        (0.01, 0.0, false, false),
        (0.0, 0.9, false, true),
        (0.0, 0.9, true, false),
        (1e-3, 0.9, true, false),
    ] {
        let hp = SgdStep {
            lr: 0.05,
            momentum,
            dampening: 0.1,
            nesterov,
            weight_decay: wd,
        };
        let c = SgdConsts::new(hp);
        let mut st = Bf16State {
            a: if first || momentum == 0.0 {
                Vec::new()
            } else {
                b0.clone()
            },
            b: Vec::new(),
        };
        let p = Tensor::new(p0.clone(), &Device::Cpu)?;
        let gt = Tensor::new(g.clone(), &Device::Cpu)?;
        assert!(update(&p, GradRef::Tensor(&gt), &mut st, Bf16Kind::Sgd(hp))
            .map_err(candle_core::Error::wrap)?);
        let got = p.to_vec1::<bf16>()?;
        for i in 0..n {
            let pi = up(p0[i]);
            let mut gi = up(g[i]);
            if wd != 0.0 {
                gi = r(gi + c.wd * pi);
            }
            let mut d = gi;
            if momentum != 0.0 {
                let b = if first {
                    gi
                } else {
                    flush(r(r(up(b0[i]) * c.mom) + c.damp * gi))
                };
                let case = format!(
                    "buf at p {:#06x} g {:#06x} buf {:#06x} ({hp:?})",
                    p0[i].to_bits(),
                    g[i].to_bits(),
                    b0[i].to_bits()
                );
                // PyTorch's first buffer is a copy of the gradient: its bits,
                // a signalling NaN too, unless the decay made a new value.
                let want = if first && wd == 0.0 { g[i] } else { down(b) };
                assert!(
                    same_or_quiet_nan(st.a[i], want),
                    "{case}: {:#06x}",
                    st.a[i].to_bits()
                );
                d = if nesterov { r(gi + c.mom * b) } else { b };
            }
            let want = down(pi + -c.lr * d);
            assert!(
                same_or_quiet_nan(got[i], want),
                "p at p {:#06x} g {:#06x} buf {:#06x} ({hp:?}): {:#06x} against {:#06x}",
                p0[i].to_bits(),
                g[i].to_bits(),
                b0[i].to_bits(),
                got[i].to_bits(),
                want.to_bits()
            );
        }
    }
    Ok(())
}

/// The Adam loop on NaNs (quiet, signalling, every payload bit set, both
/// signs), infinities, zeros of both signs and the largest bf16, in the
/// parameter, the gradient (bf16, and f32 with payload bits below bf16's)
/// and the state, against the same formula with `bf16_round`: the same
/// bits, or a quiet NaN where it gives a NaN (which of two NaN operands an
/// operation passes on is not fixed).
#[test]
fn adam_on_nans_and_infinities_gives_bf16_rounds_results() -> candle_core::Result<()> {
    let [p0, g, s0] = pairings();
    let n = p0.len();
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
                assert!(
                    same_or_quiet_nan(got, want),
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
