//! Writes TensorBoard event files for scalar metrics, and reads them back.
//!
//! An event file is a sequence of TFRecords (length, CRCs, data), each holding
//! one `tensorboard.Event` protobuf. The protobufs are encoded by hand: scalar
//! logging needs three messages and a handful of fields.
//!
//! ```no_run
//! # fn main() -> redline_tensorboard::Result<()> {
//! use redline_tensorboard::EventWriter;
//! let mut writer = EventWriter::create(std::path::Path::new("runs/mnist"))?;
//! writer.add_scalar("train/loss", 1, 2.30, 1_700_000_000.0)?;
//! writer.add_scalars(1, &[("val/loss", 2.1), ("val/acc", 0.2)], 1_700_000_001.0)?;
//! writer.flush()?;
//! # Ok(()) }
//! ```

mod error;
mod proto;
mod reader;
mod record;
mod writer;

pub use error::{Error, Result};
pub use reader::read_scalars;
pub use writer::{EventWriter, FILE_VERSION};
