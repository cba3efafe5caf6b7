//! `redline test RUN_DIR|WEIGHTS`: a finished run's weights evaluated again,
//! on its own test split or on other data of its input shape, from the same
//! plan the run was trained from (its `config.toml`), as Lightning's
//! `trainer.test(ckpt_path=...)`. Nothing is written unless `--record`
//! appends the result to the run's `tests.jsonl`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use redline_data::{place, DataOnDevice, Dataset, Loader, LoaderConfig};
use redline_train::checkpoint;
use redline_train::Trainer;

use crate::cli::{Cli, Command, TestArgs, TrainArgs};
use crate::run_shape::RunShape;
use crate::summary::show;

/// The key in `--save`'s safetensors metadata that names the run folder the
/// weights were trained in.
pub const RUN_KEY: &str = "redline_run";

/// The file `--record` appends one line to per evaluation.
pub const RECORD: &str = "tests.jsonl";

/// The run folder `arg` names, and the weights file when `arg` is one: a
/// `.safetensors` file inside a run folder (a checkpoint's), or one whose
/// metadata names its run (`--save`'s).
fn locate(arg: &Path, command: &str) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    if !arg.is_file() {
        return Ok((crate::resume::run_folder(arg, command)?, None));
    }
    let shown = arg.display();
    if arg.extension().is_none_or(|e| e != "safetensors") {
        bail!(
            "{command} {shown}: neither a run folder nor a .safetensors weights file\nHINT: give \
             a folder under runs/ (`redline runs` lists them), `last`, or a weights file"
        );
    }
    let file = std::path::absolute(arg)?;
    if let Some(dir) = file
        .ancestors()
        .skip(1)
        .find(|d| d.join("config.toml").is_file())
    {
        return Ok((dir.to_path_buf(), Some(file)));
    }
    let meta = redline_models::params::safetensors_metadata(&file)?;
    match meta.get(RUN_KEY).map(PathBuf::from) {
        Some(dir) if dir.join("config.toml").is_file() => Ok((dir, Some(file))),
        Some(dir) => bail!(
            "{command} {shown}: these weights were trained in {}, which is no longer a run \
             folder (its config.toml, the job, is gone)\nHINT: {command} RUN_DIR --checkpoint \
             {shown} with the run folder of the same job",
            dir.display()
        ),
        None => bail!(
            "{command} {shown}: a weights file outside any run folder, and it does not name its \
             run (Redline's --save records it), so the model and data are unknown\nHINT: \
             {command} RUN_DIR --checkpoint {shown} with the run folder of its job"
        ),
    }
}

/// The run's flags from its `config.toml`, with `--data`/`--device`
/// overrides, and nothing it would write (no `--save`, `--metrics`) nor
/// load (`--init`, returned beside them).
fn run_flags(
    dir: &Path,
    data: Option<&Path>,
    device: Option<&str>,
) -> anyhow::Result<(TrainArgs, Option<PathBuf>)> {
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
    let init = args.init.take();
    Ok((*args, init))
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

/// A finished run's model, ready to evaluate or predict: its job's plan
/// (the data read), its flags, the model with its weights, their file.
pub struct RunModel {
    /// The run's job, on `--data` if given.
    pub plan: crate::plan::Plan,
    /// The run's flags (`config.toml`, with the overrides).
    pub args: TrainArgs,
    /// The model, its weights loaded.
    pub model: Box<dyn redline_models::Model>,
    /// The weights file.
    pub file: PathBuf,
    /// The run folder.
    pub dir: PathBuf,
    /// The data shape the model was built for (the run's).
    pub shape: RunShape,
}

/// A finished run's job without its model: the plan, the flags, the
/// weights file `--checkpoint` names, the run folder and the data shape the
/// model was built for. `redline sample` and `export` build their GPT from
/// it; `test` and `predict` take [`run_model`].
pub struct RunJob {
    /// The run's job, on `--data` if given.
    pub plan: crate::plan::Plan,
    /// The run's flags (`config.toml`, with the overrides).
    pub args: TrainArgs,
    /// The weights file.
    pub file: PathBuf,
    /// The run folder.
    pub dir: PathBuf,
    /// The data shape the model was built for (the run's).
    pub shape: RunShape,
    /// The weights the run started from (its `--init`).
    pub init: Option<PathBuf>,
}

/// The job of the run folder `run_dir` (its `config.toml`'s, on `data` if
/// given) and the weights `checkpoint` names; `command` names the command
/// in errors.
pub fn run_job(
    command: &str,
    run_dir: &Path,
    data: Option<&Path>,
    checkpoint: &str,
    device: Option<&str>,
) -> anyhow::Result<RunJob> {
    let (dir, given) = locate(run_dir, command)?;
    let (args, init) = run_flags(&dir, data, device)?;
    let file = match given {
        Some(_) if checkpoint != "last" => bail!(
            "{command}: {} is a weights file already; --checkpoint {checkpoint} names \
             another\nHINT: give one of them",
            run_dir.display()
        ),
        Some(f) => f,
        None => weights(&dir, checkpoint, &args)?,
    };
    // The run's model (its head), on data it can take.
    let recorded = RunShape::of_run(&dir);
    let plan = crate::plan::prepare_for(&args, recorded.as_ref())?;
    let shape = recorded.unwrap_or_else(|| RunShape {
        inputs: plan.prepared.train.input_dims().to_vec(),
        target: plan.prepared.train.target(),
    });
    Ok(RunJob {
        plan,
        args,
        file,
        dir,
        shape,
        init,
    })
}

impl RunJob {
    /// The error for weights that do not fit the model the data makes.
    pub fn misfit(&self) -> String {
        format!(
            "the weights {} do not fit the model this data makes ({}, inputs {:?}, {}): give \
             data of the run's input shape and classes",
            self.file.display(),
            self.plan.model_cfg.name(),
            self.plan.prepared.train.input_dims(),
            self.plan.prepared.train.target()
        )
    }
}

/// The model of the run folder `run_dir` ([`run_job`]) with its weights
/// loaded.
pub fn run_model(
    command: &str,
    run_dir: &Path,
    data: Option<&Path>,
    checkpoint: &str,
    device: Option<&str>,
) -> anyhow::Result<RunModel> {
    let job = run_job(command, run_dir, data, checkpoint, device)?;
    let model = job
        .plan
        .model_cfg
        .build(&job.plan.device, job.plan.precision, job.args.seed)?;
    model
        .params()
        .load_safetensors(&job.file)
        .with_context(|| job.misfit())?;
    let RunJob {
        plan,
        args,
        file,
        dir,
        shape,
        ..
    } = job;
    Ok(RunModel {
        plan,
        args,
        model,
        file,
        dir,
        shape,
    })
}

impl RunModel {
    /// A loader of the split to evaluate or predict on, as the run's test
    /// pass had it (eval batch, prefetch, placement), and its samples: the
    /// data's test split, else (for `other` data than the run's) all of it.
    pub fn loader(&mut self, other: bool) -> anyhow::Result<(Loader, usize)> {
        let prepared = &mut self.plan.prepared;
        let split = match (prepared.test.take(), other) {
            (Some(t), _) => t,
            (None, true) => prepared.train.take(),
            (None, false) => bail!(
                "the run's data has no test split\nHINT: give data to evaluate on: --data PATH"
            ),
        };
        let policy: DataOnDevice = self.args.data_on_device.parse()?;
        let free = redline_core::memory::stats(&self.plan.device)?.map(|m| m.device_free);
        let placement = place(policy, split.bytes(), free)?;
        let n = split.len();
        let cfg = LoaderConfig {
            batch_size: self.args.eval_batch_size,
            shuffle: false,
            seed: 0,
            prefetch: self.args.prefetch,
            drop_last: false,
        };
        let loader = Loader::placed_host(split, self.plan.device.candle(), placement, cfg)?;
        Ok((loader, n))
    }
}

/// Runs `redline test`.
pub fn run(test: &TestArgs) -> anyhow::Result<()> {
    let mut run = run_model(
        "redline test",
        &test.run_dir,
        test.data.as_deref(),
        &test.checkpoint,
        test.device.as_deref(),
    )?;
    let (loader, n) = run.loader(test.data.is_some())?;
    let RunModel {
        plan,
        model,
        file,
        dir,
        ..
    } = run;
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
    if test.record {
        let mut line = serde_json::json!({
            "unix": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            "weights": file,
            "data": plan.data_dir,
            "samples": n,
            "test_loss": r.loss,
        });
        for (k, v) in r.metrics.iter() {
            line[format!("test_{k}")] = serde_json::json!(v);
        }
        let at = dir.join(RECORD);
        match at.exists() {
            true => redline_core::files::LineFile::append_to(&at),
            false => redline_core::files::LineFile::create(&at),
        }
        .and_then(|mut f| f.append(&line.to_string()))
        .with_context(|| format!("--record: appending to {}", at.display()))?;
        println!("recorded in {}", at.display());
    }
    Ok(())
}
