//! `--data PATH`'s formats as one list of readers. Each [`Reader`] says
//! whether it recognises a path, names the format for the startup line, and
//! opens it; [`detect`] asks them in order. A new format is one more reader
//! in [`READERS`]: nothing else changes.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::error::{Error, Result};
use crate::samples::Samples;
use crate::source::DataOptions;

mod arrays;
mod cifar;
mod idx;
mod images;
pub use images::pixel_norm;
mod shards;
mod table;
mod tokens;

/// One data format.
pub trait Reader: Send + Sync {
    /// A short stable id (`idx`, `cifar`, `csv`, `arrays`, `images`).
    fn id(&self) -> &'static str;
    /// What a path of this format looks like, for the message that lists
    /// what `--data` takes ("a .csv/.tsv table").
    fn takes(&self) -> &'static str;
    /// When `path` (a folder, or a file) holds this format: the format's
    /// name for the startup line, and the folder or file that holds it.
    fn recognise(&self, path: &Path) -> Option<(String, PathBuf)>;
    /// Whether the folder `dir` is a data set folder of this format (so a
    /// file inside it given as `--data` means the folder).
    fn is_set_folder(&self, _dir: &Path) -> bool {
        false
    }
    /// Reads the training split and the test split when the data has one,
    /// noting what it decided in `notes`; gives up with
    /// [`Error::Interrupted`] once `stop` is set.
    fn open(
        &self,
        at: &Path,
        opts: &DataOptions,
        notes: &mut Vec<String>,
        stop: &AtomicBool,
    ) -> Result<(Samples, Option<Samples>)>;
    /// One sample's input shape, where it can be read without reading the
    /// data (a table's first row). `None`: not without reading it.
    fn peek_inputs(&self, _at: &Path, _opts: &DataOptions) -> Result<Option<Vec<usize>>> {
        Ok(None)
    }
    /// Whether its features are standardised with the training rows'
    /// statistics (tables, unless `--no-standardize`).
    fn standardizes(&self) -> bool {
        false
    }
    /// The startup line's name under `opts`, where the options change what
    /// is read (a text's tokens under `--tokenizer`); `name` otherwise.
    fn name_under(&self, name: String, _opts: &DataOptions) -> String {
        name
    }
}

/// Every format, in the order they are asked (the first that recognises a
/// path reads it).
pub static READERS: [&dyn Reader; 7] = [
    &idx::Idx,
    &cifar::Cifar,
    &tokens::Tokens,
    &arrays::Arrays,
    &images::Images,
    &shards::Shards,
    &table::Table,
];

/// The format `--data` was read as.
#[derive(Clone)]
pub struct Format {
    /// Its reader.
    pub reader: &'static dyn Reader,
    /// Its name for the startup line ("CIFAR-10").
    pub name: String,
}

impl Format {
    /// The reader's id.
    pub fn id(&self) -> &'static str {
        self.reader.id()
    }
}

impl std::fmt::Debug for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.id(), self.name)
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// A path recognised: its format, and the folder or file that holds it.
#[derive(Debug, Clone)]
pub struct Found {
    /// The format.
    pub format: Format,
    /// The folder or file that holds the data.
    pub at: PathBuf,
}

/// What `--data` takes, from every reader.
fn takes() -> String {
    let all: Vec<&str> = READERS.iter().map(|r| r.takes()).collect();
    format!("--data takes {}", all.join(", "))
}

/// The real reason a path cannot be read (a symlink loop, a folder on the
/// way that cannot be entered), not a blanket "no such file".
fn unreadable(path: &Path, source: std::io::Error) -> Error {
    let (source, hint) = match source.kind() {
        std::io::ErrorKind::NotFound => (
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
            takes(),
        ),
        std::io::ErrorKind::PermissionDenied => (
            source,
            "a folder on the way cannot be entered: check the permissions".into(),
        ),
        // ELOOP (Linux): the kind is not stable in std yet.
        _ if source.raw_os_error() == Some(40) => (
            source,
            "the path is a loop of symbolic links: point --data at the real folder".into(),
        ),
        _ => (source, "check the path".into()),
    };
    Error::Io {
        path: path.to_path_buf(),
        source,
        hint,
    }
}

/// The reader that recognises `path`, asked in [`READERS`]' order.
pub fn detect(path: &Path) -> Result<Found> {
    // A shard pattern names files, not itself.
    if crate::stream::shards::is_pattern(path) {
        for reader in READERS {
            if let Some((name, at)) = reader.recognise(path) {
                return Ok(Found {
                    format: Format { reader, name },
                    at,
                });
            }
        }
    }
    let meta = std::fs::metadata(path).map_err(|e| unreadable(path, e))?;
    if meta.is_dir() {
        std::fs::read_dir(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
            hint: "the folder cannot be listed: check its permissions".into(),
        })?;
    } else if let Some(parent) = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty() && READERS.iter().any(|r| r.is_set_folder(p)))
    {
        // One file of a data set folder: the folder is what is meant.
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            msg: format!(
                "this is one file of a data set; --data takes the folder that holds it: \
                 --data {}",
                parent.display()
            ),
        });
    }
    for reader in READERS {
        if let Some((name, at)) = reader.recognise(path) {
            return Ok(Found {
                format: Format { reader, name },
                at,
            });
        }
    }
    let what = match meta.is_dir() {
        true => "no data set recognised in this folder",
        false => "unknown data file type",
    };
    Err(Error::Invalid {
        path: path.to_path_buf(),
        msg: format!("{what}; {}", takes()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_every_reader_says_what_it_takes() {
        let mut ids: Vec<&str> = READERS.iter().map(|r| r.id()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), READERS.len());
        let t = takes();
        for r in READERS {
            assert!(t.contains(r.takes()), "{t}");
        }
    }
}
