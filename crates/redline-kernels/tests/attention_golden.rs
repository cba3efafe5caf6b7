//! The fused causal attention against PyTorch's
//! `F.scaled_dot_product_attention(is_causal=True)`, forward and backward,
//! across sequence lengths, heads and head widths, computed in float64
//! (`tools/reference/make_golden_attention.py`, which documents the inputs'
//! formula, repeated here), and the bf16 path against PyTorch's bf16 run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor, Var};
use redline_kernels::causal_attention;

fn golden() -> HashMap<String, Tensor> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/golden/attention.safetensors");
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

/// `f(a i + b)` in f64, rounded to f32, shaped.
fn formula(shape: (usize, usize, usize, usize), a: f64, b: f64, f: fn(f64) -> f64) -> Tensor {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let v: Vec<f32> = (0..n).map(|i| f(a * i as f64 + b) as f32).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// Relative L2 distance.
fn rel(a: &Tensor, b: &Tensor) -> f32 {
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

const SHAPES: [(usize, usize, usize, usize); 4] =
    [(1, 1, 1, 4), (2, 3, 17, 8), (1, 2, 64, 16), (1, 1, 130, 24)];

fn inputs(shape: (usize, usize, usize, usize)) -> [Tensor; 4] {
    [
        formula(shape, 0.37, 0.1, f64::sin),
        formula(shape, 0.53, 0.2, f64::sin),
        formula(shape, 0.29, 0.3, f64::cos),
        formula(shape, 0.61, 0.4, f64::sin),
    ]
}

#[test]
fn attention_matches_pytorch_sdpa_forward_and_backward() {
    let g = golden();
    for shape in SHAPES {
        let name = format!("b{}h{}t{}d{}", shape.0, shape.1, shape.2, shape.3);
        let [q, k, v, go] = inputs(shape);
        let (q, k, v) = (
            Var::from_tensor(&q).unwrap(),
            Var::from_tensor(&k).unwrap(),
            Var::from_tensor(&v).unwrap(),
        );
        let o = causal_attention(&q, &k, &v).unwrap();
        let e = rel(&o, &g[&format!("{name}.o")]);
        assert!(e < 1e-5, "{name} output: relative error {e}");
        let grads = (o * &go).unwrap().sum_all().unwrap().backward().unwrap();
        for (x, key) in [(&q, "dq"), (&k, "dk"), (&v, "dv")] {
            let e = rel(grads.get(x).unwrap(), &g[&format!("{name}.{key}")]);
            assert!(e < 1e-5, "{name} {key}: relative error {e}");
        }
    }
}

#[test]
fn bf16_attention_is_as_close_to_float64_as_pytorchs_own_bf16() {
    let g = golden();
    let shape = SHAPES[3];
    let [q, k, v, _] = inputs(shape);
    let b = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
    let o = causal_attention(&b(&q), &b(&k), &b(&v)).unwrap();
    assert_eq!(o.dtype(), DType::BF16);
    let o = o.to_dtype(DType::F32).unwrap();
    // Against PyTorch's bf16 run: both round the output to bf16 (and
    // PyTorch its math too); Redline's softmax is fp32 throughout.
    let torch_err = g["bf16.err"].to_vec1::<f32>().unwrap()[0];
    let e = rel(&o, &g["bf16.o"]);
    assert!(
        e < 3.0 * torch_err.max(1e-3),
        "bf16 output {e} off PyTorch's bf16 (its own error {torch_err})"
    );
}
