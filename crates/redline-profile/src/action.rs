//! What the main loop can be doing ([`Action`]) and the breakdown category each
//! action's time belongs to ([`Category`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// One thing the training loop's thread does; at any instant it does exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Blocked on the loader for the next batch.
    DataWait,
    /// Copying a batch host-to-device (or waiting for an async copy).
    Transfer,
    /// The user's training step: forward, loss and the step's metrics
    /// (Lightning's `training_step`).
    TrainingStep,
    /// The backward pass.
    Backward,
    /// The optimizer step.
    OptimizerStep,
    /// Averaging gradients across data-parallel ranks (the part of the
    /// all-reduce the step waits for).
    AllReduce,
    /// Accumulating running metrics on the device (no read-back).
    Metrics,
    /// Reading metric values back to the host (a device sync).
    HostSync,
    /// Logging and callbacks.
    Logging,
    /// The validation pass.
    Validation,
    /// Writing weights or checkpoints.
    Checkpointing,
    /// Loop bookkeeping between the named actions.
    Other,
}

impl Action {
    /// Every action, in table order.
    pub const ALL: [Action; 12] = [
        Action::DataWait,
        Action::Transfer,
        Action::TrainingStep,
        Action::Backward,
        Action::OptimizerStep,
        Action::AllReduce,
        Action::Metrics,
        Action::HostSync,
        Action::Logging,
        Action::Validation,
        Action::Checkpointing,
        Action::Other,
    ];

    /// Position in [`Action::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name printed in tables and traces.
    pub fn label(self) -> &'static str {
        match self {
            Action::DataWait => "waiting for data",
            Action::Transfer => "host-to-device copy",
            Action::TrainingStep => "training_step",
            Action::Backward => "backward",
            Action::OptimizerStep => "optimizer step",
            Action::AllReduce => "gradient all-reduce",
            Action::Metrics => "metric accumulation (on device)",
            Action::HostSync => "metric read-back (host sync)",
            Action::Logging => "logging/callbacks",
            Action::Validation => "validation",
            Action::Checkpointing => "checkpointing",
            Action::Other => "other",
        }
    }

    /// The breakdown category this action's time counts in.
    pub fn category(self) -> Category {
        match self {
            Action::TrainingStep
            | Action::Backward
            | Action::OptimizerStep
            | Action::Metrics
            | Action::Validation => Category::Compute,
            Action::DataWait => Category::DataWait,
            Action::Transfer => Category::Transfer,
            Action::HostSync => Category::HostSync,
            Action::AllReduce => Category::Communication,
            Action::Logging | Action::Checkpointing | Action::Other => Category::Overhead,
        }
    }
}

/// A slice of the step-time breakdown. The six are exclusive and sum to wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// The device is running the model: forward, loss, backward, optimizer, metrics, validation.
    Compute,
    /// The loop waits for the loader.
    DataWait,
    /// Host-to-device copies the loop waits for.
    Transfer,
    /// Read-backs that make the host wait for the device.
    HostSync,
    /// Data-parallel ranks exchanging gradients: the all-reduce the step
    /// waits for (none in one process).
    Communication,
    /// Framework work on the host: logging, callbacks, checkpoints, bookkeeping.
    Overhead,
    /// Wall time in no action at all: the loop had handed control to nothing.
    Idle,
}

impl Category {
    /// Every category, in breakdown order.
    pub const ALL: [Category; 7] = [
        Category::Compute,
        Category::DataWait,
        Category::Transfer,
        Category::HostSync,
        Category::Communication,
        Category::Overhead,
        Category::Idle,
    ];

    /// Position in [`Category::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The `snake_case` name used in files.
    pub fn key(self) -> &'static str {
        match self {
            Category::Compute => "compute",
            Category::DataWait => "data_wait",
            Category::Transfer => "transfer",
            Category::HostSync => "host_sync",
            Category::Communication => "communication",
            Category::Overhead => "overhead",
            Category::Idle => "idle",
        }
    }

    /// The name printed for people.
    pub fn label(self) -> &'static str {
        match self {
            Category::Compute => "compute",
            Category::DataWait => "data wait",
            Category::Transfer => "transfer",
            Category::HostSync => "host sync",
            Category::Communication => "communication",
            Category::Overhead => "overhead",
            Category::Idle => "idle",
        }
    }
}

/// How much the profiler records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Only the breakdown (always on; a clock read per action switch).
    #[default]
    Off,
    /// Also the per-action table.
    Simple,
    /// Also per-layer spans, per-op counts and a Chrome trace.
    Detailed,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Mode::Off => "off",
            Mode::Simple => "simple",
            Mode::Detailed => "detailed",
        })
    }
}

impl FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "off" | "none" => Ok(Mode::Off),
            "simple" => Ok(Mode::Simple),
            "detailed" => Ok(Mode::Detailed),
            other => Err(Error::Mode(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_has_a_category_and_index() {
        for (i, a) in Action::ALL.iter().enumerate() {
            assert_eq!(a.index(), i);
            assert_ne!(
                a.category(),
                Category::Idle,
                "idle is the absence of an action"
            );
        }
        for (i, c) in Category::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }

    #[test]
    fn modes_parse() {
        assert_eq!("simple".parse::<Mode>().ok(), Some(Mode::Simple));
        assert_eq!("detailed".parse::<Mode>().ok(), Some(Mode::Detailed));
        let e = "verbose".parse::<Mode>().err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("simple or detailed")));
    }
}
