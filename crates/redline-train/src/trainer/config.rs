//! The loop's settings ([`TrainConfig`]) and the by-value builder that
//! assembles a [`Trainer`] from them.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use redline_core::host::HostReads;
use redline_core::Device;
use redline_profile::Mode;
use serde::{Deserialize, Serialize};

use super::{checkpointing, Trainer};
use crate::checkpoint::CheckpointConfig;
use crate::clip::GradClip;
use crate::early_stop::EarlyStop;
use crate::error::{Error, Result};
use crate::events::Callback;
use crate::graph::GraphMode;
use crate::mfu::PeakResult;
use crate::optim::OptimizerConfig;
use crate::scaler::{GradScaler, LossScale};
use crate::schedule::LrSchedule;
use crate::step::TrainStep;
use crate::strategy::Strategy;

/// Loop settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Epochs to run.
    pub epochs: usize,
    /// Stop after this many optimizer steps (overrides `epochs` when reached first).
    pub max_steps: Option<usize>,
    /// Read the running loss back every this many optimizer steps.
    pub log_every: usize,
    /// Micro-batches whose gradients add up before each optimizer step
    /// (Lightning's `accumulate_grad_batches`); each micro-batch's loss is
    /// divided by it, so N micro-batches of B step as one batch of N*B.
    #[serde(default = "one")]
    pub accumulate: usize,
    /// Gradient clipping before each optimizer step.
    #[serde(default)]
    pub clip: Option<GradClip>,
    /// Log the total gradient norm before clipping (`grad_norm`); always
    /// logged when clipping by norm, which computes it anyway.
    #[serde(default)]
    pub log_grad_norm: bool,
    /// Stop when a logged loss exceeds this many times the fit's first step's
    /// loss (Lightning's `EarlyStopping(divergence_threshold=...)`, relative);
    /// `None` turns the check off. Non-finite losses always stop the fit.
    #[serde(default = "default_divergence")]
    pub divergence_threshold: Option<f64>,
    /// Validate after each epoch when a validation loader is given.
    pub validate: bool,
    /// Return the device memory pool's cached blocks after each epoch's
    /// training pass (`--empty-cache`); the pool is always trimmed after fit.
    #[serde(default)]
    pub empty_cache: bool,
    /// Capture the training step as one CUDA graph and replay it
    /// (`--cuda-graph`; docs/cuda-graphs.md).
    #[serde(default)]
    pub cuda_graph: GraphMode,
    /// On a GPU, record when every kernel ran (CUPTI) to report GPU busy %
    /// (`--kernel-trace`); no effect on the CPU.
    #[serde(default = "yes")]
    pub kernel_trace: bool,
    /// On a CUDA device, run the steps Redline has fused GPU kernels for
    /// with them (`--fused-kernels`: the optimizer update, the cross-entropy,
    /// linear layers and the CNN block; docs/gpu-kernels.md). `auto` uses them while
    /// [`crate::graph::AUTO_FUSES`] is set; the CPU always uses its own.
    #[serde(default)]
    pub fused_kernels: GraphMode,
    /// The learning rate's schedule over the run (`--lr-schedule`); the
    /// optimizer's rate is its base.
    #[serde(default)]
    pub schedule: LrSchedule,
    /// Stop when a logged metric stops improving (`--early-stop`).
    #[serde(default)]
    pub early_stop: Option<EarlyStop>,
    /// The dynamic loss scaler (`--precision 16-mixed`, `--loss-scale`):
    /// the loss is scaled before the backward, the gradients unscaled before
    /// clipping and the update, and overflowed steps skipped.
    #[serde(default)]
    pub loss_scale: Option<LossScale>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 5,
            max_steps: None,
            log_every: 50,
            accumulate: 1,
            clip: None,
            log_grad_norm: false,
            divergence_threshold: default_divergence(),
            validate: true,
            empty_cache: false,
            cuda_graph: GraphMode::default(),
            kernel_trace: true,
            fused_kernels: GraphMode::default(),
            schedule: LrSchedule::default(),
            early_stop: None,
            loss_scale: None,
        }
    }
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

/// A loss a thousand times its start has left any sane training curve; a
/// slow drift upward never gets there.
fn default_divergence() -> Option<f64> {
    Some(1e3)
}

impl TrainConfig {
    /// Refuses settings the loop cannot run (zero counts, a bad clip or
    /// divergence factor), naming the flag; [`TrainerBuilder::build`] calls
    /// it, and a caller can call it before doing any work.
    pub fn check(&self) -> Result<()> {
        if self.log_every == 0 {
            return Err(Error::Config("--log-every must be at least 1".into()));
        }
        if self.epochs == 0 && self.max_steps.is_none() {
            return Err(Error::Config(
                "--epochs must be at least 1 (or give --max-steps)".into(),
            ));
        }
        if self.max_steps == Some(0) {
            return Err(Error::Config("--max-steps must be at least 1".into()));
        }
        if self.accumulate == 0 {
            return Err(Error::Config(
                "--accumulate 0: must be at least 1 (1: no accumulation)".into(),
            ));
        }
        if let Some(c) = &self.clip {
            c.check()?;
        }
        self.schedule.check()?;
        if let Some(es) = &self.early_stop {
            es.check()?;
        }
        if let Some(s) = &self.loss_scale {
            s.check()?;
        }
        if let Some(f) = self.divergence_threshold {
            if !(f.is_finite() && f > 1.0) {
                return Err(Error::Config(format!(
                    "--divergence-threshold {f}: give a factor > 1, or 0 to turn the check off"
                )));
            }
        }
        Ok(())
    }
}

/// Assembles a [`Trainer`].
pub struct TrainerBuilder {
    cfg: TrainConfig,
    optimizer: OptimizerConfig,
    callbacks: Vec<Box<dyn Callback>>,
    model_name: String,
    profiler: Mode,
    stop: Option<Arc<AtomicBool>>,
    threads: Option<usize>,
    checkpoints: Option<CheckpointConfig>,
    strategy: Strategy,
    cursor_steps: bool,
    peak: Option<PeakResult>,
}

impl TrainerBuilder {
    /// PyTorch-tutorial defaults (5 epochs, Adam 1e-3): [`Trainer::builder`].
    pub(super) fn new() -> Self {
        Self {
            cfg: TrainConfig::default(),
            optimizer: OptimizerConfig::Adam {
                lr: 1e-3,
                betas: (0.9, 0.999),
                eps: 1e-8,
                weight_decay: 0.0,
            },
            callbacks: Vec::new(),
            model_name: "model".into(),
            profiler: Mode::Off,
            stop: None,
            threads: None,
            checkpoints: None,
            strategy: Strategy::single(),
            cursor_steps: false,
            peak: None,
        }
    }

    /// The device's peak FLOP/s (or why it is unknown) that the fit's MFU
    /// is read against: each log point's and the summary's
    /// ([`crate::mfu`]). Without it, no MFU is computed.
    pub fn peak(mut self, peak: PeakResult) -> Self {
        self.peak = Some(peak);
        self
    }

    /// How the fit spreads over processes (default: one process). With
    /// data-parallel ranks, every rank builds its trainer with the same
    /// settings and its own shard of the data ([`redline_data::Loader::shard`]);
    /// only rank 0 should be given callbacks that write files.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Writes checkpoints as configured (docs/training-control.md); none without.
    pub fn checkpoints(mut self, cfg: CheckpointConfig) -> Self {
        self.checkpoints = Some(cfg);
        self
    }

    /// Compute threads for this trainer's fused kernels, on the thread that
    /// calls `fit`/`validate`/`test` and only while they run (default: the
    /// process's setting, `redline_core::threads::configure`). Two trainers in
    /// one process can so run with different counts.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n);
        self
    }

    /// A flag the loop polls after every step (and validation batch): once
    /// set, the fit ends with [`Error::Interrupted`] (the CLI sets it from
    /// SIGINT/SIGTERM).
    pub fn stop_when(mut self, flag: Arc<AtomicBool>) -> Self {
        self.stop = Some(flag);
        self
    }

    /// What the profiler records (the breakdown is always measured).
    pub fn profiler(mut self, mode: Mode) -> Self {
        self.profiler = mode;
        self
    }

    /// Loop settings.
    pub fn config(mut self, cfg: TrainConfig) -> Self {
        self.cfg = cfg;
        self
    }

    /// Epochs to run.
    pub fn epochs(mut self, epochs: usize) -> Self {
        self.cfg.epochs = epochs;
        self
    }

    /// Step limit.
    pub fn max_steps(mut self, steps: Option<usize>) -> Self {
        self.cfg.max_steps = steps;
        self
    }

    /// Log interval in steps.
    pub fn log_every(mut self, steps: usize) -> Self {
        self.cfg.log_every = steps;
        self
    }

    /// Micro-batches per optimizer step.
    pub fn accumulate(mut self, micro_batches: usize) -> Self {
        self.cfg.accumulate = micro_batches;
        self
    }

    /// Gradient clipping before each step.
    pub fn clip(mut self, clip: Option<GradClip>) -> Self {
        self.cfg.clip = clip;
        self
    }

    /// The optimizer to build over the model's parameters.
    pub fn optimizer(mut self, optimizer: OptimizerConfig) -> Self {
        self.optimizer = optimizer;
        self
    }

    /// Adds an observer.
    pub fn callback(mut self, cb: Box<dyn Callback>) -> Self {
        self.callbacks.push(cb);
        self
    }

    /// CUDA graph mode (default `auto`, which captures where the step can be
    /// captured while [`crate::graph::AUTO_CAPTURES`] is set; `on` captures or
    /// refuses to start).
    pub fn cuda_graph(mut self, mode: GraphMode) -> Self {
        self.cfg.cuda_graph = mode;
        self
    }

    /// Runs a fit that could be captured through graph mode's loop even
    /// where nothing is captured (a CPU, `--cuda-graph off`): batches drawn
    /// by the device cursor (or copied into static buffers), every step
    /// launched eagerly. The same batches, losses and weights as the
    /// ordinary loop; it exists so that the loop a GPU runs by default (its
    /// positions, checkpoints, stops and resumes) is tested on machines
    /// without one. Default off.
    pub fn cursor_steps(mut self, on: bool) -> Self {
        self.cursor_steps = on;
        self
    }

    /// The numeric precision's loop side (Lightning's precision plugin):
    /// `16-mixed` scales the loss with PyTorch's default `GradScaler` unless
    /// [`TrainerBuilder::loss_scale`] set one; the others need no scaler.
    /// The model's dtypes come from building it in the same precision.
    pub fn precision(mut self, precision: redline_core::Precision) -> Self {
        self.cfg.loss_scale = match precision {
            redline_core::Precision::Fp16Mixed => Some(self.cfg.loss_scale.unwrap_or_default()),
            _ => None,
        };
        self
    }

    /// The loss scaler's settings (`None`: no scaler).
    pub fn loss_scale(mut self, cfg: Option<LossScale>) -> Self {
        self.cfg.loss_scale = cfg;
        self
    }

    /// The model's name, for events.
    pub fn model_name(mut self, name: impl Into<String>) -> Self {
        self.model_name = name.into();
        self
    }

    /// Validates the settings and builds the trainer around `module` (a
    /// [`TrainStep`]: a [`crate::Classifier`] or [`crate::Regressor`] around a
    /// model, or the user's own) on `device`.
    pub fn build<S: TrainStep + 'static>(self, module: S, device: Device) -> Result<Trainer> {
        self.cfg.check()?;
        if let Some(c) = &self.checkpoints {
            c.check()?;
        }
        // As Lightning's `ModelCheckpoint`: only rank 0 writes checkpoints.
        let checkpoints = self.checkpoints.filter(|_| self.strategy.is_global_zero());
        if let Some(n) = self.threads {
            redline_core::threads::check(n).map_err(Error::Config)?;
        }
        let optimizer = self.optimizer.build_groups(module.params().with_decay())?;
        let scaler = self
            .cfg
            .loss_scale
            .map(|c| GradScaler::new(c, device.candle()))
            .transpose()?;
        // The fused GPU kernels (optimizer, loss, layers) read one process-wide
        // switch; the CPU always uses its own.
        if !device.is_cpu() {
            redline_kernels::fused_gpu::set_enabled(crate::graph::fused_kernels_on(
                self.cfg.fused_kernels,
            ));
            redline_kernels::fused_gpu::set_reduced_precision(crate::graph::reduced_kernels_on(
                self.cfg.fused_kernels,
            ));
        }
        Ok(Trainer {
            cfg: self.cfg,
            module: Box::new(module),
            optimizer,
            callbacks: self.callbacks.into_iter().map(Some).collect(),
            device,
            model_name: self.model_name,
            profile_mode: self.profiler,
            profiler: None,
            gpu_busy: None,
            reads: HostReads::new(),
            stop: self.stop,
            threads: self.threads,
            base_lr: self.optimizer.lr(),
            checkpoints,
            writer: checkpointing::Writer::default(),
            resume: None,
            strategy: self.strategy,
            ranks_stop: false,
            scaler,
            memory: None,
            cursor_steps: self.cursor_steps,
            peak: self.peak,
        })
    }
}

/// Sets the CPU's bf16 GEMM for `mode` (`--cpu-bf16-gemm`): the bf16 products
/// of `bf16-mixed` and `bf16-true` on Redline's AVX-512 BF16 kernel
/// (`redline_kernels::gemm_bf16`) under `auto` where the CPU has the
/// instruction and under `on`, which is refused where it has not; `off`
/// takes the fp32 GEMM of the bf16-rounded operands. Process-wide, as
/// `redline_core::set_matmul_precision` is (PyTorch's backend flags): every
/// trainer of the process, the precision timing's included, runs on it.
pub fn set_cpu_bf16_gemm(mode: GraphMode) -> Result<()> {
    use redline_kernels::gemm_bf16;
    if mode == GraphMode::On && !gemm_bf16::available() {
        return Err(Error::Config(
            "--cpu-bf16-gemm on: this CPU has no AVX-512 BF16 (avx512_bf16 in /proc/cpuinfo), \
             which Redline's bf16 GEMM runs on\nHINT: --cpu-bf16-gemm auto (the default) takes \
             the fp32 GEMM of the bf16-rounded operands here: the same products, slower"
                .into(),
        ));
    }
    gemm_bf16::set_enabled(mode != GraphMode::Off);
    Ok(())
}

/// Sets where a GPU's convolutions run (`--gpu-conv`): `redline`, Redline's
/// implicit-GEMM kernels (`cuda/conv.cu`, `cuda/conv_mma.cu`); `cudnn`,
/// NVIDIA's cuDNN, loaded at run time (refused where it does not load, or in
/// a build without CUDA); `auto`, cuDNN where it loads and Redline's kernels
/// where not (`graph::AUTO_CONV_CUDNN`; the fit's `gpu_conv` says which
/// ran). It reaches the fused path's convolutions (`--fused-kernels auto |
/// on`); candle's (`off`) are its own. Process-wide, as
/// `redline_core::set_matmul_precision` is.
pub fn set_gpu_conv(name: &str) -> Result<()> {
    use redline_kernels::fused_gpu::ConvBackend;
    let backend = match name {
        "auto" if crate::graph::AUTO_CONV_CUDNN => ConvBackend::CudnnWhereItLoads,
        "auto" | "redline" => ConvBackend::Redline,
        "cudnn" => {
            #[cfg(feature = "cuda")]
            redline_kernels::cuda::cudnn::version()
                .map_err(|e| Error::Config(format!("--gpu-conv {name}: {e}")))?;
            #[cfg(not(feature = "cuda"))]
            return Err(Error::Config(
                "--gpu-conv cudnn: this build has no CUDA support\nHINT: build with \
                 --features cuda (README.md, GPU section)"
                    .into(),
            ));
            #[cfg(feature = "cuda")]
            ConvBackend::Cudnn
        }
        other => {
            return Err(Error::Config(format!(
                "--gpu-conv {other:?}: expected auto, redline or cudnn"
            )))
        }
    };
    redline_kernels::fused_gpu::set_conv_backend(backend);
    Ok(())
}

/// Why `--gpu-conv auto` ran Redline's kernels: cuDNN did not load (the
/// refusal of `--gpu-conv cudnn` gives the paths tried and the fix); empty
/// where it was not asked for or did load.
fn why_not_cudnn() -> String {
    use redline_kernels::fused_gpu::{conv_backend, ConvBackend};
    if conv_backend() != ConvBackend::CudnnWhereItLoads {
        return String::new();
    }
    #[cfg(feature = "cuda")]
    if redline_kernels::cuda::cudnn::version().is_err() {
        return " (cuDNN did not load: --gpu-conv cudnn says why)".into();
    }
    String::new()
}

/// Which backend ran the fused path's convolutions, from what
/// `redline_kernels::fused_gpu::take_conv_ran` returned (the fit takes it
/// at its start and end): cuDNN with its version, Redline's kernels, or both (`--gpu-conv` changed
/// during the fit); `None` where no convolution ran on the fused path.
pub(crate) fn gpu_conv_ran((cudnn, redline): (bool, bool)) -> Option<String> {
    let cudnn_name = || {
        #[cfg(feature = "cuda")]
        if let Ok(v) = redline_kernels::cuda::cudnn::version() {
            return format!("cuDNN {}.{}.{}", v / 10000, v % 10000 / 100, v % 100);
        }
        "cuDNN".to_string()
    };
    match (cudnn, redline) {
        (true, false) => Some(cudnn_name()),
        (false, true) => Some(format!(
            "Redline's implicit-GEMM kernels{}",
            why_not_cudnn()
        )),
        (true, true) => Some(format!(
            "{} and Redline's implicit-GEMM kernels",
            cudnn_name()
        )),
        (false, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fit's `gpu_conv` names what ran, and nothing where nothing ran.
    #[test]
    fn gpu_conv_ran_names_the_backend_that_ran() {
        assert_eq!(gpu_conv_ran((false, false)), None);
        assert_eq!(
            gpu_conv_ran((false, true)).as_deref(),
            Some("Redline's implicit-GEMM kernels")
        );
        let cudnn = gpu_conv_ran((true, false)).unwrap_or_default();
        assert!(cudnn.starts_with("cuDNN"), "{cudnn}");
        let both = gpu_conv_ran((true, true)).unwrap_or_default();
        assert!(both.starts_with("cuDNN") && both.ends_with("Redline's implicit-GEMM kernels"));
    }

    /// `auto` follows `graph::AUTO_CONV_CUDNN` (cuDNN where it loads); the
    /// names set their backends; others are refused.
    #[test]
    fn set_gpu_conv_sets_the_kernels_switch() {
        use redline_kernels::fused_gpu::{conv_backend, set_conv_backend, ConvBackend};
        let before = conv_backend();
        set_gpu_conv("auto").unwrap_or_else(|e| panic!("{e}"));
        let auto = conv_backend();
        set_gpu_conv("redline").unwrap_or_else(|e| panic!("{e}"));
        let redline = conv_backend();
        let bad = set_gpu_conv("cuDNN").is_err();
        set_conv_backend(before);
        assert_eq!(
            auto,
            if crate::graph::AUTO_CONV_CUDNN {
                ConvBackend::CudnnWhereItLoads
            } else {
                ConvBackend::Redline
            }
        );
        assert_eq!(redline, ConvBackend::Redline);
        assert!(bad, "names are lower case, as the CLI's");
    }
}
