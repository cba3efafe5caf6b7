//! The run report and the runs listing.
//!
//! [`RunData::load`] reads a run directory (docs/run-dir.md), [`render_html`]
//! turns it into one self-contained page, [`write_report`] writes that page to
//! `report.html`, [`advice`] reads the measured numbers and says what to change,
//! and [`list_runs`] / [`format_runs`] make the `redline runs` table.

mod advice;
mod charts;
mod error;
mod html;
mod run;
mod runs;
mod sections;

pub use advice::{advice, Advice, Level};
pub use error::{Error, Result};
pub use html::{lr_finder_page, render_html, write_report};
/// The record types this crate reads, written by `redline-run`.
pub use redline_run::records;
pub use redline_run::records::{
    ActionRow, Breakdown, Category, CategoryShare, EpochRecord, GpuProcess, GpuSample, HostProcess,
    HostSample, ProfileFile, RunStatus, StepRecord, Summary, SystemRecord, Timeline, TimelineRow,
};
pub use run::RunData;
pub use runs::{format_runs, list_runs, RunRow};
