//! The convolution kernels (implicit GEMM, tensor cores, cuDNN) and the CNN
//! block on `cuda:0`, against candle's ops: `cuda_kernels.rs`' `mod conv`, in
//! its own file.

use super::*;

/// The convolution tests' cases, `[n, cin, h, w, cout, kh, kw, pad]`:
/// ragged tiles, padding, a 5x3 and a 1x1 kernel, the zoo CNN's second layer,
/// its first at batch 64 (dW's reduction split 131 ways) and a tile past 64
/// channels.
const CONV_CASES: [[usize; 8]; 6] = [
    [2, 3, 7, 6, 4, 3, 3, 1],
    [3, 2, 9, 9, 5, 5, 3, 2],
    [2, 4, 5, 7, 3, 1, 1, 0],
    [16, 32, 14, 14, 64, 3, 3, 1],
    [64, 1, 28, 28, 32, 3, 3, 1],
    [4, 70, 9, 9, 65, 3, 3, 0],
];

/// The CNN block tests' cases, `[n, cin, hw, cout, k]` (3x3 kernels, padding
/// 1): planes that leave a row and a column outside the last window, the zoo
/// CNN's second block, a 3x3 window.
const BLOCK_CASES: [[usize; 5]; 3] = [[8, 3, 13, 5, 2], [4, 32, 14, 64, 2], [2, 2, 10, 3, 3]];

/// The convolution of `vars` (input, weight, bias) cast to `dtype`, with
/// padding `pad`, its output in f32.
fn conv_in(dtype: DType, vars: [&Var; 3], pad: usize) -> Tensor {
    let [x, w, b] = vars.map(|v| v.as_tensor().to_dtype(dtype).unwrap());
    redline_kernels::conv2d(&x, &w, &b, pad)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
}

/// The CNN block (padding 1, pooling `k`) of `vars` cast to `dtype`, its
/// output in f32.
fn block_in(dtype: DType, vars: [&Var; 3], k: usize) -> Tensor {
    let [x, w, b] = vars.map(|v| v.as_tensor().to_dtype(dtype).unwrap());
    redline_kernels::conv2d_pool_relu(&x, &w, &b, 1, k)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
}

/// A [`CONV_CASES`] case's name.
fn conv_case(dtype: DType, [n, cin, h, w, cout, kh, kw, pad]: [usize; 8]) -> String {
    format!("{dtype:?} x ({n}, {cin}, {h}, {w}), w ({cout}, {cin}, {kh}, {kw}), pad {pad}")
}

/// A convolution's input, weight and bias variables, `[n, cin, h, w, cout,
/// kh, kw]`, with the tests' values.
fn conv_vars([n, cin, h, w, cout, kh, kw]: [usize; 7], dev: &Device) -> [Var; 3] {
    [
        var_of(n * cin * h * w, 0.7, &[n, cin, h, w], dev),
        var_of(cout * cin * kh * kw, 1.9, &[cout, cin, kh, kw], dev),
        var_of(cout, 0.2, &[cout], dev),
    ]
}

/// The implicit-GEMM convolution (then candle's bias add) against candle's
/// im2col convolution: output, dx, dW and db, over kernel sizes 1, 3 and
/// 5x3, paddings 0 to 2, and batches whose weight gradient splits its
/// reduction 1, 9 and 131 ways (the zoo CNN's first layer at batch 64).
#[test]
fn cuda_implicit_gemm_conv_matches_the_generic_path() {
    use redline_kernels::conv2d;
    let dev = gpu();
    for [n, cin, h, w, cout, kh, kw, pad] in CONV_CASES {
        let [x, wt, b] = conv_vars([n, cin, h, w, cout, kh, kw], &dev);
        let forward = || conv2d(x.as_tensor(), wt.as_tensor(), b.as_tensor(), pad).unwrap();
        let case = format!("x ({n}, {cin}, {h}, {w}), w ({cout}, {cin}, {kh}, {kw}), pad {pad}");
        assert_layer_matches(&case, &forward, [&x, &wt, &b], 1e-5);
    }
}

/// `--matmul-precision high` reaches the fused convolution: its TF32
/// tensor-core kernels (`cuda/conv_mma.cu`) against a float64 convolution
/// of the same values, TF32's error in the forward and both gradients, and
/// the f32 kernels' before and after.
#[test]
fn cuda_matmul_precision_reaches_the_conv_kernels() {
    use redline_core::{set_matmul_precision, MatmulPrecision};
    use redline_kernels::{conv2d, fused_gpu};
    let dev = gpu();
    let (n, cin, hw, cout) = (16usize, 32usize, 14usize, 64usize);
    let host = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
    let x = host(uniform(n * cin * hw * hw, 4), &[n, cin, hw, hw]);
    let w = host(uniform(cout * cin * 9, 5), &[cout, cin, 3, 3]);
    let gy = host(uniform(n * cout * hw * hw, 7), &[n, cout, hw, hw]);
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    // Reference: float64 on the CPU (output, dx, dW).
    let (xv, wv) = (
        Var::from_tensor(&f64s(&x)).unwrap(),
        Var::from_tensor(&f64s(&w)).unwrap(),
    );
    let y64 = xv.as_tensor().conv2d(wv.as_tensor(), 1, 1, 1, 1).unwrap();
    let g64 = (&y64 * f64s(&gy))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let want = [
        y64.clone(),
        g64.get(xv.as_tensor()).unwrap().clone(),
        g64.get(wv.as_tensor()).unwrap().clone(),
    ];
    let run = || {
        let xg = Var::from_tensor(&x.to_device(&dev).unwrap()).unwrap();
        let wg = Var::from_tensor(&w.to_device(&dev).unwrap()).unwrap();
        let zero = Tensor::zeros(cout, DType::F32, &dev).unwrap();
        fused_gpu::set_enabled(true);
        fused_gpu::set_reduced_precision(true);
        let y = conv2d(xg.as_tensor(), wg.as_tensor(), &zero, 1).unwrap();
        let grads = (&y * gy.to_device(&dev).unwrap())
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        fused_gpu::set_enabled(false);
        fused_gpu::set_reduced_precision(false);
        let got = [
            y,
            grads.get(xg.as_tensor()).unwrap().clone(),
            grads.get(wg.as_tensor()).unwrap().clone(),
        ];
        got.iter()
            .zip(&want)
            .map(|(g, e)| rel_err_f64(g, e))
            .fold(0f64, f64::max)
    };
    let exact = run();
    set_matmul_precision(MatmulPrecision::High);
    let tf32 = run();
    set_matmul_precision(MatmulPrecision::Highest);
    let again = run();
    eprintln!("conv: fp32 {exact:.2e}, TF32 {tf32:.2e}, fp32 again {again:.2e}");
    assert!(exact < 5e-6 && again < 5e-6, "fp32 {exact:e}, {again:e}");
    assert!((2e-5..1e-2).contains(&tf32), "TF32 {tf32:e}");
}

/// The 16-bit convolution on tensor cores (`cuda/conv_mma.cu`, bf16 and
/// fp16 operands cast from f32 variables) against candle's 16-bit
/// convolution (im2col and cuBLAS): output and the gradients of input,
/// weight and bias (through the casts, in f32), each within about two steps
/// of the format of the largest value (both round their outputs once to the
/// format, from sums in different orders).
#[test]
fn cuda_16_bit_tensor_core_conv_matches_candles() {
    let dev = gpu();
    for (dtype, tol) in [(DType::BF16, 2e-2), (DType::F16, 4e-3)] {
        for dims in CONV_CASES {
            let [x, wt, b] = conv_vars(dims[..7].try_into().unwrap(), &dev);
            let forward = || conv_in(dtype, [&x, &wt, &b], dims[7]);
            assert_layer_matches(&conv_case(dtype, dims), &forward, [&x, &wt, &b], tol);
        }
    }
}

/// `--gpu-conv cudnn`: the convolution's three passes through cuDNN against
/// Redline's kernels, in fp32 (full fp32 math on both, so only the order of
/// the sums differs) and on tensor cores in bf16 and fp16, for the plain
/// convolution and the CNN block. Fails with cuDNN's load error where it is
/// missing.
#[test]
fn cuda_cudnn_conv_matches_redlines_kernels() {
    use redline_kernels::fused_gpu;
    let dev = gpu();
    let version = redline_kernels::cuda::cudnn::version().unwrap_or_else(|e| panic!("{e}"));
    println!("cuDNN {version}");
    let with_cudnn = |on: bool, forward: &dyn Fn() -> Tensor, vars: [&Var; 3]| {
        fused_gpu::set_conv_cudnn(on);
        let out = layer_run(true, forward, vars);
        fused_gpu::set_conv_cudnn(false);
        out
    };
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2), (DType::F16, 4e-3)] {
        for dims in CONV_CASES {
            let [x, wt, b] = conv_vars(dims[..7].try_into().unwrap(), &dev);
            let forward = || conv_in(dtype, [&x, &wt, &b], dims[7]);
            let vars = [&x, &wt, &b];
            let ours = with_cudnn(false, &forward, vars);
            assert_close(
                &conv_case(dtype, dims),
                &with_cudnn(true, &forward, vars),
                &ours,
                tol,
            );
        }
        for [n, cin, hw, cout, k] in BLOCK_CASES {
            let [x, w, b] = conv_vars([n, cin, hw, hw, cout, 3, 3], &dev);
            let forward = || block_in(dtype, [&x, &w, &b], k);
            let case = format!("{dtype:?} block ({n}, {cin}, {hw}, {cout}, k {k})");
            let vars = [&x, &w, &b];
            let ours = with_cudnn(false, &forward, vars);
            // In 16 bits a block's output rounds one step apart now and then
            // and a near-tied window sends its gradient elsewhere (the 16-bit
            // block test's note): the output and the weight and bias
            // gradients (sums) are compared; dx only in fp32.
            let theirs = with_cudnn(true, &forward, vars);
            if dtype == DType::F32 {
                assert_close(&case, &theirs, &ours, tol);
            } else {
                for i in [0, 2, 3] {
                    let scale = max_abs(&ours[i]).max(1e-6);
                    let d = max_abs(&(&theirs[i] - &ours[i]).unwrap());
                    assert!(
                        d <= 4.0 * tol * scale,
                        "{case}: [{i}] differs by {d:e} of {scale:e}"
                    );
                }
            }
        }
    }
}

/// The CNN block (implicit-GEMM conv, then one bias + max pool + ReLU kernel) against
/// candle's conv, broadcast_add, max_pool2d and relu: output and the
/// gradients of input, weight and bias, with planes that leave a row and a
/// column outside the last window (floor mode).
#[test]
fn cuda_conv_pool_relu_block_matches_the_generic_path() {
    use redline_kernels::conv2d_pool_relu;
    let dev = gpu();
    for [n, cin, hw, cout, k] in BLOCK_CASES {
        let [x, w, b] = conv_vars([n, cin, hw, hw, cout, 3, 3], &dev);
        let forward =
            || conv2d_pool_relu(x.as_tensor(), w.as_tensor(), b.as_tensor(), 1, k).unwrap();
        let case = format!("({n}, {cin}, {hw}, {cout}, k {k})");
        assert_layer_matches(&case, &forward, [&x, &w, &b], 1e-5);
    }
}

/// The 16-bit CNN block (tensor-core convolution, then the 16-bit bias +
/// max pool + ReLU kernel) against the same tensor-core convolution followed
/// by candle's f32 add, Redline's generic first-maximum pool and ReLU
/// (PyTorch's gradient, in the vendored candle-core) on the 16-bit values,
/// rounded to the format where the block's outputs are: output and
/// gradients within about two steps of the format. The output also against
/// candle's 16-bit ops throughout.
///
/// candle-core 0.11.1's `relu` passed the gradient where its input is
/// exactly 0, and a 16-bit sum rounds to exactly 0 now and then (6
/// pooled maxima of 12,544 in the bf16 (4, 32, 14, 64) case: dx 1.1 of 7.5
/// off on an H200, `bench/results/h200-2026-11-26-2`); the vendored one does
/// not. Not candle's 16-bit convolution for the gradients: its sums in another order round an output
/// one step apart now and then, which can turn a near tie in a pooling
/// window.
#[test]
fn cuda_16_bit_conv_pool_relu_block_matches_the_same_convolution_then_candles_ops() {
    use redline_kernels::{conv2d, fused_gpu, max_pool2d_generic};
    let dev = gpu();
    for (dtype, tol) in [(DType::BF16, 2e-2), (DType::F16, 4e-3)] {
        for [n, cin, hw, cout, k] in BLOCK_CASES {
            let [x, w, b] = conv_vars([n, cin, hw, hw, cout, 3, 3], &dev);
            let forward = || block_in(dtype, [&x, &w, &b], k);
            let cast = |v: &Var| v.as_tensor().to_dtype(dtype).unwrap();
            let reference = || {
                // The tensor-core convolution (a zero bias adds nothing),
                // then the rest with the fused kernels off.
                fused_gpu::set_enabled(true);
                fused_gpu::set_reduced_precision(true);
                let zero = Tensor::zeros(cout, dtype, &dev).unwrap();
                let conv = conv2d(&cast(&x), &cast(&w), &zero, 1).unwrap();
                fused_gpu::set_enabled(false);
                fused_gpu::set_reduced_precision(false);
                let bias = round_trip(b.as_tensor(), dtype)
                    .reshape((1, cout, 1, 1))
                    .unwrap();
                let z = conv
                    .to_dtype(DType::F32)
                    .unwrap()
                    .broadcast_add(&bias)
                    .unwrap();
                let pooled = max_pool2d_generic(&round_trip(&z, dtype), k).unwrap();
                round_trip(&pooled.relu().unwrap(), dtype)
            };
            let vars = [&x, &w, &b];
            let case = format!("{dtype:?} ({n}, {cin}, {hw}, {cout}, k {k})");
            let ours = layer_run(true, &forward, vars);
            assert_close(&case, &ours, &layer_run(false, &reference, vars), tol);
            let candles = layer_run(false, &forward, vars);
            let scale = max_abs(&candles[0]);
            let d = max_abs(&(&ours[0] - &candles[0]).unwrap());
            assert!(
                d <= tol * scale,
                "{case}: y differs from candle's 16-bit ops by {d:e} of {scale:e}"
            );
        }
    }
}

/// cuDNN's algorithms for the zoo CNN's two convolutions (batches 64 and
/// 512, fp32 in full fp32 math, as the defaults run them), each pass run and
/// timed by `cudnnFind*Algorithm`: one `cudnn-times` line per pass with the
/// algorithm a step runs (the heuristics' first deterministic one) beside the
/// fastest deterministic one and the fastest of all, for choosing by
/// measurement later. Checks that the algorithm a step runs is one cuDNN ran
/// here, deterministic and within the workspace bound.
#[test]
fn cuda_cudnn_algorithm_times_for_the_cnns_convolutions() {
    use redline_kernels::conv_igemm::ConvDims;
    use redline_kernels::cuda::cudnn::{algorithm_times, MAX_WORKSPACE};
    use redline_kernels::cudnn_ffi::DETERMINISTIC;
    let dev = gpu();
    let Device::Cuda(cuda) = &dev else {
        panic!("cuda:0 is not a CUDA device")
    };
    for n in [64, 512] {
        for (name, x, w) in [
            ("conv1", [n, 1, 28, 28], [32, 1, 3, 3]),
            ("conv2", [n, 32, 14, 14], [64, 32, 3, 3]),
        ] {
            let d = ConvDims::new(&x, &w, 1).unwrap();
            let times =
                algorithm_times(cuda, d, DType::F32, false).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(times.len(), 3, "three passes");
            for t in times {
                let ran: Vec<_> = t.measured.iter().filter(|p| p.status == 0).collect();
                let ms = |p: Option<&&redline_kernels::cudnn_ffi::AlgoPerf>| {
                    p.map_or("-".to_string(), |p| {
                        format!("algo {} {:.4} ms", p.algo, p.time)
                    })
                };
                let chosen = ran.iter().find(|p| p.algo == t.chosen);
                let det = ran.iter().find(|p| p.determinism == DETERMINISTIC);
                println!(
                    "cudnn-times {name} b{n} {}: runs {} | fastest deterministic {} | fastest {} | all {:?}",
                    t.pass,
                    ms(chosen),
                    ms(det),
                    ms(ran.first()),
                    ran.iter().map(|p| (p.algo, p.time, p.determinism, p.memory)).collect::<Vec<_>>()
                );
                let chosen = chosen.unwrap_or_else(|| {
                    panic!("{name} b{n} {}: algorithm {} did not run", t.pass, t.chosen)
                });
                assert_eq!(chosen.determinism, DETERMINISTIC, "{name} b{n} {}", t.pass);
                assert!(chosen.memory <= MAX_WORKSPACE, "{name} b{n} {}", t.pass);
            }
        }
    }
}
