//! The error type of `redline-train`.

/// Errors raised by the training loop.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A trainer or optimizer setting that cannot work.
    #[error("{0}")]
    Config(String),
    /// The loss stopped being a finite number.
    #[error(
        "loss became {value} at step {step} (epoch {epoch})\nHINT: lower the learning rate \
         (now {lr:.3e}: --lr, or a --lr-schedule's max_lr where it sets one), check the input \
         normalisation, or add gradient clipping"
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
    /// The loss grew past `--divergence-threshold` times the first step's.
    #[error(
        "training diverged at step {step} (epoch {epoch}): the loss is {value:.4e}, {ratio:.3e} \
         times the first step's {start:.4} (above --divergence-threshold {factor})\n\
         HINT: lower the learning rate (now {lr:.3e}: --lr, or a --lr-schedule's max_lr where \
         it sets one) or clip gradients (--clip-grad-norm 1.0); \
         --divergence-threshold 0 turns this check off"
    )]
    Diverged {
        /// The loss read back.
        value: f64,
        /// The fit's first step's loss.
        start: f64,
        /// `value / start`.
        ratio: f64,
        /// The threshold it crossed.
        factor: f64,
        /// Global step (1-based) of the log point that saw it.
        step: usize,
        /// Epoch (1-based).
        epoch: usize,
        /// Learning rate at that point.
        lr: f64,
    },
    /// A writer of a result the user asked for (the run folder's records,
    /// `--metrics`) failed, e.g. on a full disk.
    #[error(
        "{callback}: {message}\nHINT: free space on that disk (or write elsewhere) and run again"
    )]
    Output {
        /// The callback's name.
        callback: String,
        /// What failed.
        message: String,
    },
    /// A checkpoint could not be written or read, or does not fit this run.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file or folder at fault.
        path: std::path::PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The fit was asked to stop (a signal): it ended after a whole step.
    #[error("interrupted after step {step} (epoch {epoch})")]
    Interrupted {
        /// The last step completed (a stop during a fit's validation names
        /// the epoch's last step; 0 in a test pass after the fit).
        step: usize,
        /// Its epoch.
        epoch: usize,
    },
    /// The device ran out of memory.
    #[error(
        "{device} ran out of memory at batch size {batch_size}: {detail}\nHINT: use a smaller \
         batch, e.g. --batch-size {smaller}; with a large dataset also try --data-on-device off \
         (streams batches instead of keeping the split on the device)"
    )]
    OutOfMemory {
        /// The device, e.g. `cuda:0`.
        device: String,
        /// The batch size of the pass that failed.
        batch_size: usize,
        /// Half of it, the suggestion.
        smaller: usize,
        /// The driver's message.
        detail: String,
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
    /// An error from a fused kernel or its fallback.
    #[error(transparent)]
    Kernels(#[from] redline_kernels::Error),
    /// A collective of data-parallel training failed (a rank died or hangs).
    #[error(transparent)]
    Dist(#[from] redline_dist::Error),
    /// A tensor operation failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

impl Error {
    /// Turns a device out-of-memory failure into [`Error::OutOfMemory`] naming
    /// the batch size; any other error passes through unchanged.
    pub fn with_oom_context(self, device: &str, batch_size: usize) -> Self {
        use redline_kernels::Error as K;
        use redline_models::Error as M;
        let candle = match &self {
            Self::Candle(c)
            | Self::Core(redline_core::Error::Candle(c))
            | Self::Kernels(K::Candle(c))
            | Self::Data(redline_data::Error::Candle(c))
            | Self::Model(M::Candle(c) | M::Kernels(K::Candle(c)))
            | Self::Model(M::Core(redline_core::Error::Candle(c))) => c,
            _ => return self,
        };
        if !redline_core::memory::is_out_of_memory(candle) {
            return self;
        }
        Self::OutOfMemory {
            device: device.to_string(),
            batch_size,
            smaller: (batch_size / 2).max(1),
            detail: candle.to_string(),
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Before: `onecycle:max_lr=1e308` hinted "lower --lr (now 4000...000)",
    /// a 300-digit number, and named only --lr.
    #[test]
    fn a_huge_rate_prints_short_and_names_the_schedule() {
        let e = Error::NonFiniteLoss {
            value: f64::NAN,
            step: 3,
            epoch: 1,
            lr: 4e306,
        }
        .to_string();
        assert!(e.contains("now 4.000e306"), "{e}");
        assert!(e.contains("--lr-schedule's max_lr"), "{e}");
        assert!(e.len() < 400, "{e}");
    }

    #[test]
    fn out_of_memory_names_the_batch_and_suggests_a_smaller_one() {
        let oom = Error::Candle(candle_core::Error::Msg(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
        ));
        let msg = oom.with_oom_context("cuda:0", 4096).to_string();
        assert!(
            msg.starts_with("cuda:0 ran out of memory at batch size 4096"),
            "{msg}"
        );
        assert!(msg.contains("--batch-size 2048"), "{msg}");
        // Inside a model's forward (a kernel's error wrapped by the model crate).
        let inner = candle_core::Error::Msg("CUDA_ERROR_OUT_OF_MEMORY".into());
        let nested = Error::Model(redline_models::Error::Kernels(inner.into()));
        let msg = nested.with_oom_context("cuda:0", 64).to_string();
        assert!(msg.contains("--batch-size 32"), "{msg}");
        let other = Error::Config("nope".into()).with_oom_context("cuda:0", 64);
        assert_eq!(other.to_string(), "nope");
    }
}
