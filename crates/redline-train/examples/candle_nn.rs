//! A model written with candle-nn (`VarMap` + `VarBuilder` + `Module`), trained
//! by Redline's trainer without rewriting it: only a `Model` impl that calls the
//! module and registers the `VarMap`'s variables under their names.
//!
//! The model is a small CNN, built exactly as a candle-nn user builds it, on
//! any image data Redline reads (`redline_data::prepare` detects the format):
//! Fashion-MNIST by default, or a CIFAR-10 binary folder (the test makes a
//! small one), with the input channels, size and classes taken from the data. Its gradients come through candle's `GradStore`, which
//! `Params::backward` moves into each parameter's gradient buffer. Clipping,
//! accumulation and the gradient norm therefore see them as they see the zoo's.
//!
//! ```text
//! cargo run --release -p redline-train --example candle_nn -- [DATA_DIR] [EPOCHS] [SAMPLES]
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Module, Tensor};
use candle_nn::{conv2d, linear, Conv2d, Conv2dConfig, Linear, VarBuilder, VarMap};
use redline_core::Device;
use redline_data::{prepare, DataOptions, Dataset, Loader, LoaderConfig, Split};
use redline_models::{Model, Params};
use redline_train::{Classifier, GradClip, TrainConfig, Trainer};

/// The user's candle-nn network, unchanged from how candle-nn code writes it.
pub struct Net {
    conv1: Conv2d,
    conv2: Conv2d,
    fc: Linear,
}

impl Net {
    /// Builds the layers through a `VarBuilder` (names `conv1.weight`, ...)
    /// for `channels` x `side` x `side` images and `classes` outputs.
    pub fn new(
        vb: VarBuilder,
        channels: usize,
        side: usize,
        classes: usize,
    ) -> candle_core::Result<Self> {
        let pad = Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        let pooled = side / 4;
        Ok(Self {
            conv1: conv2d(channels, 8, 3, pad, vb.pp("conv1"))?,
            conv2: conv2d(8, 16, 3, pad, vb.pp("conv2"))?,
            fc: linear(16 * pooled * pooled, classes, vb.pp("fc"))?,
        })
    }
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        // (B, C, S, S) -> (B, 8, S/2, S/2) -> (B, 16, S/4, S/4) -> (B, classes)
        let h = self.conv1.forward(x)?.relu()?.max_pool2d(2)?;
        let h = self.conv2.forward(&h)?.relu()?.max_pool2d(2)?;
        self.fc.forward(&h.flatten_from(1)?)
    }
}

/// The bridge: a candle-nn module and its `VarMap`, as a Redline `Model`.
pub struct CandleNn<M> {
    module: M,
    params: Params,
}

impl<M: Module + Send + Sync> CandleNn<M> {
    /// Registers every variable of `varmap`, in name order, for the optimizer
    /// and for `--save`-style safetensors files.
    pub fn new(module: M, varmap: &VarMap) -> redline_models::Result<Self> {
        let mut vars: Vec<(String, candle_core::Var)> = varmap
            .data()
            .lock()
            .map_err(|_| redline_models::Error::Config("the VarMap lock is poisoned".into()))?
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let mut params = Params::new();
        for (name, var) in vars {
            params.push(name, var)?;
        }
        Ok(Self { module, params })
    }
}

impl<M: Module + Send + Sync> Model for CandleNn<M> {
    fn forward_t(&self, x: &Tensor, _train: bool) -> redline_models::Result<Tensor> {
        Ok(self.module.forward(x)?)
    }

    fn params(&self) -> &Params {
        &self.params
    }
}

/// Trains the candle-nn CNN for `epochs` on the first `samples` training
/// images of `data` (any image format Redline detects) and returns the test
/// accuracy.
pub fn run(data: &Path, epochs: usize, samples: usize) -> anyhow::Result<f64> {
    let dev = Device::cpu();
    let found = prepare(data, &DataOptions::default())?;
    let [channels, side, width] = found.train.input_dims()[..] else {
        anyhow::bail!("{}: not images (C x H x W)", data.display());
    };
    anyhow::ensure!(side == width, "square images expected, got {side}x{width}");
    let classes = found.train.target().classes().unwrap_or(0);
    let test = found
        .test
        .clone()
        .context("the data has no test split")?
        .into_host()?;
    println!(
        "{}: {} {channels}x{side}x{side}, {classes} classes",
        data.display(),
        found.format
    );

    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, dev.candle());
    let model = CandleNn::new(Net::new(vb, channels, side, classes)?, &varmap)?;

    // The first `samples` training images (a streamed folder decodes only those).
    let train = Split::from_host(&found.train.head(samples)?, dev.candle())?;
    let train = Loader::new(train, LoaderConfig::default())?;
    let test_cfg = LoaderConfig {
        shuffle: false,
        batch_size: 1000,
        ..Default::default()
    };
    let test = Loader::new(Split::from_host(&test, dev.candle())?, test_cfg)?;
    let mut trainer = Trainer::builder()
        .config(TrainConfig {
            epochs,
            validate: false,
            log_grad_norm: true,
            ..TrainConfig::default()
        })
        .clip(Some(GradClip::Norm { max_norm: 5.0 }))
        .build(Classifier::new(model), dev)?;
    trainer.fit(&train, None)?;
    let result = trainer.test(&test)?;
    let acc = result.metrics.get("accuracy").unwrap_or(f64::NAN);
    println!("candle-nn CNN: test accuracy {:.2}%", 100.0 * acc);
    Ok(acc)
}

#[allow(dead_code)] // the test that includes this file calls `run`
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
    let data = args.get(1).map_or(default, PathBuf::from);
    let epochs = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let samples = args.get(3).map_or(Ok(60_000), |s| s.parse())?;
    run(&data, epochs, samples)?;
    Ok(())
}
