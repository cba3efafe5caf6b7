//! `redline train`: resolve flags into configs, build, fit, report, save.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use redline_core::Precision;
use redline_data::{
    place, Augmented, DataOnDevice, Dataset, HostData, Loader, LoaderConfig, Placement,
};
use redline_profile::Mode;
use redline_train::{GradClip, JsonlMetrics, TrainConfig, Trainer};
use serde_json::json;

use crate::auto_flag::Auto;
use crate::cli::TrainArgs;
use crate::data_flags::augment;
use crate::plan::Plan;
use crate::progress::Progress;
use crate::signals::Stopped;
use crate::summary;
use redline_run::{Ending, Finished, Run};

/// Runs `redline train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    // `--devices N` alone: this command again as N ranks under mpirun.
    if let Some(status) = crate::dist::spawn(args.devices)? {
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
    // Each rank reads its shard of every epoch (DistributedSampler): padded
    // for training, so every rank takes the same steps; evaluation counts
    // each sample once.
    let shard = |l: Loader, pad: bool| -> anyhow::Result<Loader> {
        Ok(l.shard(ranks.strategy.shard(pad))?)
    };
    let (inputs, target) = (prepared.train.input_dims.clone(), prepared.train.target);
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
    let batch_size = wanted_batch.min(train_n.max(1));
    if batch_size < wanted_batch {
        println!(
            "  --batch-size {} is more than the {train_n} training samples: each step uses all \
             {train_n} (batch {batch_size})",
            wanted_batch
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
    let train_loader = shard(train_loader, true)?;
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
            .map(|t| shard(load(t, eval_cfg.clone())?, false))
            .transpose()?
            .map(|l| apply("--limit-test-batches", l, short.test))
            .transpose()?;
        let val = prepared
            .val
            .filter(|_| !none(short.val))
            .map(|v| shard(load(v, eval_cfg)?, false))
            .transpose()?
            .map(|l| apply("--limit-val-batches", l, short.val))
            .transpose()?;
        (val, test)
    };

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
        loss_scale,
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
                Some(crate::resume::load(dir, &identity(&recorded)?, &shapes)?.0)
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
    // A resumed run reopens its folder at the checkpoint; a new one makes its own.
    let (mut run, resume_from) = match args.resume.as_deref() {
        None => (
            Run::create(args.run_dir.as_deref(), model_cfg.name())?,
            None,
        ),
        Some(dir) => {
            let recorded = recorded_args(args, &data_dir, dir, (wanted_batch, lr))?;
            let (loaded, at) = crate::resume::load(dir, &identity(&recorded)?, &shapes)?;
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
        ("precision", json!(precision.name())),
        (
            "precision_path",
            json!(precision_path(
                precision,
                &device,
                redline_train::graph::reduced_kernels_on(loop_cfg.fused_kernels),
            )),
        ),
        (
            "precision_timing",
            json!(precision_timing.as_ref().map(|t| &t.line)),
        ),
        (
            "precision_vs_fp32",
            json!(precision_timing.as_ref().map(|t| t.ratio)),
        ),
        (
            "precision_activations",
            json!(precision_timing.as_ref().and_then(|t| t.activations).map(
                |(half, full, batch)| json!({
                    "bytes": half, "fp32_bytes": full, "batch": batch
                })
            )),
        ),
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
        ("short_run", json!(short.describe())),
        ("fast_dev_run", json!(short.fast_dev_run)),
        ("gpu_kernels_load_s", json!(device.kernels_load_s())),
    ] {
        run.set(k, v)?;
    }
    tuned.record(&mut run)?;
    run.report(Box::new(|d| {
        redline_report::write_report(d).map_err(|e| e.to_string())
    }));

    // A dev run keeps nothing but its marked folder.
    let checkpoints = match short.fast_dev_run {
        Some(_) => None,
        None => crate::resume::checkpoint_config(args, &dir, identity(&recorded)?)?,
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
        if let Some(c) = &fit.gpu_conv {
            println!("convolutions: {c} (--gpu-conv {})", args.gpu_conv);
        }
        if let Some(m) = &fit.memory {
            println!("memory: {}", m.line());
        }
        if let Some(s) = &fit.loss_scale {
            println!(
                "loss scale: {} at the end, {} of {} steps skipped on overflow",
                s.scale, s.skipped_steps, fit.steps
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

/// How this run's 16-bit products are computed, for the summary (`None` in
/// fp32); `fused`: whether `--fused-kernels` admits Redline's 16-bit GPU
/// kernels ([`redline_train::graph::reduced_kernels_on`]).
/// Called after the trainer set the CPU's bf16 GEMM switch.
fn precision_path(
    precision: Precision,
    device: &redline_core::Device,
    fused: bool,
) -> Option<String> {
    if precision == Precision::Fp32 {
        return None;
    }
    let weights = match precision {
        Precision::Bf16True => {
            "bf16 parameters, gradients and optimizer state (each update rounded to bf16 where \
             PyTorch's bf16 ops round)"
        }
        _ => "fp32 master weights",
    };
    if !device.is_cpu() {
        return Some(gpu_precision_path(precision, weights, fused));
    }
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    if precision != Precision::Fp16Mixed && redline_kernels::gemm_bf16::enabled() {
        let amx = amx_note(&flags);
        return Some(format!(
            "{precision} on the CPU: {weights}; bf16 GEMMs and convolutions on AVX-512 BF16 \
             (Redline's vdpbf16ps kernel, fp32 accumulation, subnormals flushed), outputs \
             rounded to bf16{amx}"
        ));
    }
    let (ty, why) = match precision {
        Precision::Fp16Mixed => (
            "fp16",
            match ["avx512_fp16", "amx_fp16"].into_iter().find(|f| has(f)) {
                Some(f) => format!("this CPU has {f}, which Redline does not use yet"),
                None => "this CPU has no AVX-512 FP16 or AMX-FP16".into(),
            },
        ),
        _ if redline_kernels::gemm_bf16::available() => (
            "bf16",
            "AVX-512 BF16 is present but --cpu-bf16-gemm off".into(),
        ),
        _ => ("bf16", "this CPU has no AVX-512 BF16".into()),
    };
    let scaler = match precision {
        Precision::Fp16Mixed => {
            "; fp16 weight gradients (inf above 65504) under a dynamic loss scale"
        }
        _ => "",
    };
    Some(format!(
        "{precision} on the CPU: {weights}; fp32 GEMMs and convolutions on {ty}-rounded \
         operands, outputs rounded to {ty} (a {ty} product with fp32 accumulation){scaler}; {why}"
    ))
}

/// What the bf16 path's summary adds on a CPU whose `/proc/cpuinfo` `flags`
/// list AMX-BF16: that the faster instruction is there and not used.
fn amx_note(flags: &str) -> &'static str {
    if flags.split_whitespace().any(|w| w == "amx_bf16") {
        "; this CPU also has AMX-BF16 (tdpbf16ps tiles), which Redline does not use yet"
    } else {
        ""
    }
}

/// [`precision_path`] on a GPU: Redline's tensor-core kernels with the
/// fused kernels (`--fused-kernels auto` or `on`), else candle's 16-bit
/// CUDA ops.
fn gpu_precision_path(precision: Precision, weights: &str, fused: bool) -> String {
    let ty = if precision == Precision::Fp16Mixed {
        "fp16"
    } else {
        "bf16"
    };
    if fused {
        format!(
            "{precision} on the GPU: {weights}; linear layers (cuBLASLt) and convolutions \
             (Redline's implicit GEMMs) on {ty} tensor cores with fp32 accumulation, outputs \
             rounded to {ty} (Redline's fused kernels)"
        )
    } else {
        format!("{precision} on the GPU: {weights}; candle's {ty} CUDA kernels (cuBLAS)")
    }
}

/// `--clip-grad-norm` / `--clip-grad-value` (clap refuses both at once).
fn grad_clip(args: &TrainArgs) -> Option<GradClip> {
    match (args.clip_grad_norm, args.clip_grad_value) {
        (Some(max_norm), _) => Some(GradClip::Norm { max_norm }),
        (None, Some(limit)) => Some(GradClip::Value { limit }),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU with AMX-BF16 is told that Redline's bf16 kernel does not use it.
    #[test]
    fn an_amx_cpu_is_told_that_amx_is_not_used() {
        let spr = "flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8";
        assert!(amx_note(spr).contains("AMX-BF16"));
        assert_eq!(amx_note("flags\t\t: fpu avx512f avx512_bf16"), "");
        assert_eq!(amx_note("flags: amx_bf16x"), "", "whole words only");
    }

    /// A GPU run's summary names the kernels its 16-bit products take.
    #[test]
    fn the_gpu_precision_path_says_which_kernels_run() {
        let fused = gpu_precision_path(Precision::Bf16Mixed, "fp32 master weights", true);
        assert!(
            fused.contains("bf16 tensor cores") && !fused.contains("candle"),
            "{fused}"
        );
        let plain = gpu_precision_path(Precision::Fp16Mixed, "fp32 master weights", false);
        assert!(
            plain.contains("candle's fp16") && !plain.contains("tensor cores"),
            "{plain}"
        );
    }
}
