//! `redline train`: resolve flags into configs, build, fit, report, save.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use redline_core::{DeviceSpec, Precision};
use redline_data::{
    place, Augmented, DataOnDevice, Dataset, HostData, Loader, LoaderConfig, Placement,
};
use redline_models::ModelConfig;
use redline_profile::Mode;
use redline_train::{GradClip, JsonlMetrics, OptimizerConfig, TrainConfig, Trainer};
use serde_json::json;

use crate::cli::TrainArgs;
use crate::data_flags::{augment, data_options, hidden};
use crate::progress::Progress;
use crate::signals::{stop_on_signals, Stopped};
use crate::step_kind::StepKind;
use crate::summary;
use redline_run::{Ending, Finished, Run};

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
    if args.momentum != 0.0 && !matches!(cfg, OptimizerConfig::Sgd { .. }) {
        bail!(
            "--momentum applies to --optimizer sgd only\nHINT: Adam's momentum is --beta1 (now {})",
            args.beta1
        );
    }
    // Checked now, before any data is read or a run folder exists.
    cfg.check()?;
    Ok(cfg)
}

/// Runs `redline train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    // First of all: a signal at any phase (loading, building, training,
    // writing) stops the run the same way, never is ignored.
    let stop = stop_on_signals()?;
    if let Some(n) = args.threads {
        redline_core::threads::check(n).map_err(anyhow::Error::msg)?;
    }
    if let Some(s) = args
        .image_size
        .filter(|s| !(1..=MAX_IMAGE_SIZE).contains(s))
    {
        bail!("--image-size {s}: give a side from 1 to {MAX_IMAGE_SIZE} pixels");
    }
    let threads = redline_core::threads::configure(args.threads);
    let spec: DeviceSpec = args.device.parse()?;
    // An unusable device is refused now, before any data is read; `auto`
    // with a GPU present is settled by timing the job on both, below.
    let selected = redline_core::select(spec, &redline_core::GpuAvailability::probe())?;
    let opt_cfg = optimizer(args)?;
    if args.keep_last == 0 {
        bail!("--keep-last 0: keep at least 1 checkpoint (the resume point)\nHINT: --no-checkpoint writes none");
    }
    if args.checkpoint_every == Some(0) {
        bail!("--checkpoint-every 0: give a number of optimizer steps (at least 1)");
    }
    let schedule: redline_train::LrSchedule = args.lr_schedule.parse()?;
    let early_stop: Option<redline_train::EarlyStop> =
        args.early_stop.as_deref().map(str::parse).transpose()?;
    // Process-wide, as PyTorch's: the device probe below times the same math.
    redline_core::set_matmul_precision(args.matmul_precision.parse()?);
    let data_dir = match &args.data {
        Some(d) => d.clone(),
        None => default_data_dir()?,
    };
    if args.batch_size == 0 || args.eval_batch_size == 0 {
        bail!("--batch-size and --eval-batch-size must be at least 1");
    }
    let mode: Mode = args.profiler.parse()?;
    // 0 turns sampling off.
    let monitor_every = crate::cli::seconds("--monitor-interval", args.monitor_interval)?;
    if args.prefetch > MAX_PREFETCH {
        bail!(
            "--prefetch {}: at most {MAX_PREFETCH} batches ahead (each one is a whole batch held \
             in memory)\nHINT: 2 to 4 keeps a device fed; more only helps a loader that stalls \
             now and then",
            args.prefetch
        );
    }
    for (flag, path) in [("--save", &args.save), ("--metrics", &args.metrics)] {
        if let Some(path) = path {
            check_writable(flag, path, args.run_dir.as_deref())?;
        }
    }
    if let (Some(s), Some(m)) = (&args.save, &args.metrics) {
        if std::path::absolute(s)? == std::path::absolute(m)? {
            bail!(
                "--save and --metrics both name {}: one would overwrite the other\nHINT: give them \
                 different files",
                s.display()
            );
        }
    }

    let short = crate::short_runs::ShortRun::from_args(args)?;
    let data = data_options(args)?;
    // The model a table implies, checked from its first row before the table
    // is read: a file of 50 million columns is refused in a moment.
    if let Some(inputs) = redline_data::peek_inputs(&data_dir, &data)
        .with_context(|| format!("--data {}", data_dir.display()))?
    {
        // A model that does not fit the data says so as it would later; one
        // too large for memory is refused before any allocation.
        ModelConfig::for_inputs(&args.model, &inputs, 1, hidden(args)?.as_deref())?
            .build(&redline_core::Device::cpu(), Precision::Fp32, 0)
            .with_context(|| {
                format!(
                    "--data {}: its {} features imply a model too large for this machine",
                    data_dir.display(),
                    inputs.iter().product::<usize>()
                )
            })?;
    }
    println!("loading {} ...", data_dir.display());
    let prepared = match redline_data::prepare_until(&data_dir, &data, &stop.flag) {
        Err(redline_data::Error::Interrupted) => return Err(stop.stopped("reading the data")),
        other => other.with_context(|| format!("--data {}", data_dir.display()))?,
    };
    stop.check("reading the data")?;
    let (inputs, target) = (prepared.train.input_dims.clone(), prepared.train.target);
    let model_cfg = ModelConfig::for_data(
        &args.model,
        &inputs,
        target.classes().unwrap_or(target.width()),
        hidden(args)?.as_deref(),
    )?;
    let step_kind = StepKind::resolve(&args.loss, target)?;
    let job = crate::auto_device::Job {
        train: &prepared.train,
        model: &model_cfg,
        step: step_kind,
        optimizer: &opt_cfg,
        batch_size: args.batch_size,
        seed: args.seed,
    };
    let (device, device_choice) = crate::auto_device::choose(spec, selected, &job)?;
    if let Some(line) = &device_choice {
        println!("{line}");
    }
    if let Some(s) = device.kernels_load_s().filter(|&s| s >= 1.0) {
        println!(
            "GPU kernels: compiled for this GPU in {s:.1} s before training (a first run on \
             this machine; the driver caches them)"
        );
    }
    let policy: DataOnDevice = args.data_on_device.parse()?;
    // Read on the host, then placed: uploaded once, or streamed per batch.
    let mut device_free = redline_core::memory::stats(&device)?.map(|m| m.device_free);
    let mut load = |data: HostData, cfg: LoaderConfig| -> anyhow::Result<Loader> {
        let placement = place(policy, data.bytes(), device_free)?;
        if let (Placement::Resident, Some(free)) = (placement, device_free.as_mut()) {
            *free = free.saturating_sub(data.bytes());
        }
        Ok(Loader::placed_host(data, device.candle(), placement, cfg)?)
    };
    let eval_cfg = LoaderConfig {
        batch_size: args.eval_batch_size,
        shuffle: false,
        seed: 0,
        prefetch: args.prefetch,
        drop_last: false,
    };
    let (train_n, val_n, test_n) = (
        prepared.train.len(),
        prepared.val.as_ref().map_or(0, |v| v.len()),
        prepared.test.as_ref().map_or(0, |t| t.len()),
    );
    // A stated clamp: a batch larger than the data is the whole data.
    let batch_size = args.batch_size.min(train_n.max(1));
    if batch_size < args.batch_size {
        println!(
            "  --batch-size {} is more than the {train_n} training samples: each step uses all \
             {train_n} (batch {batch_size})",
            args.batch_size
        );
    }
    let train_cfg = LoaderConfig {
        batch_size,
        // Overfitting takes the same batches every epoch.
        shuffle: !args.no_shuffle && !short.overfit,
        seed: args.seed,
        prefetch: args.prefetch,
        drop_last: false,
    };
    let train_loader = match augment(args)? {
        Some(_) if policy == DataOnDevice::On => bail!(
            "--augment transforms batches on the loader thread, so the training split streams; \
             it cannot be combined with --data-on-device on"
        ),
        // Transforms run while gathering on the loader thread: the split streams.
        Some(aug) => Loader::from_dataset(
            Arc::new(Augmented::new(prepared.train, aug, args.seed)?),
            device.candle(),
            train_cfg,
        )?,
        None => load(prepared.train, train_cfg)?,
    };
    use crate::short_runs::{apply, Limit};
    let train_loader = apply("--limit-train-batches", train_loader, short.train)?;
    // A limit of 0 batches is no pass at all.
    let none = |l: Option<Limit>| l == Some(Limit::Batches(0));
    let (val_loader, test_loader) = if args.no_validate {
        (None, None)
    } else {
        let test = prepared
            .test
            .filter(|_| !none(short.test))
            .map(|t| load(t, eval_cfg.clone()))
            .transpose()?
            .map(|l| apply("--limit-test-batches", l, short.test))
            .transpose()?;
        let val = prepared
            .val
            .filter(|_| !none(short.val))
            .map(|v| load(v, eval_cfg))
            .transpose()?
            .map(|l| apply("--limit-val-batches", l, short.val))
            .transpose()?;
        (val, test)
    };

    let model = model_cfg.build(&device, Precision::Fp32, args.seed)?;
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
        "redline: {} ({} params) on {} ({} compute threads), {} batch {}, lr {}, loss {}",
        model_cfg.name(),
        model.params().numel(),
        device,
        threads,
        args.optimizer,
        batch_size,
        args.lr,
        step_kind
    );
    if !schedule.is_constant() {
        println!("  lr schedule: {schedule} (base lr {})", args.lr);
    }
    if let Some(es) = &early_stop {
        println!("  early stop: {es}");
    }
    println!(
        "data: {} ({}; inputs {:?}, {}): {} train / {} val / {} test, {}",
        data_dir.display(),
        prepared.format,
        inputs,
        target,
        train_n,
        val_n,
        test_n,
        train_loader.placement(),
    );
    for note in &prepared.notes {
        println!("  {note}");
    }
    if let Some(line) = short.describe() {
        println!("  {line}");
    }
    let validation = prepared
        .notes
        .iter()
        .find_map(|n| n.strip_prefix("validation: "))
        .map(str::to_string);

    // The loop's settings, checked before the run folder exists, so that a bad
    // value leaves nothing behind.
    let loop_cfg = TrainConfig {
        epochs: if short.fast_dev_run.is_some() {
            1
        } else {
            args.epochs
        },
        max_steps: args.max_steps,
        log_every: args.log_every,
        accumulate: args.accumulate,
        clip: grad_clip(args),
        log_grad_norm: args.log_grad_norm,
        divergence_threshold: (args.divergence_threshold != 0.0)
            .then_some(args.divergence_threshold),
        validate: !args.no_validate,
        empty_cache: args.empty_cache,
        cuda_graph: args.cuda_graph.parse()?,
        kernel_trace: args.kernel_trace == "on",
        fused_kernels: args.fused_kernels.parse()?,
        schedule,
        early_stop,
    };
    loop_cfg.check()?;
    let loop_cfg_schedule = loop_cfg.schedule.clone();
    if args.accumulate > 1 {
        println!(
            "  accumulating {} micro-batches of {} per optimizer step (effective batch {})",
            args.accumulate,
            batch_size,
            args.accumulate.saturating_mul(batch_size)
        );
    }

    // A resumed run reopens its folder at the checkpoint; a new one makes its own.
    let (mut run, resume_from) = match args.resume.as_deref() {
        None => (
            Run::create(args.run_dir.as_deref(), model_cfg.name())?,
            None,
        ),
        Some(dir) => {
            let recorded = recorded_args(args, &data_dir, dir)?;
            let (loaded, at) =
                crate::resume::load(dir, &crate::resume::identity(&recorded)?, &shapes)?;
            let (run, kept) = Run::reopen(dir, model_cfg.name(), &at)?;
            println!("  {}", kept.line());
            (run, Some(loaded))
        }
    };
    let dir = run.dir().to_path_buf();
    // A model file is copied into the run folder, and the config names the
    // copy: the run re-runs from its folder even after the file changes.
    let recorded = recorded_args(args, &data_dir, &dir)?;
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
        ("short_run", json!(short.describe())),
        ("fast_dev_run", json!(short.fast_dev_run)),
        ("gpu_kernels_load_s", json!(device.kernels_load_s())),
    ] {
        run.set(k, v)?;
    }
    run.report(Box::new(|d| {
        redline_report::write_report(d).map_err(|e| e.to_string())
    }));

    // A dev run keeps nothing but its marked folder.
    let checkpoints = match short.fast_dev_run {
        Some(_) => None,
        None => crate::resume::checkpoint_config(args, &dir, crate::resume::identity(&recorded)?)?,
    };
    let resumable = checkpoints.as_ref().map(|_| dir.clone());
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
        builder = builder.callback(Box::new(JsonlMetrics::create(path)?));
    }
    builder = builder.stop_when(Arc::clone(&stop.flag));
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
            Ok((
                f,
                test_loader.as_ref().map(|t| trainer.test(t)).transpose()?,
            ))
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
    let saved = match (&fit, &args.save) {
        (Ok(_), Some(path)) if short.fast_dev_run.is_none() => {
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
            Err(anyhow::Error::new(Stopped {
                signal: stop.signal.load(Ordering::Relaxed) as i32,
                step,
                epoch,
                during: None,
                resume: resumable,
            }))
        }
        (Err(e), _) => Err(anyhow::Error::from(e)),
        (Ok(_), Some(Err(e))) => Err(e),
        (Ok(f), _) => Ok(f),
    };
    if let Ok((fit, test)) = &outcome {
        summary::print(fit, test.as_ref(), batch_size)?;
        if !trainer.device().is_cpu() {
            println!("cuda graph: {}", fit.cuda_graph);
        }
        if let Some(p) = fit.matmul_precision {
            println!("matmul precision: {}", p.describe());
        } else if args.matmul_precision != "highest" {
            println!(
                "matmul precision: --matmul-precision {} has no effect on the CPU (its fp32 \
                 products are always full fp32)",
                args.matmul_precision
            );
        }
        match &fit.gpu_busy {
            Some(Ok(g)) => println!("{}", g.line()),
            Some(Err(why)) => println!("GPU busy: not measured: {why}"),
            None => {}
        }
        if let Some(c) = &fit.checkpoints {
            println!(
                "checkpoints: {} written{}",
                c.written,
                c.last
                    .as_ref()
                    .map_or(String::new(), |p| format!(", the last {}", p.display()))
            );
            for f in &c.failed {
                println!("  checkpoint failed: {f}");
            }
        }
        match (&args.save, short.fast_dev_run) {
            (Some(path), None) => println!("saved weights to {}", path.display()),
            (Some(path), Some(_)) => println!(
                "--save {}: not written by a fast dev run (it checks that the run works)",
                path.display()
            ),
            (None, _) => {}
        }
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
    report(&done);
    outcome.map(|_| ())
}

/// Prints what the run left behind: the profile table and breakdown line,
/// the trace, and where the folder and report are.
fn report(done: &Finished) {
    if let Some(p) = &done.profile {
        if p.mode != Mode::Off {
            print!("{}", p.table());
        }
        if let Some(t) = &p.trace {
            println!(
                "trace: {} ({} spans; open in https://ui.perfetto.dev or chrome://tracing)",
                done.dir.join("trace.json").display(),
                t.spans.len()
            );
        }
        println!("{}", p.breakdown.line());
    }
    match &done.report {
        Some(Ok(page)) => println!(
            "run folder: {}  (report: {})",
            done.dir.display(),
            page.display()
        ),
        Some(Err(e)) => {
            println!("run folder: {}", done.dir.display());
            eprintln!("warning: report not written: {e}");
        }
        None => println!("run folder: {}", done.dir.display()),
    }
}

/// The flags as the run folder's `config.toml` records them: paths
/// absolute, so the config re-runs from any folder, and a model file named
/// by its copy in the run folder `dir`.
fn recorded_args(args: &TrainArgs, data_dir: &Path, dir: &Path) -> anyhow::Result<TrainArgs> {
    let mut recorded = args.clone();
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

/// `--clip-grad-norm` / `--clip-grad-value` (clap refuses both at once).
fn grad_clip(args: &TrainArgs) -> Option<GradClip> {
    match (args.clip_grad_norm, args.clip_grad_value) {
        (Some(max_norm), _) => Some(GradClip::Norm { max_norm }),
        (None, Some(limit)) => Some(GradClip::Value { limit }),
        (None, None) => None,
    }
}

/// The largest side `--image-size` resizes to.
const MAX_IMAGE_SIZE: u32 = 4096;

/// The most batches `--prefetch` may keep ahead.
const MAX_PREFETCH: usize = 64;

/// Refuses an output path that cannot be written, before any training (a
/// folder, a device or FIFO, a read-only place, a file the run folder
/// itself writes): creates and removes a probe file beside it. Missing
/// parent folders are created, as writing the file would.
fn check_writable(flag: &str, path: &Path, run_dir: Option<&Path>) -> anyhow::Result<()> {
    let hint = "HINT: give a file path in a folder you can write";
    if path.is_dir() {
        bail!("{flag} {}: is a folder, not a file\n{hint}", path.display());
    }
    // Only regular files are written: /dev/full or a FIFO is refused by
    // name, never replaced by a file.
    redline_core::files::output_target(path)
        .with_context(|| format!("{flag} {}\n{hint}", path.display()))?;
    if let (Some(dir), Some(name)) = (run_dir, path.file_name()) {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        let same =
            std::path::absolute(parent.unwrap_or(Path::new(".")))? == std::path::absolute(dir)?;
        if same && redline_run::folder::is_run_file(&name.to_string_lossy()) {
            bail!(
                "{flag} {}: the run folder writes this file itself\nHINT: give another name, \
                 e.g. {}",
                path.display(),
                dir.join("weights.safetensors").display()
            );
        }
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| {
        format!(
            "{flag} {}: cannot create its folder\n{hint}",
            path.display()
        )
    })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let probe = parent.join(format!(".{name}.probe-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .with_context(|| format!("{flag} {}: cannot write there\n{hint}", path.display()))?;
    std::fs::remove_file(&probe)
        .with_context(|| format!("{flag}: removing the probe {}", probe.display()))?;
    Ok(())
}
