//! CIFAR-10 and CIFAR-100 binary batches: a folder with `data_batch_1.bin`,
//! or `train.bin` and `test.bin` (or their `cifar-*` sub-folder).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::idx::class_ids_only;
use super::Reader;
use crate::cifar::{self, Variant};
use crate::error::{Error, Result};
use crate::mnist::SplitKind;
use crate::samples::Samples;
use crate::source::DataOptions;

/// CIFAR binary.
pub struct Cifar;

fn name(v: Variant) -> &'static str {
    match v {
        Variant::Cifar10 => "CIFAR-10",
        Variant::Cifar100 => "CIFAR-100",
    }
}

impl Reader for Cifar {
    fn id(&self) -> &'static str {
        "cifar"
    }

    fn takes(&self) -> &'static str {
        "a CIFAR binary folder (data_batch_1.bin, or train.bin + test.bin)"
    }

    fn recognise(&self, path: &Path) -> Option<(String, PathBuf)> {
        let (v, dir) = cifar::detect(path).filter(|_| path.is_dir())?;
        Some((name(v).into(), dir))
    }

    fn is_set_folder(&self, dir: &Path) -> bool {
        cifar::detect(dir).is_some()
    }

    fn open(
        &self,
        at: &Path,
        opts: &DataOptions,
        _notes: &mut Vec<String>,
        stop: &AtomicBool,
    ) -> Result<(Samples, Option<Samples>)> {
        let (v, _) = cifar::detect(at).ok_or_else(|| Error::Invalid {
            path: at.to_path_buf(),
            msg: "no CIFAR batches here any more".into(),
        })?;
        class_ids_only(opts, name(v))?;
        let train = cifar::load(at, v, SplitKind::Train, opts.norm)?;
        if stop.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        let test = cifar::load(at, v, SplitKind::Test, opts.norm)?;
        Ok((train.into(), Some(test.into())))
    }
}
