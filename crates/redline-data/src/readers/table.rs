//! Numeric CSV/TSV tables: one sample per row, one column the target.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use super::Reader;
use crate::error::Result;
use crate::samples::Samples;
use crate::source::{host, DataOptions};
use crate::table::{self, Layout};

/// A CSV or TSV table.
pub struct Table;

impl Reader for Table {
    fn id(&self) -> &'static str {
        "csv"
    }

    fn takes(&self) -> &'static str {
        "a .csv/.tsv table"
    }

    fn recognise(&self, path: &Path) -> Option<(String, PathBuf)> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        (!path.is_dir() && matches!(ext.as_deref(), Some("csv" | "tsv")))
            .then(|| ("CSV table".into(), path.to_path_buf()))
    }

    fn open(
        &self,
        at: &Path,
        opts: &DataOptions,
        notes: &mut Vec<String>,
        stop: &AtomicBool,
    ) -> Result<(Samples, Option<Samples>)> {
        let layout = Layout::read(at, opts.header)?;
        notes.push(layout.note.clone());
        let raw = table::read(at, &layout, &opts.target, stop)?;
        Ok((host(at, raw, opts, notes)?.into(), None))
    }

    fn peek_inputs(&self, at: &Path, opts: &DataOptions) -> Result<Option<Vec<usize>>> {
        let layout = Layout::read(at, opts.header)?;
        Ok(Some(vec![layout.columns.saturating_sub(1).max(1)]))
    }

    fn standardizes(&self) -> bool {
        true
    }
}
