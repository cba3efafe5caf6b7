//! The zoo's GPT against nanoGPT's model structure in PyTorch, float64
//! (`tools/reference/make_golden_gpt.py`, which documents the formula every
//! weight, id and target is set by, repeated here): the logits, the mean
//! next-token cross-entropy and every parameter's gradient, the tied
//! embedding's included, to 1e-5.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use redline_models::init::Initializer;
use redline_models::{Gpt, GptConfig, Model};

fn fold(name: &str) -> u64 {
    name.bytes()
        .fold(0u64, |v, b| (31 * v + u64::from(b)) % 1_000_003)
}

fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap();
    let n = b.sqr().unwrap().sum_all().unwrap();
    (d.to_scalar::<f32>().unwrap() / n.to_scalar::<f32>().unwrap().max(1e-30)).sqrt()
}

fn tiny() -> GptConfig {
    GptConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 16,
        block_size: 8,
        vocab_size: 11,
        dropout: 0.0,
        bias: true,
    }
}

#[test]
fn gpt_matches_nanogpts_structure_logits_loss_and_gradients() {
    let g = candle_core::safetensors::load(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/gpt.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let dev = redline_core::Device::cpu();
    let mut init = Initializer::new(0, &dev, redline_core::Precision::Fp32);
    let model = Gpt::new(&tiny(), &mut init).unwrap();
    let weights: HashMap<String, Tensor> = model
        .params()
        .state()
        .map(|(name, var)| {
            let t = var.as_tensor();
            let n = t.elem_count();
            let scale_shift = |b: f64| {
                if name.ends_with(".bias") {
                    0.05 * b
                } else if t.rank() == 1 {
                    1.0 + 0.1 * b
                } else {
                    0.1 * b
                }
            };
            let v: Vec<f32> = (0..n)
                .map(|i| scale_shift((0.7 * i as f64 + 0.001 * fold(name) as f64).sin()) as f32)
                .collect();
            (
                name.to_string(),
                Tensor::from_vec(v, t.shape(), &Device::Cpu).unwrap(),
            )
        })
        .collect();
    model
        .params()
        .assign(&weights, Path::new("formula"))
        .unwrap();
    let idx: Vec<f32> = (0..16).map(|i| ((3 * i + 1) % 11) as f32).collect();
    let targets: Vec<u32> = (0..16).map(|i| (5 * i + 2) % 11).collect();
    let idx = Tensor::from_vec(idx, (2, 8), &Device::Cpu).unwrap();
    let logits = model.forward_t(&idx, true).unwrap();
    assert_eq!(logits.dims(), &[2, 8, 11]);
    let e = rel(&logits, &g["logits"]);
    assert!(e < 1e-5, "logits: relative error {e}");
    let targets = Tensor::from_vec(targets, 16, &Device::Cpu).unwrap();
    let loss =
        redline_kernels::cross_entropy(&logits.reshape((16, 11)).unwrap(), &targets).unwrap();
    let want = g["loss"].to_vec1::<f32>().unwrap()[0];
    let got = loss
        .to_dtype(DType::F32)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(
        (got - want).abs() < 1e-5 * want.abs(),
        "loss {got} against {want}"
    );
    let mut grads = loss.backward().unwrap();
    for (name, p) in model.params().iter_params() {
        p.absorb(&mut grads).unwrap();
        let got = p.grad().to_tensor(p.as_tensor()).unwrap().unwrap();
        let e = rel(&got, &g[&format!("grad.{name}")]);
        assert!(e < 1e-5, "{name}: relative error {e}");
    }
}

#[test]
fn gpt_configs_are_checked_and_sequences_past_the_block_refused() {
    let mut bad = tiny();
    bad.n_head = 3;
    let e = bad.check().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("n_embd must divide by n_head"), "{e}");
    let dev = redline_core::Device::cpu();
    let mut init = Initializer::new(0, &dev, redline_core::Precision::Fp32);
    let model = Gpt::new(&tiny(), &mut init).unwrap();
    let long = Tensor::zeros((1, 9), DType::F32, &Device::Cpu).unwrap();
    let e = model
        .forward_t(&long, false)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("longer than block_size 8"), "{e}");
    assert_eq!(model.params().len(), 2 + 2 * 12 + 2);
}
