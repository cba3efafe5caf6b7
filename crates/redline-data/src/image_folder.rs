//! An image folder: one sub-folder per class holding PNG or JPEG files
//! (torchvision's `ImageFolder`), optionally under `train/` and `test/`.
//!
//! Every image is decoded once (in parallel), resized to a common square size
//! when asked, and kept as one normalised array: epochs never decode again.
//! Classes are the sub-folder names in sorted order, as in torchvision.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use crate::dataset::{HostData, TargetKind, Targets};
use crate::error::{Error, Result};
use crate::mnist::{check_norm, normalise, Normalize};

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
        if p.is_dir() {
            images_under(&p, depth + 1, out)?;
        } else if p.is_file() && is_image(&p) {
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

/// The layout of an image folder: `(train, test)` class roots.
pub fn detect(dir: &Path) -> Option<(PathBuf, Option<PathBuf>)> {
    let has = |d: &Path| {
        d.is_dir() && classes(d).is_ok_and(|c| c.iter().any(|(_, files)| !files.is_empty()))
    };
    let (train, test) = (dir.join("train"), dir.join("test"));
    if has(&train) {
        return Some((train, has(&test).then_some(test)));
    }
    has(dir).then(|| (dir.to_path_buf(), None))
}

/// Decodes one image as `channels` channels of `size` (resized when it differs).
fn decode(path: &Path, channels: usize, size: Option<u32>) -> Result<(u32, u32, Vec<u8>)> {
    let img = image::open(path).map_err(|e| Error::Invalid {
        path: path.to_path_buf(),
        msg: format!("cannot be decoded as an image: {e}"),
    })?;
    let img = match size {
        Some(s) if (img.width(), img.height()) != (s, s) => {
            img.resize_exact(s, s, image::imageops::FilterType::Triangle)
        }
        _ => img,
    };
    let (w, h) = (img.width(), img.height());
    // Channel planes (C, H, W), as ToTensor lays them out.
    let bytes = if channels == 1 {
        img.to_luma8().into_raw()
    } else {
        let rgb = img.to_rgb8().into_raw();
        let px = (w * h) as usize;
        (0..3)
            .flat_map(|c| (0..px).map(move |i| (c, i)))
            .map(|(c, i)| rgb[i * 3 + c])
            .collect()
    };
    Ok((w, h, bytes))
}

/// Reads a class-folder tree with the class names of `names` (the training
/// split's, so test ids match) or its own.
pub fn load(
    root: &Path,
    names: Option<&[String]>,
    size: Option<u32>,
    norm: Normalize,
    stop: &AtomicBool,
) -> Result<(HostData, Vec<String>)> {
    check_norm(norm)?;
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
    let mut files = Vec::new();
    for (name, paths) in &found {
        let id = names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| Error::Invalid {
                path: root.join(name),
                msg: format!("class folder `{name}` is not one of the training classes {names:?}"),
            })?;
        files.extend(paths.iter().map(|p| (p.clone(), id as u32)));
    }
    let Some((first, _)) = files.first() else {
        return Err(Error::Invalid {
            path: root.to_path_buf(),
            msg: "holds no PNG or JPEG images in class sub-folders".into(),
        });
    };
    let probe = image::open(first).map_err(|e| Error::Invalid {
        path: first.clone(),
        msg: format!("cannot be decoded as an image: {e}"),
    })?;
    let channels = match probe.color().channel_count() {
        1 | 2 => 1,
        _ => 3,
    };
    let (w0, h0) = size.map_or((probe.width(), probe.height()), |s| (s, s));
    let decoded: Vec<Result<(u32, u32, Vec<u8>)>> = files
        .par_iter()
        .map(|(p, _)| match stop.load(Ordering::Relaxed) {
            true => Err(Error::Interrupted),
            false => decode(p, channels, size),
        })
        .collect();
    let mut pixels = Vec::with_capacity(files.len() * channels * (w0 * h0) as usize);
    for ((path, _), d) in files.iter().zip(decoded) {
        let (w, h, bytes) = d?;
        if (w, h) != (w0, h0) {
            return Err(Error::Invalid {
                path: path.clone(),
                msg: format!(
                    "is {w}x{h} while {} is {w0}x{h0}\nHINT: pass --image-size N to resize \
                     every image to N x N",
                    first.display()
                ),
            });
        }
        pixels.extend_from_slice(&bytes);
    }
    let labels = files.iter().map(|(_, id)| *id).collect();
    let data = HostData::new(
        normalise(&pixels, norm),
        vec![channels, h0 as usize, w0 as usize],
        Targets::Classes(labels),
        TargetKind::Classes(names.len()),
        root.to_path_buf(),
    )?;
    Ok((data, names))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let none = Normalize {
            mean: 0.0,
            std: 1.0,
        };
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
            Normalize::default(),
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
        let (data, names) = load(d, None, None, Normalize::default(), &go)?;
        assert_eq!(
            (names, data.y),
            (
                vec!["cat".into(), "dog".into()],
                Targets::Classes(vec![0, 1])
            )
        );
        std::fs::create_dir_all(d.join("emu")).map_err(|e| io(d, e))?;
        let m = load(d, None, None, Normalize::default(), &go)
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
