//! The run-folder stage of `redline train` (rank 0): a new folder, or the
//! stopped run's reopened at its checkpoint; its `config.toml`, input
//! fingerprints and `summary.json` header; its checkpoint settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use redline_run::Run;
use redline_train::checkpoint::{CheckpointConfig, Loaded};
use redline_train::TrainConfig;
use serde_json::{json, Value};

use super::loaders::Loaders;
use super::precision_note;
use crate::auto_flag::Auto;
use crate::cli::TrainArgs;
use crate::plan::Plan;

/// The run's folder, and the checkpoint a resumed run starts from.
pub(super) struct Folder {
    /// The folder's writer.
    pub run: Run,
    /// Its path.
    pub dir: PathBuf,
    /// The checkpoint to resume from (`--resume`).
    pub resume_from: Option<Loaded>,
    /// What a checkpoint of this run must match.
    pub identity: BTreeMap<String, Value>,
}

/// What a checkpoint must match: the flags as `recorded`, and the number of
/// ranks (`world`: a rank's loader position is a position in its shard).
pub(super) fn identity(
    recorded: &TrainArgs,
    world: usize,
) -> anyhow::Result<BTreeMap<String, Value>> {
    let mut id = crate::resume::identity(recorded)?;
    if world > 1 {
        id.insert("ranks".to_string(), json!(world));
    }
    Ok(id)
}

/// The checkpoint a run other than rank 0 resumes from: the one rank 0
/// chose (it sets refused ones aside first, then meets the others).
pub(super) fn other_rank_resume(
    args: &TrainArgs,
    plan: &Plan,
    shapes: &[(String, Vec<usize>)],
) -> anyhow::Result<Option<Loaded>> {
    let Some(dir) = args.resume.as_deref() else {
        return Ok(None);
    };
    plan.ranks
        .strategy
        .comm()
        .barrier("choosing the checkpoint to resume")?;
    let recorded = recorded_args(args, &plan.data_dir, dir, (plan.batch_size, plan.lr))?;
    let id = identity(&recorded, plan.ranks.launch.world_size)?;
    Ok(Some(
        crate::resume::load(dir, &id, shapes, args.max_steps)?.0,
    ))
}

/// Opens the run folder: new, or (`--resume`) the stopped run's, its data
/// checked against the run's and its checkpoint loaded; then writes its
/// input fingerprints and `config.toml`.
pub(super) fn open(
    args: &TrainArgs,
    plan: &Plan,
    shapes: &[(String, Vec<usize>)],
) -> anyhow::Result<Folder> {
    let world = plan.ranks.launch.world_size;
    let name = plan.model_cfg.name();
    // What the run reads, fingerprinted: a resume onto changed data is refused.
    let inputs_now = crate::resume::fingerprints(
        &plan.data_dir,
        args.init.as_deref(),
        args.tokenizer.as_deref(),
    )?;
    let wanted = (plan.batch_size, plan.lr);
    let (run, resume_from) = match args.resume.as_deref() {
        None => (Run::create(args.run_dir.as_deref(), name)?, None),
        Some(dir) => {
            let recorded = recorded_args(args, &plan.data_dir, dir, wanted)?;
            crate::resume::same_inputs(dir, &inputs_now, args.accept_changed_data)?;
            let id = identity(&recorded, world)?;
            let (loaded, at) = crate::resume::load(dir, &id, shapes, args.max_steps)?;
            let (run, kept) = Run::reopen(dir, name, &at)?;
            println!("  {}", kept.line());
            plan.ranks
                .strategy
                .comm()
                .barrier("choosing the checkpoint to resume")?;
            (run, Some(loaded))
        }
    };
    let dir = run.dir().to_path_buf();
    redline_run::inputs::record(&dir, &inputs_now)?;
    // A model file is copied into the run folder, and the config names the
    // copy: the run re-runs from its folder even after the file changes.
    let recorded = recorded_args(args, &plan.data_dir, &dir, wanted)?;
    if args.model.ends_with(".toml")
        && std::path::absolute(&args.model)? != Path::new(&recorded.model)
    {
        std::fs::copy(&args.model, &recorded.model)
            .with_context(|| format!("--model {}: copying it into the run folder", args.model))?;
    }
    let config = toml::to_string(&recorded).context("serialising the config")?;
    run.write_file(
        "config.toml",
        &format!(
            "# redline train --config {} runs this again (same seed, data and flags); \
             redline train --resume {} continues it\n{config}",
            dir.join("config.toml").display(),
            dir.display()
        ),
    )?;
    Ok(Folder {
        run,
        dir,
        resume_from,
        identity: identity(&recorded, world)?,
    })
}

/// The `summary.json` header: how the run is set up (device, precision,
/// ranks, batch, threads, data placement, schedule, short run, ...).
pub(super) fn describe(
    run: &mut Run,
    args: &TrainArgs,
    plan: &Plan,
    data: &Loaders,
    loop_cfg: &TrainConfig,
) -> anyhow::Result<()> {
    let world = plan.ranks.launch.world_size;
    let free_cores = redline_core::threads::last_free_cores()
        .unwrap_or_else(|| redline_core::threads::measure_free_cores(Duration::from_millis(100)));
    let validation = data
        .notes
        .iter()
        .find_map(|n| n.strip_prefix("validation: "));
    let schedule = &loop_cfg.schedule;
    for (k, v) in [
        ("device", json!(plan.device.to_string())),
        ("strategy", json!(if world > 1 { "ddp" } else { "single" })),
        ("world_size", json!(world)),
        ("launcher", json!(plan.ranks.launch.launcher.name())),
        ("batch_size", json!(data.batch_size)),
        ("accumulate", json!(args.accumulate)),
        ("threads", json!(plan.threads)),
        ("free_cores", json!(free_cores)),
        (
            "logical_cores",
            json!(redline_core::threads::usable_cores()),
        ),
        ("prefetch", json!(args.prefetch)),
        ("data_placement", json!(data.train.placement().to_string())),
        ("data_workers", json!(data.workers())),
        ("profiler", json!(plan.mode.to_string())),
        ("validation", json!(validation)),
        (
            "lr_schedule",
            json!((!schedule.is_constant()).then(|| schedule.to_string())),
        ),
        ("device_choice", json!(plan.device_choice)),
        (
            "short_run",
            json!(plan.short.describe(super::startup::batches(data))),
        ),
        ("fast_dev_run", json!(plan.short.fast_dev_run)),
        ("gpu_kernels_load_s", json!(plan.device.kernels_load_s())),
    ] {
        run.set(k, v)?;
    }
    let shape = crate::run_shape::RunShape {
        inputs: data.inputs.clone(),
        target: data.target,
    };
    for (k, v) in shape.to_json() {
        run.set(k, v)?;
    }
    let fused = redline_train::graph::reduced_kernels_on(loop_cfg.fused_kernels);
    let timing = plan.precision_timing.as_ref();
    for (k, v) in precision_note::fields(plan.precision, &plan.device, fused, timing) {
        run.set(k, v)?;
    }
    run.report(Box::new(|d| {
        redline_report::write_report(d).map_err(|e| e.to_string())
    }));
    Ok(())
}

/// Where and when the run checkpoints (`None` for a fast dev run, which
/// keeps nothing but its marked folder, and with `--no-checkpoint`); says
/// so on the startup lines.
pub(super) fn checkpoints(
    args: &TrainArgs,
    plan: &Plan,
    folder: &Folder,
    validates: bool,
) -> anyhow::Result<Option<CheckpointConfig>> {
    if plan.short.fast_dev_run.is_some() {
        return Ok(None);
    }
    let cfg =
        crate::resume::checkpoint_config(args, &folder.dir, folder.identity.clone(), validates)?;
    if let Some(c) = &cfg {
        println!(
            "  checkpoints: {} into {} (keep the last {} and the best by {})",
            c.every
                .map_or("each epoch end".to_string(), |n| format!("every {n} steps")),
            c.dir.display(),
            c.keep_last,
            c.monitor
                .as_ref()
                .map_or("-".to_string(), |(m, d)| format!("{m} ({})", d.as_str()))
        );
    }
    Ok(cfg)
}

/// The flags as the run folder's `config.toml` records them: paths
/// absolute, so the config re-runs from any folder, a model file named by
/// its copy in the run folder `dir`, and the batch size and rate used.
pub(super) fn recorded_args(
    args: &TrainArgs,
    data_dir: &Path,
    dir: &Path,
    (batch_size, lr): (usize, f64),
) -> anyhow::Result<TrainArgs> {
    let mut recorded = args.clone();
    // `auto` is recorded as what it found: a re-run or resume does not search again.
    recorded.batch_size = Auto::Value(batch_size);
    recorded.lr = Auto::Value(lr);
    recorded.data = Some(std::path::absolute(data_dir)?);
    if let Some(init) = &args.init {
        recorded.init = Some(std::path::absolute(init)?);
    }
    if args.model.ends_with(".toml") {
        recorded.model = std::path::absolute(dir.join("model.toml"))?
            .display()
            .to_string();
    }
    Ok(recorded)
}
