//! The reduced-precision kernels, run on the CPU by the CUDA emulator (see
//! `emulated/mod.rs`) with the grids `src/cuda/*.rs` launch: the
//! tensor-core convolutions (`cuda/conv_mma.cu`: bf16 and fp16 by
//! `mma.sync.m16n8k16`, TF32 by `m16n8k8`), the 16-bit conversions the
//! kernels store with (`cuda/half16.cu`) bit for bit against the `half`
//! crate (candle's), and the 16-bit twins of the linear layer's mask kernel
//! and the CNN block's bias + pool + ReLU. Each against candle's f32 ops on
//! the same (rounded) values.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod emulated;

use candle_core::Var;
use emulated::{
    arg, check_f32_conv, conv_outputs, conv_reference, elementwise, flat, launch, mask_sum,
    max_rel, run_bias_pool_relu, run_mask_kernel, tensor, values, ConvPass, CONV_CASES,
};
use redline_kernels::conv_igemm::{ConvDims, MMA_THREADS};

/// A 16-bit format as the kernels name it, and its conversions.
#[derive(Clone, Copy, Debug)]
enum Fmt {
    Bf16,
    F16,
}

impl Fmt {
    fn suffix(self) -> &'static str {
        match self {
            Fmt::Bf16 => "bf16",
            Fmt::F16 => "f16",
        }
    }

    fn down(self, v: f32) -> u16 {
        match self {
            Fmt::Bf16 => half::bf16::from_f32(v).to_bits(),
            Fmt::F16 => half::f16::from_f32(v).to_bits(),
        }
    }

    fn up(self, b: u16) -> f32 {
        match self {
            Fmt::Bf16 => half::bf16::from_bits(b).to_f32(),
            Fmt::F16 => half::f16::from_bits(b).to_f32(),
        }
    }

    /// Half a step of the format relative to a value (its rounding's bound).
    fn half_step(self) -> f32 {
        match self {
            Fmt::Bf16 => 2f32.powi(-8),
            Fmt::F16 => 2f32.powi(-11),
        }
    }

    /// A NaN's bits, to fill outputs no thread should leave unwritten.
    fn nan(self) -> u16 {
        self.down(f32::NAN)
    }
}

/// `values` rounded to the format: (their bits, their f32 values).
fn rounded(fmt: Fmt, v: &[f32]) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = v.iter().map(|&x| fmt.down(x)).collect();
    let vals = bits.iter().map(|&b| fmt.up(b)).collect();
    (bits, vals)
}

/// The weight gradient's split sums, rounded to the format, of `partial`
/// (`splits` x `count` f32).
fn sum_splits(fmt: Fmt, partial: &[f32], splits: u32, count: usize) -> Vec<u16> {
    let mut out = vec![fmt.nan(); count];
    let (pp, po, c) = (partial.as_ptr(), out.as_mut_ptr(), count as u32);
    launch(
        &format!("redline_sum_splits_{}", fmt.suffix()),
        elementwise(count, 256),
        256,
        &mut [arg(&pp), arg(&po), arg(&splits), arg(&c)],
    );
    out
}

/// The f32 -> 16-bit rounding of the kernels, bit for bit against the
/// `half` crate's, over ties both ways, the largest finite values and the
/// step to infinity, subnormals and their ties, signed zeros, infinities
/// and 200,000 random bit patterns (a NaN only as a NaN).
#[test]
fn emulated_16_bit_rounding_matches_the_half_crate() {
    let mut v: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        f32::from_bits(0x3f80_8000), // bf16 tie, even below: down
        f32::from_bits(0x3f81_8000), // bf16 tie, odd below: up
        f32::from_bits(0x7f7f_8000), // bf16: rounds to infinity
        1.0 + 2f32.powi(-11),        // f16 tie: down
        1.0 + 3.0 * 2f32.powi(-11),  // f16 tie: up
        65504.0,
        65519.99,
        65520.0, // f16: to infinity
        -65520.0,
        2f32.powi(-25),                  // f16: half the smallest subnormal, to 0
        3.0 * 2f32.powi(-25),            // f16 subnormal tie: up to 2 steps
        2f32.powi(-14) - 2f32.powi(-25), // f16: the last subnormal tie, up to the smallest normal
        -2f32.powi(-20),
        6.1e-5,
    ];
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..200_000 {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        v.push(f32::from_bits((s >> 32) as u32));
    }
    for fmt in [Fmt::Bf16, Fmt::F16] {
        let ours = sum_splits(fmt, &v, 1, v.len());
        let mut wrong = 0;
        for (x, o) in v.iter().zip(&ours) {
            let want = fmt.down(*x);
            let same = if x.is_nan() {
                fmt.up(*o).is_nan()
            } else {
                *o == want
            };
            if !same {
                if wrong < 5 {
                    eprintln!(
                        "{fmt:?}: {x:e} ({:#010x}) -> {o:#06x}, want {want:#06x}",
                        x.to_bits()
                    );
                }
                wrong += 1;
            }
        }
        assert_eq!(
            wrong,
            0,
            "{fmt:?}: {wrong} of {} values rounded differently",
            v.len()
        );
    }
}

/// The convolution's three passes on tensor cores, with the f32 kernels'
/// grids and splits, against candle's f32 convolution and gradients of the
/// same 16-bit values: every element within half a step of the format of
/// its value, plus f32 summation error. Covers ragged tiles (M, N and K not
/// multiples of 64, 64 and 16), padding, a 5 x 3 kernel, more than one tile
/// in each direction and a weight gradient over many splits. Outputs start
/// as NaN, so an element no thread writes fails.
#[test]
fn emulated_tensor_core_conv_matches_candle_on_16_bit_values() {
    for fmt in [Fmt::Bf16, Fmt::F16] {
        for (x_dims, w_dims, pad) in CONV_CASES {
            let d = ConvDims::new(&x_dims, &w_dims, pad).unwrap();
            let case = format!("{fmt:?} {x_dims:?} {w_dims:?} pad {pad}");
            let (xb, xs) = rounded(fmt, &values(x_dims.iter().product(), 0.3));
            let (wb, ws) = rounded(fmt, &values(w_dims.iter().product(), 1.1));
            let (gb, gy) = rounded(fmt, &values(conv_outputs(&d), 2.3));
            let [y, want_dx, want_dw] = conv_reference(&d, &xs, &ws, &gy);
            let run16 = |name: &str, a: &[u16], b: &[u16], len: usize, grid| {
                let pass = ConvPass {
                    kernel: &format!("redline_conv_{name}_{}", fmt.suffix()),
                    grid,
                    threads: MMA_THREADS,
                    chunk: None,
                };
                let out = pass.run(&d, (a, b), fmt.nan(), len);
                out.iter().map(|&b| fmt.up(b)).collect::<Vec<f32>>()
            };
            let check = |what: &str, ours: &[f32], want: &[f32]| {
                let scale = want.iter().fold(1e-12f32, |m, v| m.max(v.abs()));
                let bad = ours
                    .iter()
                    .zip(want)
                    .filter(|(o, w)| {
                        // A NaN (an element never written) is off too.
                        let within = (*o - *w).abs() <= w.abs() * fmt.half_step() + 1e-5 * scale;
                        !within
                    })
                    .count();
                assert_eq!(
                    bad,
                    0,
                    "{case}: {what}: {bad} of {} elements off",
                    want.len()
                );
            };
            let ours = run16("fwd", &xb, &wb, y.len(), d.fwd_grid());
            check("y", &ours, &y);
            let dx = run16("dx", &gb, &wb, xs.len(), d.dx_grid());
            check("dx", &dx, &want_dx);

            let (grid, chunk) = d.dw_plan();
            let dw_pass = ConvPass {
                kernel: &format!("redline_conv_dw_{}", fmt.suffix()),
                grid,
                threads: MMA_THREADS,
                chunk: Some(chunk as u32),
            };
            let partial = dw_pass.run(&d, (&gb, &xb), f32::NAN, grid.2 as usize * ws.len());
            let dw: Vec<f32> = sum_splits(fmt, &partial, grid.2, ws.len())
                .iter()
                .map(|&b| fmt.up(b))
                .collect();
            check(&format!("dw over {} splits", grid.2), &dw, &want_dw);
        }
    }
}

/// The 16-bit linear layer's backward kernel: the incoming gradient's bits
/// where the ReLU passed (all of them without one), and the bias gradient
/// summed in f32 in the kernel's fixed order (`mask_sum`), rounded once to
/// the format.
#[test]
fn emulated_16_bit_relu_mask_bias_grad_matches_a_reference() {
    // More row groups than rows, and many rows per group.
    for (rows, cols) in [(37usize, 150usize), (5, 40), (300, 10)] {
        for fmt in [Fmt::Bf16, Fmt::F16] {
            let (g, gv) = rounded(fmt, &values(rows * cols, 0.2));
            let (y, yv) = rounded(fmt, &values(rows * cols, 1.7));
            // The ReLU's output: zeros (some -0.0) where it blocked.
            let y: Vec<u16> = y
                .iter()
                .zip(&yv)
                .map(|(&b, &v)| if v > 0.0 { b } else { fmt.down(-0.0 * v.abs()) })
                .collect();
            for relu in [true, false] {
                let kernel = format!("redline_relu_mask_bias_grad_{}", fmt.suffix());
                let y = relu.then_some(&y[..]);
                let (dz, db) = run_mask_kernel(&kernel, &g, y, (rows, cols), fmt.nan());
                let want: Vec<u16> = (0..rows * cols)
                    .map(|i| if relu && yv[i] <= 0.0 { 0 } else { g[i] })
                    .collect();
                assert_eq!(dz, want, "{fmt:?} relu {relu}: dz");
                let want_db: Vec<u16> = (0..cols)
                    .map(|j| {
                        fmt.down(mask_sum(rows, |r| {
                            let i = r * cols + j;
                            if relu && yv[i] <= 0.0 {
                                0.0
                            } else {
                                gv[i]
                            }
                        }))
                    })
                    .collect();
                assert_eq!(db, want_db, "{fmt:?} relu {relu}: db");
            }
        }
    }
}

/// The CNN block's bias + max-pool + ReLU kernel and its two backward
/// kernels in 16 bits against candle's ops on the same values: the bias
/// added in f32 and the sum rounded to the format (candle's 16-bit add),
/// Redline's generic first-maximum pool and the ReLU, with tied windows
/// (rounding ties often) and a row and column past the last window.
#[test]
fn emulated_16_bit_bias_pool_relu_matches_the_generic_ops() {
    use redline_kernels::max_pool2d_generic;
    for fmt in [Fmt::Bf16, Fmt::F16] {
        // The last: several images per block of the backward, in uneven ranges.
        for (n, c, h, w, k, splits) in [
            (2usize, 3usize, 9usize, 7usize, 2usize, None),
            (3, 5, 6, 6, 3, None),
            (5, 3, 5, 7, 2, Some(4)),
        ] {
            let case = format!("{fmt:?} ({n}, {c}, {h}, {w}), k {k}");
            let (conv, conv_v) = rounded(
                fmt,
                &(0..n * c * h * w)
                    .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0 + 0.01 * (i % 5) as f32)
                    .collect::<Vec<f32>>(),
            );
            let (bias, bias_v) = rounded(
                fmt,
                &(0..c).map(|i| i as f32 * 0.25 - 0.3).collect::<Vec<f32>>(),
            );
            // conv + bias rounded to the format, as candle's 16-bit add.
            let summed: Vec<f32> = conv_v
                .iter()
                .enumerate()
                .map(|(i, v)| fmt.up(fmt.down(v + bias_v[(i / (h * w)) % c])))
                .collect();
            let sv = Var::from_tensor(&tensor(&summed, &[n, c, h, w])).unwrap();
            let want = max_pool2d_generic(sv.as_tensor(), k)
                .unwrap()
                .relu()
                .unwrap();
            let (ph, pw) = (h / k, w / k);
            let pooled = n * c * ph * pw;
            let (gy, gy_v) = rounded(fmt, &values(pooled, 0.9));
            let grads = (&want * tensor(&gy_v, want.dims()))
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let splits = splits.unwrap_or_else(|| redline_kernels::pool::block_bwd_splits(n, c));
            let out = run_bias_pool_relu(
                fmt.suffix(),
                (&conv, &bias, &gy),
                [n, c, h, w, k, splits],
                fmt.nan(),
            );
            let y: Vec<f32> = out.y.iter().map(|&b| fmt.up(b)).collect();
            assert_eq!(y, flat(&want), "{case}: y");
            let dconv: Vec<f32> = out.dconv.iter().map(|&b| fmt.up(b)).collect();
            assert_eq!(
                dconv,
                flat(grads.get(sv.as_tensor()).unwrap()),
                "{case}: dconv"
            );
            // The bias gradient: the passed gradients summed (in f32, in
            // another order than here), rounded once.
            let sums = flat(&grads.get(sv.as_tensor()).unwrap().sum((0, 2, 3)).unwrap());
            for (ch, (&b, s)) in out.db.iter().zip(&sums).enumerate() {
                let got = fmt.up(b);
                assert!(
                    (got - s).abs() <= s.abs() * 2.0 * fmt.half_step() + 1e-6,
                    "{case}: db[{ch}] {got} vs {s}"
                );
            }
        }
    }
}

/// `v` rounded to TF32 as `cvt.rna.tf32.f32` rounds (nearest, ties away
/// from zero; 10 mantissa bits).
fn tf32(v: f32) -> f32 {
    f32::from_bits((v.to_bits() + 0x1000) & 0xffff_e000)
}

/// The TF32 convolution (`--matmul-precision high`): the kernels round their
/// f32 operands to TF32 and sum exact products in f32, so each pass matches
/// candle's f32 convolution of the TF32-rounded values within f32 summation
/// error, and differs from the unrounded convolution by TF32's rounding.
#[test]
fn emulated_tf32_conv_matches_candle_on_tf32_values() {
    for (x_dims, w_dims, pad) in CONV_CASES {
        let d = ConvDims::new(&x_dims, &w_dims, pad).unwrap();
        let case = format!("{x_dims:?} {w_dims:?} pad {pad}");
        // Values with all 23 mantissa bits in use, so TF32 rounds them.
        let xs: Vec<f32> = values(x_dims.iter().product(), 0.3)
            .iter()
            .map(|v| v * 1.000_123_4)
            .collect();
        let ws = values(w_dims.iter().product(), 1.1);
        let gy = values(conv_outputs(&d), 2.3);
        let round = |v: &[f32]| v.iter().map(|&x| tf32(x)).collect::<Vec<f32>>();
        let want = conv_reference(&d, &round(&xs), &round(&ws), &round(&gy));
        let ours = check_f32_conv(&case, &d, ("tf32", MMA_THREADS), (&xs, &ws, &gy), &want);
        // The unrounded operands' convolution is further off: TF32 rounded them.
        let [exact, _, _] = conv_reference(&d, &xs, &ws, &gy);
        let off = max_rel(&ours, &exact);
        assert!(off > 1e-5, "{case}: y is the unrounded product ({off:e})");
    }
}
