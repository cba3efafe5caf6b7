//! Image folders in torchvision's `ImageFolder` layout: one sub-folder of
//! PNG/JPEG files per class, optionally under `train/` and `test/` (or
//! `val/`). Decoded into memory once when the split fits the host-memory
//! budget, streamed from disk batch by batch when it does not
//! ([`crate::stream`]); both through the same decode and transforms.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::idx::class_ids_only;
use super::Reader;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::image_folder;
use crate::samples::Samples;
use crate::source::{DataOptions, StreamMode};
use crate::stream::{worker_pool, ChannelNorm, Listing, Streamed, Transform, View};

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
    ) -> Result<(Samples, Option<Samples>)> {
        class_ids_only(opts, "an image folder's")?;
        let (train_dir, test_dir) = image_folder::detect(at).ok_or_else(|| Error::Invalid {
            path: at.to_path_buf(),
            msg: "no class sub-folders of images".into(),
        })?;
        let (train, names) = image_folder::listing(&train_dir, None)?;
        let shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
        notes.push(format!(
            "classes (sorted folder names): {}{}",
            shown.join(", "),
            if names.len() > 10 { ", ..." } else { "" }
        ));
        let test = test_dir
            .map(|d| image_folder::listing(&d, Some(&names)).map(|t| t.0))
            .transpose()?;
        open_images(train, test, opts, notes, stop)
    }
}

/// The view of a listing's samples the options ask for: the transform, the
/// normalisation, the channels and side of its first image.
fn view(list: &Listing, opts: &DataOptions) -> Result<View> {
    let s = &opts.stream;
    let size = s.crop.or(opts.image_size);
    let (channels, side) = image_folder::probe(list, size)?;
    let transform = match s.crop {
        Some(size) => Transform::RandomResizedCrop {
            size,
            hflip: s.hflip,
        },
        None => Transform::Resize(opts.image_size),
    };
    let norm = pixel_norm(opts, channels);
    Ok(View {
        transform,
        norm,
        channels,
        side,
        skip_bad: s.skip_bad,
    })
}

/// The normalisation of image folders and tar shards of `channels`
/// channels: `--mean/--std` when given, else ImageNet's per channel for RGB
/// and the scalar default for grey.
pub fn pixel_norm(opts: &DataOptions, channels: usize) -> ChannelNorm {
    match (opts.stream.norm, channels) {
        (Some(n), _) => n,
        (None, 1) => ChannelNorm::same(opts.norm.mean, opts.norm.std),
        (None, _) => ChannelNorm::IMAGENET,
    }
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The training and test listings as samples: streamed or decoded into
/// memory as `opts.stream` decides (the reason noted).
pub(super) fn open_images(
    train: Listing,
    test: Option<Listing>,
    opts: &DataOptions,
    notes: &mut Vec<String>,
    stop: &AtomicBool,
) -> Result<(Samples, Option<Samples>)> {
    let s = &opts.stream;
    let v = view(&train, opts)?;
    let pool = worker_pool(s.workers)?;
    let train = Streamed::new(Arc::new(train), v, pool.clone(), opts.seed)?;
    let mut eval = v;
    eval.transform = v.transform.for_eval();
    let test = test
        .map(|t| Streamed::new(Arc::new(t), eval, pool.clone(), opts.seed))
        .transpose()?;
    let bytes = train.decoded_bytes() + test.as_ref().map_or(0, |t| t.decoded_bytes());
    let (stream, why) = match (s.mode, s.crop, s.budget) {
        (StreamMode::Off, Some(c), _) => {
            return Err(Error::Config(format!(
                "--augment random-resized-crop={c} decodes every image afresh each epoch, so \
                 the images stream from disk; it cannot be combined with --stream off"
            )))
        }
        (StreamMode::Off, None, _) => (false, "--stream off".to_string()),
        (StreamMode::On, _, _) => (true, "--stream on".to_string()),
        (StreamMode::Auto, Some(c), _) => (
            true,
            format!("auto: random-resized-crop={c} decodes each image afresh every epoch"),
        ),
        (StreamMode::Auto, None, Some(b)) if bytes > b => (
            true,
            format!(
                "auto: decoded they would take {}, more than the host-memory budget of {} \
                 (--host-memory-budget)",
                gib(bytes),
                gib(b)
            ),
        ),
        (StreamMode::Auto, None, _) => (
            false,
            format!(
                "auto: decoded they take {}{}",
                gib(bytes),
                s.budget
                    .map(|b| format!(", within the host-memory budget of {}", gib(b)))
                    .unwrap_or_default()
            ),
        ),
    };
    notes.push(match stream {
        true => format!(
            "images: streamed from disk, decoded{} on {} worker thread{} each epoch ({why}; \
             --stream and --workers change it)",
            match v.transform {
                Transform::RandomResizedCrop { size, hflip } => format!(
                    ", random-resized-cropped to {size}{}",
                    if hflip { " and flipped" } else { "" }
                ),
                _ => String::new(),
            },
            train.workers(),
            if train.workers() == 1 { "" } else { "s" }
        ),
        false => format!("images: decoded into memory once ({why}; --stream on streams them)"),
    });
    if s.norm.is_none() && v.norm == ChannelNorm::IMAGENET {
        notes.push(
            "images: normalised with ImageNet's mean and std per channel (--mean/--std \
             change it)"
                .into(),
        );
    }
    if stream {
        return Ok((
            Samples::Streamed(Box::new(train)),
            test.map(|t| Samples::Streamed(Box::new(t))),
        ));
    }
    // Decoded once before training: on every core, whatever --workers says
    // (the decode threads of a streamed run share the cores with the step).
    let cores = redline_core::threads::usable_cores();
    let train = train.with_workers(cores)?.materialise(stop)?;
    let test = test
        .map(|t| t.with_workers(cores)?.materialise(stop))
        .transpose()?;
    if train.is_empty() {
        return Err(Error::Invalid {
            path: train.source.clone(),
            msg: "holds no images".into(),
        });
    }
    Ok((train.into(), test.map(Samples::from)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rgb_images_default_to_imagenet_and_black_pads_in_their_units() {
        let mut opts = DataOptions::default();
        assert_eq!(pixel_norm(&opts, 3), ChannelNorm::IMAGENET);
        assert_eq!(pixel_norm(&opts, 1), ChannelNorm::same(0.5, 0.5));
        let black = pixel_norm(&opts, 3).black();
        assert!((black[0] + 0.485 / 0.229).abs() < 1e-6 && (black[2] + 0.406 / 0.225).abs() < 1e-6);
        opts.stream.norm = Some(ChannelNorm::same(0.25, 0.5));
        assert_eq!(pixel_norm(&opts, 3).black(), [-0.5; 3]);
    }
}
