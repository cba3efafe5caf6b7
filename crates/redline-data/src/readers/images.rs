//! Image folders in torchvision's `ImageFolder` layout: one sub-folder of
//! PNG/JPEG files per class, optionally under `train/` and `test/`.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use super::idx::class_ids_only;
use super::Reader;
use crate::dataset::HostData;
use crate::error::{Error, Result};
use crate::image_folder;
use crate::source::DataOptions;

/// An image folder.
pub struct Images;

impl Reader for Images {
    fn id(&self) -> &'static str {
        "images"
    }

    fn takes(&self) -> &'static str {
        "a folder of class sub-folders of PNG/JPEG images (optionally under train/ and test/)"
    }

    fn recognise(&self, path: &Path) -> Option<(String, PathBuf)> {
        (path.is_dir() && image_folder::detect(path).is_some())
            .then(|| ("image folder".into(), path.to_path_buf()))
    }

    fn open(
        &self,
        at: &Path,
        opts: &DataOptions,
        notes: &mut Vec<String>,
        stop: &AtomicBool,
    ) -> Result<(HostData, Option<HostData>)> {
        class_ids_only(opts, "an image folder's")?;
        let (train_dir, test_dir) = image_folder::detect(at).ok_or_else(|| Error::Invalid {
            path: at.to_path_buf(),
            msg: "no class sub-folders of images".into(),
        })?;
        let (train, names) =
            image_folder::load(&train_dir, None, opts.image_size, opts.norm, stop)?;
        let shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
        notes.push(format!(
            "classes (sorted folder names): {}{}",
            shown.join(", "),
            if names.len() > 10 { ", ..." } else { "" }
        ));
        let size = train.input_dims.get(1).map(|&s| s as u32);
        let test = test_dir
            .map(|d| image_folder::load(&d, Some(&names), size, opts.norm, stop).map(|t| t.0))
            .transpose()?;
        Ok((train, test))
    }
}
