//! The profile crate's one error type.

use std::path::PathBuf;

/// What can go wrong writing profiles.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A profile file could not be written.
    #[error("{path}: {source} (check that the run folder is writable)")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Serialising a profile failed.
    #[error("serialising {what}: {source}")]
    Json {
        /// Which output.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// An unknown `--profiler` value.
    #[error("--profiler {0}: expected off, simple or detailed")]
    Mode(String),
}

/// Result with this crate's error.
pub type Result<T> = std::result::Result<T, Error>;
