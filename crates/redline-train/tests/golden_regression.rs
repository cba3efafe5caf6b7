//! Regression numerics against PyTorch: golden files made by
//! `tools/reference/make_golden_regression.py` (torch CPU, fp32). A residual
//! MLP from a model file (`reg_model.toml`: Linear, GELU, a residual block
//! with LayerNorm and dropout off, LayerNorm, Linear) on
//! `data/tables/diabetes.csv` read and standardised by Redline's own CSV
//! path, trained with MSE: one forward and backward, then 8 Adam steps.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use common::{
    check_losses, flat, golden, load, max_rel, rel_l2, root, steps_config, trace, Losses,
};
use redline_core::{Device, Precision};
use redline_data::{prepare, DataOptions, Loader, LoaderConfig, Split, Task};
use redline_models::{Model, ModelConfig};
use redline_train::{loss::mse, OptimizerConfig, RegressionLoss, Regressor, Trainer};

const BATCH: usize = 32;

/// Every row, in file order, features standardised with every row's statistics.
fn loader() -> Loader {
    let opts = DataOptions {
        task: Task::Regression,
        val_split: Some(0.0),
        ..DataOptions::default()
    };
    let data = prepare(&root().join("data/tables/diabetes.csv"), &opts).unwrap();
    assert!(data.val.is_none() && data.test.is_none());
    let split = Split::from_host(
        &data.train.clone().into_host().unwrap(),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let cfg = LoaderConfig {
        batch_size: BATCH,
        shuffle: false,
        seed: 0,
        prefetch: 0,
        drop_last: false,
    };
    Loader::new(split, cfg).unwrap()
}

fn config() -> ModelConfig {
    let file = golden("reg_model.toml");
    ModelConfig::for_data(file.to_str().unwrap(), &[10], 1, None).unwrap()
}

fn model() -> Box<dyn Model> {
    let m = config().build(&Device::cpu(), Precision::Fp32, 0).unwrap();
    m.params()
        .load_safetensors(&golden("reg_init.safetensors"))
        .unwrap();
    m
}

#[test]
fn regression_forward_and_gradients_match_pytorch() {
    let m = model();
    let want = load("reg_first_batch.safetensors");
    let batch = loader().epoch(0).next().unwrap().unwrap();
    let pred = m.forward_t(&batch.x, true).unwrap();
    let r = max_rel(&pred, &want["pred"]);
    assert!(r < 1e-5, "predictions rel {r:e}");
    let y = batch.y.reshape(pred.dims()).unwrap();
    let loss = mse(&pred, &y).unwrap();
    let (l, wl) = (loss.to_scalar::<f32>().unwrap(), flat(&want["loss"])[0]);
    assert!(((l - wl) / wl).abs() < 1e-5, "loss {l} vs {wl}");
    m.params().backward(&loss).unwrap();
    let mut checked = 0;
    for (name, _) in m.params().iter() {
        let g = m.params().grad(name).unwrap().unwrap();
        // Held to the float64 gradients, and no further off than PyTorch's fp32.
        let exact = &want[&format!("grad64.{name}")];
        let (ours, theirs) = (
            max_rel(&g, exact),
            max_rel(&want[&format!("grad.{name}")], exact),
        );
        assert!(
            ours < 1e-5 || ours < 4.0 * theirs,
            "{name}: ours {ours:.2e}, PyTorch fp32 {theirs:.2e} from float64"
        );
        checked += 1;
    }
    assert_eq!(
        checked, 10,
        "3 linears and 2 layer norms, weight and bias each"
    );
}

#[test]
fn regression_adam_matches_pytorch() {
    let trace = trace("reg_trace.json");
    assert_eq!(trace["batch_size"].as_u64(), Some(BATCH as u64));
    let steps = trace["steps"].as_u64().unwrap() as usize;
    let lr = trace["lr"].as_f64().unwrap();
    let losses = Arc::new(Mutex::new(Vec::new()));
    let cfg = steps_config(steps);
    let mut trainer = Trainer::builder()
        .config(cfg)
        .optimizer(OptimizerConfig::by_name("adam", lr).unwrap())
        .callback(Box::new(Losses(losses.clone(), Arc::default())))
        .build(Regressor::new(model(), RegressionLoss::Mse), Device::cpu())
        .unwrap();
    trainer.fit(&loader(), None).unwrap();
    check_losses(&losses.lock().unwrap(), &trace, 1e-5);
    let (init, want) = (load("reg_init.safetensors"), load("reg_final.safetensors"));
    let got = trainer.params().to_map();
    assert_eq!(got.len(), want.len());
    for (name, theirs) in &want {
        let ours = (&got[name] - &init[name]).unwrap();
        let theirs = (theirs - &init[name]).unwrap();
        let r = rel_l2(&ours, &theirs);
        assert!(r < 1e-4, "{name}: update rel L2 {r:e}");
    }
}
