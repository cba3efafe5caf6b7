//! `redline test RUN_DIR`: a finished run's weights evaluated again, on its
//! own test split or on other data of its input shape, from the same plan
//! the run was trained from (its `config.toml`), as Lightning's
//! `trainer.test(ckpt_path=...)`. Nothing is written.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use redline_data::{place, DataOnDevice, Dataset, HostData, Loader, LoaderConfig};
use redline_train::checkpoint;
use redline_train::Trainer;

use crate::cli::{Cli, Command, TestArgs, TrainArgs};
use crate::summary::show;

/// The run's flags from its `config.toml`, with `--data`/`--device`
/// overrides, and nothing it would write (no `--save`, `--metrics`).
fn run_flags(dir: &Path, data: Option<&Path>, device: Option<&str>) -> anyhow::Result<TrainArgs> {
    let config = dir.join("config.toml");
    let mut argv: Vec<OsString> = ["redline", "train", "--config"]
        .map(OsString::from)
        .into_iter()
        .chain([config.clone().into_os_string()])
        .collect();
    if let Some(d) = data {
        // All of other data is evaluated when it has no test split.
        argv.extend(["--val-split=0".into(), "--data".into(), d.into()]);
    }
    if let Some(d) = device {
        argv.extend(["--device".into(), d.into()]);
    }
    argv.extend(["--monitor-interval=0".into()]);
    let (argv, _) = crate::cli::expand_config(argv)?;
    let cli = Cli::try_parse_from(argv)
        .map_err(|e| anyhow::anyhow!("{}: {}", config.display(), e.render()))?;
    let Command::Train(mut args) = cli.command else {
        bail!("{}: not the config of a training run", config.display());
    };
    args.save = None;
    args.metrics = None;
    args.init = None;
    Ok(*args)
}

/// The weights `--checkpoint` names in the run folder `dir`: the newest
/// checkpoint's, the best one's by the run's `--monitor`, or a checkpoint
/// folder or weights file.
fn weights(dir: &Path, which: &str, args: &TrainArgs) -> anyhow::Result<PathBuf> {
    let folder = dir.join("checkpoints");
    let all = checkpoint::list(&folder);
    let none = || {
        anyhow::anyhow!(
            "{}: the run kept no checkpoint (--no-checkpoint, or a fast dev run)\nHINT: give \
             the weights it saved: --checkpoint FILE.safetensors",
            dir.display()
        )
    };
    let chosen = match which {
        "last" => all.last().map(|(_, p)| p.clone()).ok_or_else(none)?,
        "best" => best(&all, args).ok_or_else(none)?,
        path => {
            let p = PathBuf::from(path);
            if p.is_dir() {
                p
            } else if p.is_file() {
                return Ok(p);
            } else {
                bail!(
                    "--checkpoint {path}: no such checkpoint folder or weights file\nHINT: \
                     best, last, a folder under {}, or a .safetensors file",
                    folder.display()
                );
            }
        }
    };
    let file = chosen.join(checkpoint::WEIGHTS);
    if !file.is_file() {
        bail!(
            "--checkpoint {}: not a checkpoint folder (it has no {})",
            chosen.display(),
            checkpoint::WEIGHTS
        );
    }
    Ok(file)
}

/// The checkpoint with the best monitored value (`state.json` `monitor`),
/// by the run's `--monitor` and `--mode`.
fn best(all: &[(usize, PathBuf)], args: &TrainArgs) -> Option<PathBuf> {
    let larger = match args.mode.as_deref() {
        Some(m) => m == "max",
        None => args.monitor.as_deref().is_some_and(|m| m.contains("acc")),
    };
    let value = |p: &PathBuf| -> Option<f64> {
        let text = std::fs::read_to_string(p.join(checkpoint::STATE)).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("monitor")?.as_f64().filter(|x| x.is_finite())
    };
    all.iter()
        .filter_map(|(_, p)| Some((value(p)?, p)))
        .max_by(|a, b| match larger {
            true => a.0.total_cmp(&b.0),
            false => b.0.total_cmp(&a.0),
        })
        .map(|(_, p)| p.clone())
}

/// The model of the run folder `run_dir` (its `config.toml`'s job on
/// `data` if given, else its own), with the weights `checkpoint` names
/// loaded: the plan (its data read), the model and the weights file.
pub fn run_model(
    run_dir: &Path,
    data: Option<&Path>,
    checkpoint: &str,
    device: Option<&str>,
) -> anyhow::Result<(crate::plan::Plan, Box<dyn redline_models::Model>, PathBuf)> {
    let dir = crate::resume::run_folder(run_dir)
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().replace("--resume ", "")))?;
    let args = run_flags(&dir, data, device)?;
    let file = weights(&dir, checkpoint, &args)?;
    let plan = crate::plan::prepare(&args)?;
    let model = plan
        .model_cfg
        .build(&plan.device, plan.precision, args.seed)?;
    model.params().load_safetensors(&file).with_context(|| {
        format!(
            "the weights {} do not fit the model this data makes ({}, inputs {:?}, {}): give \
             data of the run's input shape and classes",
            file.display(),
            plan.model_cfg.name(),
            plan.prepared.train.input_dims,
            plan.prepared.train.target
        )
    })?;
    Ok((plan, model, file))
}

/// The split to evaluate or predict on: the data's test split, else (for
/// `other` data than the run's) all of it; taken out of the plan.
pub fn data_split(
    plan: &mut crate::plan::Plan,
    other: bool,
    run_dir: &Path,
) -> anyhow::Result<HostData> {
    let target = plan.prepared.train.target;
    Ok(match (plan.prepared.test.take(), other) {
        (Some(t), _) => t,
        (None, true) => std::mem::replace(
            &mut plan.prepared.train,
            HostData {
                x: Vec::new(),
                y: redline_data::Targets::Classes(Vec::new()),
                input_dims: Vec::new(),
                target,
                source: PathBuf::new(),
            },
        ),
        (None, false) => bail!(
            "{}: the run's data has no test split\nHINT: give data to evaluate on: --data PATH",
            run_dir.display()
        ),
    })
}

/// Runs `redline test`.
pub fn run(test: &TestArgs) -> anyhow::Result<()> {
    let (mut plan, model, file) = run_model(
        &test.run_dir,
        test.data.as_deref(),
        &test.checkpoint,
        test.device.as_deref(),
    )?;
    let split = data_split(&mut plan, test.data.is_some(), &test.run_dir)?;
    // The loader as the run's test pass had it (eval batch, prefetch, placement).
    let args = run_flags(
        &crate::resume::run_folder(&test.run_dir)?,
        test.data.as_deref(),
        test.device.as_deref(),
    )?;
    let policy: DataOnDevice = args.data_on_device.parse()?;
    let free = redline_core::memory::stats(&plan.device)?.map(|m| m.device_free);
    let placement = place(policy, split.bytes(), free)?;
    let n = split.len();
    let loader = Loader::placed_host(
        split,
        plan.device.candle(),
        placement,
        LoaderConfig {
            batch_size: args.eval_batch_size,
            shuffle: false,
            seed: 0,
            prefetch: args.prefetch,
            drop_last: false,
        },
    )?;
    let mut trainer = Trainer::builder()
        .model_name(plan.model_cfg.name())
        .build(plan.step_kind.step(model), plan.device.clone())?;
    let r = trainer.test(&loader)?;
    let mut parts = vec![format!("test loss {:.4}", r.loss)];
    parts.extend(
        r.metrics
            .iter()
            .map(|(k, v)| format!("test {k} {}", show(k, v))),
    );
    println!(
        "{} | {n} samples | weights {}",
        parts.join(" | "),
        file.display()
    );
    Ok(())
}
