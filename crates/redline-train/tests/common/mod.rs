//! Helpers the golden tests share: where the golden files are, reading them,
//! and the error measures the checks use.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::{Device as CDevice, Tensor};
use redline_train::{Callback, Event, TrainConfig};

pub fn root() -> PathBuf {
    // A test binary carried to another machine (bench/gpu.sh) is told where the repository is.
    std::env::var_os("REDLINE_REPO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

pub fn golden(name: &str) -> PathBuf {
    root().join("testdata/golden").join(name)
}

pub fn load(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(golden(name), &CDevice::Cpu).unwrap()
}

pub fn trace(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(golden(name)).unwrap()).unwrap()
}

pub fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// max |a-b| / max(|b|_inf, tiny)
pub fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (flat(a), flat(b));
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max) as f64
        / scale as f64
}

/// ||a-b||_2 / ||b||_2
pub fn rel_l2(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (flat(a), flat(b));
    let num: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

pub fn check_losses(got: &[f64], trace: &serde_json::Value, rel_tol: f64) {
    check_series(got, trace, "losses", rel_tol);
}

pub fn check_series(got: &[f64], trace: &serde_json::Value, key: &str, rel_tol: f64) {
    let want: Vec<f64> = trace[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let rel = (g - w).abs() / w.abs();
        assert!(
            rel < rel_tol,
            "{key} at step {}: ours {g}, PyTorch {w}, rel {rel:e}",
            i + 1
        );
    }
}

/// Collects every logged loss, and every logged gradient norm into the second list.
pub struct Losses(pub Arc<Mutex<Vec<f64>>>, pub Arc<Mutex<Vec<f64>>>);

impl Callback for Losses {
    fn name(&self) -> &str {
        "losses"
    }
    fn on_event(&mut self, e: &Event<'_>) -> Result<(), String> {
        if let Event::Log(s) = e {
            self.0.lock().unwrap().push(s.loss);
            if let Some(g) = s.grad_norm {
                self.1.lock().unwrap().push(g);
            }
        }
        Ok(())
    }
}

/// The references' loop: `steps` optimizer steps in one pass, a log point
/// each, no validation.
pub fn steps_config(steps: usize) -> TrainConfig {
    TrainConfig {
        epochs: 1,
        max_steps: Some(steps),
        log_every: 1,
        validate: false,
        ..TrainConfig::default()
    }
}
