//! Redline data: datasets and the loader that feeds the trainer.
//!
//! * [`idx`]: a strict reader for the IDX format of the MNIST family (gzip or raw).
//! * [`mnist`]: an MNIST-format folder as two normalised device tensors per split.
//! * [`loader`]: seeded per-epoch shuffling, batch slicing and background prefetch.

mod error;
pub mod idx;
pub mod loader;
pub mod mnist;

pub use error::{Error, Result};
pub use loader::{Batch, Loader, LoaderConfig};
pub use mnist::{Normalize, Split, SplitKind};
