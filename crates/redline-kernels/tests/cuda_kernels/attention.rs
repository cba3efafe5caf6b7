//! Causal attention on `cuda:0` (Redline's kernels, `cuda/attention.cu`;
//! candle's ops for heads over 64 wide) against the CPU's fused kernel,
//! forward and backward, in fp32 and bf16, with dropout; and
//! `cuda_attention_timing` (ignored: a benchmark, run by
//! `bench/attention.py --kernels BIN`), which prints one JSON line of
//! median milliseconds per shape.

use candle_core::{DType, Device, Tensor, Var};
use redline_kernels::attention::{causal_attention_dropout, generic, DropDraw};
use redline_kernels::causal_attention;

fn inputs(dev: &Device, dtype: DType) -> [Var; 3] {
    shaped(dev, dtype, (2, 3, 70, 16))
}

fn shaped(dev: &Device, dtype: DType, shape: (usize, usize, usize, usize)) -> [Var; 3] {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let mk = |s: f64| {
        let t = Tensor::arange(0f32, n as f32, &Device::Cpu)
            .unwrap()
            .affine(0.37, s)
            .unwrap()
            .sin()
            .unwrap()
            .reshape(shape)
            .unwrap();
        Var::from_tensor(&t.to_dtype(dtype).unwrap().to_device(dev).unwrap()).unwrap()
    };
    [mk(0.1), mk(0.2), mk(0.3)]
}

fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (
        a.to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap(),
        b.to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap(),
    );
    let d = (&a - &b)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let n = b
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    (d / n.max(1e-30)).sqrt()
}

#[test]
fn cuda_attention_matches_the_cpu_kernel_forward_and_backward() {
    let gpu = super::gpu();
    for (dtype, tol) in [(DType::F32, 1e-5f32), (DType::BF16, 2e-2)] {
        let (c, g) = (inputs(&Device::Cpu, dtype), inputs(&gpu, dtype));
        let oc = causal_attention(&c[0], &c[1], &c[2]).unwrap();
        let og = causal_attention(&g[0], &g[1], &g[2]).unwrap();
        assert_eq!(og.dtype(), dtype);
        let e = rel(&og, &oc);
        assert!(e < tol, "{dtype:?} output: {e}");
        let gc = oc
            .to_dtype(DType::F32)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gg = og
            .to_dtype(DType::F32)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for i in 0..3 {
            let e = rel(gg.get(&g[i]).unwrap(), gc.get(&c[i]).unwrap());
            assert!(e < tol * 10.0, "{dtype:?} gradient {i}: {e}");
        }
        println!("cuda attention {dtype:?}: output within {e:.2e} of the CPU kernel");
    }
}

/// Output and gradients (of the output times a fixed gradient) of
/// attention on `dev`, widened to f32 on the CPU.
fn grads_on(
    dev: &Device,
    dtype: DType,
    shape: (usize, usize, usize, usize),
    drop: Option<DropDraw>,
) -> Vec<Tensor> {
    let x = shaped(dev, dtype, shape);
    let o = causal_attention_dropout(&x[0], &x[1], &x[2], drop).unwrap();
    assert_eq!(o.dtype(), dtype);
    let n = o.elem_count();
    let go = Tensor::arange(0f32, n as f32, dev)
        .unwrap()
        .affine(0.61, 0.4)
        .unwrap()
        .cos()
        .unwrap()
        .reshape(o.shape())
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let g = (o.to_dtype(DType::F32).unwrap() * go.to_dtype(DType::F32).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let cpu = |t: &Tensor| {
        t.to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap()
    };
    let mut out = vec![cpu(&o)];
    out.extend(x.iter().map(|v| cpu(g.get(v).unwrap())));
    out
}

/// The kernels' dropout mask is the CPU kernel's (one hash of the seed and
/// the position); heads of 64 over several blocks; a second run gives the
/// same bits (the backward sums in a fixed order); heads over 64 wide take
/// candle's ops and still agree.
#[test]
fn cuda_attention_dropout_wide_heads_and_repeatable_bits() {
    let gpu = super::gpu();
    let drop = Some(DropDraw { p: 0.2, seed: 42 });
    for (shape, drop) in [
        ((2, 2, 150, 64), drop),
        ((1, 2, 300, 64), None),
        ((1, 2, 90, 80), None),
    ] {
        let c = grads_on(&Device::Cpu, DType::F32, shape, drop);
        let g = grads_on(&gpu, DType::F32, shape, drop);
        for (i, (a, b)) in g.iter().zip(&c).enumerate() {
            let e = rel(a, b);
            assert!(
                e < 1e-5,
                "{shape:?} {drop:?}: output/gradient {i} off the CPU by {e}"
            );
        }
        let again = grads_on(&gpu, DType::F32, shape, drop);
        for (i, (a, b)) in g.iter().zip(&again).enumerate() {
            let (a, b) = (
                a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{shape:?}: output/gradient {i} differs between two runs"
            );
        }
    }
}

/// 16-bit heads of 64 and 32 take the tensor-core forward
/// (`cuda/attention_mma.cu`): output and gradients within the formats'
/// rounding of the CPU's fp32 kernel on the same rounded inputs.
#[test]
fn cuda_tensor_core_forward_agrees_with_the_cpu() {
    let gpu = super::gpu();
    for (dtype, shape, tol) in [
        (DType::BF16, (2, 2, 200, 64), 1e-2f32),
        (DType::F16, (1, 2, 100, 32), 2e-3),
    ] {
        let c = grads_on(&Device::Cpu, dtype, shape, None);
        let g = grads_on(&gpu, dtype, shape, None);
        for (i, (a, b)) in g.iter().zip(&c).enumerate() {
            let e = rel(a, b);
            println!("cuda attention {dtype:?} {shape:?}: output/gradient {i} within {e:.2e}");
            assert!(
                e < tol,
                "{dtype:?} {shape:?}: output/gradient {i} off the CPU by {e}"
            );
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Not a test: median milliseconds of the forward and of the forward plus
/// backward on `cuda:0`, Redline's kernels and candle's ops (the score
/// matrix held), at GPT-2's and shakespeare-char's shapes in bf16 and
/// fp32, one JSON line each, for `bench/attention.py --kernels BIN`.
#[test]
#[ignore]
fn cuda_attention_timing() {
    let gpu = super::gpu();
    let sync = || gpu.synchronize().unwrap();
    for (b, h, t, d) in [(8usize, 12usize, 1024usize, 64usize), (16, 6, 256, 64)] {
        for dtype in [DType::BF16, DType::F32] {
            let x = shaped(&gpu, dtype, (b, h, t, d));
            for path in ["redline", "candle-ops"] {
                let run = |backward: bool| {
                    let o = match path {
                        "redline" => causal_attention(&x[0], &x[1], &x[2]).unwrap(),
                        _ => generic(&x[0], &x[1], &x[2]).unwrap(),
                    };
                    if backward {
                        let g = o.to_dtype(DType::F32).unwrap().sum_all().unwrap();
                        g.backward().unwrap();
                    }
                };
                let time = |backward: bool| {
                    let mut v = Vec::new();
                    for i in 0..12 {
                        sync();
                        let t0 = std::time::Instant::now();
                        run(backward);
                        sync();
                        if i >= 2 {
                            v.push(t0.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                    median(v)
                };
                let (fwd, both) = (time(false), time(true));
                println!(
                    "{{\"shape\": [{b}, {h}, {t}, {d}], \"dtype\": \"{dtype:?}\", \"path\": \"{path}\", \"forward_ms\": {fwd:.3}, \"fwd_bwd_ms\": {both:.3}}}"
                );
            }
        }
    }
}
