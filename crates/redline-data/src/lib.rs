//! Redline data: datasets and the loader that feeds the trainer.
//!
//! * [`idx`]: a strict reader for the IDX format of the MNIST family (gzip or raw).
//! * [`mnist`]: an MNIST-format folder as two normalised device tensors per split.
//! * [`loader`]: seeded per-epoch shuffling, device-resident or streamed batches, background prefetch.
//! * [`place`]: the `--data-on-device` policy (resident when the split fits a memory budget).
//! * [`stage`]: staging buffers for streaming (pinned memory and async copies on GPUs).

#[cfg(feature = "cuda")]
mod cuda_stage;
mod error;
pub mod idx;
pub mod loader;
pub mod mnist;
pub mod place;
pub mod stage;

pub use error::{Error, Result};
pub use loader::{Batch, Loader, LoaderConfig};
pub use mnist::{Normalize, Split, SplitKind};
pub use place::{place, DataOnDevice, Placement};
