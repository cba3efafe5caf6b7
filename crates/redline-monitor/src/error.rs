//! The error type of `redline-monitor`.
//!
//! Sampling itself never fails (a missing driver or an unsupported query becomes
//! a note or a `None`); errors come only from `run`'s outputs and options.

use std::path::PathBuf;

/// Errors raised by [`crate::run`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CSV file could not be opened, read or written.
    // The I/O error is part of the message, not a `source`: the CLI prints the
    // chain after the message, and the HINT line should come last.
    #[error("{path}: cannot {action} the CSV file: {error}\nHINT: {hint}")]
    Csv {
        /// The `--csv` file.
        path: PathBuf,
        /// What was being done (`open`, `read`, `append to`).
        action: &'static str,
        /// The underlying error.
        error: std::io::Error,
        /// How to fix it.
        hint: String,
    },
    /// An existing CSV file whose header is not the one this machine would write.
    #[error(
        "{path}: the existing CSV header does not match this machine's columns\n  \
         found:    {found}\n  expected: {expected}\n\
         HINT: the file was written with a different GPU count; pass a new --csv FILE"
    )]
    CsvHeader {
        /// The `--csv` file.
        path: PathBuf,
        /// The header line found in the file.
        found: String,
        /// The header line this machine writes.
        expected: String,
    },
    /// A monitor option that cannot work (e.g. a zero interval).
    #[error("{0}")]
    Options(String),
    /// The output (stdout for `run`) could not be written; a closed pipe is not
    /// an error, it ends the run.
    #[error("writing the monitor output: {0}")]
    Output(std::io::Error),
    /// A sample could not be encoded as JSON.
    #[error("encoding a sample as JSON: {0}")]
    Json(serde_json::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
