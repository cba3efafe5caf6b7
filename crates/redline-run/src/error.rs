//! The run folder's one error type.

use std::path::PathBuf;

/// What went wrong writing a run folder.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or folder could not be created or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done (`creating`, `writing`).
        what: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The folder asked for already holds a run.
    #[error(
        "--run-dir {}: this folder already holds a run\nHINT: pick a new folder, or leave out \
         --run-dir for runs/<date-time>-<model>",
        .0.display()
    )]
    Exists(PathBuf),
    /// The folder asked for holds files of its own: a run would overwrite them.
    #[error(
        "--run-dir {}: this folder is not empty and not a Redline run (it holds {entries}); a \
         run would write config.toml, metrics.csv, report.html and checkpoints/ into it, over \
         any files of those names\nHINT: pick a new or empty folder, or leave out --run-dir \
         for runs/<date-time>-<model>",
        dir.display()
    )]
    NotEmpty {
        /// The folder.
        dir: PathBuf,
        /// What it holds: the first few names, and how many in all.
        entries: String,
    },
    /// `--resume` named a run folder whose process is still alive.
    #[error(
        "--resume {}: this run is still running (pid {pid})\nHINT: stop it first (Ctrl-C or \
         `kill {pid}` writes a checkpoint), then resume",
        dir.display()
    )]
    Running {
        /// The run folder.
        dir: PathBuf,
        /// Its live process.
        pid: u32,
    },
    /// A record could not be written or a field does not fit its record.
    #[error("{what}: {source}")]
    Json {
        /// Which record.
        what: &'static str,
        /// The cause.
        source: serde_json::Error,
    },
    /// The run's end could not be written whole; `summary.json` says `failed`
    /// with this message.
    #[error("{0}")]
    Unfinished(String),
    /// The TensorBoard event file could not be written.
    #[error("the TensorBoard event file: {0}")]
    Tensorboard(#[from] redline_tensorboard::Error),
    /// The profile or breakdown could not be written.
    #[error(transparent)]
    Profile(#[from] redline_profile::Error),
    /// A checkpoint could not be read or does not fit the run.
    #[error(transparent)]
    Checkpoint(#[from] redline_train::Error),
    /// A resume that cannot go on (a step limit below the checkpoint's).
    #[error("{0}")]
    Resume(String),
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { what, path, source }
    }
}

/// The run folder's result type.
pub type Result<T> = std::result::Result<T, Error>;
