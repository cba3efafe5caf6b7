//! Redline's profilers.
//!
//! * [`Profiler`]: the training loop switches between [`Action`]s; time goes to
//!   exactly one action at a time, so the table and the breakdown sum to wall time.
//! * [`Breakdown`]: compute, data wait, transfer, host sync, overhead, idle;
//!   on a GPU also [`GpuBusy`], the time kernels ran (from a kernel trace).
//! * [`Profile`]: the finished tables, written into the run folder
//!   (`breakdown.json`, `profile.txt`/`.json`, `trace.json`).

mod action;
mod breakdown;
mod chrome;
mod error;
mod kernels;
mod nullable;
mod profiler;
mod report;

pub use action::{Action, Category, Mode};
pub use breakdown::{Breakdown, CategoryShare, Timeline, TimelineRow, RULE};
pub use chrome::to_chrome_json;
pub use error::{Error, Result};
pub use kernels::{GpuBusy, KernelRow, KernelSpan, KernelTally, TOP_KERNELS};
pub use nullable::nullable;
pub use profiler::{DeviceClock, Profiler};
pub use report::{ActionRow, Profile, ProfileFile, SpanRow};
