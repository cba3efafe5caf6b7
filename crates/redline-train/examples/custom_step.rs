//! A training step of your own, with a metric and a callback of your own,
//! in one file: nothing in `crates/` changes.
//!
//! The step is a classifier with label smoothing (PyTorch's
//! `F.cross_entropy(logits, y, label_smoothing=0.1)`) that reports two metrics:
//! `accuracy` and `confidence`, the mean probability the model gives its top
//! class (near accuracy when it is calibrated). Both stay on the device as
//! sums; the trainer reads them at epoch ends. The callback remembers the
//! epoch with the best validation loss and says so when the fit ends.
//!
//! ```text
//! cargo run --release -p redline-train --example custom_step -- [DATA_DIR] [EPOCHS] [SAMPLES]
//! ```

use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor, D};
use redline_core::{Device, Precision};
use redline_data::{Batch, Loader, LoaderConfig, Normalize, Split, SplitKind};
use redline_models::{Model, ModelConfig, Params};
use redline_train::step::output;
use redline_train::{Callback, Event, Metric, StepOutput, TrainStep, Trainer};

/// The user's step: a model and a smoothing factor.
pub struct SmoothedClassifier {
    model: Box<dyn Model>,
    smoothing: f64,
}

impl SmoothedClassifier {
    /// The step around `model` with smoothing `e` (0 = plain cross-entropy).
    #[allow(dead_code)] // used by the test that includes this file
    pub fn for_test(model: Box<dyn Model>, smoothing: f64) -> Self {
        Self { model, smoothing }
    }

    fn outputs(&self, logits: &Tensor, batch: &Batch) -> redline_train::Result<StepOutput> {
        let (b, _classes) = logits.dims2()?;
        // log-softmax: (B, C)
        let max = logits.max_keepdim(D::Minus1)?;
        let shifted = logits.broadcast_sub(&max)?;
        let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
        let log_p = shifted.broadcast_sub(&log_sum)?;
        // Smoothed targets: (1 - e) on the class, e / C spread over all classes.
        let picked = log_p
            .gather(&batch.y.unsqueeze(1)?, 1)?
            .squeeze(1)?
            .mean_all()?;
        let uniform = log_p.mean_all()?;
        let e = self.smoothing;
        let loss = (picked.affine(-(1.0 - e), 0.0)? - uniform.affine(e, 0.0)?)?;

        let probs = log_p.detach().exp()?;
        let confidence = probs.max(D::Minus1)?.sum_all()?;
        let correct = logits
            .detach()
            .argmax(D::Minus1)?
            .eq(&batch.y)?
            .to_dtype(DType::F32)?
            .sum_all()?;
        Ok(StepOutput {
            loss,
            samples: b,
            metrics: vec![
                Metric::mean("accuracy", correct, b as f64),
                Metric::mean("confidence", confidence, b as f64),
            ],
        })
    }
}

impl TrainStep for SmoothedClassifier {
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

/// The user's callback: the epoch with the lowest validation loss.
#[derive(Default)]
pub struct BestEpoch {
    /// (epoch, validation loss) of the best epoch so far.
    pub best: Option<(usize, f64)>,
    /// Confidence minus accuracy on validation, per epoch (calibration gap).
    pub gaps: Vec<f64>,
}

impl Callback for BestEpoch {
    fn name(&self) -> &str {
        "best epoch"
    }
    fn on_event(&mut self, event: &Event<'_>) -> Result<(), String> {
        match event {
            Event::EpochEnd(e) => {
                let Some(val) = &e.val else { return Ok(()) };
                if self.best.is_none_or(|(_, l)| val.loss < l) {
                    self.best = Some((e.epoch, val.loss));
                }
                if let (Some(c), Some(a)) =
                    (val.metrics.get("confidence"), val.metrics.get("accuracy"))
                {
                    self.gaps.push(c - a);
                }
            }
            Event::FitEnd(_) => {
                if let Some((epoch, loss)) = self.best {
                    println!("best validation loss {loss:.4} after epoch {epoch}");
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The first `n` samples of a split (the whole split when it has fewer).
fn head(split: Split, n: usize) -> anyhow::Result<Split> {
    let n = n.min(split.len());
    Ok(Split {
        x: split.x.narrow(0, 0, n)?,
        y: split.y.narrow(0, 0, n)?,
        ..split
    })
}

/// Trains the step on `samples` training images of the MNIST-format folder
/// `data` and returns the test pass's metrics as `(name, value)`.
pub fn run(data: &Path, epochs: usize, samples: usize) -> anyhow::Result<Vec<(String, f64)>> {
    let dev = Device::cpu();
    let load = |kind| Split::load(data, kind, 10, Normalize::default(), dev.candle());
    let loader = |split, shuffle| {
        Loader::new(
            split,
            LoaderConfig {
                shuffle,
                ..LoaderConfig::default()
            },
        )
    };
    let train = loader(head(load(SplitKind::Train)?, samples)?, true)?;
    let test = loader(head(load(SplitKind::Test)?, samples / 4)?, false)?;

    let model = ModelConfig::by_name("mlp")?.build(&dev, Precision::Fp32, 0)?;
    let step = SmoothedClassifier {
        model,
        smoothing: 0.1,
    };
    let best = std::sync::Arc::new(std::sync::Mutex::new(BestEpoch::default()));
    let mut trainer = Trainer::builder()
        .epochs(epochs)
        .callback(Box::new(Shared(best.clone())))
        .build(step, dev)?;
    trainer.fit(&train, Some(&test))?;
    let result = trainer.test(&test)?;
    let gaps = best.lock().map(|b| b.gaps.clone()).unwrap_or_default();
    println!(
        "test: loss {:.4}, {}; calibration gap per epoch {gaps:.3?}",
        result.loss,
        result
            .metrics
            .iter()
            .map(|(n, v)| format!("{n} {v:.4}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(result.metrics.0)
}

/// Lets the caller read a callback after the trainer took it.
struct Shared(std::sync::Arc<std::sync::Mutex<BestEpoch>>);

impl Callback for Shared {
    fn name(&self) -> &str {
        "best epoch"
    }
    fn on_event(&mut self, event: &Event<'_>) -> Result<(), String> {
        self.0.lock().map_err(|e| e.to_string())?.on_event(event)
    }
}

#[allow(dead_code)] // the test includes this file for `run`
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let data = args.get(1).map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../data/fashion-mnist"
            ))
        },
        PathBuf::from,
    );
    let epochs = args.get(2).map_or(Ok(3), |s| s.parse())?;
    let samples = args.get(3).map_or(Ok(60_000), |s| s.parse())?;
    run(&data, epochs, samples)?;
    Ok(())
}
