//! The crate's one error type: every variant names the file and, for a bad
//! record, the byte offset, so a message reads well on its own.

use std::io;
use std::path::PathBuf;

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong writing or reading an event file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation on `path` failed (`op` says which: "creating directory", "writing", ...).
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// What was being done when it failed.
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The file ends in the middle of a record.
    #[error(
        "{}: record at byte {offset}: needs {needed} bytes but only {available} remain \
         (file truncated, or still being written?)",
        path.display()
    )]
    Truncated {
        /// The event file.
        path: PathBuf,
        /// Byte offset of the start of the incomplete record.
        offset: u64,
        /// Bytes the record needs from `offset` on.
        needed: u64,
        /// Bytes the file actually has from `offset` on.
        available: u64,
    },

    /// A record's stored CRC does not match its bytes.
    #[error(
        "{}: record at byte {offset}: {part} CRC mismatch (stored {stored:#010x}, computed {computed:#010x}); \
         the file is corrupt",
        path.display()
    )]
    BadCrc {
        /// The event file.
        path: PathBuf,
        /// Byte offset of the start of the bad record.
        offset: u64,
        /// Which checksum failed: `"length"` or `"data"`.
        part: &'static str,
        /// The masked CRC stored in the file.
        stored: u32,
        /// The masked CRC computed from the bytes read.
        computed: u32,
    },

    /// A record's payload is not a valid `Event` protobuf.
    #[error("{}: record at byte {offset}: malformed Event protobuf: {reason}", path.display())]
    Malformed {
        /// The event file.
        path: PathBuf,
        /// Byte offset of the start of the record.
        offset: u64,
        /// What the decoder found wrong.
        reason: String,
    },
}
