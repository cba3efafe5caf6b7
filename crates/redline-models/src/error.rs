//! The error type of `redline-models`.

use std::path::PathBuf;

/// Errors raised while building models or moving their weights.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model configuration that cannot be built.
    #[error("model config: {0}")]
    Config(String),
    /// A weights file whose names or shapes do not fit the model.
    #[error("{path}: {msg}\nHINT: {hint}")]
    Weights {
        /// The file.
        path: PathBuf,
        /// What did not fit, listing the offending names.
        msg: String,
        /// How to fix it.
        hint: String,
    },
    /// A weights file that could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An error from the core crate (device, precision).
    #[error(transparent)]
    Core(#[from] redline_core::Error),
    /// An error from a fused kernel or its fallback.
    #[error(transparent)]
    Kernels(#[from] redline_kernels::Error),
    /// A tensor operation failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
