//! An image folder: one sub-folder per class holding PNG or JPEG files
//! (torchvision's `ImageFolder`), optionally under `train/` and `test/`.
//!
//! [`listing`] lists the images and their classes (the sub-folder names in
//! sorted order, as in torchvision); [`load`] decodes every image once (in
//! parallel) into one normalised array, and the streaming reader decodes
//! them batch by batch instead ([`crate::stream`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::dataset::HostData;
use crate::error::{Error, Result};
use crate::stream::{decode, worker_pool, ChannelNorm, Item, Listing, Streamed, Transform, View};

const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

fn is_image(p: &Path) -> bool {
    p.extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .is_some_and(|e| EXTENSIONS.contains(&e.as_str()))
}

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
        hint: "check the folder's permissions".into(),
    }
}

/// How deep images may sit under a class folder (a link loop ends here).
const MAX_DEPTH: usize = 8;

/// The images under `dir`, at any depth (torchvision walks the class folder
/// the same way), sorted.
fn images_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::Invalid {
            path: dir.to_path_buf(),
            msg: format!(
                "folders nested deeper than {MAX_DEPTH} levels under a class folder (a loop of \
                 symbolic links?)"
            ),
        });
    }
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))?.flatten() {
        let p = entry.path();
        // The entry's type comes with the listing on most file systems: a
        // million images cost no stat each; only links are followed.
        let kind = entry.file_type().ok();
        let (is_dir, is_file) = match kind {
            Some(t) if t.is_symlink() => (p.is_dir(), p.is_file()),
            Some(t) => (t.is_dir(), t.is_file()),
            None => (p.is_dir(), p.is_file()),
        };
        if is_dir {
            images_under(&p, depth + 1, out)?;
        } else if is_file && is_image(&p) {
            out.push(p);
        }
    }
    Ok(())
}

/// Sorted sub-folders of `dir` with their images (at any depth; a folder
/// may hold none).
fn classes(dir: &Path) -> Result<Vec<(String, Vec<PathBuf>)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))?.flatten() {
        let p = entry.path();
        if !p.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        images_under(&p, 0, &mut files)?;
        files.sort();
        let name = entry.file_name().to_string_lossy().into_owned();
        out.push((name, files));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The layout of an image folder: `(train, test)` class roots (`test/`, or
/// ImageNet's `val/`).
pub fn detect(dir: &Path) -> Option<(PathBuf, Option<PathBuf>)> {
    let has = |d: &Path| {
        d.is_dir() && classes(d).is_ok_and(|c| c.iter().any(|(_, files)| !files.is_empty()))
    };
    let train = dir.join("train");
    if has(&train) {
        // ImageNet's folders name the held-out split `val`.
        let test = [dir.join("test"), dir.join("val")]
            .into_iter()
            .find(|d| has(d));
        return Some((train, test));
    }
    has(dir).then(|| (dir.to_path_buf(), None))
}

/// The samples of a class-folder tree, with the class names of `names` (the
/// training split's, so test ids match) or its own (sorted folder names).
/// Each path is held once.
pub fn listing(root: &Path, names: Option<&[String]>) -> Result<(Listing, Vec<String>)> {
    let found = classes(root)?;
    // A class without images would be a class the model never sees, with
    // every id after it shifted: refused, as torchvision's ImageFolder does.
    if let Some((name, _)) = found.iter().find(|(_, files)| files.is_empty()) {
        return Err(Error::Invalid {
            path: root.join(name),
            msg: format!(
                "class folder `{name}` holds no PNG or JPEG images\nHINT: add its images, or \
                 remove the folder if `{name}` is not a class"
            ),
        });
    }
    let names: Vec<String> = match names {
        Some(n) => n.to_vec(),
        None => found.iter().map(|(n, _)| n.clone()).collect(),
    };
    let (mut items, mut labels) = (Vec::new(), Vec::new());
    for (name, paths) in found {
        let id = names
            .iter()
            .position(|n| *n == name)
            .ok_or_else(|| Error::Invalid {
                path: root.join(&name),
                msg: format!("class folder `{name}` is not one of the training classes {names:?}"),
            })?;
        labels.extend(std::iter::repeat_n(id as u32, paths.len()));
        items.extend(paths.into_iter().map(Item::File));
    }
    if items.is_empty() {
        return Err(Error::Invalid {
            path: root.to_path_buf(),
            msg: "holds no PNG or JPEG images in class sub-folders".into(),
        });
    }
    let list = Listing {
        items,
        labels,
        shards: Vec::new(),
        classes: names.len(),
        source: root.to_path_buf(),
    };
    Ok((list, names))
}

/// Reads a class-folder tree into host memory, every image decoded once
/// and resized to `size` x `size` when given (else every image must have
/// the first one's size), through the same code the streamed folder uses.
pub fn load(
    root: &Path,
    names: Option<&[String]>,
    size: Option<u32>,
    norm: ChannelNorm,
    stop: &AtomicBool,
) -> Result<(HostData, Vec<String>)> {
    let (list, names) = listing(root, names)?;
    let (channels, side) = probe(&list, size)?;
    let view = View {
        transform: Transform::Resize(size),
        norm,
        channels,
        side,
        skip_bad: false,
    };
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let data = Streamed::new(Arc::new(list), view, worker_pool(workers)?, 0)?;
    Ok((data.materialise(stop)?, names))
}

/// The channels (1 for grey images, else 3) and the side of the first
/// image of `list`, or `size` x `size`.
pub fn probe(list: &Listing, size: Option<u32>) -> Result<(usize, (u32, u32))> {
    let first = list.name(0);
    let bytes = list.read(0)?;
    let (channels, w, h) = decode::probe(&bytes, &first)?;
    Ok((channels, size.map_or((w, h), |s| (s, s))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Targets;

    fn write(path: &Path, w: u32, h: u32, rgb: [u8; 3]) -> Result<()> {
        std::fs::create_dir_all(path.parent().unwrap_or(path)).map_err(|e| io(path, e))?;
        image::RgbImage::from_pixel(w, h, image::Rgb(rgb))
            .save(path)
            .map_err(|e| Error::Config(e.to_string()))
    }

    #[test]
    fn classes_sorted_planes_and_resize() -> Result<()> {
        let tmp = tempfile::tempdir().map_err(|e| io(Path::new("tmp"), e))?;
        let d = tmp.path();
        write(&d.join("train/zebra/a.png"), 4, 4, [255, 0, 0])?;
        write(&d.join("train/ant/b.png"), 4, 4, [0, 255, 0])?;
        write(&d.join("train/ant/c.jpg"), 8, 8, [0, 0, 255])?;
        write(&d.join("test/zebra/d.png"), 4, 4, [0, 0, 0])?;
        std::fs::write(d.join("train/ant/notes.txt"), "x").map_err(|e| io(d, e))?;
        let (train, test) = detect(d).ok_or_else(|| Error::Config("not detected".into()))?;
        let none = ChannelNorm::same(0.0, 1.0);
        let go = AtomicBool::new(false);
        let err = load(&train, None, None, none, &go)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|m| m.contains("is 8x8 while") && m.contains("--image-size")));
        let (data, names) = load(&train, None, Some(4), none, &go)?;
        assert_eq!(names, vec!["ant", "zebra"]);
        assert_eq!(data.input_dims, vec![3, 4, 4]);
        assert_eq!(data.y, Targets::Classes(vec![0, 0, 1]));
        // Sample 2 is the red zebra: the red plane is 1, green and blue 0.
        let s = &data.x[2 * 48..3 * 48];
        assert!(s[..16].iter().all(|&v| v == 1.0) && s[16..].iter().all(|&v| v == 0.0));
        let (t, _) = load(
            &test.ok_or_else(|| Error::Config("no test".into()))?,
            Some(&names),
            Some(4),
            none,
            &go,
        )?;
        assert_eq!(t.y, Targets::Classes(vec![1]));
        Ok(())
    }

    #[test]
    fn a_file_that_is_not_an_image_is_named() -> Result<()> {
        let tmp = tempfile::tempdir().map_err(|e| io(Path::new("tmp"), e))?;
        write(&tmp.path().join("cat/a.png"), 2, 2, [1, 2, 3])?;
        std::fs::write(tmp.path().join("cat/b.png"), b"not a png")
            .map_err(|e| io(tmp.path(), e))?;
        let m = load(
            tmp.path(),
            None,
            None,
            ChannelNorm::IMAGENET,
            &AtomicBool::new(false),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(m.contains("b.png: cannot be decoded as an image"), "{m}");
        Ok(())
    }

    #[test]
    fn nested_images_count_and_an_empty_class_is_named() -> Result<()> {
        let tmp = tempfile::tempdir().map_err(|e| io(Path::new("tmp"), e))?;
        let d = tmp.path();
        write(&d.join("cat/a.png"), 2, 2, [1, 2, 3])?;
        write(&d.join("dog/2024/june/b.png"), 2, 2, [1, 2, 3])?;
        let go = AtomicBool::new(false);
        let (data, names) = load(d, None, None, ChannelNorm::IMAGENET, &go)?;
        assert_eq!(
            (names, data.y),
            (
                vec!["cat".into(), "dog".into()],
                Targets::Classes(vec![0, 1])
            )
        );
        std::fs::create_dir_all(d.join("emu")).map_err(|e| io(d, e))?;
        let m = load(d, None, None, ChannelNorm::IMAGENET, &go)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            m.contains("class folder `emu` holds no PNG or JPEG images"),
            "{m}"
        );
        Ok(())
    }
}
