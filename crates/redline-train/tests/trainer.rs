//! The trainer's own behaviour, each with a real short fit on small data:
//! callback detachment, `max_steps` against `epochs`, validation and test
//! passes, a regression step trained end to end, and graph mode's loop
//! (uncaptured) against the eager loop.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Tensor};
use redline_core::{Device, Precision};
use redline_data::{Loader, LoaderConfig, Split, TargetKind};
use redline_models::{MlpConfig, ModelConfig};
use redline_train::{
    loss::cross_entropy, Callback, Classifier, Event, JsonlMetrics, OptimizerConfig,
    RegressionLoss, Regressor, TrainConfig, Trainer,
};

type R = anyhow::Result<()>;

/// `n` samples of 4 features: class 1 where the first feature is positive.
fn classes(n: usize) -> anyhow::Result<Split> {
    let x: Vec<f32> = (0..n * 4)
        .map(|i| ((i * 7919) % 13) as f32 / 6.0 - 1.0)
        .collect();
    let y: Vec<u32> = (0..n).map(|i| u32::from(x[i * 4] > 0.0)).collect();
    Ok(Split {
        x: Tensor::from_vec(x, (n, 1, 2, 2), &candle_core::Device::Cpu)?,
        y: Tensor::from_vec(y, n, &candle_core::Device::Cpu)?,
        target: TargetKind::Classes(2),
        source: PathBuf::from("synthetic"),
    })
}

fn loader(split: Split, batch_size: usize) -> anyhow::Result<Loader> {
    Ok(Loader::new(
        split,
        LoaderConfig {
            batch_size,
            shuffle: false,
            seed: 0,
            prefetch: 0,
            drop_last: false,
        },
    )?)
}

fn mlp(outputs: usize) -> anyhow::Result<Box<dyn redline_models::Model>> {
    let cfg = ModelConfig::Mlp(MlpConfig {
        in_features: 4,
        hidden: vec![8],
        classes: outputs,
    });
    Ok(cfg.build(&Device::cpu(), Precision::Fp32, 1)?)
}

fn cfg(epochs: usize, max_steps: Option<usize>) -> TrainConfig {
    TrainConfig {
        epochs,
        max_steps,
        log_every: 1,
        validate: true,
        ..TrainConfig::default()
    }
}

/// Records the events it sees; fails on the `fail_at`-th one when given.
struct Recorder {
    seen: Arc<Mutex<Vec<String>>>,
    fail_at: Option<usize>,
}

impl Callback for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    fn on_event(&mut self, e: &Event<'_>) -> Result<(), String> {
        let mut seen = self.seen.lock().map_err(|e| e.to_string())?;
        let tag = match e {
            Event::FitStart { .. } => "fit_start".to_string(),
            Event::EpochStart { epoch } => format!("epoch_start {epoch}"),
            Event::StepEnd { step, .. } => format!("step {step}"),
            Event::Log(s) => format!("log {}", s.step),
            Event::ValidationStart { epoch } => format!("validation {epoch}"),
            Event::EpochEnd(e) => format!("epoch_end {}", e.epoch),
            Event::FitEnd(f) => format!("fit_end {}", f.steps),
            Event::Test(t) => format!("test {}", t.samples),
        };
        seen.push(tag);
        if self.fail_at == Some(seen.len()) {
            return Err("deliberate failure".into());
        }
        Ok(())
    }
}

fn recorder(fail_at: Option<usize>) -> (Box<Recorder>, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    (
        Box::new(Recorder {
            seen: seen.clone(),
            fail_at,
        }),
        seen,
    )
}

#[test]
fn a_failing_callback_is_detached_and_training_goes_on() -> R {
    let (failing, failing_seen) = recorder(Some(3));
    let (healthy, healthy_seen) = recorder(None);
    let mut t = Trainer::builder()
        .config(cfg(1, None))
        .callback(failing)
        .callback(healthy)
        .build(Classifier::new(mlp(2)?), Device::cpu())?;
    let fit = t.fit(&loader(classes(12)?, 4)?, None)?;
    assert_eq!(fit.steps, 3);
    let failing = failing_seen.lock().map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(*failing, ["fit_start", "epoch_start 1", "step 1"]);
    let healthy = healthy_seen.lock().map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(healthy.last().map(String::as_str), Some("fit_end 3"));
    assert_eq!(healthy.iter().filter(|s| s.starts_with("step ")).count(), 3);
    Ok(())
}

#[test]
fn max_steps_cuts_epochs_and_alone_sets_their_number() -> R {
    // 10 samples in batches of 4: 3 steps an epoch.
    let mut t = Trainer::builder()
        .config(cfg(3, Some(5)))
        .build(Classifier::new(mlp(2)?), Device::cpu())?;
    let fit = t.fit(&loader(classes(10)?, 4)?, None)?;
    assert_eq!((fit.steps, fit.epochs), (5, 2));
    let steps: Vec<usize> = fit.epochs_log.iter().map(|e| e.steps).collect();
    assert_eq!(steps, [3, 2]);
    assert_eq!(fit.samples, 10 + 8);

    let mut t = Trainer::builder()
        .config(cfg(0, Some(7)))
        .build(Classifier::new(mlp(2)?), Device::cpu())?;
    let fit = t.fit(&loader(classes(10)?, 4)?, None)?;
    assert_eq!((fit.steps, fit.epochs), (7, 3));

    // Fewer steps than planned epochs would take: the epochs win.
    let mut t = Trainer::builder()
        .config(cfg(1, Some(100)))
        .build(Classifier::new(mlp(2)?), Device::cpu())?;
    assert_eq!(t.fit(&loader(classes(10)?, 4)?, None)?.steps, 3);
    Ok(())
}

#[test]
fn validation_is_the_mean_over_every_sample_and_test_is_reported() -> R {
    let val = loader(classes(11)?, 4)?;
    let (rec, seen) = recorder(None);
    let dir = tempfile::tempdir()?;
    let jsonl = dir.path().join("m.jsonl");
    let mut t = Trainer::builder()
        .config(cfg(1, None))
        .callback(rec)
        .callback(Box::new(JsonlMetrics::create(&jsonl)?))
        .build(Classifier::new(mlp(2)?), Device::cpu())?;
    let fit = t.fit(&loader(classes(16)?, 4)?, Some(&val))?;

    // The same numbers by hand: every sample at once through the trained weights.
    let split = classes(11)?;
    let model = mlp(2)?;
    model
        .params()
        .assign(&t.params().to_map(), std::path::Path::new("trained"))?;
    let logits = model.forward(&split.x)?;
    let loss = cross_entropy(&logits, &split.y)?.to_scalar::<f32>()? as f64;
    let hits = logits
        .argmax(1)?
        .eq(&split.y)?
        .to_dtype(DType::F32)?
        .sum_all()?
        .to_scalar::<f32>()? as f64;

    let v = t.validate(&val)?;
    assert_eq!(v.samples, 11);
    assert!((v.loss - loss).abs() < 1e-6, "{} vs {loss}", v.loss);
    assert_eq!(v.metrics.get("accuracy"), Some(hits / 11.0));
    let last = fit.val.as_ref().map(|e| (e.loss, e.metrics.clone()));
    assert_eq!(last, Some((v.loss, v.metrics.clone())));

    let test = t.test(&val)?;
    assert_eq!(test.metrics, v.metrics);
    let seen = seen.lock().map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(seen.last().map(String::as_str), Some("test 11"));
    drop(t);
    let text = std::fs::read_to_string(&jsonl)?;
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let epoch = records.iter().find(|r| r["kind"] == "epoch");
    let test = records.iter().find(|r| r["kind"] == "test");
    assert!(epoch.is_some_and(|e| e["val_accuracy"].is_number() && e["train_accuracy"].is_number()));
    assert!(test.is_some_and(|t| t["test_accuracy"].as_f64() == Some(hits / 11.0)));
    Ok(())
}

/// `y = 2 x0 - x1 + 0.5` with float targets, learned by the zoo MLP with one
/// output through the ready regression step.
fn linear_targets(n: usize) -> anyhow::Result<Split> {
    let x: Vec<f32> = (0..n * 4)
        .map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0)
        .collect();
    let y: Vec<f32> = (0..n)
        .map(|i| 2.0 * x[i * 4] - x[i * 4 + 1] + 0.5)
        .collect();
    Ok(Split {
        x: Tensor::from_vec(x, (n, 4), &candle_core::Device::Cpu)?,
        y: Tensor::from_vec(y, n, &candle_core::Device::Cpu)?,
        target: TargetKind::Values(1),
        source: PathBuf::from("synthetic"),
    })
}

#[test]
fn a_regression_step_trains_with_mse_and_reports_mae() -> R {
    let train = loader(linear_targets(64)?, 16)?;
    let mut t = Trainer::builder()
        .config(cfg(30, None))
        .optimizer(OptimizerConfig::by_name("adam", 0.02)?)
        .build(Regressor::new(mlp(1)?, RegressionLoss::Mse), Device::cpu())?;
    let before = t.validate(&train)?;
    let fit = t.fit(&train, Some(&train))?;
    let after = fit
        .val
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no validation"))?;
    let (mae0, mae1) = (before.metrics.get("mae"), after.metrics.get("mae"));
    assert!(
        after.loss < 0.1 * before.loss,
        "{} -> {}",
        before.loss,
        after.loss
    );
    assert!(mae1 < mae0, "{mae0:?} -> {mae1:?}");
    assert_eq!(fit.epochs_log[0].train.0.len(), 1, "train_mae only");
    Ok(())
}

#[test]
fn float_targets_stream_through_staging_like_resident_ones() -> R {
    // Streaming gathers each batch into staging buffers typed by the data set's
    // targets; a regression fit must see exactly the resident batches.
    let fit = |placement| -> anyhow::Result<Vec<f64>> {
        let data = linear_targets(40)?;
        let cfg_l = LoaderConfig {
            batch_size: 16,
            shuffle: true,
            seed: 3,
            prefetch: 1,
            drop_last: false,
        };
        let train = Loader::placed(data, &candle_core::Device::Cpu, placement, cfg_l)?;
        let mut t = Trainer::builder()
            .config(cfg(3, None))
            .optimizer(OptimizerConfig::by_name("adam", 0.01)?)
            .build(Regressor::new(mlp(1)?, RegressionLoss::L1), Device::cpu())?;
        let f = t.fit(&train, None)?;
        Ok(f.epochs_log.iter().map(|e| e.train_loss).collect())
    };
    let resident = fit(redline_data::Placement::Resident)?;
    assert_eq!(resident.len(), 3);
    assert_eq!(resident, fit(redline_data::Placement::Streaming)?);
    Ok(())
}

#[test]
fn a_step_that_returns_a_non_scalar_loss_is_refused() -> R {
    use redline_train::{StepOutput, TrainStep};
    struct Bad(Box<dyn redline_models::Model>);
    impl TrainStep for Bad {
        fn params(&self) -> &redline_models::Params {
            self.0.params()
        }
        fn training_step(&self, b: &redline_data::Batch) -> redline_train::Result<StepOutput> {
            Ok(StepOutput {
                loss: self.0.forward_t(&b.x, true)?,
                samples: b.size(),
                metrics: vec![],
            })
        }
        fn validation_step(&self, b: &redline_data::Batch) -> redline_train::Result<StepOutput> {
            self.training_step(b)
        }
    }
    let mut t = Trainer::builder()
        .config(cfg(1, None))
        .build(Bad(mlp(2)?), Device::cpu())?;
    let err = t
        .fit(&loader(classes(8)?, 4)?, None)
        .err()
        .map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("must be a scalar")));
    Ok(())
}

#[test]
fn each_trainer_counts_its_own_host_syncs() -> R {
    // Two fits at once: 3 steps, a log point each (3 reads) and an epoch end
    // (1 read), plus the first step's loss that the divergence guard reads
    // once per fit, give exactly 5/3 syncs a step to each, whatever the other does.
    let fit = || -> anyhow::Result<f64> {
        let mut t = Trainer::builder()
            .config(TrainConfig {
                validate: false,
                ..cfg(1, None)
            })
            .build(Classifier::new(mlp(2)?), Device::cpu())?;
        Ok(t.fit(&loader(classes(12)?, 4)?, None)?.host_syncs_per_step)
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(fit);
        let b = s.spawn(fit);
        (a.join(), b.join())
    });
    for got in [a, b] {
        let got = got.map_err(|_| anyhow::anyhow!("fit panicked"))??;
        assert_eq!(got, 5.0 / 3.0);
    }
    Ok(())
}

#[test]
fn a_diverging_fit_stops_with_the_step_and_the_likely_cause() -> R {
    let fit = |threshold: Option<f64>| -> anyhow::Result<redline_train::FitSummary> {
        let mut t = Trainer::builder()
            .config(TrainConfig {
                validate: false,
                divergence_threshold: threshold,
                ..cfg(1, None)
            })
            .optimizer(redline_train::OptimizerConfig::by_name("adam", 1e6)?)
            .build(Classifier::new(mlp(2)?), Device::cpu())?;
        Ok(t.fit(&loader(classes(12)?, 4)?, None)?)
    };
    let err = fit(Some(1e3))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("training diverged at step"), "{err}");
    assert!(err.contains("lower the learning rate"), "{err}");
    // Off, the same fit runs to its end.
    assert!(fit(None).is_ok());
    // A threshold that cannot work is refused when the trainer is built.
    let bad = Trainer::builder()
        .config(TrainConfig {
            divergence_threshold: Some(0.5),
            ..cfg(1, None)
        })
        .build(Classifier::new(mlp(2)?), Device::cpu());
    assert!(bad.is_err());
    Ok(())
}

#[test]
fn a_set_stop_flag_ends_the_fit_after_a_whole_step() -> R {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut t = Trainer::builder()
        .config(cfg(1, None))
        .stop_when(Arc::clone(&flag))
        .build(Classifier::new(mlp(2)?), Device::cpu())?;
    let err = t.fit(&loader(classes(12)?, 4)?, None).err();
    assert!(
        matches!(
            err,
            Some(redline_train::Error::Interrupted { step: 1, epoch: 1 })
        ),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn each_trainer_keeps_its_own_thread_count() -> R {
    use redline_train::{StepOutput, TrainStep};
    // A classifier that notes the fused kernels' thread count at every step.
    struct Spy(
        Classifier<Box<dyn redline_models::Model>>,
        Arc<Mutex<Vec<usize>>>,
    );
    impl TrainStep for Spy {
        fn params(&self) -> &redline_models::Params {
            self.0.params()
        }
        fn training_step(&self, b: &redline_data::Batch) -> redline_train::Result<StepOutput> {
            let n = redline_core::threads::compute_threads();
            self.1
                .lock()
                .map_err(|_| redline_train::Error::Config("poisoned".into()))?
                .push(n);
            self.0.training_step(b)
        }
        fn validation_step(&self, b: &redline_data::Batch) -> redline_train::Result<StepOutput> {
            self.training_step(b)
        }
    }
    let fit = |threads: usize| -> anyhow::Result<Vec<usize>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let spy = Spy(Classifier::new(mlp(2)?), Arc::clone(&seen));
        let mut t = Trainer::builder()
            .config(cfg(1, None))
            .threads(threads)
            .build(spy, Device::cpu())?;
        let data = loader(classes(12)?, 4)?;
        t.fit(&data, Some(&data))?;
        t.test(&data)?;
        let seen = seen
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .clone();
        Ok(seen)
    };
    let before = redline_core::threads::compute_threads();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| fit(3));
        let b = s.spawn(|| fit(7));
        (a.join(), b.join())
    });
    let a = a.map_err(|_| anyhow::anyhow!("fit panicked"))??;
    let b = b.map_err(|_| anyhow::anyhow!("fit panicked"))??;
    // 3 training steps, 3 validation and 3 test batches each.
    assert_eq!(a, vec![3; 9]);
    assert_eq!(b, vec![7; 9]);
    assert_eq!(redline_core::threads::compute_threads(), before);
    let zero = Trainer::builder()
        .threads(0)
        .build(Classifier::new(mlp(2)?), Device::cpu())
        .err()
        .map(|e| e.to_string());
    assert!(zero.is_some_and(|e| e.contains("--threads 0: give 1 to 1024")));
    Ok(())
}

/// Graph mode on the CPU: `auto` trains eagerly and the summary says why;
/// `on` refuses before the first step, leaving the weights untouched.
#[test]
fn cuda_graph_mode_on_the_cpu_says_why_it_is_off() -> R {
    let train = loader(classes(64)?, 16)?;
    let mut trainer = Trainer::builder()
        .config(cfg(1, None))
        .build(Classifier::new(mlp(2)?), Device::cpu())?;
    let fit = trainer.fit(&train, None)?;
    assert_eq!(fit.steps, 4);
    assert_eq!(
        fit.cuda_graph.to_string(),
        "off (the device is the CPU; CUDA graphs need a CUDA device)"
    );

    let model = mlp(2)?;
    let before = model.params().to_map();
    let mut trainer = Trainer::builder()
        .config(cfg(1, None))
        .cuda_graph(redline_train::GraphMode::On)
        .build(Classifier::new(model), Device::cpu())?;
    let err = trainer.fit(&train, None).err().map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("--cuda-graph on: the training step cannot be captured")),
        "{err:?}"
    );
    for (name, w) in trainer.params().to_map() {
        let diff = (&w - &before[&name])?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert_eq!(diff, 0.0, "{name} moved");
    }
    Ok(())
}

/// The fit's memory split, measured at its first step: the 4-8-2 MLP's
/// parameters (58 f32), as many gradient bytes, Adam's two moments, and
/// activations that grow with the batch (the hidden layer and the logits).
#[test]
fn the_memory_split_counts_parameters_gradients_state_and_activations() -> R {
    let split = |batch: usize| -> anyhow::Result<redline_train::MemorySplit> {
        let mut trainer = Trainer::builder()
            .config(cfg(1, Some(2)))
            .build(Classifier::new(mlp(2)?), Device::cpu())?;
        let fit = trainer.fit(&loader(classes(64)?, batch)?, None)?;
        fit.memory.ok_or_else(|| anyhow::anyhow!("no memory split"))
    };
    let (small, big) = (split(4)?, split(32)?);
    let params = (4 * 8 + 8 + 8 * 2 + 2) * 4;
    assert_eq!(
        (small.parameters, small.gradients, small.optimizer),
        (params, params, 2 * params)
    );
    assert_eq!((small.batch, big.batch), (4, 32));
    assert_eq!(small.measured_by, "tensor sizes");
    // At least the hidden layer (B x 8) and the logits (B x 2), in f32.
    assert!(small.activations >= 4 * 10 * 4, "{small:?}");
    assert!(
        big.activations >= 6 * small.activations,
        "{small:?} -> {big:?}"
    );
    Ok(())
}

/// What a fit did, as bits.
struct FitBits {
    /// The events, in order.
    events: Vec<String>,
    /// Every log point's step, loss and rate.
    logs: Vec<(usize, u64, u64)>,
    /// The final weights.
    weights: Vec<u32>,
    /// What the summary says about CUDA graphs.
    graph: String,
}

/// One fit of the test's MLP in `precision`, through graph mode's loop
/// (uncaptured) where `cursor`.
fn fit_bits(
    cfg: TrainConfig,
    precision: Precision,
    streaming: bool,
    cursor: bool,
) -> anyhow::Result<FitBits> {
    let split = classes(100)?;
    let loader_cfg = LoaderConfig {
        batch_size: 8,
        shuffle: true,
        seed: 5,
        prefetch: 0,
        drop_last: false,
    };
    let train = match streaming {
        true => Loader::streaming(split, &candle_core::Device::Cpu, loader_cfg)?,
        false => Loader::new(split, loader_cfg)?,
    };
    let val = loader(classes(24)?, 8)?;
    let model = ModelConfig::Mlp(MlpConfig {
        in_features: 4,
        hidden: vec![8],
        classes: 2,
    })
    .build(&Device::cpu(), precision, 1)?;
    let (rec, seen) = recorder(None);
    let logs = Arc::new(Mutex::new(Vec::new()));
    struct Logs(Arc<Mutex<Vec<(usize, u64, u64)>>>);
    impl Callback for Logs {
        fn name(&self) -> &str {
            "logs"
        }
        fn on_event(&mut self, e: &Event<'_>) -> Result<(), String> {
            if let Event::Log(s) = e {
                let mut l = self.0.lock().map_err(|e| e.to_string())?;
                l.push((s.step, s.loss.to_bits(), s.lr.to_bits()));
            }
            Ok(())
        }
    }
    let mut t = Trainer::builder()
        .config(cfg)
        .precision(precision)
        .optimizer(OptimizerConfig::by_name("adamw", 0.01)?)
        .cursor_steps(cursor)
        .callback(rec)
        .callback(Box::new(Logs(logs.clone())))
        .build(Classifier::new(model), Device::cpu())?;
    let fit = t.fit(&train, Some(&val))?;
    let weights = t
        .params()
        .state()
        .map(|(_, v)| Ok(v.as_tensor().flatten_all()?.to_vec1::<f32>()?))
        .collect::<anyhow::Result<Vec<_>>>()?
        .concat()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let events = seen.lock().map_err(|e| anyhow::anyhow!("{e}"))?.clone();
    let logs = logs.lock().map_err(|e| anyhow::anyhow!("{e}"))?.clone();
    Ok(FitBits {
        events,
        logs,
        weights,
        graph: fit.cuda_graph.to_string(),
    })
}

/// Graph mode's loop (a GPU's default; here uncaptured) trains as the eager
/// loop does, bit for bit, with the same events: clipping, the gradient
/// norm, a per-step schedule, a fit ending mid-epoch, early stopping, the
/// loss scaler of 16-mixed, resident and streamed data.
#[test]
fn graph_modes_loop_trains_as_the_eager_loop_does() -> R {
    let base = TrainConfig {
        epochs: 3,
        log_every: 3,
        validate: true,
        ..TrainConfig::default()
    };
    let cases = [
        ("plain", base.clone(), Precision::Fp32),
        (
            "clip, norm, step schedule, max_steps mid-epoch",
            TrainConfig {
                clip: Some(redline_train::GradClip::Norm { max_norm: 0.5 }),
                log_grad_norm: true,
                schedule: "cosine:warmup=3:interval=step".parse()?,
                max_steps: Some(30),
                ..base.clone()
            },
            Precision::Fp32,
        ),
        (
            "early stop",
            TrainConfig {
                epochs: 6,
                early_stop: Some("train_loss:patience=1:min_delta=10".parse()?),
                ..base.clone()
            },
            Precision::Fp32,
        ),
        ("16-mixed", base.clone(), Precision::Fp16Mixed),
    ];
    for (what, cfg, precision) in cases {
        for streaming in [false, true] {
            let want = fit_bits(cfg.clone(), precision, streaming, false)?;
            let got = fit_bits(cfg.clone(), precision, streaming, true)?;
            let case = format!("{what}, streaming {streaming}");
            assert!(got.graph.contains("uncaptured"), "{case}: {}", got.graph);
            assert!(!want.graph.contains("uncaptured"), "{case}: {}", want.graph);
            assert_eq!(got.events, want.events, "{case}: events");
            assert_eq!(got.logs, want.logs, "{case}: log points");
            assert!(!got.logs.is_empty(), "{case}: no log points");
            assert!(got.weights == want.weights, "{case}: weights");
        }
    }
    Ok(())
}
