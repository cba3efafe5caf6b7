//! Redline train: the loop and what it drives.
//!
//! * [`Trainer`] (built with [`Trainer::builder`]): fit / validate / test.
//! * [`TrainStep`]: the step contract (batch in, loss and named metrics out);
//!   [`Classifier`] and [`Regressor`] are ready implementations.
//! * [`Event`] and [`Callback`]: the loop emits events; logging, progress bars
//!   and (later) profilers observe them and can never break training.
//! * [`optim`]: Adam, AdamW and SGD with PyTorch's update rules.
//! * [`clip`]: gradient clipping (norm, value) and the gradient norm.
//! * [`metrics`]: the JSON-lines metrics writer.
//! * [`strategy`]: one process or data-parallel ranks (`--strategy ddp`).
//! * [`mfu`]: the fit's FLOPs and model FLOPs utilisation against the device's peak.
//! * [`scaler`]: the dynamic loss scaler of `16-mixed` (PyTorch's `GradScaler`).

pub mod checkpoint;
pub mod clip;
mod device_clock;
pub mod early_stop;
mod error;
pub mod events;
pub mod graph;
mod kernel_trace;
pub mod lm_step;
pub mod loss;
pub mod memory;
pub mod metrics;
pub mod mfu;
pub mod optim;
#[cfg(feature = "cuda")]
mod optim_gpu;
pub mod probe;
mod running;
pub mod scaler;
pub mod schedule;
pub mod step;
pub mod strategy;
pub(crate) mod trainer;
pub mod tune;

pub use clip::GradClip;
pub use early_stop::EarlyStop;
pub use error::{Error, Result};
pub use events::{Callback, EpochLog, EvalResult, Event, FitSummary, MetricValues, StepLog};
pub use graph::{GraphMode, GraphNodes, GraphStatus};
pub use kernel_trace::GpuBusyResult;
pub use lm_step::LanguageModel;
pub use memory::MemorySplit;
pub use metrics::{epoch_record, prefixed, step_record, test_record, JsonlMetrics};
pub use optim::{Optimizer, OptimizerConfig};
pub use redline_profile::{GpuBusy, Mode as ProfilerMode, Profile};
pub use scaler::{GradScaler, LossScale, ScalerState};
pub use schedule::LrSchedule;
pub use step::{Classifier, Metric, RegressionLoss, Regressor, StepOutput, TrainStep};
pub use strategy::Strategy;
pub use trainer::{
    set_cpu_bf16_gemm, set_gpu_conv, CheckpointLog, TrainConfig, Trainer, TrainerBuilder,
};
