//! The crate's one error type: every variant names the file or chart it is about.

use std::path::PathBuf;

/// Everything that can go wrong reading a run directory or writing its report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or folder could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A JSON file (or one line of `metrics.jsonl`) does not parse.
    #[error(
        "{}:{line}:{column}: {source}\nHINT: the file is corrupt (a run killed while writing it?); \
         delete it and `redline report` shows the section as missing",
        path.display()
    )]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line in the file.
        line: usize,
        /// 1-based column in that line.
        column: usize,
        /// The parser's message.
        source: serde_json::Error,
    },
    /// The folder holds none of the files a run writes.
    #[error(
        "{}: not a run directory (no summary.json, metrics.jsonl, config.toml or breakdown.json)\n\
         HINT: pass the folder `redline train` wrote, e.g. runs/20261122-031000-mlp; \
         `redline runs` lists them",
        dir.display()
    )]
    NotARunDir {
        /// The folder that was given.
        dir: PathBuf,
    },
    /// Plotters failed to draw a chart.
    #[error("chart {chart}: {message}")]
    Chart {
        /// The chart's name (its `data-chart` attribute).
        chart: &'static str,
        /// What plotters said.
        message: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Wraps an I/O error with the path it happened on.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    /// Wraps a plotters error with the chart it happened in.
    pub(crate) fn chart<E: std::fmt::Display>(chart: &'static str) -> impl Fn(E) -> Error {
        move |e| Error::Chart {
            chart,
            message: e.to_string(),
        }
    }
}
