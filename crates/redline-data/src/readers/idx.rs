//! The MNIST family's IDX files: a folder with
//! `train-images-idx3-ubyte[.gz]` (and its labels, and the test split's).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::Reader;
use crate::error::{Error, Result};
use crate::mnist::{self, SplitKind};
use crate::samples::Samples;
use crate::source::{DataOptions, Task};

/// IDX (MNIST, Fashion-MNIST, KMNIST).
pub struct Idx;

impl Reader for Idx {
    fn id(&self) -> &'static str {
        "idx"
    }

    fn takes(&self) -> &'static str {
        "an MNIST-format folder (train-images-idx3-ubyte[.gz])"
    }

    fn recognise(&self, path: &Path) -> Option<(String, PathBuf)> {
        (path.is_dir() && mnist::is_idx_dir(path))
            .then(|| ("IDX (MNIST family)".into(), path.to_path_buf()))
    }

    fn is_set_folder(&self, dir: &Path) -> bool {
        mnist::is_idx_dir(dir)
    }

    fn open(
        &self,
        at: &Path,
        opts: &DataOptions,
        _notes: &mut Vec<String>,
        stop: &AtomicBool,
    ) -> Result<(Samples, Option<Samples>)> {
        class_ids_only(opts, "IDX (MNIST family)")?;
        let train = mnist::load(at, SplitKind::Train, opts.classes, opts.norm)?;
        if stop.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        let test = mnist::load(at, SplitKind::Test, train.target.classes(), opts.norm)?;
        Ok((train.into(), Some(test.into())))
    }
}

/// Refuses `--task regression` for a format whose labels are class ids.
pub(super) fn class_ids_only(opts: &DataOptions, format: &str) -> Result<()> {
    match opts.task {
        Task::Regression => Err(Error::Config(format!(
            "--task regression: {format} labels are class ids; regression needs a table or \
             array file with value targets"
        ))),
        _ => Ok(()),
    }
}
