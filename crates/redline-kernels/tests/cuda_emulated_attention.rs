//! The fused attention's CUDA kernels (`cuda/attention.cu`), run on the CPU
//! by the CUDA emulator (see `emulated/mod.rs`) with the grids and
//! arguments `src/cuda/attention.rs` launches, against the CPU's fused op
//! (itself held to PyTorch's `scaled_dot_product_attention` by
//! `attention_golden.rs`): the output, each row's log-sum-exp (against
//! float64), the three gradients, dropout's mask, and bf16 and f16 inputs.
//! Outputs start as NaN, so an element no thread writes fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod emulated;

use candle_core::{Device, Tensor, Var};
use emulated::{arg, flat, launch, max_rel, values};
use redline_kernels::attention::{causal_attention_dropout, DropDraw};

/// What the kernels wrote, widened to f32.
struct Run {
    o: Vec<f32>,
    lse: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// An element type of the kernels: f32, or a 16-bit format's bits.
trait Elem: Copy {
    const SUFFIX: &'static str;
    fn down(v: f32) -> Self;
    fn up(self) -> f32;
}

impl Elem for f32 {
    const SUFFIX: &'static str = "f32";
    fn down(v: f32) -> Self {
        v
    }
    fn up(self) -> f32 {
        self
    }
}

#[derive(Clone, Copy)]
struct Bf16(u16);
impl Elem for Bf16 {
    const SUFFIX: &'static str = "bf16";
    fn down(v: f32) -> Self {
        Bf16(half::bf16::from_f32(v).to_bits())
    }
    fn up(self) -> f32 {
        half::bf16::from_bits(self.0).to_f32()
    }
}

#[derive(Clone, Copy)]
struct F16(u16);
impl Elem for F16 {
    const SUFFIX: &'static str = "f16";
    fn down(v: f32) -> Self {
        F16(half::f16::from_f32(v).to_bits())
    }
    fn up(self) -> f32 {
        half::f16::from_bits(self.0).to_f32()
    }
}

/// The forward and the three backward kernels, launched as
/// `src/cuda/attention.rs` launches them, on `(heads, t, d)` inputs.
fn run<T: Elem>(inputs: [&[T]; 4], dims: (usize, usize, usize), drop: Option<DropDraw>) -> Run {
    run_with::<T>(inputs, dims, drop, false)
}

/// [`run`] on tensor cores (`cuda/attention_mma.cu`: the forward and the
/// dK/dV and dQ kernels) when `mma`, as `src/cuda/attention.rs` picks them
/// for 16-bit heads of 32 or 64.
fn run_with<T: Elem>(
    [q, k, v, go]: [&[T]; 4],
    (heads, t, d): (usize, usize, usize),
    drop: Option<DropDraw>,
    mma: bool,
) -> Run {
    let n = heads * t * d;
    let nan = T::down(f32::NAN);
    let (t32, d32, rows) = (t as u32, d as u32, (heads * t) as u32);
    let scale = 1.0 / (d as f32).sqrt();
    let (p, seed) = drop.map_or((0.0f32, 0u64), |d| (d.p, d.seed));
    let (pq, pk, pv, pgo) = (q.as_ptr(), k.as_ptr(), v.as_ptr(), go.as_ptr());
    let sfx = T::SUFFIX;

    let mut o = vec![nan; n];
    let mut lse = vec![f32::NAN; heads * t];
    let (po, pl) = (o.as_mut_ptr(), lse.as_mut_ptr());
    let mut args = vec![arg(&pq), arg(&pk), arg(&pv), arg(&po), arg(&pl), arg(&t32)];
    if !mma {
        args.push(arg(&d32));
    }
    args.extend([arg(&scale), arg(&p), arg(&seed)]);
    let grid = (t.div_ceil(64) as u32, heads as u32, 1);
    let name = match mma {
        true => format!("redline_attn_fwd_mma_{sfx}_d{d}"),
        false => format!("redline_attn_fwd_{sfx}"),
    };
    launch(&name, grid, 128, &mut args);

    let mut dvec = vec![f32::NAN; heads * t];
    let (po, pdvec) = (o.as_ptr(), dvec.as_mut_ptr());
    let mut args = [arg(&po), arg(&pgo), arg(&pdvec), arg(&rows), arg(&d32)];
    launch(
        &format!("redline_attn_dot_{sfx}"),
        (rows.div_ceil(128), 1, 1),
        128,
        &mut args,
    );

    let mut out = vec![nan; 3 * n];
    let (dq, rest) = out.split_at_mut(n);
    let (dk, dv) = rest.split_at_mut(n);
    let (pdq, pdk, pdv) = (dq.as_mut_ptr(), dk.as_mut_ptr(), dv.as_mut_ptr());
    let (pl, pdvec) = (lse.as_ptr(), dvec.as_ptr());
    // The tensor-core kernels: 64 keys or queries a block, the width in
    // their name; the others: 32 a block, the width an argument.
    type Name = fn(&str, &str, usize) -> String;
    let (grid, name, width): (_, Name, Vec<_>) = match mma {
        true => (
            (t.div_ceil(64) as u32, heads as u32, 1),
            |k: &str, sfx: &str, d: usize| format!("redline_attn_{k}_mma_{sfx}_d{d}"),
            vec![],
        ),
        false => (
            (t.div_ceil(32) as u32, heads as u32, 1),
            |k: &str, sfx: &str, _: usize| format!("redline_attn_{k}_{sfx}"),
            vec![arg(&d32)],
        ),
    };
    // dK and dV, then dQ: the same inputs, their outputs, the same sizes.
    let run = |kernel: &str, outputs: &[*mut std::ffi::c_void]| {
        let mut args = vec![
            arg(&pq),
            arg(&pk),
            arg(&pv),
            arg(&pgo),
            arg(&pl),
            arg(&pdvec),
        ];
        args.extend_from_slice(outputs);
        args.push(arg(&t32));
        args.extend(width.iter().copied());
        args.extend([arg(&scale), arg(&p), arg(&seed)]);
        launch(&name(kernel, sfx, d), grid, 128, &mut args);
    };
    run("dkdv", &[arg(&pdk), arg(&pdv)]);
    run("dq", &[arg(&pdq)]);

    let up = |v: &[T]| -> Vec<f32> { v.iter().map(|x| x.up()).collect() };
    Run {
        o: up(&o),
        lse,
        dq: up(&out[..n]),
        dk: up(&out[n..2 * n]),
        dv: up(&out[2 * n..]),
    }
}

/// The CPU's fused op on the same values: output and gradients for the
/// output gradient `go`.
fn reference(
    [q, k, v, go]: [&[f32]; 4],
    (heads, t, d): (usize, usize, usize),
    drop: Option<DropDraw>,
) -> [Vec<f32>; 4] {
    let var = |x: &[f32]| {
        Var::from_tensor(&Tensor::from_vec(x.to_vec(), (1, heads, t, d), &Device::Cpu).unwrap())
            .unwrap()
    };
    let (q, k, v) = (var(q), var(k), var(v));
    let o = causal_attention_dropout(&q, &k, &v, drop).unwrap();
    let g = Tensor::from_vec(go.to_vec(), (1, heads, t, d), &Device::Cpu).unwrap();
    let grads = (&o * g).unwrap().sum_all().unwrap().backward().unwrap();
    [
        flat(&o),
        flat(grads.get(&q).unwrap()),
        flat(grads.get(&k).unwrap()),
        flat(grads.get(&v).unwrap()),
    ]
}

/// Each row's log-sum-exp of its scaled, masked scores, in float64.
fn lse64(q: &[f32], k: &[f32], (heads, t, d): (usize, usize, usize)) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = Vec::with_capacity(heads * t);
    for h in 0..heads {
        for i in 0..t {
            let s: Vec<f64> = (0..=i)
                .map(|j| {
                    (0..d)
                        .map(|x| {
                            f64::from(q[(h * t + i) * d + x]) * f64::from(k[(h * t + j) * d + x])
                        })
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out.push(m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln());
        }
    }
    out
}

/// Runs the kernels on inputs made from `seed`, rounded to `T`, against the
/// CPU op on the rounded values; each error under `tol` (relative to the
/// largest reference value). Returns the largest error.
fn check<T: Elem>(dims: (usize, usize, usize), drop: Option<DropDraw>, tol: f32) -> f32 {
    check_with::<T>(dims, drop, tol, false)
}

/// [`check`], the forward on tensor cores when `mma`.
fn check_with<T: Elem>(
    dims: (usize, usize, usize),
    drop: Option<DropDraw>,
    tol: f32,
    mma: bool,
) -> f32 {
    let n = dims.0 * dims.1 * dims.2;
    let inputs: Vec<Vec<T>> = [0.3f32, 1.1, 2.3, 0.7]
        .iter()
        .map(|&s| values(n, s).iter().map(|&x| T::down(x)).collect())
        .collect();
    let widened: Vec<Vec<f32>> = inputs
        .iter()
        .map(|v| v.iter().map(|x| x.up()).collect())
        .collect();
    let got = run_with::<T>(
        [&inputs[0], &inputs[1], &inputs[2], &inputs[3]],
        dims,
        drop,
        mma,
    );
    let want = reference(
        [&widened[0], &widened[1], &widened[2], &widened[3]],
        dims,
        drop,
    );
    let case = format!("{} {dims:?} {drop:?} mma {mma}", T::SUFFIX);
    let mut worst = 0f32;
    for (name, ours, theirs) in [
        ("o", &got.o, &want[0]),
        ("dq", &got.dq, &want[1]),
        ("dk", &got.dk, &want[2]),
        ("dv", &got.dv, &want[3]),
    ] {
        assert!(
            ours.iter().all(|x| x.is_finite()),
            "{case}: {name} has elements no thread wrote (or not finite)"
        );
        let e = max_rel(ours, theirs);
        eprintln!("{case}: {name} max rel error {e:.2e}");
        assert!(e < tol, "{case}: {name} off the CPU op by {e}");
        worst = worst.max(e);
    }
    let lse = lse64(&widened[0], &widened[1], dims);
    for (i, (&ours, &want)) in got.lse.iter().zip(&lse).enumerate() {
        assert!(
            (f64::from(ours) - want).abs() < 1e-5 * want.abs().max(1.0),
            "{case}: row {i}'s log-sum-exp {ours}, float64 {want}"
        );
    }
    worst
}

#[test]
fn emulated_attention_matches_the_cpu_op_forward_and_backward() {
    // Sequences within one block, across forward blocks (64 queries) and
    // backward blocks (32), not multiples of either; heads of 1, 24 and 64.
    for dims in [(2, 5, 1), (3, 70, 24), (1, 130, 64)] {
        check::<f32>(dims, None, 1e-5);
    }
}

#[test]
fn emulated_attention_drops_the_cpu_kernels_probabilities() {
    let drop = DropDraw { p: 0.3, seed: 99 };
    check::<f32>((2, 70, 16), Some(drop), 1e-5);
    // Another seed is another mask: far off the first's outputs.
    let other = DropDraw { p: 0.3, seed: 100 };
    let n = 2 * 70 * 16;
    let x: Vec<Vec<f32>> = [0.3f32, 1.1, 2.3, 0.7]
        .iter()
        .map(|&s| values(n, s))
        .collect();
    let a = run::<f32>([&x[0], &x[1], &x[2], &x[3]], (2, 70, 16), Some(drop));
    let b = run::<f32>([&x[0], &x[1], &x[2], &x[3]], (2, 70, 16), Some(other));
    assert!(max_rel(&a.o, &b.o) > 1e-2);
}

#[test]
fn emulated_attention_takes_bf16_and_f16_with_an_f32_softmax() {
    // Outputs rounded once from f32 sums: within a few of the format's
    // half-steps of the CPU's f32 op on the same rounded inputs (the
    // backward's D comes from the rounded output, as FlashAttention's does).
    let dims = (2, 70, 32);
    let bf = check::<Bf16>(dims, None, 8e-3);
    let hf = check::<F16>(dims, None, 1e-3);
    assert!(hf < bf, "f16 ({hf}) should be closer than bf16 ({bf})");
}

#[test]
fn emulated_tensor_core_kernels_match_the_cpu_op() {
    // Heads of 64 and 32, sequences across blocks and tiles of 64, not
    // multiples of them. P and dS are rounded to the format for their
    // products (as FlashAttention does), so the bounds are the SIMT
    // kernels' with room for that.
    check_with::<Bf16>((2, 150, 64), None, 1e-2, true);
    check_with::<F16>((1, 130, 32), None, 1e-3, true);
    let drop = DropDraw { p: 0.25, seed: 5 };
    check_with::<Bf16>((1, 100, 64), Some(drop), 1e-2, true);
}
