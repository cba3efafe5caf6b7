//! A training step of your own, with a run folder, checkpoints and resume,
//! through the library alone (no CLI): what `redline train` and
//! `redline train --resume` do, in one file.
//!
//! The step is a classifier trained on the Brier score (the squared distance
//! between the softmax and the one-hot target), with accuracy as its metric,
//! on a synthetic two-class table. The run folder gets `metrics.jsonl`,
//! `summary.json`, checkpoints every 20 steps and, at the end, the final
//! weights in `final.safetensors`. Killed at any point (even `kill -9`) and
//! started again with `--resume`, it ends with the same weights, bit for bit.
//!
//! ```text
//! cargo run -p redline-run --example resumable -- RUN_DIR STEPS [--resume]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor, D};
use redline_core::{Device, Precision};
use redline_data::{Batch, Loader, LoaderConfig, Split, TargetKind};
use redline_models::{MlpConfig, Model, ModelConfig, Params};
use redline_run::{Ending, Run};
use redline_train::checkpoint::CheckpointConfig;
use redline_train::step::output;
use redline_train::{
    Callback, Event, Metric, OptimizerConfig, StepOutput, TrainConfig, TrainStep, Trainer,
};

/// The user's step: a model trained on the Brier score.
struct BrierClassifier {
    model: Box<dyn Model>,
}

impl BrierClassifier {
    fn outputs(&self, logits: &Tensor, batch: &Batch) -> redline_train::Result<StepOutput> {
        let (b, classes) = logits.dims2()?;
        // softmax: (B, C)
        let max = logits.max_keepdim(D::Minus1)?;
        let e = logits.broadcast_sub(&max)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        // one-hot targets: (B, C)
        let ids = Tensor::arange(0u32, classes as u32, logits.device())?;
        let onehot = batch
            .y
            .unsqueeze(1)?
            .broadcast_eq(&ids.unsqueeze(0)?)?
            .to_dtype(DType::F32)?;
        let loss = (p - onehot)?.sqr()?.sum(D::Minus1)?.mean_all()?;
        let correct = logits
            .detach()
            .argmax(D::Minus1)?
            .eq(&batch.y)?
            .to_dtype(DType::F32)?
            .sum_all()?;
        Ok(StepOutput {
            loss,
            samples: b,
            metrics: vec![Metric::mean("accuracy", correct, b as f64)],
        })
    }
}

impl TrainStep for BrierClassifier {
    fn params(&self) -> &Params {
        self.model.params()
    }
    fn metric_names(&self) -> Option<Vec<String>> {
        Some(vec!["accuracy".into()])
    }
    fn training_step(&self, batch: &Batch) -> redline_train::Result<StepOutput> {
        self.outputs(&output(&self.model, batch, true)?, batch)
    }
    fn validation_step(&self, batch: &Batch) -> redline_train::Result<StepOutput> {
        self.outputs(&output(&self.model, batch, false)?, batch)
    }
}

/// A millisecond a step, so that a test can kill the run part way.
struct Paced;

impl Callback for Paced {
    fn name(&self) -> &str {
        "paced"
    }
    fn on_event(&mut self, event: &Event<'_>) -> Result<(), String> {
        if let Event::StepEnd { .. } = event {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }
}

/// `n` samples of 4 features; class 1 where the first feature is positive.
fn table(n: usize, seed: usize) -> anyhow::Result<Split> {
    let x: Vec<f32> = (0..n * 4)
        .map(|i| (((i + seed) * 7919) % 13) as f32 / 6.0 - 1.0)
        .collect();
    let y: Vec<u32> = (0..n).map(|i| u32::from(x[i * 4] > 0.0)).collect();
    Ok(Split {
        x: Tensor::from_vec(x, (n, 4), &candle_core::Device::Cpu)?,
        y: Tensor::from_vec(y, n, &candle_core::Device::Cpu)?,
        target: TargetKind::Classes(2),
        source: PathBuf::from("synthetic"),
    })
}

fn loader(split: Split, shuffle: bool) -> anyhow::Result<Loader> {
    let cfg = LoaderConfig {
        batch_size: 16,
        shuffle,
        seed: 7,
        prefetch: 2,
        drop_last: false,
    };
    Ok(Loader::new(split, cfg)?)
}

/// Trains (or, with `resume`, continues) the run in `dir` for `steps` steps.
fn train(dir: &Path, steps: usize, resume: bool) -> anyhow::Result<()> {
    let model = ModelConfig::Mlp(MlpConfig {
        in_features: 4,
        hidden: vec![16],
        classes: 2,
    })
    .build(&Device::cpu(), Precision::Fp32, 1)?;
    let shapes: Vec<(String, Vec<usize>)> = model
        .params()
        .state()
        .map(|(n, v)| (n.to_string(), v.as_tensor().dims().to_vec()))
        .collect();
    // What a checkpoint must match to be resumed by this run.
    let identity = BTreeMap::from([
        ("example".to_string(), serde_json::json!("resumable")),
        ("lr".to_string(), serde_json::json!(0.05)),
    ]);
    let (run, resume_from) = match resume {
        false => (Run::create(Some(dir), "brier-mlp")?, None),
        true => {
            let picked = redline_run::resume::pick(dir, &identity, &shapes, Some(steps))?;
            let (run, kept) = Run::reopen(dir, "brier-mlp", &picked.at)?;
            println!("resuming at step {}: {}", picked.at.step, kept.line());
            (run, Some(picked.loaded))
        }
    };
    let mut trainer = Trainer::builder()
        .config(TrainConfig {
            epochs: 0,
            max_steps: Some(steps),
            log_every: 10,
            ..TrainConfig::default()
        })
        .optimizer(OptimizerConfig::by_name("adam", 0.05)?)
        .callback(run.callback())
        .callback(Box::new(Paced))
        .checkpoints(CheckpointConfig {
            dir: dir.join("checkpoints"),
            every: Some(20),
            keep_last: 2,
            monitor: Some(("val_loss".into(), redline_train::early_stop::Direction::Min)),
            identity,
        })
        .build(Box::new(BrierClassifier { model }), Device::cpu())?;
    if let Some(loaded) = resume_from {
        trainer.resume_from(loaded)?;
    }
    let (train, val) = (loader(table(200, 0)?, true)?, loader(table(48, 3)?, false)?);
    let fit = trainer.fit(&train, Some(&val));
    let message = fit.as_ref().err().map(ToString::to_string);
    let ending = match (&fit, &message) {
        (Ok(f), _) => Ending::Finished { fit: f, test: None },
        (Err(_), m) => Ending::Failed(m.as_deref().unwrap_or_default()),
    };
    let done = run.finish(&mut trainer, ending);
    let fit = fit?;
    done?;
    trainer.save_weights(&dir.join("final.safetensors"))?;
    println!(
        "{} steps, val loss {:.4}",
        fit.steps,
        fit.val.map_or(f64::NAN, |v| v.loss)
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(dir), Some(steps)) = (args.first(), args.get(1)) else {
        anyhow::bail!("usage: resumable RUN_DIR STEPS [--resume]");
    };
    let resume = args.iter().any(|a| a == "--resume");
    train(Path::new(dir), steps.parse()?, resume)
}
