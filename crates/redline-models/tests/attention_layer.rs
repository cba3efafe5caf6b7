//! The layer set's `attention` against nanoGPT's `CausalSelfAttention`
//! (PyTorch, float64; `tools/reference/make_golden_attention.py` documents
//! the formula every value is set by, repeated here): the output and the
//! gradients of the input and of `c_attn` and `c_proj`, to 1e-5.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};
use redline_models::init::Initializer;
use redline_models::{Model, SequentialConfig};

fn f(shape: &[usize], a: f64, b: f64, func: fn(f64) -> f64, scale: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| (scale * func(a * i as f64 + b)) as f32)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap();
    let n = b.sqr().unwrap().sum_all().unwrap();
    (d.to_scalar::<f32>().unwrap() / n.to_scalar::<f32>().unwrap()).sqrt()
}

#[test]
fn attention_layer_matches_nanogpts_causal_self_attention() {
    let golden_path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/golden/attention.safetensors");
    let g = candle_core::safetensors::load(&golden_path, &Device::Cpu).unwrap();
    let text = r#"[model]
layers = [{ type = "attention", heads = 3, name = "attn" }]"#;
    let cfg = SequentialConfig::from_toml(text, "attn", &[7, 12], 12).unwrap();
    let dev = redline_core::Device::cpu();
    let mut init = Initializer::new(0, &dev, redline_core::Precision::Fp32);
    let model = cfg.build(&mut init).unwrap();
    let c = 12;
    let weights: HashMap<String, Tensor> = [
        (
            "attn.c_attn.weight",
            f(&[3 * c, c], 0.11, 0.7, f64::sin, 0.3),
        ),
        ("attn.c_attn.bias", f(&[3 * c], 0.17, 0.0, f64::cos, 0.1)),
        ("attn.c_proj.weight", f(&[c, c], 0.13, 0.2, f64::cos, 0.3)),
        ("attn.c_proj.bias", f(&[c], 0.19, 0.3, f64::sin, 0.1)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    model
        .params()
        .assign(&weights, Path::new("formula"))
        .unwrap();
    let x = Var::from_tensor(&f(&[2, 7, c], 0.23, 0.5, f64::sin, 1.0)).unwrap();
    let y = model.forward_t(&x, true).unwrap();
    let e = rel(&y, &g["layer.y"]);
    assert!(e < 1e-5, "output: relative error {e}");
    let go = f(&[2, 7, c], 0.41, 0.6, f64::sin, 1.0);
    let mut grads = (y * go).unwrap().sum_all().unwrap().backward().unwrap();
    let e = rel(grads.get(&x).unwrap(), &g["layer.dx"]);
    assert!(e < 1e-5, "dx: relative error {e}");
    for name in [
        "c_attn.weight",
        "c_attn.bias",
        "c_proj.weight",
        "c_proj.bias",
    ] {
        // The fused linear writes its weight gradients into the parameter's
        // own buffer; anything left in candle's store joins them there.
        let p = model.params().param(&format!("attn.{name}")).unwrap();
        p.absorb(&mut grads).unwrap();
        let got = p
            .grad()
            .to_tensor(p.as_tensor())
            .unwrap()
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let e = rel(&got, &g[&format!("layer.{name}")]);
        assert!(e < 1e-5, "{name}: relative error {e}");
    }
}
