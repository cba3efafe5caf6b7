//! The error type of `redline-train`.

/// Errors raised by the training loop.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A trainer or optimizer setting that cannot work.
    #[error("{0}")]
    Config(String),
    /// The loss stopped being a finite number.
    #[error(
        "loss became {value} at step {step} (epoch {epoch})\nHINT: lower --lr (now {lr}), \
         check the input normalisation, or add gradient clipping"
    )]
    NonFiniteLoss {
        /// The loss read back.
        value: f64,
        /// Global step (1-based) of the log point that saw it.
        step: usize,
        /// Epoch (1-based).
        epoch: usize,
        /// Learning rate at that point.
        lr: f64,
    },
    /// An error from the data crate.
    #[error(transparent)]
    Data(#[from] redline_data::Error),
    /// An error from the models crate.
    #[error(transparent)]
    Model(#[from] redline_models::Error),
    /// An error from the core crate.
    #[error(transparent)]
    Core(#[from] redline_core::Error),
    /// A tensor operation failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
