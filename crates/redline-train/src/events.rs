//! What the loop tells its observers.
//!
//! Values in events are host numbers read at log points only; per-step events
//! carry counters, never tensor reads, so observing them costs no device sync.

use serde::{Deserialize, Serialize};

/// One logged training point (every `log_every` steps).
#[derive(Debug, Clone, Serialize)]
pub struct StepLog {
    /// Global step, 1-based.
    pub step: usize,
    /// Epoch, 1-based.
    pub epoch: usize,
    /// Mean training loss over the steps since the previous log point.
    pub loss: f64,
    /// Mean total gradient norm (before clipping) over the same steps, when
    /// measured (`--log-grad-norm` or `--clip-grad-norm`).
    pub grad_norm: Option<f64>,
    /// Learning rate used by the last step.
    pub lr: f64,
    /// The loss scale after the last step (`16-mixed`).
    pub loss_scale: Option<f64>,
    /// Training samples per second over the same window.
    pub samples_per_s: f64,
    /// Training FLOPs per second over the same window (all ranks), when the
    /// model counts its FLOPs.
    pub flops_per_s: Option<f64>,
    /// Model FLOPs utilisation over the same window, when the peak is known.
    pub mfu: Option<f64>,
    /// Seconds since fit started.
    pub elapsed_s: f64,
}

/// Named metric values, in the order the step returned them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricValues(pub Vec<(String, f64)>);

impl MetricValues {
    /// The value of metric `name`, if the step returned it.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    /// `(name, value)` pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0.iter().map(|(n, v)| (n.as_str(), *v))
    }
}

/// Result of a validation or test pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// Mean loss.
    pub loss: f64,
    /// The step's metrics over the pass (e.g. `accuracy` as a fraction).
    pub metrics: MetricValues,
    /// Samples evaluated.
    pub samples: usize,
    /// Seconds taken.
    pub seconds: f64,
}

/// The end of one epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochLog {
    /// Epoch, 1-based.
    pub epoch: usize,
    /// Mean training loss over the epoch.
    pub train_loss: f64,
    /// The step's training metrics over the epoch.
    pub train: MetricValues,
    /// The validation pass after this epoch, when there was one.
    pub val: Option<EvalResult>,
    /// Training time of this epoch alone, validation excluded.
    pub epoch_s: f64,
    /// Validation time after this epoch.
    pub eval_s: f64,
    /// Steps run in this epoch.
    pub steps: usize,
    /// Samples seen in this epoch.
    pub samples: usize,
}

/// What a finished fit reports.
#[derive(Debug, Clone, Serialize)]
pub struct FitSummary {
    /// Epochs run (a partial last epoch counts).
    pub epochs: usize,
    /// Optimizer steps run.
    pub steps: usize,
    /// Training samples seen.
    pub samples: usize,
    /// Sum of the epochs' training time.
    pub train_s: f64,
    /// Sum of validation time.
    pub eval_s: f64,
    /// Wall time of the whole fit.
    pub wall_s: f64,
    /// samples / train_s.
    pub samples_per_s: f64,
    /// The last validation pass, when there was one.
    pub val: Option<EvalResult>,
    /// Host reads of tensors per training step (logging included).
    pub host_syncs_per_step: f64,
    /// Per-epoch logs.
    pub epochs_log: Vec<EpochLog>,
    /// The early stop's best epoch and value, when `--early-stop` monitored one.
    pub best: Option<crate::early_stop::EarlyStopState>,
    /// Why the fit ended before its planned epochs (`--early-stop`).
    pub stopped_early: Option<crate::early_stop::StopReason>,
    /// What the fit's checkpoints came to, when it wrote any.
    pub checkpoints: Option<crate::trainer::CheckpointLog>,
    /// Whether the step ran as a replayed CUDA graph, and why not.
    pub cuda_graph: crate::graph::GraphStatus,
    /// On a GPU: how long kernels ran over the fit's wall time, or why that
    /// was not measured; `None` on the CPU.
    pub gpu_busy: crate::kernel_trace::GpuBusyResult,
    /// On a GPU: how its fp32 matrix products were computed
    /// (`--matmul-precision`); `None` on the CPU, where they are always fp32.
    pub matmul_precision: Option<redline_core::MatmulPrecision>,
    /// On a GPU: what ran the fused path's convolutions (`--gpu-conv`), e.g.
    /// "cuDNN 9.19.0"; `None` where none ran there (no convolution, the CPU,
    /// candle's ops).
    pub gpu_conv: Option<String>,
    /// Data-parallel: every rank's training time and breakdown (empty in one
    /// process); the slowest rank is the one the others waited for.
    pub ranks: Vec<crate::strategy::RankTimes>,
    /// The loss scaler's standing at the end (`16-mixed`): scale, clean
    /// steps in a row, steps skipped on overflow; `None` without a scaler.
    pub loss_scale: Option<crate::scaler::ScalerState>,
    /// The step's memory: parameters, gradients, optimizer state and one
    /// batch's activations, measured at the fit's first step.
    pub memory: Option<crate::memory::MemorySplit>,
    /// The training FLOPs and MFU ([`crate::mfu`]), or why they are not
    /// known (the model does not count its FLOPs); `None` when no peak was
    /// given to the trainer.
    pub flops: Option<std::result::Result<crate::mfu::FlopsSummary, String>>,
}

/// An event of the training loop.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// Fit is about to start.
    FitStart {
        /// Model name.
        model: &'a str,
        /// Device the run uses.
        device: &'a str,
        /// Trainable scalars.
        params: usize,
        /// Epochs planned.
        epochs: usize,
        /// Batches per epoch.
        steps_per_epoch: usize,
        /// Steps planned in total (max_steps applied).
        total_steps: usize,
    },
    /// An epoch starts (1-based).
    EpochStart {
        /// Epoch, 1-based.
        epoch: usize,
    },
    /// A step finished; counters only.
    StepEnd {
        /// Global step, 1-based.
        step: usize,
        /// Epoch, 1-based.
        epoch: usize,
    },
    /// A log point with values read back from the device.
    Log(&'a StepLog),
    /// Validation starts after an epoch.
    ValidationStart {
        /// Epoch, 1-based.
        epoch: usize,
    },
    /// An epoch and its validation finished.
    EpochEnd(&'a EpochLog),
    /// The fit finished.
    FitEnd(&'a FitSummary),
    /// A test pass ([`crate::Trainer::test`]) finished.
    Test(&'a EvalResult),
}

/// An observer of training events. A callback that returns an error is
/// reported once and then detached: observers never break training. A
/// callback that writes a result the user asked for says so with
/// [`Callback::required`]; its failure (a full disk) ends the fit instead,
/// so the run says `failed` with the cause rather than finishing without it.
pub trait Callback: Send {
    /// A short name for messages.
    fn name(&self) -> &str;
    /// Handles one event.
    fn on_event(&mut self, event: &Event<'_>) -> std::result::Result<(), String>;
    /// Whether the run fails when this callback fails (default: no, it is
    /// detached with a warning).
    fn required(&self) -> bool {
        false
    }
}
