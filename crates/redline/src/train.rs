//! `redline train`: resolve flags into configs, build, fit, report, save.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use redline_core::{Device, DeviceSpec, Precision};
use redline_data::{Loader, LoaderConfig, Normalize, Split, SplitKind};
use redline_models::ModelConfig;
use redline_train::{JsonlMetrics, OptimizerConfig, TrainConfig, Trainer};

use crate::cli::TrainArgs;
use crate::progress::Progress;
use crate::summary;

/// The shipped Fashion-MNIST: `./data/fashion-mnist` from the repository root,
/// else the copy beside the sources this binary was built from.
fn default_data_dir() -> anyhow::Result<PathBuf> {
    let candidates = [
        PathBuf::from("data/fashion-mnist"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist"),
    ];
    candidates
        .iter()
        .find(|p| p.is_dir())
        .cloned()
        .with_context(|| {
            format!(
                "the shipped Fashion-MNIST was not found (looked in {})\nHINT: run from the \
                 repository root or pass --data DIR",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// Builds the optimizer config from the flags.
fn optimizer(args: &TrainArgs) -> anyhow::Result<OptimizerConfig> {
    let mut cfg = OptimizerConfig::by_name(&args.optimizer, args.lr)?;
    match &mut cfg {
        OptimizerConfig::Adam {
            betas,
            eps,
            weight_decay,
            ..
        }
        | OptimizerConfig::AdamW {
            betas,
            eps,
            weight_decay,
            ..
        } => {
            *betas = (args.beta1, args.beta2);
            *eps = args.eps;
            if let Some(wd) = args.weight_decay {
                *weight_decay = wd;
            }
        }
        OptimizerConfig::Sgd {
            momentum,
            nesterov,
            weight_decay,
            ..
        } => {
            *momentum = args.momentum;
            *nesterov = args.nesterov;
            if let Some(wd) = args.weight_decay {
                *weight_decay = wd;
            }
        }
    }
    if args.nesterov && !matches!(cfg, OptimizerConfig::Sgd { .. }) {
        bail!("--nesterov applies to --optimizer sgd only");
    }
    Ok(cfg)
}

/// Runs `redline train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    if args.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let threads = redline_core::threads::configure(args.threads);
    let spec: DeviceSpec = args.device.parse()?;
    let device = Device::resolve(spec)?;
    let model_cfg = ModelConfig::by_name(&args.model)?;
    let opt_cfg = optimizer(args)?;
    let data_dir = match &args.data {
        Some(d) => d.clone(),
        None => default_data_dir()?,
    };
    if args.batch_size == 0 || args.eval_batch_size == 0 {
        bail!("--batch-size and --eval-batch-size must be at least 1");
    }

    let norm = Normalize {
        mean: args.mean,
        std: args.std,
    };
    let train = Split::load(
        &data_dir,
        SplitKind::Train,
        args.classes,
        norm,
        device.candle(),
    )?;
    let test = if args.no_validate {
        None
    } else {
        Some(Split::load(
            &data_dir,
            SplitKind::Test,
            args.classes,
            norm,
            device.candle(),
        )?)
    };
    let train_loader = Loader::new(
        train,
        LoaderConfig {
            batch_size: args.batch_size,
            shuffle: !args.no_shuffle,
            seed: args.seed,
            prefetch: args.prefetch,
            drop_last: false,
        },
    )?;
    let test_loader = test
        .map(|s| {
            Loader::new(
                s,
                LoaderConfig {
                    batch_size: args.eval_batch_size,
                    shuffle: false,
                    seed: 0,
                    prefetch: args.prefetch,
                    drop_last: false,
                },
            )
        })
        .transpose()?;

    let model = model_cfg.build(&device, Precision::Fp32, args.seed)?;
    if let Some(init) = &args.init {
        model.params().load_safetensors(init).context("--init")?;
    }
    println!(
        "redline: {} ({} params) on {} ({} compute threads), data {} ({} train / {} test), {} batch {}, lr {}",
        model_cfg.name(),
        model.params().numel(),
        device,
        threads,
        data_dir.display(),
        train_loader.len(),
        test_loader.as_ref().map_or(0, |l| l.len()),
        args.optimizer,
        args.batch_size,
        args.lr
    );

    let mut builder = Trainer::builder()
        .config(TrainConfig {
            epochs: args.epochs,
            max_steps: args.max_steps,
            log_every: args.log_every,
            validate: !args.no_validate,
        })
        .optimizer(opt_cfg)
        .model_name(model_cfg.name())
        .callback(Box::new(Progress::new()));
    if let Some(path) = &args.metrics {
        builder = builder.callback(Box::new(JsonlMetrics::create(path)?));
    }
    let mut trainer = builder.build(model, device)?;
    let fit = trainer.fit(&train_loader, test_loader.as_ref())?;
    summary::print(&fit, args.batch_size)?;

    if let Some(path) = &args.save {
        trainer
            .model()
            .params()
            .save_safetensors(path)
            .context("--save")?;
        println!("saved weights to {}", path.display());
    }
    Ok(())
}
