//! `redline pack`: an image folder turned into WebDataset tar shards that
//! the shard reader streams ([`crate::stream::shards`]). Each image is
//! shrunk to a largest side (re-encoded as JPEG) or, when it is already
//! small enough, copied as it is; members are `KEY.jpg|png` + `KEY.cls`, in
//! a seeded shuffled order, in shards of about `--shard-size` bytes, under
//! `DEST/train/` and `DEST/val/`, with `DEST/index.json` naming the classes.
//!
//! Atomic: everything is written under `DEST.partial/` and renamed to
//! `DEST` once complete, so a killed pack never leaves a folder that looks
//! finished; a stop request removes the partial folder.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::image_folder;
use crate::stream::decode::{self, Pixels};
use crate::stream::{crop, Listing};

/// A file in the partial folder that marks it as a pack's own (only such a
/// folder is removed when a later pack finds it).
const MARK: &str = ".redline-pack";

/// How `pack` writes.
#[derive(Debug, Clone, PartialEq)]
pub struct PackOptions {
    /// Images larger than this on their longer side are shrunk to it.
    pub max_side: u32,
    /// JPEG quality of re-encoded images (1-100).
    pub quality: u8,
    /// A shard is closed once it holds this many bytes.
    pub shard_bytes: u64,
    /// Threads that decode, shrink and encode.
    pub workers: usize,
    /// Seed of the order the samples are written in.
    pub seed: u64,
}

/// What a pack wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    /// Per split: its name, samples and shards.
    pub splits: Vec<(String, usize, usize)>,
    /// Bytes of all shards.
    pub bytes: u64,
    /// Images re-encoded because they were larger than `max_side`.
    pub shrunk: usize,
}

fn io(path: &Path, what: &str) -> impl Fn(std::io::Error) -> Error + use<> {
    let (path, hint) = (
        path.to_path_buf(),
        format!("{what}: check the folder's permissions and free space"),
    );
    move |source| Error::Io {
        path: path.clone(),
        source,
        hint: hint.clone(),
    }
}

/// Refuses a destination that exists (a file, a device, a folder) or whose
/// parent does not: a pack never writes over anything.
fn check_dest(dest: &Path) -> Result<PathBuf> {
    if let Ok(meta) = std::fs::symlink_metadata(dest) {
        let what = if meta.is_dir() {
            "a folder"
        } else if meta.is_file() {
            "a file"
        } else {
            "a device, pipe or socket"
        };
        return Err(Error::Invalid {
            path: dest.to_path_buf(),
            msg: format!(
                "already exists ({what}); pack writes a new folder and never over anything\n\
                 HINT: give a path that does not exist yet"
            ),
        });
    }
    let name = dest.file_name().ok_or_else(|| Error::Invalid {
        path: dest.to_path_buf(),
        msg: "names no folder".into(),
    })?;
    let partial = dest.with_file_name(format!("{}.partial", name.to_string_lossy()));
    if partial.exists() {
        if partial.join(MARK).is_file() {
            std::fs::remove_dir_all(&partial).map_err(io(&partial, "removing a stopped pack"))?;
        } else {
            return Err(Error::Invalid {
                path: partial,
                msg: "exists and is not a stopped pack's: pack writes there before renaming \
                      it to the destination\nHINT: move it away, or choose another destination"
                    .into(),
            });
        }
    }
    Ok(partial)
}

/// One sample's members: its image bytes with their extension, and
/// whether it was shrunk.
fn encode(list: &Listing, i: usize, opts: &PackOptions) -> Result<(Vec<u8>, &'static str, bool)> {
    let what = list.name(i);
    let bytes = list.read(i)?;
    let (channels, w, h) = decode::probe(&bytes, &what)?;
    let is_png = bytes.starts_with(b"\x89PNG");
    if w.max(h) <= opts.max_side {
        // Small enough: the original bytes, checked to decode.
        decode::decode(&bytes, channels, &what)?;
        return Ok((bytes, if is_png { "png" } else { "jpg" }, false));
    }
    let px = decode::decode(&bytes, channels, &what)?;
    let scale = f64::from(opts.max_side) / f64::from(w.max(h));
    let (nw, nh) = (
        ((f64::from(w) * scale).round() as u32).clamp(1, opts.max_side),
        ((f64::from(h) * scale).round() as u32).clamp(1, opts.max_side),
    );
    let small: Pixels = crop::resize(&px, nw, nh);
    let mut out = Vec::new();
    let color = match small.channels {
        1 => image::ExtendedColorType::L8,
        _ => image::ExtendedColorType::Rgb8,
    };
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, opts.quality)
        .encode(&small.data, nw, nh, color)
        .map_err(|e| Error::Invalid {
            path: what,
            msg: format!("cannot be encoded as JPEG: {e}"),
        })?;
    Ok((out, "jpg", true))
}

/// Writes tar shards of one split.
struct ShardWriter {
    dir: PathBuf,
    split: String,
    limit: u64,
    current: Option<(tar::Builder<std::io::BufWriter<std::fs::File>>, u64)>,
    shards: usize,
    bytes: u64,
}

impl ShardWriter {
    fn append(&mut self, name: &str, data: &[u8]) -> Result<()> {
        if self.current.is_none() {
            let path = self
                .dir
                .join(format!("{}-{:06}.tar", self.split, self.shards));
            let f = std::fs::File::create(&path).map_err(io(&path, "creating a shard"))?;
            self.current = Some((tar::Builder::new(std::io::BufWriter::new(f)), 0));
            self.shards += 1;
        }
        let Some((b, size)) = self.current.as_mut() else {
            return Ok(());
        };
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, name, data)
            .map_err(io(&self.dir, "writing a shard"))?;
        *size += 512 + (data.len() as u64).div_ceil(512) * 512;
        Ok(())
    }

    /// Closes the current shard once it is full (after a whole sample).
    fn roll(&mut self, force: bool) -> Result<()> {
        let full = self.current.as_ref().is_some_and(|(_, s)| *s >= self.limit);
        if full || force {
            if let Some((b, size)) = self.current.take() {
                let mut w = b.into_inner().map_err(io(&self.dir, "closing a shard"))?;
                w.flush().map_err(io(&self.dir, "closing a shard"))?;
                self.bytes += size + 1024;
            }
        }
        Ok(())
    }
}

/// Packs the image folder `src` into shards under `dest`; `progress` is
/// called with the samples done and the total. Stops with
/// [`Error::Interrupted`], removing what it wrote, once `stop` is set.
pub fn pack(
    src: &Path,
    dest: &Path,
    opts: &PackOptions,
    stop: &AtomicBool,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Packed> {
    if !(1..=100).contains(&opts.quality) || opts.max_side == 0 || opts.shard_bytes == 0 {
        return Err(Error::Config(format!(
            "pack: quality {} (1-100), max side {} (>= 1) and shard size {} (>= 1 byte)",
            opts.quality, opts.max_side, opts.shard_bytes
        )));
    }
    let partial = check_dest(dest)?;
    let (train_dir, test_dir) = image_folder::detect(src).ok_or_else(|| Error::Invalid {
        path: src.to_path_buf(),
        msg: "is not an image folder: pack takes a folder of class sub-folders of PNG/JPEG \
              images (optionally under train/ and val/ or test/)"
            .into(),
    })?;
    let (train, names) = image_folder::listing(&train_dir, None)?;
    let test = test_dir
        .map(|d| image_folder::listing(&d, Some(&names)).map(|t| t.0))
        .transpose()?;
    let total = train.items.len() + test.as_ref().map_or(0, |t| t.items.len());
    std::fs::create_dir(&partial).map_err(io(&partial, "creating the pack's folder"))?;
    let result = (|| {
        std::fs::write(partial.join(MARK), b"").map_err(io(&partial, "writing"))?;
        let pool = crate::stream::worker_pool(opts.workers)?;
        let done = AtomicUsize::new(0);
        let mut packed = Packed {
            splits: Vec::new(),
            bytes: 0,
            shrunk: 0,
        };
        for (split, list) in [("train", Some(&train)), ("val", test.as_ref())] {
            let Some(list) = list else { continue };
            let dir = partial.join(split);
            std::fs::create_dir(&dir).map_err(io(&dir, "creating"))?;
            let mut order: Vec<usize> = (0..list.items.len()).collect();
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(opts.seed));
            let mut w = ShardWriter {
                dir,
                split: split.into(),
                limit: opts.shard_bytes,
                current: None,
                shards: 0,
                bytes: 0,
            };
            for (c, chunk) in order.chunks(64 * opts.workers.max(1)).enumerate() {
                if stop.load(Ordering::Relaxed) {
                    return Err(Error::Interrupted);
                }
                let encoded: Vec<(Vec<u8>, &str, bool)> = pool.install(|| {
                    chunk
                        .par_iter()
                        .map(|&i| {
                            let r = encode(list, i, opts);
                            progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                            r
                        })
                        .collect::<Result<_>>()
                })?;
                for (k, ((data, ext, shrunk), &i)) in encoded.iter().zip(chunk).enumerate() {
                    let key = format!("{split}{:08}", c * 64 * opts.workers.max(1) + k);
                    w.append(&format!("{key}.{ext}"), data)?;
                    w.append(&format!("{key}.cls"), list.labels[i].to_string().as_bytes())?;
                    packed.shrunk += usize::from(*shrunk);
                    w.roll(false)?;
                }
            }
            w.roll(true)?;
            packed.bytes += w.bytes;
            packed
                .splits
                .push((split.into(), list.items.len(), w.shards));
        }
        let index = serde_json::json!({
            "classes": names,
            "splits": packed.splits.iter().map(|(s, n, k)| (s.clone(), serde_json::json!({"samples": n, "shards": k}))).collect::<serde_json::Map<_, _>>(),
            "max_side": opts.max_side,
            "quality": opts.quality,
            "source": src.display().to_string(),
        });
        let text = serde_json::to_string_pretty(&index)
            .map_err(|e| Error::Config(format!("index.json: {e}")))?;
        std::fs::write(partial.join("index.json"), text).map_err(io(&partial, "writing"))?;
        std::fs::remove_file(partial.join(MARK)).map_err(io(&partial, "writing"))?;
        Ok(packed)
    })();
    match result {
        Ok(p) => {
            std::fs::rename(&partial, dest).map_err(io(dest, "renaming the finished pack"))?;
            Ok(p)
        }
        Err(e) => {
            // Nothing half-written is left behind (best effort: the error
            // that stopped the pack is the one reported).
            let _ = std::fs::remove_dir_all(&partial);
            Err(e)
        }
    }
}

/// The class names a pack recorded in `dir/index.json`, if any.
pub fn class_names(dir: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("index.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("classes")?
        .as_array()?
        .iter()
        .map(|c| c.as_str().map(String::from))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::shards;

    fn folder(d: &Path) -> Result<()> {
        for (split, n) in [("train", 5u32), ("val", 2)] {
            for class in ["ant", "bee"] {
                let dir = d.join(split).join(class);
                std::fs::create_dir_all(&dir).map_err(io(&dir, "test"))?;
                for i in 0..n {
                    let img = image::RgbImage::from_fn(30 + i * 20, 24 + i * 10, |x, y| {
                        image::Rgb([(x * 3) as u8, (y * 5) as u8, (i * 40) as u8])
                    });
                    img.save(dir.join(format!("{i}.png")))
                        .map_err(|e| Error::Config(e.to_string()))?;
                }
            }
        }
        Ok(())
    }

    fn opts(shard_bytes: u64) -> PackOptions {
        PackOptions {
            max_side: 64,
            quality: 90,
            shard_bytes,
            workers: 2,
            seed: 0,
        }
    }

    #[test]
    fn a_folder_packs_into_shards_the_reader_lists_with_every_label() -> Result<()> {
        let tmp = tempfile::tempdir().map_err(io(Path::new("tmp"), "test"))?;
        folder(tmp.path())?;
        let dest = tmp.path().join("packed");
        let calls = AtomicUsize::new(0);
        let p = pack(
            tmp.path(),
            &dest,
            &opts(8 << 10),
            &AtomicBool::new(false),
            &|_, t| {
                assert_eq!(t, 14);
                calls.fetch_add(1, Ordering::Relaxed);
            },
        )?;
        assert_eq!(calls.load(Ordering::Relaxed), 14);
        assert!(!dest.with_file_name("packed.partial").exists() && !dest.join(MARK).exists());
        assert_eq!(p.splits[0].0, "train");
        assert_eq!((p.splits[0].1, p.splits[1].1), (10, 4));
        // Training images 2, 3 and 4 of each class are wider than 64 px: shrunk.
        assert_eq!(p.shrunk, 6);
        assert!(p.splits[0].2 > 1, "{p:?}");
        let (train, val) = shards::layout(&dest).ok_or(Error::Config("layout".into()))?;
        assert_eq!((train.len(), val.len()), (p.splits[0].2, p.splits[1].2));
        let list = shards::list(&train, None, &dest, &AtomicBool::new(false))?;
        let mut labels = list.labels.clone();
        labels.sort_unstable();
        assert_eq!(labels, vec![0, 0, 0, 0, 0, 1, 1, 1, 1, 1]);
        assert_eq!(class_names(&dest), Some(vec!["ant".into(), "bee".into()]));
        // Every member decodes, none larger than the max side.
        for i in 0..list.items.len() {
            let (_, w, h) = decode::probe(&list.read(i)?, Path::new("m"))?;
            assert!(w.max(h) <= 64);
        }
        Ok(())
    }

    #[test]
    fn existing_destinations_are_refused_and_a_stop_leaves_nothing() -> Result<()> {
        let tmp = tempfile::tempdir().map_err(io(Path::new("tmp"), "test"))?;
        folder(tmp.path())?;
        let go = AtomicBool::new(false);
        let msg = |dest: &Path| {
            pack(tmp.path(), dest, &opts(1 << 20), &go, &|_, _| {})
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let m = msg(&tmp.path().join("train"));
        assert!(m.contains("already exists (a folder)"), "{m}");
        let m = msg(Path::new("/dev/null"));
        assert!(m.contains("a device, pipe or socket"), "{m}");
        // A partial folder that is not a stopped pack's is left alone.
        let other = tmp.path().join("out.partial");
        std::fs::create_dir(&other).map_err(io(&other, "test"))?;
        let m = msg(&tmp.path().join("out"));
        assert!(m.contains("is not a stopped pack's"), "{m}");
        // A stopped pack's is replaced.
        std::fs::write(other.join(MARK), b"").map_err(io(&other, "test"))?;
        pack(
            tmp.path(),
            &tmp.path().join("out"),
            &opts(1 << 20),
            &go,
            &|_, _| {},
        )?;
        assert!(tmp.path().join("out/index.json").is_file() && !other.exists());
        // A stop request: an interruption, and nothing on disk.
        let stop = AtomicBool::new(true);
        let dest = tmp.path().join("stopped");
        let r = pack(tmp.path(), &dest, &opts(1 << 20), &stop, &|_, _| {});
        assert!(matches!(r, Err(Error::Interrupted)), "{r:?}");
        assert!(!dest.exists() && !tmp.path().join("stopped.partial").exists());
        Ok(())
    }
}
