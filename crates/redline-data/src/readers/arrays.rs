//! Named arrays: `.npz` and `.safetensors` files, or a folder of `.npy`
//! files (`x.npy`/`y.npy`, or `x_train.npy`... with a test split).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::Reader;
use crate::arrays;
use crate::error::{Error, Result};
use crate::samples::Samples;
use crate::source::{finish, host, DataOptions};

/// Named arrays.
pub struct Arrays;

impl Reader for Arrays {
    fn id(&self) -> &'static str {
        "arrays"
    }

    fn takes(&self) -> &'static str {
        "an .npz/.safetensors file or a folder of .npy files (x.npy or x_train.npy)"
    }

    fn recognise(&self, path: &Path) -> Option<(String, PathBuf)> {
        let file = !path.is_dir()
            && path.extension().is_some_and(|e| {
                let e = e.to_string_lossy().to_ascii_lowercase();
                e == "npz" || e == "safetensors"
            });
        (file || (path.is_dir() && arrays::is_npy_dir(path)))
            .then(|| ("arrays".into(), path.to_path_buf()))
    }

    fn open(
        &self,
        at: &Path,
        opts: &DataOptions,
        notes: &mut Vec<String>,
        stop: &AtomicBool,
    ) -> Result<(Samples, Option<Samples>)> {
        let (train, test) = arrays::load(at, opts.norm)?;
        if stop.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        let first = train.y.name.clone();
        let train = host(at, train, opts, notes)?;
        let test = test
            .map(|t| finish(at, t, train.target, &first))
            .transpose()?;
        Ok((train.into(), test.map(Samples::from)))
    }
}
