//! Redline's CUDA kernels (`cuda/*.cu`), compiled unchanged by the host's
//! C++ compiler against `cuda/emulate/cuda_host.h` (CUDA's threads, blocks,
//! barriers and warp shuffles on OS threads), launched with the grids and
//! arguments the GPU path uses, against candle's CPU ops. They check the
//! kernels' logic (indexing, tiles, bounds, reductions, barriers) on machines
//! without a GPU; `cuda_kernels.rs` checks them on one.
//!
//! Needs a C++20 compiler: `c++`, or the one `$CXX` names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod emulated;

use std::ffi::CString;

use candle_core::{Device, Tensor, Var};
use emulated::{
    arg, check_f32_conv, conv_outputs, conv_reference, elementwise, emulator, flat, launch,
    mask_sum, max_rel, run_bias_pool_relu, run_mask_kernel, tensor, values, CONV_CASES,
};
use redline_kernels::conv_igemm::{ConvDims, THREADS};
use redline_kernels::max_pool2d_generic;

/// The convolution's three passes (grids and splits from `ConvDims`, as
/// `src/cuda/conv.rs` launches them) against candle's conv2d and its
/// gradients. Outputs start as NaN, so an element no thread writes fails.
#[test]
fn emulated_implicit_gemm_conv_matches_candle() {
    for (x_dims, w_dims, pad) in CONV_CASES {
        let d = ConvDims::new(&x_dims, &w_dims, pad).unwrap();
        let case = format!("{x_dims:?} {w_dims:?} pad {pad}");
        let xs = values(x_dims.iter().product(), 0.3);
        let ws = values(w_dims.iter().product(), 1.1);
        let gy = values(conv_outputs(&d), 2.3);
        let want = conv_reference(&d, &xs, &ws, &gy);
        check_f32_conv(&case, &d, ("f32", THREADS), (&xs, &ws, &gy), &want);
    }
}

/// The CNN block's bias + max-pool + ReLU kernel and its two backward
/// kernels against candle's add, Redline's generic (first-maximum) max pool
/// and ReLU, with tied windows and a row and column past the last window.
#[test]
fn emulated_bias_pool_relu_matches_the_generic_ops() {
    // The backward's blocks take a channel of a range of images: one image
    // each in the first five (`block_bwd_splits`' plan; the fifth has 400
    // positions, more than a block's 256 threads), then several images a
    // block (splits given): 30 images of 9 positions (28 images and 4
    // positions a step within a block), and 5 images in 4 uneven ranges
    // with a row and column past the last window.
    for (n, c, h, w, k, splits) in [
        (2usize, 3usize, 9usize, 7usize, 2usize, None),
        (3, 5, 6, 6, 3, None),
        (3, 4, 28, 28, 2, None),
        (30, 2, 6, 6, 2, None),
        (2, 2, 40, 40, 2, None),
        (90, 4, 6, 6, 2, Some(3)),
        (5, 3, 5, 7, 2, Some(4)),
    ] {
        let case = format!("({n}, {c}, {h}, {w}), k {k}");
        // Steps of 1/8 tie often; none lands on exactly -bias (a zero after the ReLU).
        let conv: Vec<f32> = (0..n * c * h * w)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0 + 0.01)
            .collect();
        let bias: Vec<f32> = (0..c).map(|i| i as f32 * 0.25 - 0.3).collect();
        let cv = Var::from_tensor(&tensor(&conv, &[n, c, h, w])).unwrap();
        let bv = Var::from_tensor(&tensor(&bias, &[c])).unwrap();
        let summed = cv
            .as_tensor()
            .broadcast_add(&bv.as_tensor().reshape((1, c, 1, 1)).unwrap())
            .unwrap();
        let want = max_pool2d_generic(&summed, k).unwrap().relu().unwrap();
        let (ph, pw) = (h / k, w / k);
        let pooled = n * c * ph * pw;
        let gy = values(pooled, 0.9);
        let grads = (&want * tensor(&gy, want.dims()))
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let splits = splits.unwrap_or_else(|| redline_kernels::pool::block_bwd_splits(n, c));
        let dims = [n, c, h, w, k, splits];
        let out = run_bias_pool_relu("f32", (&conv, &bias, &gy), dims, f32::NAN);
        assert_eq!(out.y, flat(&want), "{case}: y");
        assert_eq!(
            out.dconv,
            flat(grads.get(cv.as_tensor()).unwrap()),
            "{case}: dconv"
        );
        // The bias gradient: the same values as candle's sum, added in
        // another order, so within the two f32 sums' rounding (each at most
        // m * 2^-24 of the sum of |g| over the m passed values), which is
        // far below most single values (0.04 at most here, |g| up to 1.3):
        // a value missed or taken twice shows.
        let dconv = grads.get(cv.as_tensor()).unwrap();
        let abs = flat(&dconv.abs().unwrap().sum((0, 2, 3)).unwrap());
        let want = flat(grads.get(bv.as_tensor()).unwrap());
        let m = (n * ph * pw) as f32;
        for (ch, ((&got, &want), &abs)) in out.db.iter().zip(&want).zip(&abs).enumerate() {
            let bound = m * f32::EPSILON * abs;
            assert!(
                (got - want).abs() <= bound,
                "{case}: db[{ch}] {got} vs {want} (bound {bound:e})"
            );
        }
    }
}

/// The cross-entropy forward's one block of 32 warps: the softmax, the mean
/// loss and the count of first-maximum hits.
fn ce_forward(logits: &[f32], targets: &[u32], rows: u32, cols: u32) -> (Vec<f32>, f32, f32) {
    let mut probs = vec![f32::NAN; logits.len()];
    let (mut loss, mut hits) = (f32::NAN, f32::NAN);
    let (px, pt, pp) = (logits.as_ptr(), targets.as_ptr(), probs.as_mut_ptr());
    let (pl, ph) = (&mut loss as *mut f32, &mut hits as *mut f32);
    let mut args = [
        arg(&px),
        arg(&pt),
        arg(&pp),
        arg(&pl),
        arg(&ph),
        arg(&rows),
        arg(&cols),
    ];
    launch("redline_ce_fwd_f32", (1, 1, 1), 1024, &mut args);
    (probs, loss, hits)
}

/// The largest elementwise difference relative to the larger magnitude
/// (2.4e-7 is 1 ulp).
fn worst_relative(ours: &[f32], want: &[f32]) -> f32 {
    ours.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / a.abs().max(b.abs()).max(1e-30))
        .fold(0f32, f32::max)
}

/// Cross-entropy: the one-block forward (a thread or a warp per row,
/// shuffles, fixed-order sums) and the backward against the CPU's fused kernel: loss, count of
/// first-maximum hits and gradient; a bad target gives a NaN loss.
#[test]
fn emulated_cross_entropy_matches_the_cpu_kernel() {
    // A thread per row (at most 32 classes; more rows than threads in the
    // second case), and a warp per row (70 classes).
    for (rows, cols) in [(64usize, 10usize), (1100, 10), (45, 70), (3, 1)] {
        let case = format!("({rows}, {cols})");
        let mut logits = values(rows * cols, 0.4);
        // A tied row: its first maximum counts.
        logits[..cols].fill(0.5);
        let targets: Vec<u32> = (0..rows).map(|r| ((r * 7) % cols) as u32).collect();
        let lv = Var::from_tensor(&tensor(&logits, &[rows, cols])).unwrap();
        let t = Tensor::from_vec(targets.clone(), rows, &Device::Cpu).unwrap();
        let (loss, count) = redline_kernels::cross_entropy_counted(lv.as_tensor(), &t).unwrap();
        let want_grad = flat(loss.backward().unwrap().get(lv.as_tensor()).unwrap());

        let (r32, c32) = (rows as u32, cols as u32);
        let (probs, l, hits) = ce_forward(&logits, &targets, r32, c32);
        let want_loss = loss.to_scalar::<f32>().unwrap();
        assert!(
            (l - want_loss).abs() <= 1e-6 * want_loss.abs().max(1.0),
            "{case}: loss {l} vs {want_loss}"
        );
        assert_eq!(
            hits,
            count.unwrap().to_scalar::<f32>().unwrap(),
            "{case}: hits"
        );

        let g = 1f32;
        let mut grad = vec![f32::NAN; rows * cols];
        let (pp, pt, pg, po) = (
            probs.as_ptr(),
            targets.as_ptr(),
            &g as *const f32,
            grad.as_mut_ptr(),
        );
        let mut args = [arg(&pp), arg(&pt), arg(&pg), arg(&po), arg(&r32), arg(&c32)];
        launch(
            "redline_ce_bwd_f32",
            elementwise(rows * cols, 256),
            256,
            &mut args,
        );
        let r = max_rel(&grad, &want_grad);
        assert!(r < 1e-6, "{case}: grad {r:e}");

        let bad: Vec<u32> = (0..rows as u32).map(|r| r.max(c32)).collect();
        let (_, l, _) = ce_forward(&logits, &bad, r32, c32);
        assert!(l.is_nan(), "{case}: a target out of range gives {l}");
    }
}

/// The linear backward's mask + bias-gradient kernel: the gradient zeroed
/// where the forward's ReLU output was not positive, and the bias gradient
/// summed over rows in the kernel's fixed order (`mask_sum`); without a ReLU
/// (`y` null) nothing is masked.
#[test]
fn emulated_relu_mask_bias_grad_matches_a_reference() {
    // More row groups than rows, and many rows per group.
    for (rows, cols) in [(37usize, 150usize), (5, 40), (300, 10)] {
        let g = values(rows * cols, 0.2);
        let y: Vec<f32> = values(rows * cols, 1.7)
            .iter()
            .map(|v| v.max(0.0))
            .collect();
        for relu in [true, false] {
            let (dz, db) = run_mask_kernel(
                "redline_relu_mask_bias_grad_f32",
                &g,
                relu.then_some(&y[..]),
                (rows, cols),
                f32::NAN,
            );
            let want: Vec<f32> = g
                .iter()
                .zip(&y)
                .map(|(&g, &y)| if relu && y <= 0.0 { 0.0 } else { g })
                .collect();
            assert_eq!(dz, want, "relu {relu}: dz");
            let want_db: Vec<f32> = (0..cols)
                .map(|j| mask_sum(rows, |r| want[r * cols + j]))
                .collect();
            assert_eq!(db, want_db, "relu {relu}: db");
        }
    }
}

/// A launch the emulator cannot run is refused, not run wrong.
#[test]
fn emulated_launches_check_their_shape() {
    let name = CString::new("no_such_kernel").unwrap();
    // SAFETY: refused before any argument is read.
    let rc = unsafe { (emulator().launch)(name.as_ptr(), 1, 1, 1, 32, 1, 1, std::ptr::null_mut()) };
    assert_eq!(rc, 1);
    let name = CString::new("redline_sum_splits_f32").unwrap();
    // SAFETY: as above: 33 threads are not whole warps.
    let rc = unsafe { (emulator().launch)(name.as_ptr(), 1, 1, 1, 33, 1, 1, std::ptr::null_mut()) };
    assert_eq!(rc, 2);
}

/// Sizes of the MLP's parameters, a tensor of several chunks, a scalar and
/// 40 more: two launches of the multi-tensor kernels.
fn optim_sizes() -> Vec<usize> {
    let mut s = vec![100_352, 128, 1280, 10, 9_001, 1];
    s.extend((0..40).map(|i| 17 + 301 * i));
    s
}

/// Starting parameters of `sizes`, and per item the kernel's buffers: the
/// parameter, its gradient and `states` zeroed state buffers.
fn optim_start(sizes: &[usize], states: usize) -> (Vec<Vec<f32>>, Vec<Vec<Vec<f32>>>) {
    let p0: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| values(n, i as f32))
        .collect();
    let bufs = p0
        .iter()
        .map(|p| {
            let mut b = vec![p.clone()];
            b.extend((0..=states).map(|_| vec![0.0; p.len()]));
            b
        })
        .collect();
    (p0, bufs)
}

/// Host buffers for the multi-tensor kernels: the step count and learning
/// rate (f64, read by the kernel), and each launch of `sizes` with the
/// argument struct `src/cuda/optim.rs` builds.
fn run_multi<H, T>(kernel: &str, bufs: &mut [Vec<Vec<T>>], sizes: &[usize], hyper: H) {
    use redline_kernels::multi_tensor::{pack, BLOCK_THREADS, CHUNK, MAX_TENSORS};
    use redline_kernels::multi_tensor_args::tensor_list;
    // p, g, then the state buffers of each item, as addresses.
    let per_item = bufs[0].len();
    let ptrs: Vec<u64> = (0..sizes.len())
        .flat_map(|i| (0..per_item).map(move |k| (i, k)))
        .map(|(i, k)| bufs[i][k].as_mut_ptr() as u64)
        .collect();
    let chunk = CHUNK as u64;
    for l in pack(sizes, CHUNK, MAX_TENSORS).unwrap() {
        let list = tensor_list(&l, &ptrs, per_item, sizes);
        let mut args = [arg(&list), arg(&hyper), arg(&chunk)];
        launch(kernel, (l.blocks(), 1, 1), BLOCK_THREADS, &mut args);
    }
}

/// Adam (L2) and AdamW over 25 steps with a learning-rate change: the
/// multi-tensor kernel on host buffers against the generic path on the CPU,
/// parameters and both moments within 1 ulp (as `cuda_kernels.rs` holds
/// the GPU to). Steps 5 and 17 carry the loss scaler's overflow flag: the
/// kernel changes nothing and the step count stays (PyTorch's skipped
/// `optimizer.step()`); other steps pass a clear flag, or none.
#[test]
fn emulated_multi_adam_matches_the_generic_path() {
    use redline_kernels::multi_tensor_args::AdamHyper;
    use redline_kernels::optim::{adam_tensors, AdamStep, DeviceHyper, TensorState};
    let sizes = optim_sizes();
    for decoupled in [false, true] {
        // Per item: p, g, m, v.
        let (p0, mut bufs) = optim_start(&sizes, 2);
        let mut generic: Vec<Tensor> = p0.iter().map(|p| tensor(p, &[p.len()])).collect();
        let mut states = vec![TensorState::default(); sizes.len()];
        let mut h = DeviceHyper::new(&Device::Cpu, 1e-2, 0).unwrap();
        let mut done = 0u64;
        for t in 1..=25u64 {
            let rate = if t <= 12 { 1e-2 } else { 3e-3 };
            let overflow = t == 5 || t == 17;
            let hp = AdamStep {
                lr: rate,
                betas: (0.9, 0.999),
                eps: 1e-8,
                weight_decay: 0.05,
                decoupled,
                step: done + 1,
            };
            // The device-held step count and rate the kernel reads (the
            // count advanced unless the step overflowed), and the flag.
            let (step, lr) = ((done + u64::from(!overflow)) as f64, rate);
            let flag = if overflow { 1f32 } else { 0.0 };
            for (i, b) in bufs.iter_mut().enumerate() {
                b[1] = values(sizes[i], (t * 7 + i as u64) as f32);
            }
            let hyper = AdamHyper::new(hp, &step as *const f64 as u64, &lr as *const f64 as u64);
            let hyper = match t % 2 {
                0 => hyper.skipping(&flag as *const f32 as u64),
                _ if overflow => hyper.skipping(&flag as *const f32 as u64),
                _ => hyper,
            };
            run_multi("redline_multi_adam_f32", &mut bufs, &sizes, hyper);
            if overflow {
                continue;
            }
            done += 1;
            h.set_lr(rate).unwrap();
            h.advance().unwrap();
            let c = h.adam(hp, candle_core::DType::F32).unwrap();
            for i in 0..sizes.len() {
                let g = tensor(&bufs[i][1], &[sizes[i]]);
                generic[i] = adam_tensors(&generic[i], &g, &mut states[i], &c).unwrap();
            }
        }
        for i in 0..sizes.len() {
            let st = &states[i];
            for (name, ours, want) in [
                ("p", &bufs[i][0], flat(&generic[i])),
                ("m", &bufs[i][2], flat(st.a.as_ref().unwrap().as_tensor())),
                ("v", &bufs[i][3], flat(st.b.as_ref().unwrap().as_tensor())),
            ] {
                let worst = worst_relative(ours, &want);
                assert!(
                    worst <= 2.4e-7,
                    "decoupled {decoupled}, tensor {i}, {name}: {worst:e}"
                );
            }
        }
    }
}

/// SGD plain, with momentum and decay, and Nesterov: the multi-tensor kernel
/// against the generic path over 10 steps, of which the loss scaler's flag
/// skips the first and the sixth.
#[test]
fn emulated_multi_sgd_matches_the_generic_path() {
    use redline_kernels::multi_tensor_args::SgdHyper;
    use redline_kernels::optim::{sgd_tensors, DeviceHyper, SgdStep, TensorState};
    let sizes = optim_sizes();
    for (momentum, nesterov, wd) in [(0.0, false, 0.0), (0.9, false, 0.01), (0.9, true, 0.0)] {
        let hp = SgdStep {
            lr: 0.05,
            momentum,
            dampening: 0.0,
            nesterov,
            weight_decay: wd,
        };
        // Per item: p, g, and the momentum buffer when there is momentum.
        let (p0, mut bufs) = optim_start(&sizes, usize::from(momentum != 0.0));
        let mut generic: Vec<Tensor> = p0.iter().map(|p| tensor(p, &[p.len()])).collect();
        let mut states = vec![TensorState::default(); sizes.len()];
        let h = DeviceHyper::new(&Device::Cpu, 0.05, 0).unwrap();
        let lr = 0.05f64;
        let mut done = 0u64;
        for t in 1..=10u64 {
            // The first step overflows (as 16-mixed's first steps at scale
            // 65536 do): the buffer starts from the first step taken.
            let overflow = t == 1 || t == 6;
            let step = (done + u64::from(!overflow)) as f64;
            let flag = if overflow { 1f32 } else { 0.0 };
            for (i, b) in bufs.iter_mut().enumerate() {
                b[1] = values(sizes[i], (t * 5 + i as u64) as f32);
            }
            let hyper = SgdHyper::new(hp, &step as *const f64 as u64, &lr as *const f64 as u64)
                .skipping(&flag as *const f32 as u64);
            run_multi("redline_multi_sgd_f32", &mut bufs, &sizes, hyper);
            if overflow {
                continue;
            }
            done += 1;
            h.advance().unwrap();
            let c = h.sgd(hp, candle_core::DType::F32).unwrap();
            for i in 0..sizes.len() {
                let g = tensor(&bufs[i][1], &[sizes[i]]);
                generic[i] = sgd_tensors(&generic[i], &g, &mut states[i], &c).unwrap();
            }
        }
        for (i, b) in bufs.iter().enumerate() {
            let want = flat(&generic[i]);
            let worst = worst_relative(&b[0], &want);
            assert!(
                worst <= 2.4e-7,
                "momentum {momentum}, nesterov {nesterov}, tensor {i}: {worst:e}"
            );
        }
    }
}

/// bf16-true's multi-tensor kernels (`redline_multi_adam_bf16`,
/// `redline_multi_sgd_bf16`) on bf16 bits against the CPU's bf16 loop
/// (`optim_bf16.rs`, PyTorch's bf16 rounding), over 12 steps with a
/// learning-rate change: Adam (L2), AdamW, and SGD with Nesterov momentum
/// and decay; Adam and SGD again without weight decay, with infinite
/// weights, which stay infinite (PyTorch adds `wd * p` only with a weight
/// decay). Parameters and state equal bit for bit, except where the
/// kernel's f32 constants (f64 `exp(t ln beta)`, as the fp32 kernel's) and
/// the CPU's (`powi`) differ in their last bit and flip a bf16 rounding:
/// one bf16 step (2^-8 relative) in at most one element in 10,000.
#[test]
fn emulated_bf16_optimizers_match_the_cpu_loop() {
    use half::bf16;
    use redline_kernels::grad::GradRef;
    use redline_kernels::multi_tensor_args::{AdamHyper, SgdHyper};
    use redline_kernels::optim::{adam_step, sgd_step, AdamStep, SgdStep, SlotState};
    let sizes = optim_sizes();
    let bits = |v: &[f32]| -> Vec<u16> { v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect() };
    let bf16_tensor = |b: &[u16]| {
        let v: Vec<bf16> = b.iter().map(|x| bf16::from_bits(*x)).collect();
        Tensor::from_vec(v, b.len(), &Device::Cpu).unwrap()
    };
    let tensor_bits = |t: &Tensor| -> Vec<u16> {
        t.to_vec1::<bf16>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    let state_bits = |v: &[bf16]| -> Vec<u16> { v.iter().map(|x| x.to_bits()).collect() };
    // (kind, state buffers per item, weight decay)
    for (kind, states, wd) in [
        ("adam", 2, 0.05),
        ("adamw", 2, 0.05),
        ("sgd", 1, 1e-3),
        ("adam", 2, 0.0),
        ("sgd", 1, 0.0),
    ] {
        let mut p0: Vec<Vec<u16>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                bits(
                    &values(n, i as f32)
                        .iter()
                        .map(|x| x * 0.05)
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        if wd == 0.0 {
            p0[2][3] = 0x7F80;
            p0[4][0] = 0xFF80;
        }
        // Per item: p, g, then the state buffers.
        let mut bufs: Vec<Vec<Vec<u16>>> = p0
            .iter()
            .map(|p| {
                let mut b = vec![p.clone(), vec![0; p.len()]];
                b.extend((0..states).map(|_| vec![0u16; p.len()]));
                b
            })
            .collect();
        let cpu: Vec<Tensor> = p0.iter().map(|p| bf16_tensor(p)).collect();
        let mut slots = vec![SlotState::default(); sizes.len()];
        for t in 1..=12u64 {
            let rate = if t <= 6 { 1e-2 } else { 3e-3 };
            let adam = AdamStep {
                lr: rate,
                betas: (0.9, 0.999),
                eps: 1e-8,
                weight_decay: wd,
                decoupled: kind == "adamw",
                step: t,
            };
            let sgd = SgdStep {
                lr: rate,
                momentum: 0.9,
                dampening: 0.0,
                nesterov: true,
                weight_decay: wd,
            };
            let (step, lr) = (t as f64, rate);
            let (sp, lp) = (&step as *const f64 as u64, &lr as *const f64 as u64);
            for (i, b) in bufs.iter_mut().enumerate() {
                let g = values(sizes[i], (t * 7 + i as u64) as f32);
                b[1] = bits(&g.iter().map(|x| x * 1e-2).collect::<Vec<_>>());
            }
            if kind == "sgd" {
                run_multi(
                    "redline_multi_sgd_bf16",
                    &mut bufs,
                    &sizes,
                    SgdHyper::new(sgd, sp, lp),
                );
            } else {
                run_multi(
                    "redline_multi_adam_bf16",
                    &mut bufs,
                    &sizes,
                    AdamHyper::new(adam, sp, lp),
                );
            }
            for i in 0..sizes.len() {
                let g = bf16_tensor(&bufs[i][1]);
                let done = if kind == "sgd" {
                    sgd_step(&cpu[i], GradRef::Tensor(&g), &mut slots[i], sgd)
                } else {
                    adam_step(&cpu[i], GradRef::Tensor(&g), &mut slots[i], adam)
                };
                assert!(done.unwrap(), "the CPU's bf16 loop covers a bf16 tensor");
            }
        }
        let (mut differ, mut total) = (0usize, 0usize);
        for i in 0..sizes.len() {
            let half = &slots[i].half;
            let mut pairs = vec![("p", bufs[i][0].clone(), tensor_bits(&cpu[i]))];
            pairs.push(("a", bufs[i][2].clone(), state_bits(&half.a)));
            if states == 2 {
                pairs.push(("b", bufs[i][3].clone(), state_bits(&half.b)));
            }
            for (name, ours, want) in pairs {
                assert_eq!(ours.len(), want.len(), "{kind} tensor {i} {name}");
                for (a, b) in ours.iter().zip(&want) {
                    total += 1;
                    if a == b {
                        continue;
                    }
                    differ += 1;
                    let (x, y) = (bf16::from_bits(*a).to_f32(), bf16::from_bits(*b).to_f32());
                    assert!(
                        (x - y).abs() <= 2f32.powi(-7) * x.abs().max(y.abs()),
                        "{kind} tensor {i} {name}: {x} against the CPU's {y}"
                    );
                }
            }
        }
        if wd == 0.0 {
            assert_eq!([bufs[2][0][3], bufs[4][0][0]], [0x7F80, 0xFF80], "{kind}");
        }
        eprintln!("{kind} (wd {wd}): {differ} of {total} values differ by one bf16 step");
        assert!(
            differ * 10_000 <= total,
            "{kind} (wd {wd}): {differ} of {total} values differ"
        );
        assert!(total > 500_000);
    }
}

/// The device cursor's gather (`cuda/gather.cu`): batch row `b` is sample
/// `perm[counter * batch + b]` of x and of y, for every batch of an epoch,
/// with fewer threads than a sample's words (the stride loop) and with more.
/// Outputs start as u32::MAX, so a word no thread writes shows.
#[test]
fn emulated_cursor_gather_draws_the_counters_batch() {
    let (len, batch, x_words, y_words) = (10usize, 3usize, 37u32, 2u32);
    let perm: Vec<u32> = vec![7, 2, 9, 0, 4, 1, 8, 3, 6, 5];
    let x: Vec<u32> = (0..len as u32 * x_words).map(|i| i * 3 + 1).collect();
    let y: Vec<u32> = (0..len as u32 * y_words).map(|i| 1000 + i).collect();
    for threads in [32u32, 256] {
        for counter in 0..(len / batch) as u32 {
            let mut out_x = vec![u32::MAX; batch * x_words as usize];
            let mut out_y = vec![u32::MAX; batch * y_words as usize];
            let c = [counter];
            let (pp, pc, px, py) = (perm.as_ptr(), c.as_ptr(), x.as_ptr(), y.as_ptr());
            let (ox, oy) = (out_x.as_mut_ptr(), out_y.as_mut_ptr());
            let b32 = batch as u32;
            let mut args = vec![
                arg(&pp),
                arg(&pc),
                arg(&px),
                arg(&py),
                arg(&ox),
                arg(&oy),
                arg(&b32),
                arg(&x_words),
                arg(&y_words),
            ];
            launch("redline_cursor_gather", (b32, 1, 1), threads, &mut args);
            let (xw, yw) = (x_words as usize, y_words as usize);
            for b in 0..batch {
                let row = perm[counter as usize * batch + b] as usize;
                let case = format!("threads {threads}, batch {counter}, row {b}");
                assert_eq!(out_x[b * xw..][..xw], x[row * xw..][..xw], "{case}: x");
                assert_eq!(out_y[b * yw..][..yw], y[row * yw..][..yw], "{case}: y");
            }
        }
    }
}

/// A step's sums in one launch (`cuda/tally.cu`): each `sum + value * scale`
/// in order, with the bits of the ops it replaces (a product rounded once,
/// then the add), for awkward values: products that round, subnormals, an
/// overflow to inf, NaN, -0, a sum listed twice (it adds twice, in order).
/// Then the counters' `+= 1`, u32 (wrapping, as candle's u32 affine) and f64.
#[test]
fn emulated_step_sums_and_counters_match_the_ops_they_replace() {
    use redline_kernels::tally::SumList;
    let start = [0.0f32, 1.0e30, 0.0, 3.0e-39, 7.5, 3.0e38, 1.0, 0.1];
    let values = [
        0.1f32,
        3.333_333_3,
        -0.0,
        1.0e-39,
        f32::NAN,
        2.0e38,
        16_777_216.0,
        0.2,
    ];
    let scales = [64.0f32, 17.0, 1.0, 3.0, 1.0, 2.0, 1.0, 1.0 / 3.0];
    let mut sums = start;
    let (base, from) = (sums.as_mut_ptr() as u64, values.as_ptr() as u64);
    let mut items: Vec<(u64, u64, f32)> = (0..start.len() as u64)
        .map(|i| (base + 4 * i, from + 4 * i, scales[i as usize]))
        .collect();
    items.push((items[0].0, items[7].1, 5.0));
    let list = SumList::new(&items).unwrap();
    launch("redline_step_sums", (1, 1, 1), 32, &mut [arg(&list)]);
    let mut want = start;
    for &(dst, src, scale) in &items {
        want[((dst - base) / 4) as usize] += values[((src - from) / 4) as usize] * scale;
    }
    for (i, (g, w)) in sums.iter().zip(&want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "sum {i}: {g:e} ({:#x}), want {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
    assert_eq!(
        want[0],
        (0.1f32 * 64.0) + 0.2 * 5.0,
        "the repeated sum added twice"
    );
    assert!(want[4].is_nan() && want[5].is_infinite() && want[6] == 16_777_216.0);

    let mut c32 = [41u32, u32::MAX];
    for c in &mut c32 {
        let p = c as *mut u32;
        launch("redline_count_u32", (1, 1, 1), 32, &mut [arg(&p)]);
    }
    assert_eq!(c32, [42, 0]);
    let mut c64 = [3.0f64, 9_007_199_254_740_992.0];
    for c in &mut c64 {
        let p = c as *mut f64;
        launch("redline_count_f64", (1, 1, 1), 32, &mut [arg(&p)]);
    }
    assert_eq!(c64, [4.0, 9_007_199_254_740_992.0]);
}
