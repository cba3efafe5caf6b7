//! The error type of `redline-data`.

use std::path::PathBuf;

/// Errors raised while reading datasets or producing batches.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read (missing, permissions, corrupt gzip stream).
    #[error("{path}: {source}\nHINT: {hint}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
        /// How to fix it.
        hint: String,
    },
    /// A file whose contents are not what the IDX format or the dataset requires.
    #[error("{path}: {msg}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong, with the numbers involved.
        msg: String,
    },
    /// A loader setting that cannot work (e.g. batch size 0).
    #[error("{0}")]
    Config(String),
    /// The background prefetch thread stopped unexpectedly.
    #[error("loader: the prefetch thread stopped: {0}")]
    Prefetch(String),
    /// Reading was stopped (a signal while the data loaded).
    #[error("stopped while reading the data")]
    Interrupted,
    /// A tensor operation failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
