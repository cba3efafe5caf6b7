//! A model, a dataset and a loss of your own, in one file: nothing in
//! `crates/` changes.
//!
//! - **The dataset** (`Waves`) makes its samples on demand: input (a, b) in
//!   [-1, 1]^2, target sin(3a)·cos(2b). It implements `redline_data::Dataset`,
//!   so the loader shuffles it, gathers batches on its prefetch thread and
//!   stages them, as it does for the shipped formats.
//! - **The model** (`Tanh3`) is three linear layers with tanh, written in plain
//!   candle ops over parameters registered in a `Params` (names as PyTorch's
//!   `state_dict()`: `l1.weight`, `l1.bias`, ...).
//! - **The loss** (`Huber`) is PyTorch's `F.huber_loss(pred, y, delta=0.1)`,
//!   with the mean absolute error as a metric, in a `TrainStep`.
//!
//! ```text
//! cargo run --release -p redline-train --example own_model_data_loss -- [EPOCHS] [SAMPLES]
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Tensor;
use redline_core::{Device, Precision};
use redline_data::{Batch, Dataset, Loader, LoaderConfig, TargetKind, TargetsMut};
use redline_models::init::Initializer;
use redline_models::{Model, Params};
use redline_train::step::output;
use redline_train::{Metric, OptimizerConfig, StepOutput, TrainStep, Trainer};

/// Samples `first..first + len` of an endless, seeded stream of (a, b) -> sin(3a)·cos(2b).
pub struct Waves {
    first: u64,
    len: usize,
    source: PathBuf,
}

impl Waves {
    /// `len` samples starting at sample `first` (disjoint ranges make disjoint splits).
    pub fn new(first: u64, len: usize) -> Self {
        Self {
            first,
            len,
            source: PathBuf::from(format!("waves[{first}..{}]", first + len as u64)),
        }
    }

    /// A value in [-1, 1) from sample `i`, coordinate `k` (SplitMix64).
    fn coord(i: u64, k: u64) -> f32 {
        let mut z = (i * 2 + k).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

impl Dataset for Waves {
    fn len(&self) -> usize {
        self.len
    }
    fn input_dims(&self) -> &[usize] {
        &[2]
    }
    fn target(&self) -> TargetKind {
        TargetKind::Values(1)
    }
    fn gather(&self, idx: &[u32], x: &mut [f32], y: TargetsMut<'_>) -> redline_data::Result<()> {
        let TargetsMut::Values(y) = y else {
            return Err(redline_data::Error::Config(
                "Waves has float targets".into(),
            ));
        };
        for (k, &i) in idx.iter().enumerate() {
            let n = self.first + u64::from(i);
            let (a, b) = (Self::coord(n, 0), Self::coord(n, 1));
            x[2 * k] = a;
            x[2 * k + 1] = b;
            y[k] = (3.0 * a).sin() * (2.0 * b).cos();
        }
        Ok(())
    }
    fn source(&self) -> &Path {
        &self.source
    }
}

/// 2 -> width -> width -> 1 with tanh, in plain candle ops.
pub struct Tanh3 {
    layers: Vec<(Tensor, Tensor)>,
    params: Params,
}

impl Tanh3 {
    /// PyTorch's `nn.Linear` initialisation from `seed`.
    pub fn new(width: usize, device: &Device, seed: u64) -> redline_models::Result<Self> {
        let mut init = Initializer::new(seed, device, Precision::Fp32);
        let mut params = Params::new();
        let mut layers = Vec::new();
        for (i, (fan_in, fan_out)) in [(2, width), (width, width), (width, 1)]
            .into_iter()
            .enumerate()
        {
            let bound = 1.0 / (fan_in as f32).sqrt();
            let w = init.uniform(&[fan_out, fan_in], bound)?;
            let b = init.uniform(&[fan_out], bound)?;
            let w = params.push(format!("l{}.weight", i + 1), w)?;
            let b = params.push(format!("l{}.bias", i + 1), b)?;
            layers.push((w.as_tensor().clone(), b.as_tensor().clone()));
        }
        Ok(Self { layers, params })
    }
}

impl Model for Tanh3 {
    fn forward_t(&self, x: &Tensor, _train: bool) -> redline_models::Result<Tensor> {
        let mut h = x.clone();
        for (i, (w, b)) in self.layers.iter().enumerate() {
            h = h.matmul(&w.t()?)?.broadcast_add(b)?;
            if i + 1 < self.layers.len() {
                h = h.tanh()?;
            }
        }
        Ok(h)
    }
    fn params(&self) -> &Params {
        &self.params
    }
}

/// Huber loss (PyTorch's `F.huber_loss`, mean over the batch), with `mae`.
pub struct Huber<M> {
    model: M,
    delta: f64,
}

impl<M: Model> Huber<M> {
    /// The step around `model`, quadratic below `delta` and linear above.
    pub fn new(model: M, delta: f64) -> Self {
        Self { model, delta }
    }

    fn outputs(&self, pred: &Tensor, batch: &Batch) -> redline_train::Result<StepOutput> {
        let b = batch.size();
        let y = batch.y.reshape(pred.shape())?;
        let abs = (pred - &y)?.abs()?;
        // 0.5·r² where r < delta, delta·(r - 0.5·delta) elsewhere.
        let small = abs.lt(self.delta)?;
        let quad = (abs.sqr()? * 0.5)?;
        let lin = ((&abs - 0.5 * self.delta)? * self.delta)?;
        let loss = small.where_cond(&quad, &lin)?.mean_all()?;
        let mae = abs.detach().sum_all()?;
        Ok(StepOutput {
            loss,
            samples: b,
            metrics: vec![Metric::mean("mae", mae, b as f64)],
        })
    }
}

impl<M: Model> TrainStep for Huber<M> {
    fn params(&self) -> &Params {
        self.model.params()
    }
    fn training_step(&self, batch: &Batch) -> redline_train::Result<StepOutput> {
        self.outputs(&output(&self.model, batch, true)?, batch)
    }
    fn validation_step(&self, batch: &Batch) -> redline_train::Result<StepOutput> {
        self.outputs(&output(&self.model, batch, false)?, batch)
    }
}

/// Trains on `samples` samples for `epochs` and returns the validation mean
/// absolute error before and after.
pub fn run(epochs: usize, samples: usize) -> anyhow::Result<(f64, f64)> {
    let dev = Device::cpu();
    let loader = |data: Waves, shuffle| {
        let cfg = LoaderConfig {
            batch_size: 64,
            shuffle,
            ..LoaderConfig::default()
        };
        Loader::from_dataset(Arc::new(data), dev.candle(), cfg)
    };
    let train = loader(Waves::new(0, samples), true)?;
    let val = loader(Waves::new(1 << 40, samples / 4), false)?;

    let step = Huber::new(Tanh3::new(64, &dev, 0)?, 0.1);
    let mut trainer = Trainer::builder()
        .epochs(epochs)
        .optimizer(OptimizerConfig::by_name("adam", 3e-3)?)
        .build(step, dev)?;
    let before = trainer
        .validate(&val)?
        .metrics
        .get("mae")
        .unwrap_or(f64::NAN);
    trainer.fit(&train, Some(&val))?;
    let after = trainer
        .validate(&val)?
        .metrics
        .get("mae")
        .unwrap_or(f64::NAN);
    println!("validation mean absolute error: {before:.4} before, {after:.4} after");
    Ok((before, after))
}

#[allow(dead_code)] // the test includes this file for `run`
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let epochs = args.get(1).map_or(Ok(20), |s| s.parse())?;
    let samples = args.get(2).map_or(Ok(20_000), |s| s.parse())?;
    run(epochs, samples)?;
    Ok(())
}
