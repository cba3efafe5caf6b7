//! Redline train: the loop and what it drives.
//!
//! * [`Trainer`] (built with [`Trainer::builder`]): fit / validate / test.
//! * [`Event`] and [`Callback`]: the loop emits events; logging, progress bars
//!   and (later) profilers observe them and can never break training.
//! * [`optim`]: Adam, AdamW and SGD with PyTorch's update rules.
//! * [`metrics`]: the JSON-lines metrics writer.

mod device_clock;
mod error;
pub mod events;
pub mod loss;
pub mod metrics;
pub mod optim;
mod running;
mod trainer;

pub use error::{Error, Result};
pub use events::{Callback, EpochLog, Event, FitSummary, StepLog};
pub use metrics::{epoch_record, step_record, JsonlMetrics};
pub use optim::{Optimizer, OptimizerConfig};
pub use redline_profile::{Mode as ProfilerMode, Profile};
pub use trainer::{EvalResult, TrainConfig, Trainer, TrainerBuilder};
