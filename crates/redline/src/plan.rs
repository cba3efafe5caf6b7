//! The plan of a run: flags checked, data read, model shaped, device
//! picked. `redline train` and `redline tune` start from the same plan, so a
//! tuned batch or rate is measured on exactly the job that then trains.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use redline_core::{Device, DeviceSpec, Precision};
use redline_data::Dataset;
use redline_models::ModelConfig;
use redline_profile::Mode;
use redline_train::OptimizerConfig;

use crate::auto_flag::Auto;
use crate::cli::TrainArgs;
use crate::data_flags::{data_options, hidden};
use crate::run_shape::RunShape;
use crate::short_runs::ShortRun;
use crate::signals::{stop_on_signals, StopFlags};
use crate::step_kind::StepKind;

/// `--batch-size`'s default, and where `auto` starts timing.
pub const DEFAULT_BATCH: usize = 64;

/// `--lr`'s default.
pub const DEFAULT_LR: f64 = 1e-3;

/// The largest side `--image-size` resizes to.
pub(crate) const MAX_IMAGE_SIZE: u32 = 4096;

/// The most batches `--prefetch` may keep ahead.
const MAX_PREFETCH: usize = 64;

/// What a run is, resolved from its flags.
pub struct Plan {
    /// The signal flags (installed first).
    pub stop: StopFlags,
    /// Compute threads.
    pub threads: usize,
    /// The optimizer, at [`Plan::lr`].
    pub opt_cfg: OptimizerConfig,
    /// The learning rate (`--lr`, or the default until `auto` is found).
    pub lr: f64,
    /// Samples per step (`--batch-size`, or the default until `auto` is found).
    pub batch_size: usize,
    /// `--lr-schedule`.
    pub schedule: redline_train::LrSchedule,
    /// `--early-stop`.
    pub early_stop: Option<redline_train::EarlyStop>,
    /// The data folder or file.
    pub data_dir: PathBuf,
    /// `--profiler`.
    pub mode: Mode,
    /// `--monitor-interval`.
    pub monitor_every: Duration,
    /// The short-run limits.
    pub short: ShortRun,
    /// The data, read and split.
    pub prepared: redline_data::Prepared,
    /// The model, shaped for the data.
    pub model_cfg: ModelConfig,
    /// Classification or regression, and the loss.
    pub step_kind: StepKind,
    /// The device.
    pub device: Device,
    /// For `--device auto` with a choice: what was measured.
    pub device_choice: Option<String>,
    /// `--seed`.
    pub seed: u64,
    /// This process's rank and the strategy joining the ranks.
    pub ranks: crate::dist::Ranks,
    /// `--precision`.
    pub precision: Precision,
    /// A 16-bit precision's step time against fp32's on this job and device:
    /// the line, and the ratio.
    pub precision_timing: Option<crate::auto_device::PrecisionTiming>,
    /// 16-mixed's loss scaler (`--loss-scale`, else GradScaler's defaults).
    pub loss_scale: Option<redline_train::LossScale>,
    /// The peak MFU is read against, once `train` has resolved it
    /// ([`crate::peak::resolve`]).
    pub peak: Option<redline_train::mfu::PeakResult>,
}

/// The shipped Fashion-MNIST: `./data/fashion-mnist` from the repository root,
/// else the copy beside the executable, else beside the sources this binary
/// was built from; with where it was found when that is not the working
/// directory (the caller says so).
pub fn default_data_dir() -> anyhow::Result<(PathBuf, Option<&'static str>)> {
    let rel = Path::new("data/fashion-mnist");
    let exe = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    // A binary copied or installed elsewhere looks in the working directory,
    // then beside itself, before the source tree it was built in.
    let mut candidates = vec![(rel.to_path_buf(), "in the working directory")];
    if let Some(exe) = exe {
        candidates.push((exe.join(rel), "beside the executable"));
    }
    candidates.push((
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../")
            .join(rel),
        "in the source tree it was built from",
    ));
    if let Some((dir, place)) = candidates.iter().find(|(p, _)| p.is_dir()) {
        let elsewhere = (*place != "in the working directory").then_some(*place);
        return Ok((dir.clone(), elsewhere));
    }
    bail!(
        "the shipped Fashion-MNIST was not found (looked in {})\nHINT: run from the repository \
         root, copy its data/ folder beside the executable, or pass --data DIR",
        candidates
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Builds the optimizer config from the flags.
pub fn optimizer(args: &TrainArgs, lr: f64) -> anyhow::Result<OptimizerConfig> {
    let mut cfg = OptimizerConfig::by_name(&args.optimizer, lr)?;
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

/// Counts that must be at least 1: kept checkpoints, the checkpoint
/// interval, the batch sizes.
fn check_counts(args: &TrainArgs) -> anyhow::Result<()> {
    if args.keep_last == 0 {
        bail!("--keep-last 0: keep at least 1 checkpoint (the resume point)\nHINT: --no-checkpoint writes none");
    }
    if args.checkpoint_every == Some(0) {
        bail!("--checkpoint-every 0: give a number of optimizer steps (at least 1)");
    }
    for (flag, zero) in [
        ("--batch-size", args.batch_size == Auto::Value(0)),
        ("--eval-batch-size", args.eval_batch_size == 0),
    ] {
        if zero {
            bail!("{flag} 0: give at least 1 sample a batch");
        }
    }
    Ok(())
}

/// `--prefetch` within bounds, and `--save`/`--metrics` writable files
/// that are neither the run folder's own nor each other.
fn check_outputs(args: &TrainArgs) -> anyhow::Result<()> {
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
    Ok(())
}

/// The model a table implies, checked from its first row before the table
/// is read: a file of 50 million columns is refused in a moment; a model
/// that does not fit the data says so as it would later, and one too large
/// for memory is refused before any allocation.
fn check_model_fits(
    args: &TrainArgs,
    data_dir: &Path,
    data: &redline_data::DataOptions,
) -> anyhow::Result<()> {
    if let Some(inputs) = redline_data::peek_inputs(data_dir, data)
        .with_context(|| format!("--data {}", data_dir.display()))?
    {
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
    Ok(())
}

/// The device (`--device auto` settled by timing `job` on each), what was
/// measured, and a 16-bit precision's timing against fp32; each said on a
/// line. The ranks learn their device.
fn pick_device(
    (spec, selected): (DeviceSpec, DeviceSpec),
    job: &crate::auto_device::Job,
    ranks: &mut crate::dist::Ranks,
    precision: Precision,
) -> anyhow::Result<(
    redline_core::Device,
    Option<String>,
    Option<crate::auto_device::PrecisionTiming>,
)> {
    let (device, device_choice) = if ranks.is_distributed() {
        (rank_device(spec, selected, ranks)?, None)
    } else {
        crate::auto_device::choose(spec, selected, job)?
    };
    if let Some(line) = &device_choice {
        println!("{line}");
    }
    let precision_timing = crate::auto_device::precision_timing(job, &device, precision)?;
    if let Some(crate::auto_device::PrecisionTiming { line, .. }) = &precision_timing {
        println!("{line}");
    }
    if let Some(line) = ranks.on_device(&device)? {
        println!("{line}");
    }
    if let Some(s) = device.kernels_load_s().filter(|&s| s >= 1.0) {
        println!(
            "GPU kernels: compiled for this GPU in {s:.1} s before training (a first run on \
             this machine; the driver caches them)"
        );
    }
    Ok((device, device_choice, precision_timing))
}

/// The settings that are process-wide, as PyTorch's are: how fp32 products
/// are computed on a GPU, the CPU's bf16 GEMM and the GPU's convolutions.
/// Set before the device is picked: its probe times the same math.
fn set_process_wide(args: &TrainArgs) -> anyhow::Result<()> {
    redline_core::set_matmul_precision(args.matmul_precision.parse()?);
    redline_train::set_cpu_bf16_gemm(args.cpu_bf16_gemm.parse()?)?;
    redline_train::set_gpu_conv(&args.gpu_conv)?;
    Ok(())
}

/// Checks the flags, reads the data, shapes the model and picks the device:
/// everything `train` and `tune` do before their first step. Errors come
/// before any run folder exists.
pub fn prepare(args: &TrainArgs) -> anyhow::Result<Plan> {
    prepare_for(args, None)
}

/// [`prepare`] for a finished run's model on `--data`: the model is built
/// for `run`'s shape (its head), and data it cannot take is refused.
pub fn prepare_for(args: &TrainArgs, run: Option<&RunShape>) -> anyhow::Result<Plan> {
    // First of all: a signal at any phase (loading, building, training,
    // writing) stops the run the same way, never is ignored.
    let stop = stop_on_signals()?;
    if let Some(n) = args.threads {
        redline_core::threads::check(n).map_err(anyhow::Error::msg)?;
    }
    // Every rank joins the others before it does anything that may fail on
    // one rank only; ranks other than 0 print nothing.
    let mut ranks = crate::dist::join(&args.strategy, args.dist_timeout, &stop.flag)?;
    if !ranks.is_global_zero() {
        crate::dist::quiet_stdout()?;
    }
    if let Some(line) = &ranks.line {
        println!("{line}");
    }
    // Ranks on one machine share its cores (measuring free cores would see
    // them all free at once and oversubscribe).
    let (usable, online) = (
        redline_core::threads::usable_cores(),
        crate::dist::online_cores(),
    );
    let threads = redline_core::threads::configure(
        args.threads
            .or_else(|| ranks.default_threads(usable, online)),
    );
    if ranks.is_distributed() && args.threads.is_none() && usable < online / ranks.local_ranks() {
        println!(
            "  each rank is bound to {usable} of this machine's {online} cores by the launcher \
             (mpirun binds each rank to one core by default): `mpirun --bind-to none` or \
             `--map-by slot:PE={}` gives each rank its share",
            online / ranks.local_ranks()
        );
    }
    let spec: DeviceSpec = args.device.parse()?;
    // An unusable device is refused now, before any data is read; `auto`
    // with a GPU present is settled by timing the job on both, below.
    let selected = redline_core::select(spec, &redline_core::GpuAvailability::probe())?;
    // `--lr auto` is checked with the default rate; the finder sets it.
    let lr = args.lr.or(DEFAULT_LR);
    let opt_cfg = optimizer(args, lr)?;
    check_counts(args)?;
    // `--peak-flops` is checked now; `train` takes it when it resolves the peak.
    crate::peak::flag(args)?;
    let schedule: redline_train::LrSchedule = args.lr_schedule.parse()?;
    // Every precision is built; an unknown name is refused by the parse.
    let precision: Precision = args.precision.parse()?;
    let loss_scale = loss_scale(precision, args.loss_scale.as_deref())?;
    let early_stop: Option<redline_train::EarlyStop> =
        args.early_stop.as_deref().map(str::parse).transpose()?;
    set_process_wide(args)?;
    let data_dir = match &args.data {
        Some(d) => d.clone(),
        None => {
            let (dir, place) = default_data_dir()?;
            if let Some(place) = place {
                println!(
                    "data: no --data given; the shipped Fashion-MNIST found {place}: {}",
                    dir.display()
                );
            }
            dir
        }
    };
    let mode: Mode = args.profiler.parse()?;
    // 0 turns sampling off.
    let monitor_every = crate::cli::seconds("--monitor-interval", args.monitor_interval)?;
    check_outputs(args)?;

    let short = crate::short_runs::ShortRun::from_args(args)?;
    let workers = crate::data_flags::workers(
        args,
        usable,
        threads,
        matches!(selected, DeviceSpec::Cuda(_)),
    )?;
    let data = data_options(args, workers)?;
    check_model_fits(args, &data_dir, &data)?;
    println!("loading {} ...", data_dir.display());
    let prepared = match redline_data::prepare_until(&data_dir, &data, &stop.flag) {
        Err(redline_data::Error::Interrupted) => return Err(stop.stopped("reading the data")),
        other => other.with_context(|| format!("--data {}", data_dir.display()))?,
    };
    stop.check("reading the data")?;
    let data_shape = RunShape {
        inputs: prepared.train.input_dims().to_vec(),
        target: prepared.train.target(),
    };
    if let Some(run) = run {
        run.check(&data_dir, &data_shape)?;
    }
    let RunShape { inputs, target } = run.cloned().unwrap_or(data_shape);
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
        // `--batch-size auto` times the device at the default batch.
        batch_size: args.batch_size.or(DEFAULT_BATCH),
        seed: args.seed,
        loss_scale,
    };
    let (device, device_choice, precision_timing) =
        pick_device((spec, selected), &job, &mut ranks, precision)?;
    Ok(Plan {
        stop,
        threads,
        opt_cfg,
        lr,
        batch_size: args.batch_size.or(DEFAULT_BATCH),
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
        seed: args.seed,
        ranks,
        precision,
        precision_timing,
        loss_scale,
        peak: None,
    })
}

/// The loss scaler of `16-mixed` (`--loss-scale`, or GradScaler's defaults);
/// the flag with another precision is refused (it would do nothing).
fn loss_scale(
    precision: Precision,
    flag: Option<&str>,
) -> anyhow::Result<Option<redline_train::LossScale>> {
    match (precision, flag) {
        (Precision::Fp16Mixed, f) => Ok(Some(f.map(str::parse).transpose()?.unwrap_or_default())),
        (_, None) => Ok(None),
        (p, Some(f)) => bail!(
            "--loss-scale {f}: only --precision 16-mixed scales the loss (this run is {p}; bf16 \
             keeps fp32's range and needs no scaling)"
        ),
    }
}

/// A data-parallel rank's device: `cuda:LOCAL_RANK` where `auto` found GPUs
/// (one process per GPU, as torchrun's recipes), else the CPU; an explicit
/// `cuda:N` only where this machine runs one rank (several would share it).
fn rank_device(
    spec: DeviceSpec,
    selected: DeviceSpec,
    ranks: &crate::dist::Ranks,
) -> anyhow::Result<Device> {
    let local = ranks.launch.local_rank;
    let on_machine = ranks.launch.local_world_size.unwrap_or(1);
    let spec = match (spec, selected) {
        (_, DeviceSpec::Cpu) => DeviceSpec::Cpu,
        (DeviceSpec::Auto, _) => redline_core::select(
            DeviceSpec::Cuda(local),
            &redline_core::GpuAvailability::probe(),
        )
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}\nHINT: start at most one rank per GPU on each machine (mpirun -n GPUS), \
                 or train on the CPU with --device cpu"
            )
        })?,
        (DeviceSpec::Cuda(n), _) if on_machine > 1 => bail!(
            "--device cuda:{n} with {on_machine} ranks on this machine: they would all train on \
             one GPU\nHINT: give --device auto: rank r of a machine takes cuda:r"
        ),
        (_, s) => s,
    };
    Ok(Device::resolve(spec)?)
}

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
                dir.join(match flag {
                    "--metrics" => "my-metrics.jsonl",
                    _ => "weights.safetensors",
                })
                .display()
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
