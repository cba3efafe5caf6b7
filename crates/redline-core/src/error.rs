//! The error type of `redline-core`.

/// Errors raised by device selection, dtype policy and host reads.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `--device` string that does not parse.
    #[error("--device {spec:?}: not a device; expected `auto`, `cpu` or `cuda:N` (e.g. cuda:0)")]
    BadDeviceSpec {
        /// What the user wrote.
        spec: String,
    },
    /// A device that this machine or this build does not have.
    #[error("--device {requested}: {reason}\nHINT: {hint}")]
    DeviceUnavailable {
        /// The device asked for, as written.
        requested: String,
        /// What exists instead.
        reason: String,
        /// How to fix it.
        hint: String,
    },
    /// A precision name that does not parse.
    #[error(
        "--precision {0:?}: expected 32-true (32), bf16-mixed (bf16), 16-mixed (16) or bf16-true"
    )]
    BadPrecision(String),
    /// A matmul precision name that does not parse.
    #[error(
        "--matmul-precision {0:?}: expected `highest` (fp32 products, the default) or `high` \
         (TF32 products on a GPU)"
    )]
    BadMatmulPrecision(String),
    /// A tensor operation failed in candle.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;
