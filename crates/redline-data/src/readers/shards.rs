//! WebDataset-style tar shards ([`crate::stream::shards`]): a folder of
//! `*.tar` (with `train`/`test`/`val` split by sub-folder or file name) or a
//! brace pattern `train-{000000..000127}.tar`. Streamed from disk unless
//! they fit the host-memory budget.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use super::idx::class_ids_only;
use super::images::open_images;
use super::Reader;
use crate::error::{Error, Result};
use crate::samples::Samples;
use crate::source::DataOptions;
use crate::stream::shards;

/// Tar shards.
pub struct Shards;

impl Reader for Shards {
    fn id(&self) -> &'static str {
        "shards"
    }

    fn takes(&self) -> &'static str {
        "a folder of WebDataset tar shards (KEY.jpg|png + KEY.cls) or a pattern \
         train-{000000..000127}.tar"
    }

    fn recognise(&self, path: &Path) -> Option<(String, PathBuf)> {
        let name = |n: usize| format!("tar shards ({n})");
        if shards::is_pattern(path) {
            let n = shards::expand(&path.to_string_lossy()).map_or(0, |p| p.len());
            return Some((name(n), path.to_path_buf()));
        }
        if path.is_file() && path.extension().is_some_and(|e| e == "tar") {
            return Some((name(1), path.to_path_buf()));
        }
        let (train, _) = path.is_dir().then(|| shards::layout(path)).flatten()?;
        Some((name(train.len()), path.to_path_buf()))
    }

    fn open(
        &self,
        at: &Path,
        opts: &DataOptions,
        notes: &mut Vec<String>,
        stop: &AtomicBool,
    ) -> Result<(Samples, Option<Samples>)> {
        class_ids_only(opts, "tar shards'")?;
        let (train, test) = if at.is_dir() {
            shards::layout(at).ok_or_else(|| Error::Invalid {
                path: at.to_path_buf(),
                msg: "holds no *.tar shards".into(),
            })?
        } else {
            (shards::expand(&at.to_string_lossy())?, Vec::new())
        };
        if let Some(missing) = train.iter().chain(&test).find(|p| !p.is_file()) {
            return Err(Error::Invalid {
                path: missing.clone(),
                msg: "is a shard of the pattern, but no such file".into(),
            });
        }
        let train_list = shards::list(&train, opts.classes, at, stop)?;
        let classes = train_list.classes;
        let test_list = match test.is_empty() {
            true => None,
            false => Some(shards::list(&test, Some(classes), at, stop)?),
        };
        notes.push(format!(
            "tar shards: {} training samples in {} shard{}, {} classes{}",
            train_list.items.len(),
            train.len(),
            if train.len() == 1 { "" } else { "s" },
            classes,
            test_list
                .as_ref()
                .map(|t| format!("; {} test samples in {} shards", t.items.len(), test.len()))
                .unwrap_or_default()
        ));
        if let Some(names) = at.is_dir().then(|| crate::pack::class_names(at)).flatten() {
            let shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
            notes.push(format!(
                "classes (index.json of `redline pack`): {}{}",
                shown.join(", "),
                if names.len() > 10 { ", ..." } else { "" }
            ));
        }
        open_images(train_list, test_list, opts, notes, stop)
    }
}
