//! Redline's GPU kernels against the generic candle ops they replace, on
//! `cuda:0` (a build with `--features cuda` on a machine with a GPU; the
//! bundle of `scripts/gpu-bundle.sh` runs them as `kernels cuda_`).
//! Tolerance: the kernels round once per operation in the generic path's
//! order, so the updates are expected bit for bit; the tests allow 1 ulp
//! (relative 2.4e-7) and print how many elements differ at all.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use candle_core::{DType, Device, Tensor, Var};
use redline_kernels::cuda::{multi_adam, multi_sgd, AdamItem, SgdItem};
use redline_kernels::optim::{
    adam_tensors, sgd_tensors, AdamStep, DeviceHyper, SgdStep, TensorState,
};

#[path = "cuda_kernels/attention.rs"]
mod attention;
#[path = "cuda_kernels/conv.rs"]
mod conv;
#[path = "cuda_kernels/tally.rs"]
mod tally;

fn gpu() -> Device {
    Device::new_cuda(0).expect("these tests need cuda:0")
}

/// Sizes of the MLP's parameters, a tensor of several chunks and a scalar,
/// and (with `many`) enough tensors for two launches.
fn sizes(many: bool) -> Vec<usize> {
    let mut s = vec![100_352, 128, 1280, 10, 9_001, 1];
    if many {
        s.extend((0..40).map(|i| 17 + 301 * i));
    }
    s
}

fn values(n: usize, seed: f32, dev: &Device) -> Tensor {
    Tensor::arange(0f32, n as f32, dev)
        .unwrap()
        .affine(0.013, f64::from(seed))
        .unwrap()
        .sin()
        .unwrap()
}

/// Largest difference in ulps-ish (relative to the magnitude) and the count
/// of elements that differ.
fn compare(a: &Tensor, b: &Tensor) -> (f32, usize) {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut worst = 0f32;
    let mut differ = 0;
    for (x, y) in a.iter().zip(&b) {
        if x.to_bits() != y.to_bits() {
            differ += 1;
            worst = worst.max((x - y).abs() / x.abs().max(y.abs()).max(1e-30));
        }
    }
    (worst, differ)
}

fn adam_hp(step: u64, lr: f64, decoupled: bool) -> AdamStep {
    AdamStep {
        lr,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.05,
        decoupled,
        step,
    }
}

/// A variable of `len` values from `seed`, shaped `shape`.
fn var_of(len: usize, seed: f32, shape: &[usize], dev: &Device) -> Var {
    Var::from_tensor(&values(len, seed, dev).reshape(shape).unwrap()).unwrap()
}

/// The multi-tensor Adam's items: parameter `p[i]` with gradient `g[i]` and
/// moments `m[i]`, `v[i]`.
fn adam_items<'a>(p: &'a [Var], g: &'a [Tensor], m: &'a [Var], v: &'a [Var]) -> Vec<AdamItem<'a>> {
    (0..p.len())
        .map(|i| AdamItem {
            p: p[i].as_tensor(),
            g: &g[i],
            m: m[i].as_tensor(),
            v: v[i].as_tensor(),
        })
        .collect()
}

/// The largest difference of `got` (any device, any float dtype) from the
/// float64 `want` on the CPU, over `want`'s largest absolute element.
fn rel_err_f64(got: &Tensor, want: &Tensor) -> f64 {
    let f64_of = |t: &Tensor| -> f64 { t.max_all().unwrap().to_scalar::<f64>().unwrap() };
    let got = got
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap();
    f64_of(&(got - want).unwrap().abs().unwrap()) / f64_of(&want.abs().unwrap())
}

/// The largest absolute element of `t`.
fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// A layer's output and the gradients of `vars` (input, weight, bias) under
/// a fixed upstream gradient, with the fused GPU kernels `fused` or not.
fn layer_run(fused: bool, forward: &dyn Fn() -> Tensor, vars: [&Var; 3]) -> [Tensor; 4] {
    // With the reduced-precision variants (16-bit, TF32), as `--fused-kernels on`.
    redline_kernels::fused_gpu::set_enabled(fused);
    redline_kernels::fused_gpu::set_reduced_precision(fused);
    let y = forward();
    redline_kernels::fused_gpu::set_enabled(false);
    redline_kernels::fused_gpu::set_reduced_precision(false);
    let r = values(y.elem_count(), 4.1, y.device())
        .reshape(y.shape())
        .unwrap();
    let grads = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
    let g = |v: &Var| grads.get(v.as_tensor()).unwrap().clone();
    [y.clone(), g(vars[0]), g(vars[1]), g(vars[2])]
}

/// The layer `forward` with the fused kernels against without: output and
/// the three gradients each within `tol` of the generic one's largest value.
fn assert_layer_matches(case: &str, forward: &dyn Fn() -> Tensor, vars: [&Var; 3], tol: f32) {
    let fused = layer_run(true, forward, vars);
    let generic = layer_run(false, forward, vars);
    assert_close(case, &fused, &generic, tol);
}

/// Output and gradients `ours` against `want`, each within `tol` of `want`'s
/// largest value.
fn assert_close(case: &str, ours: &[Tensor; 4], want: &[Tensor; 4], tol: f32) {
    for (name, (a, b)) in ["y", "dx", "dW", "db"].iter().zip(ours.iter().zip(want)) {
        assert_eq!(a.dims(), b.dims(), "{case}: {name}");
        let scale = max_abs(b).max(1e-6);
        let d = max_abs(&(a - b).unwrap());
        assert!(
            d <= tol * scale,
            "{case}: {name} differs by {d:e} of {scale:e}"
        );
    }
}

/// `v` rounded to `dtype` and back to f32: the 16-bit value in f32, whose
/// gradient is rounded to `dtype` on the way back, as a 16-bit input's is.
fn round_trip(v: &Tensor, dtype: DType) -> Tensor {
    v.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap()
}

/// Starting parameters of `sizes` on `dev`, and a copy of them in variables
/// for the kernel to update in place.
fn start(sizes: &[usize], dev: &Device) -> (Vec<Tensor>, Vec<Var>) {
    let p0: Vec<Tensor> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| values(n, i as f32, dev))
        .collect();
    let vars = p0
        .iter()
        .map(|t| Var::from_tensor(&t.copy().unwrap()).unwrap())
        .collect();
    (p0, vars)
}

/// A zeroed variable shaped as each of `p0`.
fn zeroed(p0: &[Tensor]) -> Vec<Var> {
    p0.iter()
        .map(|t| Var::from_tensor(&t.zeros_like().unwrap()).unwrap())
        .collect()
}

#[test]
fn cuda_multi_adam_matches_the_generic_path() {
    let dev = gpu();
    for (decoupled, many) in [(false, false), (true, true)] {
        let sizes = sizes(many);
        // The kernel's side: parameters and zeroed moments updated in place.
        let (p0, fused_p) = start(&sizes, &dev);
        let (m, v) = (zeroed(&p0), zeroed(&p0));
        let mut generic_p: Vec<Tensor> = p0.clone();
        let mut states = vec![TensorState::default(); sizes.len()];
        let mut h_fused = DeviceHyper::new(&dev, 1e-2, 0).unwrap();
        let mut h_generic = DeviceHyper::new(&dev, 1e-2, 0).unwrap();
        for step in 1..=25u64 {
            let lr = if step <= 12 { 1e-2 } else { 3e-3 };
            let hp = adam_hp(step, lr, decoupled);
            let grads: Vec<Tensor> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| values(n, (step * 7 + i as u64) as f32, &dev))
                .collect();
            for h in [&mut h_fused, &mut h_generic] {
                h.set_lr(lr).unwrap();
                h.advance().unwrap();
            }
            let items = adam_items(&fused_p, &grads, &m, &v);
            multi_adam(&items, &h_fused, hp, None).unwrap();
            let c = h_generic.adam(hp, DType::F32).unwrap();
            for i in 0..sizes.len() {
                generic_p[i] = adam_tensors(&generic_p[i], &grads[i], &mut states[i], &c).unwrap();
            }
        }
        let mut differ = 0;
        for i in 0..sizes.len() {
            let (worst, d) = compare(fused_p[i].as_tensor(), &generic_p[i]);
            differ += d;
            assert!(
                worst <= 2.4e-7,
                "decoupled {decoupled}, tensor {i}: relative {worst:e}"
            );
            let (worst, _) = compare(m[i].as_tensor(), states[i].a.as_ref().unwrap().as_tensor());
            assert!(worst <= 2.4e-7, "first moment {i}: {worst:e}");
            let (worst, _) = compare(v[i].as_tensor(), states[i].b.as_ref().unwrap().as_tensor());
            assert!(worst <= 2.4e-7, "second moment {i}: {worst:e}");
        }
        eprintln!(
            "adam decoupled={decoupled}: {differ} parameter elements differ from the generic path"
        );
    }
}

#[test]
fn cuda_multi_sgd_matches_the_generic_path() {
    let dev = gpu();
    for (momentum, nesterov, wd) in [(0.0, false, 0.0), (0.9, false, 0.01), (0.9, true, 0.0)] {
        let sizes = sizes(true);
        let (p0, fused_p) = start(&sizes, &dev);
        let bufs = zeroed(&p0);
        let mut generic_p = p0.clone();
        let mut states = vec![TensorState::default(); sizes.len()];
        let hp = SgdStep {
            lr: 0.05,
            momentum,
            dampening: 0.0,
            nesterov,
            weight_decay: wd,
        };
        let h_fused = DeviceHyper::new(&dev, 0.05, 0).unwrap();
        let h_generic = DeviceHyper::new(&dev, 0.05, 0).unwrap();
        for step in 1..=10u64 {
            let grads: Vec<Tensor> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| values(n, (step * 3 + i as u64) as f32, &dev))
                .collect();
            h_fused.advance().unwrap();
            h_generic.advance().unwrap();
            let items: Vec<SgdItem<'_>> = (0..sizes.len())
                .map(|i| SgdItem {
                    p: fused_p[i].as_tensor(),
                    g: &grads[i],
                    buf: (momentum != 0.0).then(|| bufs[i].as_tensor()),
                })
                .collect();
            multi_sgd(&items, &h_fused, hp, None).unwrap();
            let c = h_generic.sgd(hp, DType::F32).unwrap();
            for i in 0..sizes.len() {
                generic_p[i] = sgd_tensors(&generic_p[i], &grads[i], &mut states[i], &c).unwrap();
            }
        }
        for i in 0..sizes.len() {
            let (worst, _) = compare(fused_p[i].as_tensor(), &generic_p[i]);
            assert!(
                worst <= 2.4e-7,
                "momentum {momentum} nesterov {nesterov}: tensor {i}: {worst:e}"
            );
        }
    }
}

#[test]
fn cuda_multi_tensor_kernels_refuse_what_they_cannot_take() {
    let dev = gpu();
    let h = DeviceHyper::new(&dev, 0.1, 1).unwrap();
    let p = Tensor::zeros((4, 6), DType::F32, &dev).unwrap();
    let strided = p.t().unwrap();
    let g = Tensor::zeros((6, 4), DType::F32, &dev).unwrap();
    let sgd = SgdStep {
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let err = multi_sgd(
        &[SgdItem {
            p: &strided,
            g: &g,
            buf: None,
        }],
        &h,
        sgd,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("not contiguous"), "{err}");
    let short = Tensor::zeros(5, DType::F32, &dev).unwrap();
    let err = multi_sgd(
        &[SgdItem {
            p: &p,
            g: &short,
            buf: None,
        }],
        &h,
        sgd,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("elements"), "{err}");
    let f64p = p.to_dtype(DType::F64).unwrap();
    let err = multi_sgd(
        &[SgdItem {
            p: &f64p,
            g: &f64p,
            buf: None,
        }],
        &h,
        sgd,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("F64"), "{err}");
    let cpu = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
    assert!(multi_sgd(
        &[SgdItem {
            p: &cpu,
            g: &cpu,
            buf: None
        }],
        &h,
        sgd,
        None
    )
    .is_err());
    // The scaler's flag is one f32 value.
    let two = Tensor::zeros(2, DType::F32, &dev).unwrap();
    let err = multi_sgd(
        &[SgdItem {
            p: &p,
            g: &p,
            buf: None,
        }],
        &h,
        sgd,
        Some(&two),
    )
    .unwrap_err();
    assert!(err.to_string().contains("one value"), "{err}");
}

/// The loss scaler's overflow flag, read on the device: set, the Adam and
/// SGD kernels change no parameter or state; clear, they update.
#[test]
fn cuda_optimizers_skip_a_flagged_step() {
    let dev = gpu();
    let sizes = sizes(false);
    let (p0, vars) = start(&sizes, &dev);
    let (m, v) = (zeroed(&p0), zeroed(&p0));
    let grads: Vec<Tensor> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| values(n, 3.0 + i as f32, &dev))
        .collect();
    let h = DeviceHyper::new(&dev, 1e-2, 1).unwrap();
    let items = adam_items(&vars, &grads, &m, &v);
    let set = Tensor::new(1f32, &dev).unwrap();
    let clear = Tensor::new(0f32, &dev).unwrap();
    multi_adam(&items, &h, adam_hp(1, 1e-2, true), Some(&set)).unwrap();
    for (i, var) in vars.iter().enumerate() {
        assert_eq!(
            compare(var.as_tensor(), &p0[i]).1,
            0,
            "Adam flagged: p{i} changed"
        );
        assert_eq!(max_abs(m[i].as_tensor()), 0.0, "Adam flagged: m{i} changed");
    }
    multi_adam(&items, &h, adam_hp(1, 1e-2, true), Some(&clear)).unwrap();
    assert!(
        compare(vars[0].as_tensor(), &p0[0]).1 > 0,
        "Adam, clear flag: no update"
    );

    let sgd = SgdStep {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let (p0, vars) = start(&sizes, &dev);
    let bufs = zeroed(&p0);
    let items: Vec<SgdItem<'_>> = (0..sizes.len())
        .map(|i| SgdItem {
            p: vars[i].as_tensor(),
            g: &grads[i],
            buf: Some(bufs[i].as_tensor()),
        })
        .collect();
    multi_sgd(&items, &h, sgd, Some(&set)).unwrap();
    for (i, var) in vars.iter().enumerate() {
        assert_eq!(
            compare(var.as_tensor(), &p0[i]).1,
            0,
            "SGD flagged: p{i} changed"
        );
        assert_eq!(
            max_abs(bufs[i].as_tensor()),
            0.0,
            "SGD flagged: buffer {i} changed"
        );
    }
}

/// The fused cross-entropy (one forward launch, one backward launch) against
/// candle's generic log-softmax path on the same GPU: loss and gradient.
#[test]
fn cuda_cross_entropy_matches_the_generic_path() {
    use redline_kernels::{cross_entropy, fused_gpu};
    let dev = gpu();
    for (rows, cols) in [(64usize, 10usize), (300, 1000), (5, 33)] {
        let x = Var::from_tensor(
            &values(rows * cols, 0.3, &dev)
                .affine(4.0, 0.0)
                .unwrap()
                .reshape((rows, cols))
                .unwrap(),
        )
        .unwrap();
        let t: Vec<u32> = (0..rows).map(|r| ((r * 7919) % cols) as u32).collect();
        let t = Tensor::new(t.as_slice(), &dev).unwrap();
        // The count of right predictions from the fused pass is argmax's.
        fused_gpu::set_enabled(true);
        let (_, counted) = redline_kernels::cross_entropy_counted(x.as_tensor(), &t).unwrap();
        let want = x
            .as_tensor()
            .argmax(1)
            .unwrap()
            .eq(&t)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        assert_eq!(
            counted.unwrap().to_scalar::<f32>().unwrap(),
            want.sum_all().unwrap().to_scalar::<f32>().unwrap(),
            "({rows}, {cols}): count"
        );
        let run = |fused: bool| {
            fused_gpu::set_enabled(fused);
            let loss = cross_entropy(x.as_tensor(), &t).unwrap();
            let grads = (&loss * 3.0).unwrap().backward().unwrap();
            let g = grads.get(x.as_tensor()).unwrap().clone();
            (loss.to_scalar::<f32>().unwrap(), g)
        };
        let (lf, gf) = run(true);
        let (lg, gg) = run(false);
        fused_gpu::set_enabled(false);
        assert!(
            (lf - lg).abs() <= 2e-6 * lg.abs().max(1.0),
            "({rows}, {cols}): loss {lf} vs {lg}"
        );
        let d = max_abs(&(gf - gg).unwrap());
        assert!(d <= 1e-6, "({rows}, {cols}): gradient differs by {d:e}");
    }
    // A target outside the classes makes the loss NaN (the loop then stops
    // with a non-finite loss), not a silent number.
    fused_gpu::set_enabled(true);
    let x = Tensor::zeros((2, 3), DType::F32, &dev).unwrap();
    let bad = Tensor::new(&[0u32, 3], &dev).unwrap();
    let loss = cross_entropy(&x, &bad).unwrap().to_scalar::<f32>().unwrap();
    fused_gpu::set_enabled(false);
    assert!(loss.is_nan(), "{loss}");
}

/// The cuBLASLt linear layer (bias and ReLU in the GEMM's epilogue; mask,
/// bias gradient and two GEMMs backward) against candle's matmul,
/// broadcast_add and relu: outputs and all three gradients. At batch 512
/// the weight gradient is split over the batch (8 chunks for both MLP
/// layers, 4 at 384: `weight_grad_splits`) and its splits summed in order.
#[test]
fn cuda_linear_matches_the_generic_path() {
    use redline_kernels::linear;
    let dev = gpu();
    for (batch, fan_in, fan_out, relu) in [
        (64, 784, 128, true),
        (64, 128, 10, false),
        (3, 5, 7, true),
        (512, 784, 128, true),
        (512, 128, 10, false),
        (384, 784, 128, true),
    ] {
        let var = |len: usize, s: f32, shape: &[usize]| var_of(len, s, shape, &dev);
        let x = var(batch * fan_in, 0.5, &[batch, fan_in]);
        let w = var(fan_out * fan_in, 1.5, &[fan_out, fan_in]);
        let b = var(fan_out, 2.5, &[fan_out]);
        let forward = || linear(x.as_tensor(), w.as_tensor(), b.as_tensor(), relu).unwrap();
        let case = format!("({batch}, {fan_in}, {fan_out}, relu {relu})");
        assert_layer_matches(&case, &forward, [&x, &w, &b], 1e-5);
    }
}

/// The 16-bit linear layer (one cuBLASLt call on tensor cores with the bias
/// and ReLU in its epilogue; the mask kernel's 16-bit twin and two 16-bit
/// GEMMs backward), bf16 and fp16 operands cast from f32 variables, against
/// candle's f32 ops on the same 16-bit values, rounded to the format where
/// the layer's outputs are: output and the three gradients (through the
/// casts, in f32) within about two steps of the format.
///
/// Not against candle's 16-bit ops: its fp16 sum (the bias gradient)
/// accumulates in fp16 (`fast_sum_f16`), and on an H200 it was 1.35e-2 off
/// the f32 sum of 512 rows of about 2.7 (`bench/results/h200-2026-11-26`),
/// where the layer sums in f32 and rounds once.
#[test]
fn cuda_16_bit_linear_matches_f32_on_16_bit_values() {
    use redline_kernels::linear;
    let dev = gpu();
    for (dtype, tol) in [(DType::BF16, 2e-2), (DType::F16, 4e-3)] {
        for (batch, fan_in, fan_out, relu) in [
            (64, 784, 128, true),
            (64, 128, 10, false),
            (512, 784, 128, true),
            (3, 5, 7, true),
        ] {
            let var = |len: usize, s: f32, shape: &[usize]| var_of(len, s, shape, &dev);
            let x = var(batch * fan_in, 0.5, &[batch, fan_in]);
            let w = var(fan_out * fan_in, 1.5, &[fan_out, fan_in]);
            let b = var(fan_out, 2.5, &[fan_out]);
            let cast = |v: &Var| v.as_tensor().to_dtype(dtype).unwrap();
            let forward = || {
                linear(&cast(&x), &cast(&w), &cast(&b), relu)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
            };
            let round = |v: &Var| round_trip(v.as_tensor(), dtype);
            let reference = || {
                let y = linear(&round(&x), &round(&w), &round(&b), relu).unwrap();
                round_trip(&y, dtype)
            };
            let vars = [&x, &w, &b];
            let case = format!("{dtype:?} ({batch}, {fan_in}, {fan_out}, relu {relu})");
            let want = layer_run(false, &reference, vars);
            assert_close(&case, &layer_run(true, &forward, vars), &want, tol);
        }
    }
}

/// `n` values uniform in [-1, 1) from a 64-bit LCG: uncorrelated, so TF32's
/// rounding of the inputs shows in a product's sums.
fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `--matmul-precision`: `highest` (the default) keeps candle's cuBLAS
/// products and Redline's cuBLASLt linear layer in fp32; `high` lets both use
/// TF32. Measured against a float64 product on the CPU (numpy, same values:
/// fp32 4.0e-7, TF32 2.3e-4 of the largest output).
#[test]
fn cuda_matmul_precision_reaches_both_gemm_paths() {
    use redline_core::{matmul_precision, set_matmul_precision, MatmulPrecision};
    use redline_kernels::{fused_gpu, linear};
    let dev = gpu();
    let (m, k, n) = (128, 512, 256);
    let host = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
    let (x, w, b) = (
        host(uniform(m * k, 1), &[m, k]),
        host(uniform(n * k, 2), &[n, k]),
        host(uniform(n, 3), &[n]),
    );
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let want = f64s(&x)
        .matmul(&f64s(&w).t().unwrap())
        .unwrap()
        .broadcast_add(&f64s(&b))
        .unwrap();
    let err = |y: Tensor| rel_err_f64(&y, &want);
    let (xg, wg, bg) = (
        x.to_device(&dev).unwrap(),
        w.to_device(&dev).unwrap(),
        b.to_device(&dev).unwrap(),
    );
    let candle = || {
        fused_gpu::set_enabled(false);
        xg.matmul(&wg.t().unwrap())
            .unwrap()
            .broadcast_add(&bg)
            .unwrap()
    };
    let lt = || {
        fused_gpu::set_enabled(true);
        let y = linear(&xg, &wg, &bg, false).unwrap();
        fused_gpu::set_enabled(false);
        y
    };
    assert_eq!(matmul_precision(), MatmulPrecision::Highest, "the default");
    let paths: [(&str, &dyn Fn() -> Tensor); 2] = [("candle cuBLAS", &candle), ("cuBLASLt", &lt)];
    for (name, product) in paths {
        let exact = err(product());
        set_matmul_precision(MatmulPrecision::High);
        let tf32 = err(product());
        set_matmul_precision(MatmulPrecision::Highest);
        let again = err(product());
        eprintln!("{name}: fp32 {exact:.2e}, TF32 {tf32:.2e}, fp32 again {again:.2e}");
        assert!(
            exact < 5e-6 && again < 5e-6,
            "{name}: fp32 {exact:e}, {again:e}"
        );
        assert!((2e-5..1e-2).contains(&tf32), "{name}: TF32 {tf32:e}");
    }
}

/// bf16-true's multi-tensor Adam on the GPU against the CPU's bf16 loop
/// (PyTorch's bf16 rounding): the same bf16 parameters and gradients, 12
/// steps, AdamW; within one bf16 step (2^-8 relative) where the GPU's f64
/// `exp` gives a last-bit different constant, in at most one element in
/// 10,000 (the emulated kernel is bit for bit).
#[test]
fn cuda_bf16_multi_adam_matches_the_cpu_bf16_loop() {
    use redline_kernels::grad::GradRef;
    use redline_kernels::optim::{adam_step, SlotState};
    let dev = gpu();
    let sizes = sizes(true);
    let bf = |t: Tensor| t.affine(0.05, 0.0).unwrap().to_dtype(DType::BF16).unwrap();
    let p0: Vec<Tensor> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| bf(values(n, i as f32, &Device::Cpu)))
        .collect();
    let gpu_p: Vec<Var> = p0
        .iter()
        .map(|t| Var::from_tensor(&t.to_device(&dev).unwrap()).unwrap())
        .collect();
    let (m, v): (Vec<Var>, Vec<Var>) = gpu_p
        .iter()
        .map(|p| {
            let z = || Var::from_tensor(&p.as_tensor().zeros_like().unwrap()).unwrap();
            (z(), z())
        })
        .unzip();
    let cpu_p: Vec<Tensor> = p0.iter().map(|t| t.copy().unwrap()).collect();
    let mut slots = vec![SlotState::default(); sizes.len()];
    let mut h = DeviceHyper::new(&dev, 1e-2, 0).unwrap();
    for step in 1..=12u64 {
        let lr = if step <= 6 { 1e-2 } else { 3e-3 };
        let hp = adam_hp(step, lr, true);
        h.set_lr(lr).unwrap();
        h.advance().unwrap();
        let grads: Vec<Tensor> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| bf(values(n, (step * 7 + i as u64) as f32, &Device::Cpu)))
            .collect();
        let on_gpu: Vec<Tensor> = grads.iter().map(|g| g.to_device(&dev).unwrap()).collect();
        let items = adam_items(&gpu_p, &on_gpu, &m, &v);
        multi_adam(&items, &h, hp, None).unwrap();
        for i in 0..sizes.len() {
            assert!(adam_step(&cpu_p[i], GradRef::Tensor(&grads[i]), &mut slots[i], hp).unwrap());
        }
    }
    let (mut differ, mut total) = (0usize, 0usize);
    for i in 0..sizes.len() {
        let ours = gpu_p[i]
            .as_tensor()
            .to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let want = cpu_p[i].to_dtype(DType::F32).unwrap();
        let (worst, d) = compare(&ours, &want);
        assert!(worst <= 2f32.powi(-7), "tensor {i}: relative {worst:e}");
        differ += d;
        total += sizes[i];
    }
    eprintln!("bf16 adam: {differ} of {total} parameter elements differ from the CPU loop");
    assert!(differ * 10_000 <= total, "{differ} of {total} differ");
}

/// candle's kernel modules that a training step loads ship machine code (the
/// vendored candle-kernels' fatbins, `vendor/candle-kernels/REDLINE.md`), so
/// a first run does not JIT-compile their PTX. Needs no GPU: it reads the
/// bytes the build embedded.
#[test]
fn cuda_candle_kernels_ship_machine_code() {
    use candle_core::cuda_backend::kernels as k;
    let modules = [
        ("affine", k::AFFINE),
        ("binary", k::BINARY),
        ("cast", k::CAST),
        ("conv", k::CONV),
        ("fill", k::FILL),
        ("indexing", k::INDEXING),
        ("reduce", k::REDUCE),
        ("sort", k::SORT),
        ("ternary", k::TERNARY),
        ("unary", k::UNARY),
    ];
    for (name, m) in modules {
        let fatbin = m.fatbin();
        // A fatbin's header starts with its magic, 0xBA55ED50 little-endian.
        assert_eq!(
            fatbin.get(..4),
            Some(&[0x50, 0xED, 0x55, 0xBA][..]),
            "module {name}: no fatbin ({} bytes)",
            fatbin.len()
        );
        let elf = fatbin.windows(4).filter(|w| *w == b"\x7fELF").count();
        assert!(elf >= 1, "module {name}: its fatbin holds no machine code");
        assert!(m.ptx().contains(".target sm_"), "module {name}: PTX");
    }
    // quantized is left as PTX (Redline never loads it).
    assert!(k::QUANTIZED.fatbin().is_empty());
}

/// The device cursor's one-launch draw against candle's ops (what
/// `DeviceCursor::gather` runs): every batch of an epoch, f32 images with u32
/// classes and u8 images with i64 classes, bit for bit; a u8 class (not a
/// whole word per sample) is left to candle's ops.
#[test]
fn cuda_cursor_gather_matches_candles_ops() {
    use redline_kernels::cuda::cursor_gather;
    let dev = gpu();
    let (len, batch) = (1000usize, 64usize);
    let order: Vec<u32> = (0..len as u32)
        .map(|i| (i * 389 + 17) % len as u32)
        .collect();
    let perm = Tensor::from_slice(&order, len, &dev).unwrap();
    let images = values(len * 784, 0.7, &dev)
        .reshape((len, 1, 28, 28))
        .unwrap();
    let classes: Vec<u32> = (0..len as u32).map(|i| i % 10).collect();
    let cases = [
        (
            images.clone(),
            Tensor::from_slice(&classes, len, &dev).unwrap(),
        ),
        (
            images
                .affine(100.0, 120.0)
                .unwrap()
                .to_dtype(DType::U8)
                .unwrap(),
            Tensor::from_slice(&classes, len, &dev)
                .unwrap()
                .to_dtype(DType::I64)
                .unwrap(),
        ),
    ];
    for (x, y) in &cases {
        for n in 0..(len / batch) as u32 {
            let counter = Tensor::from_slice(&[n], 1, &dev).unwrap();
            let (gx, gy) = cursor_gather(&perm, &counter, batch, x, y)
                .unwrap()
                .expect("applies");
            let rows = perm.narrow(0, n as usize * batch, batch).unwrap();
            let (wx, wy) = (
                x.index_select(&rows, 0).unwrap(),
                y.index_select(&rows, 0).unwrap(),
            );
            assert_eq!(gx.dims(), wx.dims());
            assert_eq!(gx.dtype(), wx.dtype());
            let bits = |t: &Tensor| {
                t.flatten_all()
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap()
            };
            assert_eq!(bits(&gx), bits(&wx), "{:?} batch {n}: x", x.dtype());
            assert_eq!(bits(&gy), bits(&wy), "{:?} batch {n}: y", y.dtype());
        }
    }
    let counter = Tensor::from_slice(&[0u32], 1, &dev).unwrap();
    let y8 = cases[0].1.to_dtype(DType::U8).unwrap();
    assert!(cursor_gather(&perm, &counter, batch, &images, &y8)
        .unwrap()
        .is_none());
}

/// `REDLINE_CANDLE_PTX` (which makes candle-core load its kernels' PTX, to
/// time the JIT against the machine code) takes exactly `1`; any other value,
/// hostile ones included, leaves the machine code. Needs no GPU.
#[test]
fn cuda_candle_ptx_switch_takes_exactly_one() {
    use candle_core::cuda_backend::kernels::ptx_requested;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    assert!(ptx_requested(Some(OsStr::new("1"))));
    for v in ["", "0", "true", "yes", " 1", "1 ", "01", "11", "1\0"] {
        assert!(!ptx_requested(Some(OsStr::new(v))), "{v:?}");
    }
    assert!(!ptx_requested(Some(OsStr::from_bytes(b"\xff1"))));
    assert!(!ptx_requested(None));
}

/// Gradient clipping keeps NaNs on the GPU as PyTorch does there (and as
/// candle's CPU ops do): candle's CUDA clamp and minimum are `fmaxf`/`fminf`,
/// which return the other operand for a NaN. By value, a NaN stays NaN; by
/// norm, a NaN norm gives a NaN factor (every gradient NaN) and an infinite
/// one 0.
#[test]
fn cuda_clipping_keeps_nans() {
    use redline_kernels::grad::{norm_clip_coef, GradBuffer, GradRef};
    let dev = gpu();
    let coef = |norm: f32| {
        norm_clip_coef(&Tensor::new(norm, &dev).unwrap(), 1.0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    assert!(coef(f32::NAN).is_nan(), "a NaN norm's factor");
    assert_eq!(coef(f32::INFINITY), 0.0);
    assert_eq!(coef(0.5), 1.0);
    let buf = GradBuffer::new();
    let g = [f32::NAN, -5.0, 0.5, f32::INFINITY];
    buf.absorb(&Tensor::new(&g, &dev).unwrap()).unwrap();
    buf.clamp(1.0).unwrap();
    let got = buf
        .with(|g| match g {
            GradRef::Tensor(t) => t.to_vec1::<f32>().unwrap(),
            GradRef::Host(_) => panic!("a GPU gradient is held as a tensor"),
        })
        .unwrap();
    assert!(got[0].is_nan(), "clamp kept {:?}", got);
    assert_eq!(got[1..], [-1.0, 0.5, 1.0]);
}

/// candle's ReLU on the GPU keeps a NaN and passes its gradient, as PyTorch's
/// (the vendored candle-kernels' `relu_fwd` and candle-core's backward,
/// `vendor/candle-core/REDLINE.md`): `fmaxf(NaN, 0)` gave 0 in f32 and f64.
#[test]
fn cuda_relu_keeps_nan_as_pytorch() {
    let dev = gpu();
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let x = [f32::NAN, -1.0, 0.0, 2.0, f32::INFINITY, f32::NEG_INFINITY];
        let x = Var::from_tensor(&Tensor::new(&x, &dev).unwrap().to_dtype(dtype).unwrap()).unwrap();
        let y = x.as_tensor().relu().unwrap();
        let out = y.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        assert!(out[0].is_nan(), "{dtype:?}: relu(nan) = {}", out[0]);
        assert_eq!(out[1..], [0.0, 0.0, 2.0, f32::INFINITY, 0.0], "{dtype:?}");
        let grads = y
            .affine(3.0, 0.0)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let dx = grads.get(x.as_tensor()).unwrap();
        let dx = dx.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(dx, [3.0, 0.0, 0.0, 3.0, 3.0, 0.0], "{dtype:?}");
    }
}
