//! Redline data: datasets and the loader that feeds the trainer.
//!
//! * [`idx`]: a strict reader for the IDX format of the MNIST family (gzip or raw).
//! * [`dataset`]: the `Dataset` trait, typed targets, and host-memory data.
//! * [`split`]: a whole data set as two tensors on a device.
//! * [`mnist`]: an MNIST-format folder, normalised.
//! * [`readers`]: the formats `--data` reads, one [`Reader`] each, in one list.
//! * [`source`]: `--data PATH`: format detection, task, hold-out; [`cifar`], [`table`] (CSV), [`arrays`] (npz, safetensors, npy), [`image_folder`]; [`augment`]: random crop and flip on the loader thread.
//! * [`stream`]: image folders and tar shards read from disk batch by batch, decoded and augmented on worker threads; [`samples`]: a split resident or streamed.
//! * [`tokens`]: token ids of a text file (bytes) or nanoGPT `.bin`, memory-mapped, as windows of `block + 1` ids for language models.
//! * [`pack`]: `redline pack`, an image folder into tar shards.
//! * [`loader`]: seeded per-epoch shuffling, device-resident or streamed batches, background prefetch.
//! * [`place`]: the `--data-on-device` policy (resident when the split fits a memory budget).
//! * [`stage`]: staging buffers for streaming (pinned memory and async copies on GPUs).

pub mod arrays;
pub mod augment;
pub mod cifar;
#[cfg(feature = "cuda")]
mod cuda_stage;
pub mod cursor;
pub mod dataset;
mod error;
pub mod idx;
pub mod image_folder;
pub mod loader;
pub mod mnist;
pub mod pack;
pub mod place;
pub mod readers;
pub mod samples;
pub mod source;
pub mod split;
pub mod stage;
pub mod stream;
pub mod table;
pub mod tokens;

pub use augment::{Augment, Augmented};
pub use cursor::DeviceCursor;
pub use dataset::{Dataset, HostData, TargetKind, Targets, TargetsMut};
pub use error::{Error, Result};
pub use loader::{Batch, Loader, LoaderConfig, Shard};
pub use mnist::{Normalize, SplitKind};
pub use place::{place, DataOnDevice, Placement};
pub use readers::{pixel_norm, Reader, READERS};
pub use samples::Samples;
pub use source::{
    detect, peek_inputs, prepare, prepare_until, DataOptions, Format, Found, Prepared, StreamMode,
    StreamOptions, Task,
};
pub use split::Split;
pub use stream::{ChannelNorm, PipelineStats, Streamed, Transform};
pub use table::{Header, TargetColumn};
