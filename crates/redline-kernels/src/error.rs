//! The error type of `redline-kernels`.

/// Errors raised by the fused kernels and their generic fallbacks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed in candle (shapes that do not fit, a device
    /// the op cannot run on); the message names the op and the operands.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// Tensors that a fused kernel cannot take (sizes, layouts, dtypes), said
    /// with the numbers that do not fit.
    #[error("{0}")]
    Shape(String),
    /// A GPU kernel of Redline's own could not be loaded or launched.
    #[error("GPU kernel: {0}")]
    Gpu(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
