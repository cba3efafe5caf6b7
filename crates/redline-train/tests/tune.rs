//! The learning-rate range test against Lightning's own (`Tuner.lr_find`,
//! golden file made by `tools/reference/make_golden_lr_finder.py`): the same
//! rate at every step, the same smoothed losses from the same raw losses,
//! the same stop and the same suggestion; and a real range test through the
//! trainer logs exactly those rates.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use candle_core::Tensor;
use redline_core::{Device, Precision};
use redline_data::{Loader, LoaderConfig, Split, TargetKind};
use redline_models::ModelConfig;
use redline_train::tune::{suggestion, LrRangeTest, Smoother};
use redline_train::{Classifier, OptimizerConfig, TrainStep};
use serde_json::Value;

fn cases() -> Vec<Value> {
    let text = std::fs::read_to_string(common::golden("lr_finder.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap_or(f64::NAN))
        .collect()
}

fn test_of(case: &Value) -> LrRangeTest {
    LrRangeTest {
        min_lr: case["min_lr"].as_f64().unwrap(),
        max_lr: case["max_lr"].as_f64().unwrap(),
        steps: case["num_training"].as_u64().unwrap() as usize,
        ..LrRangeTest::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

#[test]
fn rates_smoothing_stop_and_suggestion_are_lightnings() {
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let t = test_of(&case);
        let want_lr = floats(&case["lr"]);
        let sched = t.schedule();
        for (i, want) in want_lr.iter().enumerate() {
            let got = sched.lr(0.123, i, 0, 1000, 1);
            assert!(close(got, *want), "{name} step {i}: {got} vs {want}");
        }
        let raw = floats(&case["raw_loss"]);
        let want = floats(&case["smoothed_loss"]);
        let mut s = Smoother::new(t.beta, t.stop_factor);
        let mut smoothed = Vec::new();
        for (i, l) in raw.iter().enumerate() {
            let (v, stop) = s.push(i + 1, *l);
            smoothed.push(v);
            if stop {
                break;
            }
        }
        assert_eq!(smoothed.len(), want.len(), "{name}: where it stopped");
        for (i, (a, b)) in smoothed.iter().zip(&want).enumerate() {
            assert!(close(*a, *b), "{name} step {i}: {a} vs {b}");
        }
        let got = suggestion(&want_lr, &smoothed, 10, 1);
        assert_eq!(
            got.map(|i| i as u64),
            case["suggestion_index"].as_u64(),
            "{name}"
        );
    }
}

#[test]
fn a_range_test_through_the_trainer_logs_the_scheduled_rates_and_stops_on_divergence() {
    let cpu = candle_core::Device::Cpu;
    let n = 512;
    let x = Tensor::randn(0f32, 1.0, (n, 8), &cpu).unwrap();
    let y: Vec<u32> = x
        .narrow(1, 0, 1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| u32::from(*v > 0.0))
        .collect();
    let split = Split {
        x,
        y: Tensor::from_vec(y, n, &cpu).unwrap(),
        target: TargetKind::Classes(2),
        source: "synthetic".into(),
    };
    let train = Loader::new(
        split,
        LoaderConfig {
            batch_size: 16,
            ..LoaderConfig::default()
        },
    )
    .unwrap();
    let dev = Device::cpu();
    let make = || -> redline_train::Result<Box<dyn TrainStep>> {
        let m =
            ModelConfig::for_data("mlp", &[8], 2, Some(&[16]))?.build(&dev, Precision::Fp32, 0)?;
        Ok(Box::new(Classifier::new(m)))
    };
    let sgd = OptimizerConfig::by_name("sgd", 1.0).unwrap();
    // Case 1's rates, 100 steps over 32-batch epochs.
    let case = &cases()[0];
    let t = test_of(case);
    let curve = t.run(&make, &dev, &train, &sgd).unwrap();
    let want_lr = floats(&case["lr"]);
    assert!(!curve.lr.is_empty());
    for (i, (a, b)) in curve.lr.iter().zip(&want_lr).enumerate() {
        assert!(close(*a, *b), "step {i}: logged {a}, Lightning {b}");
    }
    assert_eq!(curve.lr.len(), curve.smoothed.len());
    // Up to a rate of 1e6, SGD blows up: the test ends before its steps, and says why.
    let wild = LrRangeTest { max_lr: 1e6, ..t };
    let curve = wild.run(&make, &dev, &train, &sgd).unwrap();
    assert!(curve.lr.len() < 100, "{}", curve.lr.len());
    assert!(curve.stopped.is_some());
}
