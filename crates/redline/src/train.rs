//! `redline train`: resolve flags into configs, build, fit, report, save.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use redline_core::Precision;
use redline_data::Loader;
use redline_profile::Mode;
use redline_train::{JsonlMetrics, Trainer};
use serde_json::json;

use crate::auto_flag::Auto;
use crate::cli::TrainArgs;
use crate::plan::Plan;
use crate::progress::Progress;
use crate::signals::Stopped;
use redline_run::{Ending, Run};

mod loaders;
mod loop_config;
mod precision_note;
mod results;

/// Runs `redline train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    // `--devices N` alone: this command again as N ranks under mpirun.
    if let Some(status) = crate::dist::spawn(args.devices, &args.strategy)? {
        if !status.success() {
            bail!(
                "the {} ranks ended with {status} (their errors are above)",
                args.devices.unwrap_or(1)
            );
        }
        return Ok(());
    }
    let mut plan = crate::plan::prepare(args)?;
    // `auto` flags are settled by measurement on this very job.
    let tuned = crate::tune::resolve(args, &mut plan)?;
    let Plan {
        stop,
        threads,
        opt_cfg,
        lr,
        batch_size: wanted_batch,
        schedule,
        early_stop,
        data_dir,
        mode,
        monitor_every,
        short,
        prepared,
        model_cfg,
        step_kind,
        device,
        device_choice,
        seed: _,
        ranks,
        precision,
        precision_timing,
        loss_scale,
    } = plan;
    let world = ranks.launch.world_size;
    let data = loaders::build(
        args,
        prepared,
        &device,
        &ranks.strategy,
        &short,
        wanted_batch,
    )?;
    let batch_size = data.batch_size;
    let (train_n, val_n, test_n) = data.counts;
    let (train_loader, val_loader, test_loader) = (data.train, data.val, data.test);

    let model = model_cfg.build(&device, precision, args.seed)?;
    if let Some(init) = &args.init {
        model.params().load_safetensors(init).context("--init")?;
    }
    // What a checkpoint to resume from must hold: `(name, shape)` in order.
    let shapes: Vec<(String, Vec<usize>)> = model
        .params()
        .state()
        .map(|(n, v)| (n.to_string(), v.as_tensor().dims().to_vec()))
        .collect();
    stop.check("building the model")?;
    println!(
        "redline: {} ({} params) on {} ({} compute threads), {} batch {}, lr {}, loss {}{}",
        model_cfg.name(),
        model.params().numel(),
        device,
        threads,
        args.optimizer,
        batch_size,
        lr,
        step_kind,
        match precision {
            Precision::Fp32 => String::new(),
            p => format!(", precision {p}"),
        }
    );
    if !schedule.is_constant() {
        println!("  lr schedule: {schedule} (base lr {lr})");
    }
    if let Some(es) = &early_stop {
        println!("  early stop: {es}");
    }
    println!(
        "data: {} ({}; inputs {:?}, {}): {} train / {} val / {} test, {}",
        data_dir.display(),
        data.format,
        data.inputs,
        data.target,
        train_n,
        val_n,
        test_n,
        train_loader.placement(),
    );
    for note in &data.notes {
        println!("  {note}");
    }
    // The batches an epoch of each split runs, as limited.
    let ran = [
        Some(train_loader.batches_per_epoch()),
        val_loader.as_ref().map(Loader::batches_per_epoch),
        test_loader.as_ref().map(Loader::batches_per_epoch),
    ];
    if let Some(line) = short.describe(ran) {
        println!("  {line}");
    }
    let validation = data
        .notes
        .iter()
        .find_map(|n| n.strip_prefix("validation: "))
        .map(str::to_string);

    // The loop's settings, checked before the run folder exists, so that a bad
    // value leaves nothing behind.
    let loop_cfg = loop_config::build(args, &short, (schedule, early_stop, loss_scale))?;
    let loop_cfg_schedule = loop_cfg.schedule.clone();
    loop_config::print_accumulation(args, batch_size);

    // What a checkpoint must match: the flags, and the number of ranks (a
    // rank's loader position is a position in its shard).
    let identity = |recorded: &TrainArgs| -> anyhow::Result<_> {
        let mut id = crate::resume::identity(recorded)?;
        if world > 1 {
            id.insert("ranks".to_string(), json!(world));
        }
        Ok(id)
    };
    if !ranks.is_global_zero() {
        // Ranks other than 0 train their shard and keep no folder.
        let resume_from = match args.resume.as_deref() {
            None => None,
            Some(dir) => {
                // Rank 0 picks the checkpoint (and sets refused ones aside) first.
                ranks
                    .strategy
                    .comm()
                    .barrier("choosing the checkpoint to resume")?;
                let recorded = recorded_args(args, &data_dir, dir, (wanted_batch, lr))?;
                Some(crate::resume::load(dir, &identity(&recorded)?, &shapes, args.max_steps)?.0)
            }
        };
        let mut trainer = Trainer::builder()
            .config(loop_cfg)
            .optimizer(opt_cfg)
            .model_name(model_cfg.name())
            .stop_when(Arc::clone(&stop.flag))
            .strategy(ranks.strategy)
            .build(step_kind.step(model), device)?;
        if let Some(loaded) = resume_from {
            trainer.resume_from(loaded)?;
        }
        trainer.fit(&train_loader, val_loader.as_ref())?;
        if let Some(t) = &test_loader {
            trainer.test(t)?;
        }
        return Ok(());
    }
    // What the run reads, fingerprinted: a resume onto changed data is refused.
    let inputs_now = crate::resume::fingerprints(&data_dir, args.init.as_deref())?;
    // A resumed run reopens its folder at the checkpoint; a new one makes its own.
    let (mut run, resume_from) = match args.resume.as_deref() {
        None => (
            Run::create(args.run_dir.as_deref(), model_cfg.name())?,
            None,
        ),
        Some(dir) => {
            let recorded = recorded_args(args, &data_dir, dir, (wanted_batch, lr))?;
            crate::resume::same_inputs(dir, &inputs_now, args.accept_changed_data)?;
            let (loaded, at) =
                crate::resume::load(dir, &identity(&recorded)?, &shapes, args.max_steps)?;
            let (run, kept) = Run::reopen(dir, model_cfg.name(), &at)?;
            println!("  {}", kept.line());
            ranks
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
    let recorded = recorded_args(args, &data_dir, &dir, (wanted_batch, lr))?;
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
    // `detailed`: this thread and the monitor's record into one trace, which
    // the trainer's profiler joins and writes.
    let tracer = (mode == Mode::Detailed).then(redline_core::trace::Tracer::new);
    let _traced = tracer.as_ref().map(redline_core::trace::Tracer::attach);
    if args.monitor_interval > 0.0 {
        run.monitor(monitor_every);
    }
    let free_cores = redline_core::threads::last_free_cores()
        .unwrap_or_else(|| redline_core::threads::measure_free_cores(Duration::from_millis(100)));
    for (k, v) in [
        ("device", json!(device.to_string())),
        ("strategy", json!(if world > 1 { "ddp" } else { "single" })),
        ("world_size", json!(world)),
        ("launcher", json!(ranks.launch.launcher.name())),
        ("batch_size", json!(batch_size)),
        ("accumulate", json!(args.accumulate)),
        ("threads", json!(threads)),
        ("free_cores", json!(free_cores)),
        (
            "logical_cores",
            json!(redline_core::threads::usable_cores()),
        ),
        ("prefetch", json!(args.prefetch)),
        (
            "data_placement",
            json!(train_loader.placement().to_string()),
        ),
        ("profiler", json!(mode.to_string())),
        ("validation", json!(validation)),
        (
            "lr_schedule",
            json!((!loop_cfg_schedule.is_constant()).then(|| loop_cfg_schedule.to_string())),
        ),
        ("device_choice", json!(device_choice)),
        ("short_run", json!(short.describe(ran))),
        ("fast_dev_run", json!(short.fast_dev_run)),
        ("gpu_kernels_load_s", json!(device.kernels_load_s())),
    ] {
        run.set(k, v)?;
    }
    let fused = redline_train::graph::reduced_kernels_on(loop_cfg.fused_kernels);
    for (k, v) in precision_note::fields(precision, &device, fused, precision_timing.as_ref()) {
        run.set(k, v)?;
    }
    tuned.record(&mut run)?;
    run.report(Box::new(|d| {
        redline_report::write_report(d).map_err(|e| e.to_string())
    }));

    // A dev run keeps nothing but its marked folder.
    let checkpoints = match short.fast_dev_run {
        Some(_) => None,
        None => crate::resume::checkpoint_config(
            args,
            &dir,
            identity(&recorded)?,
            val_loader.is_some(),
        )?,
    };
    // The run folder, and its checkpoints' folder.
    let resumable = checkpoints.as_ref().map(|c| (dir.clone(), c.dir.clone()));
    if let Some(c) = &checkpoints {
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
    let mut builder = Trainer::builder()
        .profiler(mode)
        .callback(run.callback())
        .config(loop_cfg)
        .optimizer(opt_cfg)
        .model_name(model_cfg.name())
        .callback(Box::new(Progress::new()));
    if let Some(path) = &args.metrics {
        if let Some(bytes) = JsonlMetrics::existing(path) {
            println!(
                "  --metrics {}: the file exists ({bytes} bytes); this run's records are appended \
                 after what it holds",
                path.display()
            );
        }
        builder = builder.callback(Box::new(JsonlMetrics::create(path)?));
    }
    builder = builder
        .stop_when(Arc::clone(&stop.flag))
        .strategy(ranks.strategy);
    if let Some(c) = checkpoints {
        builder = builder.checkpoints(c);
    }
    let mut trainer = builder.build(step_kind.step(model), device)?;
    if let Some(loaded) = resume_from {
        trainer.resume_from(loaded)?;
    }
    // Lightning's `trainer.test` after `fit`: the test split, reported as test_*.
    let fit = trainer
        .fit(&train_loader, val_loader.as_ref())
        .and_then(|f| {
            let test = match test_loader.as_ref().map(|t| trainer.test(t)).transpose() {
                // The evaluation loop knows no step: the fit's last is named.
                Err(redline_train::Error::Interrupted { .. }) => {
                    return Err(redline_train::Error::Interrupted {
                        step: f.steps,
                        epoch: f.epochs,
                    })
                }
                other => other?,
            };
            Ok((f, test))
        });
    // A signal after the last step: the run's records are complete, but it
    // ends as interrupted and --save is left alone, as during training.
    let fit = match fit {
        Ok((f, _)) if stop.flag.load(Ordering::Relaxed) => Err(redline_train::Error::Interrupted {
            step: f.steps,
            epoch: f.epochs,
        }),
        other => other,
    };
    // Weights no step changed are not a result: `--save` is left alone.
    let untrained = fit.as_ref().ok().and_then(|(f, _)| results::untrained(f));
    let saved = match (&fit, &args.save) {
        (Ok(_), Some(path)) if short.fast_dev_run.is_none() && untrained.is_none() => {
            Some(trainer.save_weights(path).context("--save").map(|()| path))
        }
        _ => None,
    };
    // After fit the pool was trimmed: peak is the run's high-water mark.
    if let Ok(Some(mem)) = trainer.memory() {
        println!(
            "device memory: peak allocated {:.1} MiB, pool {:.1} MiB after trim, {:.1} of {:.1} GiB free",
            mem.peak_allocated as f64 / 1048576.0,
            mem.reserved as f64 / 1048576.0,
            mem.device_free as f64 / 1073741824.0,
            mem.device_total as f64 / 1073741824.0
        );
    }
    let outcome = match (fit, saved) {
        (Err(redline_train::Error::Interrupted { step, epoch }), _) => {
            let log = trainer.checkpoint_log();
            Err(anyhow::Error::new(Stopped {
                signal: stop.signal.load(Ordering::Relaxed) as i32,
                step,
                epoch,
                during: None,
                // Only a folder that holds a checkpoint can be resumed (this
                // process's, or an earlier one's before a resume).
                resume: resumable
                    .filter(|(_, c)| !redline_train::checkpoint::list(c).is_empty())
                    .map(|(d, _)| d),
                checkpoint: log.stop.clone().map(|r| r.map(|_| ())),
            }))
        }
        (Err(e), _) => Err(anyhow::Error::from(e)),
        (Ok(_), Some(Err(e))) => Err(e),
        (Ok(f), _) => Ok(f),
    };
    if let Ok((fit, test)) = &outcome {
        results::print(args, (fit, test.as_ref()), &trainer, batch_size)?;
        results::print_save(args, short.fast_dev_run, untrained.as_deref());
    }
    let message = outcome.as_ref().err().map(|e| format!("{e:#}"));
    let ending = match (&outcome, &message) {
        (Ok((fit, test)), _) => Ending::Finished {
            fit,
            test: test.as_ref(),
        },
        (Err(e), Some(m)) if e.downcast_ref::<Stopped>().is_some() => Ending::Interrupted(m),
        (Err(_), m) => Ending::Failed(m.as_deref().unwrap_or_default()),
    };
    let done = run.finish(&mut trainer, ending)?;
    results::report(&done);
    outcome.map(|_| ())
}

/// The flags as the run folder's `config.toml` records them: paths
/// absolute, so the config re-runs from any folder, a model file named by
/// its copy in the run folder `dir`, and the batch size and rate used.
fn recorded_args(
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
