//! The fused CPU convolution (each of its paths: per-sample and whole-batch
//! GEMMs, 1x1 without im2col, strided through column phases, the stem,
//! patches, grouped and depthwise), the fused training batch norm (alone and with its ReLU) and
//! the windowed max pool against PyTorch, forward and backward, computed in
//! float64 (`tools/reference/make_golden_conv.py`, which documents the
//! inputs' formula, repeated here), to 1e-5 or three times torch's own
//! float32 error, whichever is larger (a bias gradient's sum cancels).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor, Var};
use redline_kernels::batch_norm::batch_norm2d_train;
use redline_kernels::grad::Param;
use redline_kernels::{avg_pool2d, conv2d_grouped_param, max_pool2d_window, AvgWindow};

fn golden() -> HashMap<String, Tensor> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/golden/conv_classes.safetensors");
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

/// `shift + scale * f(a i + b)` in f64, rounded to f32, shaped.
fn formula(
    dims: &[usize],
    (a, b): (f64, f64),
    f: fn(f64) -> f64,
    (scale, shift): (f64, f64),
) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| (shift + scale * f(a * i as f64 + b)) as f32)
        .collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

/// Relative L2 distance.
fn rel(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let d = (a - b)
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

fn check(g: &HashMap<String, Tensor>, key: &str, got: &Tensor) {
    let e = rel(got, &g[key]);
    let torch32 = g[&format!("err32.{key}")].to_vec1::<f32>().unwrap()[0];
    let bound = (3.0 * torch32).max(1e-5);
    assert!(
        e < bound,
        "{key}: relative error {e} against PyTorch's float64 (bound {bound}: torch's float32 is {torch32} off)"
    );
}

/// (name, [batch, cin, h, w, cout, kernel, stride, padding, groups]).
const CONVS: [(&str, [usize; 9]); 11] = [
    ("k3s1p1", [2, 3, 10, 9, 4, 3, 1, 1, 1]),
    ("k3s1p1_small", [3, 4, 5, 5, 6, 3, 1, 1, 1]),
    ("k1s1", [2, 5, 9, 8, 3, 1, 1, 0, 1]),
    ("k1s2", [2, 4, 9, 9, 6, 1, 2, 0, 1]),
    ("k3s2p1", [2, 3, 17, 16, 5, 3, 2, 1, 1]),
    ("k7s2p3", [2, 3, 23, 22, 4, 7, 2, 3, 1]),
    ("k8s8", [2, 3, 32, 32, 4, 8, 8, 0, 1]),
    ("k3s1p1_wino", [2, 64, 7, 6, 64, 3, 1, 1, 1]),
    ("g2", [2, 4, 9, 8, 6, 3, 1, 1, 2]),
    ("dw", [2, 6, 10, 9, 6, 3, 1, 1, 6]),
    ("dw2_s2", [2, 4, 11, 11, 8, 3, 2, 1, 4]),
];

#[test]
fn convolutions_of_every_shape_class_match_pytorch() {
    let g = golden();
    for (name, [b, cin, h, w, cout, k, s, p, groups]) in CONVS {
        let x =
            Var::from_tensor(&formula(&[b, cin, h, w], (0.37, 0.1), f64::sin, (1.0, 0.0))).unwrap();
        let wt = Param::new(
            Var::from_tensor(&formula(
                &[cout, cin / groups, k, k],
                (0.53, 0.2),
                f64::sin,
                (0.3, 0.0),
            ))
            .unwrap(),
        );
        let bias = Param::new(
            Var::from_tensor(&formula(&[cout], (0.29, 0.3), f64::cos, (0.1, 0.0))).unwrap(),
        );
        let y = conv2d_grouped_param(x.as_tensor(), &wt, &bias, p, s, groups).unwrap();
        check(&g, &format!("{name}.y"), &y);
        let go = formula(y.dims(), (0.61, 0.4), f64::sin, (1.0, 0.0));
        let mut grads = (y * go).unwrap().sum_all().unwrap().backward().unwrap();
        check(&g, &format!("{name}.dx"), grads.get(x.as_tensor()).unwrap());
        for (param, key) in [(&wt, "dw"), (&bias, "db")] {
            param.absorb(&mut grads).unwrap();
            let got = param.grad().to_tensor(param.as_tensor()).unwrap().unwrap();
            check(&g, &format!("{name}.{key}"), &got);
        }
    }
}

#[test]
fn training_batch_norm_alone_and_with_its_relu_matches_pytorch() {
    let g = golden();
    let dims = [3, 4, 5, 6];
    for (name, relu) in [("bn", false), ("bn_relu", true)] {
        let x = Var::from_tensor(&formula(&dims, (0.37, 0.1), f64::sin, (1.0, 0.0))).unwrap();
        let wt = Param::new(
            Var::from_tensor(&formula(&[4], (0.53, 0.2), f64::sin, (0.1, 0.5))).unwrap(),
        );
        let bias = Param::new(
            Var::from_tensor(&formula(&[4], (0.29, 0.3), f64::cos, (0.1, 0.0))).unwrap(),
        );
        let out = batch_norm2d_train(x.as_tensor(), &wt, &bias, 1e-5, relu).unwrap();
        check(&g, &format!("{name}.y"), &out.y);
        let go = formula(&dims, (0.61, 0.4), f64::sin, (1.0, 0.0));
        let grads = (&out.y * go)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        check(&g, &format!("{name}.dx"), grads.get(x.as_tensor()).unwrap());
        for (param, key) in [(&wt, "dw"), (&bias, "db")] {
            let got = param.grad().to_tensor(param.as_tensor()).unwrap().unwrap();
            check(&g, &format!("{name}.{key}"), &got);
        }
    }
}

#[test]
fn resnets_stem_pool_matches_pytorch() {
    let g = golden();
    let x = Var::from_tensor(&formula(&[2, 3, 11, 10], (0.37, 0.1), f64::sin, (1.0, 0.0))).unwrap();
    let y = max_pool2d_window(x.as_tensor(), 3, 2, 1).unwrap();
    check(&g, "pool.y", &y);
    let go = formula(y.dims(), (0.61, 0.4), f64::sin, (1.0, 0.0));
    let grads = (y * go).unwrap().sum_all().unwrap().backward().unwrap();
    check(&g, "pool.dx", grads.get(x.as_tensor()).unwrap());
}

/// `F.avg_pool2d` with stride, padding and both divisor rules, through the
/// fused CPU kernel and through candle's ops (a bf16 round trip of an f32
/// input would change its values, so the generic path is reached by
/// running the same pool in f64, which the fused kernel does not take).
#[test]
fn average_pools_match_pytorch() {
    let g = golden();
    for (name, k, s, p, inc) in [
        ("avg3s2p1", 3, 2, 1, true),
        ("avg3s2p1_ex", 3, 2, 1, false),
        ("avg3s1p1_ex", 3, 1, 1, false),
        ("avg2s2", 2, 2, 0, true),
        ("avg5s3p2_ex", 5, 3, 2, false),
    ] {
        let win = AvgWindow {
            kernel: k,
            stride: s,
            padding: p,
            count_include_pad: inc,
        };
        for dtype in [DType::F32, DType::F64] {
            let x32 = formula(&[2, 3, 11, 10], (0.37, 0.1), f64::sin, (1.0, 0.0));
            let x = Var::from_tensor(&x32.to_dtype(dtype).unwrap()).unwrap();
            let y = avg_pool2d(x.as_tensor(), win).unwrap();
            check(&g, &format!("{name}.y"), &y.to_dtype(DType::F32).unwrap());
            let go = formula(y.dims(), (0.61, 0.4), f64::sin, (1.0, 0.0));
            let go = go.to_dtype(dtype).unwrap();
            let grads = (y * go).unwrap().sum_all().unwrap().backward().unwrap();
            let dx = grads
                .get(x.as_tensor())
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            check(&g, &format!("{name}.dx"), &dx);
        }
    }
}
