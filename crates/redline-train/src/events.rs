//! What the loop tells its observers.
//!
//! Values in events are host numbers read at log points only; per-step events
//! carry counters, never tensor reads, so observing them costs no device sync.

use serde::Serialize;

/// One logged training point (every `log_every` steps).
#[derive(Debug, Clone, Serialize)]
pub struct StepLog {
    /// Global step, 1-based.
    pub step: usize,
    /// Epoch, 1-based.
    pub epoch: usize,
    /// Mean training loss over the steps since the previous log point.
    pub loss: f64,
    /// Learning rate used by the last step.
    pub lr: f64,
    /// Training samples per second over the same window.
    pub samples_per_s: f64,
    /// Seconds since fit started.
    pub elapsed_s: f64,
}

/// The end of one epoch.
#[derive(Debug, Clone, Serialize)]
pub struct EpochLog {
    /// Epoch, 1-based.
    pub epoch: usize,
    /// Mean training loss over the epoch.
    pub train_loss: f64,
    /// Training accuracy over the epoch (fraction).
    pub train_accuracy: f64,
    /// Mean validation loss (NaN when there is no validation split).
    pub test_loss: f64,
    /// Validation accuracy (fraction; NaN without validation).
    pub test_accuracy: f64,
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
    /// Last validation loss.
    pub test_loss: f64,
    /// Last validation accuracy (fraction).
    pub test_accuracy: f64,
    /// Host reads of tensors per training step (logging included).
    pub host_syncs_per_step: f64,
    /// Per-epoch logs.
    pub epochs_log: Vec<EpochLog>,
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
}

/// An observer of training events. A callback that returns an error is
/// reported once and then detached: observers never break training.
pub trait Callback: Send {
    /// A short name for messages.
    fn name(&self) -> &str;
    /// Handles one event.
    fn on_event(&mut self, event: &Event<'_>) -> std::result::Result<(), String>;
}
