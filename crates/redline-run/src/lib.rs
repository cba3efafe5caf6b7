//! The run folder (format: docs/run-dir.md) as a library: its record types
//! ([`records`]), the writer a training run fills as it goes ([`RunLog`]:
//! metrics as JSON lines, CSV and TensorBoard scalars, system samples) and
//! [`Run`], which creates the folder, hands the trainer its observer and, in
//! one call at the end, writes the profile, the breakdown, `summary.json` and
//! the report. `redline train` uses exactly this; `redline-report` reads the
//! same record types back.

mod csv;
mod error;
pub mod folder;
pub mod inputs;
mod log;
pub mod records;
mod reopen;
pub mod resume;
mod run;
pub mod segments;

pub use csv::CsvLog;
pub use error::{Error, Result};
pub use log::RunLog;
pub use records::{LossScaleRecord, RunStatus, Summary};
pub use reopen::{Reopened, ResumePoint};
pub use run::{summarize, Ending, Finished, ReportFn, Run};
