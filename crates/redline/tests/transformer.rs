//! A transformer written as a model file trains through the CLI: token ids
//! `(T,)` in a safetensors file, embeddings, positions, a pre-norm block of
//! causal self-attention and a tanh-GELU MLP, a linear head; the loss falls
//! and the test accuracy beats chance, in fp32 and bf16-mixed, with the
//! FLOPs counted from its layers and an MFU.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

/// 600 training and 200 test sequences of 8 ids in 0..10, labelled by the
/// first id modulo 3 (the head must carry position 0's token through).
fn write_ids(path: &Path) {
    let mut state = 12345u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % 10) as u32
    };
    let mut split = |n: usize| {
        let x: Vec<u32> = (0..n * 8).map(|_| next()).collect();
        let y: Vec<u32> = (0..n).map(|i| x[i * 8] % 3).collect();
        (
            Tensor::from_vec(x, (n, 8), &Device::Cpu).unwrap(),
            Tensor::from_vec(y, n, &Device::Cpu).unwrap(),
        )
    };
    let (x_train, y_train) = split(600);
    let (x_test, y_test) = split(200);
    let map: HashMap<String, Tensor> = [
        ("x_train", x_train),
        ("y_train", y_train),
        ("x_test", x_test),
        ("y_test", y_test),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    candle_core::safetensors::save(&map, path).unwrap();
}

#[test]
fn a_model_file_transformer_learns_with_attention_in_fp32_and_bf16() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("ids.safetensors");
    write_ids(&data);
    let model = common::root().join("examples/models/tiny-transformer.toml");
    for precision in ["32-true", "bf16-mixed"] {
        let run = t.path().join(precision);
        let out = common::train_in(
            &run,
            &[
                "--data",
                data.to_str().unwrap(),
                "--model",
                model.to_str().unwrap(),
                "--epochs",
                "8",
                "--batch-size",
                "32",
                "--lr",
                "3e-3",
                "--precision",
                precision,
                "--log-every",
                "5",
            ],
        );
        let losses = common::step_losses(&run);
        let (first, last) = (losses[0], *losses.last().unwrap());
        assert!(
            last < 0.6 * first,
            "{precision}: loss {first} -> {last}\n{out}"
        );
        let s = common::json(&run.join("summary.json"));
        let acc = s["test_accuracy"].as_f64().unwrap();
        assert!(
            acc > 0.6,
            "{precision}: test accuracy {acc} (chance 0.33)\n{out}"
        );
        let f = &s["flops"];
        assert!(f["train_per_sample"].as_u64().unwrap() > 0, "{s}");
        let mfu = f["mfu"].as_f64().unwrap();
        assert!(mfu > 0.0 && mfu < 1.0, "{precision}: MFU {mfu}");
    }
}
