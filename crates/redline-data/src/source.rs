//! `--data PATH`: detect the format, read the splits, decide the task, and
//! hold out a validation split.
//!
//! | path | format |
//! |---|---|
//! | a folder with `train-images-idx3-ubyte[.gz]` | MNIST family (IDX) |
//! | a folder with `data_batch_1.bin` or `train.bin`+`test.bin` (or their `cifar-*` sub-folder) | CIFAR-10 / CIFAR-100 binary |
//! | `*.csv`, `*.tsv` | a numeric table |
//! | `*.npz`, `*.safetensors`, a folder with `x.npy` / `x_train.npy` | named arrays |
//! | a folder of class sub-folders of PNG/JPEG (optionally under `train/`, `test/`) | image folder |

use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::arrays::{self, RawSplit};
use crate::cifar::{self, Variant};
use crate::dataset::{Dataset, HostData, TargetKind, Targets};
use crate::error::{Error, Result};
use crate::image_folder;
use crate::mnist::{self, Normalize, SplitKind};
use crate::table::{Standardize, Table, TargetColumn};

/// Targets as a file stores them, before the task decides what they are.
#[derive(Debug, Clone)]
pub struct RawTargets {
    /// Values, `n * width`.
    pub values: Vec<f64>,
    /// Values per sample.
    pub width: usize,
    /// Stored with an integer type (a strong hint of class ids).
    pub integer: bool,
    /// The column or array name, for messages.
    pub name: String,
}

/// What the model learns: `--task`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Task {
    /// Decided from the targets (and said in the run's header).
    #[default]
    Auto,
    /// Class ids: cross-entropy and accuracy.
    Classification,
    /// Values: MSE (or L1) and mean absolute error.
    Regression,
}

impl std::str::FromStr for Task {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "classification" | "classify" => Ok(Self::Classification),
            "regression" | "regress" => Ok(Self::Regression),
            _ => Err(Error::Config(format!(
                "--task {s:?}: expected `auto`, `classification` or `regression`"
            ))),
        }
    }
}

/// The format `--data` was read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The MNIST family's IDX files.
    Idx,
    /// CIFAR binary batches.
    Cifar(Variant),
    /// A numeric CSV/TSV table.
    Csv,
    /// Named arrays in `.npz`, `.safetensors` or `.npy` files.
    Arrays,
    /// PNG/JPEG files in one sub-folder per class.
    Images,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Idx => "IDX (MNIST family)",
            Self::Cifar(Variant::Cifar10) => "CIFAR-10",
            Self::Cifar(Variant::Cifar100) => "CIFAR-100",
            Self::Csv => "CSV table",
            Self::Arrays => "arrays",
            Self::Images => "image folder",
        })
    }
}

/// How `--data` is read.
#[derive(Debug, Clone, PartialEq)]
pub struct DataOptions {
    /// The task (`auto` decides from the targets).
    pub task: Task,
    /// Classes the labels must lie in (`None`: one more than the largest label).
    pub classes: Option<usize>,
    /// The target column of a table.
    pub target: TargetColumn,
    /// Pixel normalisation of images (IDX, CIFAR, byte arrays).
    pub norm: Normalize,
    /// Standardise table features with the training rows' statistics.
    pub standardize: bool,
    /// Fraction of the training samples held out for validation; `None`
    /// validates on the test split, or holds out 10% when there is none.
    pub val_split: Option<f64>,
    /// Seed of the hold-out draw.
    pub seed: u64,
    /// Resize every image of an image folder to this square size.
    pub image_size: Option<u32>,
}

impl Default for DataOptions {
    fn default() -> Self {
        Self {
            task: Task::Auto,
            classes: None,
            target: TargetColumn::Last,
            norm: Normalize::default(),
            standardize: true,
            val_split: None,
            seed: 0,
            image_size: None,
        }
    }
}

/// The splits of `--data`, ready for loaders.
#[derive(Debug)]
pub struct Prepared {
    /// The format detected.
    pub format: Format,
    /// Training samples.
    pub train: HostData,
    /// Validation samples held out of the training data (`None` with
    /// [`Prepared::val_is_test`]: validate on the test split).
    pub val: Option<HostData>,
    /// Validation runs on the test split (the tutorial's setup when the data
    /// has a test split and no `--val-split` was given).
    pub val_is_test: bool,
    /// The test split the file provides, for the test pass after fit.
    pub test: Option<HostData>,
    /// What was decided and why (task, hold-out, scaling), for the run's header.
    pub notes: Vec<String>,
}

/// Detects the format of `path`, with the folder or file that holds it.
pub fn detect(path: &Path) -> Result<(Format, PathBuf)> {
    const TAKES: &str = "--data takes an MNIST-format or CIFAR folder, a .csv/.tsv table, or an \
                         .npz/.safetensors file or folder of .npy files";
    // The real reason (a symlink loop, a folder on the way that cannot be
    // entered), not a blanket "no such file".
    let meta = std::fs::metadata(path).map_err(|source| {
        let (source, hint) = match source.kind() {
            std::io::ErrorKind::NotFound => (
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
                TAKES.to_string(),
            ),
            std::io::ErrorKind::PermissionDenied => (
                source,
                "a folder on the way cannot be entered: check the permissions".into(),
            ),
            // ELOOP (Linux): the kind is not stable in std yet.
            _ if source.raw_os_error() == Some(40) => (
                source,
                "the path is a loop of symbolic links: point --data at the real folder".into(),
            ),
            _ => (source, "check the path".into()),
        };
        Error::Io {
            path: path.to_path_buf(),
            source,
            hint,
        }
    })?;
    if meta.is_dir() {
        std::fs::read_dir(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
            hint: "the folder cannot be listed: check its permissions".into(),
        })?;
    } else if let Some(parent) = path.parent().filter(|p| {
        !p.as_os_str().is_empty() && (mnist::is_idx_dir(p) || cifar::detect(p).is_some())
    }) {
        // One file of a data set folder: the folder is what is meant.
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            msg: format!(
                "this is one file of a data set; --data takes the folder that holds it: \
                 --data {}",
                parent.display()
            ),
        });
    }
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    if path.is_dir() {
        if mnist::is_idx_dir(path) {
            return Ok((Format::Idx, path.to_path_buf()));
        }
        if let Some((v, dir)) = cifar::detect(path) {
            return Ok((Format::Cifar(v), dir));
        }
        if arrays::is_npy_dir(path) {
            return Ok((Format::Arrays, path.to_path_buf()));
        }
        if image_folder::detect(path).is_some() {
            return Ok((Format::Images, path.to_path_buf()));
        }
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            msg: "no data set recognised in this folder: expected train-images-idx3-ubyte[.gz] \
                  (MNIST family), data_batch_1.bin or train.bin + test.bin (CIFAR binary), \
                  x.npy / x_train.npy, or class sub-folders of PNG/JPEG images"
                .into(),
        });
    }
    match ext.as_deref() {
        Some("csv" | "tsv") => Ok((Format::Csv, path.to_path_buf())),
        Some("npz" | "safetensors") => Ok((Format::Arrays, path.to_path_buf())),
        _ => Err(Error::Invalid {
            path: path.to_path_buf(),
            msg: "unknown data file type; --data takes .csv, .tsv, .npz or .safetensors files, \
                  or a data set folder"
                .into(),
        }),
    }
}

/// Reads `--data`, decides the task and prepares train, validation and test splits.
pub fn prepare(path: &Path, opts: &DataOptions) -> Result<Prepared> {
    let (format, at) = detect(path)?;
    let mut notes = Vec::new();
    let (train, test) = match format {
        Format::Idx | Format::Cifar(_) => {
            if opts.task == Task::Regression {
                return Err(Error::Config(format!(
                    "--task regression: {format} labels are class ids; regression needs a \
                     table or array file with value targets"
                )));
            }
            let load = |kind, classes| match format {
                Format::Cifar(v) => cifar::load(&at, v, kind, opts.norm),
                _ => mnist::load(&at, kind, classes, opts.norm),
            };
            let train = load(SplitKind::Train, opts.classes)?;
            let test = load(SplitKind::Test, train.target.classes())?;
            (train, Some(test))
        }
        Format::Images => {
            if opts.task == Task::Regression {
                return Err(Error::Config(
                    "--task regression: an image folder's labels are class ids".into(),
                ));
            }
            let (train_dir, test_dir) =
                image_folder::detect(&at).ok_or_else(|| Error::Invalid {
                    path: at.clone(),
                    msg: "no class sub-folders of images".into(),
                })?;
            let (train, names) = image_folder::load(&train_dir, None, opts.image_size, opts.norm)?;
            let shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
            notes.push(format!(
                "classes (sorted folder names): {}{}",
                shown.join(", "),
                if names.len() > 10 { ", ..." } else { "" }
            ));
            let size = train.input_dims.get(1).map(|&s| s as u32);
            let test = test_dir
                .map(|d| image_folder::load(&d, Some(&names), size, opts.norm).map(|t| t.0))
                .transpose()?;
            (train, test)
        }
        Format::Csv => {
            let raw = Table::read(&at)?.split(&opts.target)?;
            (host(&at, raw, opts, &mut notes)?, None)
        }
        Format::Arrays => {
            let (train, test) = arrays::load(&at, opts.norm)?;
            let first = train.y.name.clone();
            let train = host(&at, train, opts, &mut notes)?;
            let test = test
                .map(|t| finish(&at, t, train.target, &first))
                .transpose()?;
            (train, test)
        }
    };
    let (train, val, test) = match (opts.val_split, test) {
        (None, Some(test)) => (train, None, Some(test)),
        (frac, test) => {
            let frac = frac.unwrap_or(0.1);
            let (train, val) = holdout(train, frac, opts.seed)?;
            notes.push(format!(
                "validation: {} samples held out ({:.0}% of the training data, seed {})",
                val.as_ref().map_or(0, |v| v.len()),
                frac * 100.0,
                opts.seed
            ));
            (train, val, test)
        }
    };
    let (mut train, mut val, mut test) = (train, val, test);
    if format == Format::Csv && opts.standardize {
        let cols = train.input_dims.iter().product();
        let s = Standardize::fit(&train.x, cols);
        for d in std::iter::once(&mut train)
            .chain(val.iter_mut())
            .chain(test.iter_mut())
        {
            s.apply(&mut d.x);
        }
        notes.push(
            "features standardised with the training rows' mean and std (--no-standardize \
             turns it off)"
                .into(),
        );
    }
    // Checked now, not after a whole epoch of training.
    for (split, d) in [("validation", val.as_ref()), ("test", test.as_ref())] {
        if let Some(d) = d.filter(|d| d.input_dims != train.input_dims) {
            return Err(Error::Invalid {
                path: d.source.clone(),
                msg: format!(
                    "the {split} samples are {:?} but the training samples are {:?}; both \
                     splits must hold inputs of one shape",
                    d.input_dims, train.input_dims
                ),
            });
        }
    }
    Ok(Prepared {
        format,
        train,
        val_is_test: val.is_none() && opts.val_split.is_none() && test.is_some(),
        val,
        test,
        notes,
    })
}

/// Whole numbers >= 0 that fit a class id.
fn class_ids(values: &[f64]) -> bool {
    values
        .iter()
        .all(|&v| v >= 0.0 && v.fract() == 0.0 && v < u32::MAX as f64)
}

/// Decides the target kind of the training split (`notes` says why).
fn decide(raw: &RawTargets, opts: &DataOptions, notes: &mut Vec<String>) -> Result<TargetKind> {
    let n = raw.values.len() / raw.width.max(1);
    let distinct = || {
        let mut v: Vec<u64> = raw.values.iter().map(|v| v.to_bits()).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    let max = raw.values.iter().fold(0f64, |m, &v| m.max(v));
    let as_classes = || -> Result<TargetKind> {
        if raw.width != 1 || !class_ids(&raw.values) {
            return Err(Error::Config(format!(
                "--task classification: target `{}` is not one whole number >= 0 per sample\n\
                 HINT: use --task regression for value targets",
                raw.name
            )));
        }
        let classes = opts.classes.unwrap_or(max as usize + 1);
        if max as usize >= classes {
            return Err(Error::Config(format!(
                "--classes {classes}: target `{}` holds the class id {max}",
                raw.name
            )));
        }
        Ok(TargetKind::Classes(classes))
    };
    match opts.task {
        Task::Classification => as_classes(),
        Task::Regression => Ok(TargetKind::Values(raw.width)),
        Task::Auto => {
            // As AutoGluon: integer targets with few distinct values are classes.
            let d = distinct();
            let few = d <= 100 && d * 10 <= n.max(20);
            if raw.width == 1 && class_ids(&raw.values) && (raw.integer || few) {
                let kind = as_classes()?;
                notes.push(format!(
                    "task: classification, {kind} (auto: target `{}` holds whole numbers; \
                     --task regression to change)",
                    raw.name
                ));
                Ok(kind)
            } else {
                notes.push(format!(
                    "task: regression (auto: target `{}` holds {}; --task classification to change)",
                    raw.name,
                    if raw.width > 1 {
                        format!("{} values per sample", raw.width)
                    } else {
                        "continuous values".into()
                    }
                ));
                Ok(TargetKind::Values(raw.width))
            }
        }
    }
}

/// Host data from a raw split whose target kind is known.
fn finish(path: &Path, raw: RawSplit, kind: TargetKind, first: &str) -> Result<HostData> {
    let y = match kind {
        TargetKind::Classes(_) => {
            if !class_ids(&raw.y.values) {
                return Err(Error::Invalid {
                    path: path.to_path_buf(),
                    msg: format!(
                        "`{}` holds values that are not class ids while `{}` does",
                        raw.y.name, first
                    ),
                });
            }
            Targets::Classes(raw.y.values.iter().map(|&v| v as u32).collect())
        }
        TargetKind::Values(_) => Targets::Values(raw.y.values.iter().map(|&v| v as f32).collect()),
    };
    HostData::new(raw.x, raw.input_dims, y, kind, path.to_path_buf())
}

fn host(
    path: &Path,
    raw: RawSplit,
    opts: &DataOptions,
    notes: &mut Vec<String>,
) -> Result<HostData> {
    let kind = decide(&raw.y, opts, notes)?;
    let first = raw.y.name.clone();
    finish(path, raw, kind, &first)
}

/// Splits off `frac` of the samples (a seeded draw) for validation.
pub fn holdout(data: HostData, frac: f64, seed: u64) -> Result<(HostData, Option<HostData>)> {
    if !(0.0..1.0).contains(&frac) {
        return Err(Error::Config(format!(
            "--val-split {frac}: give a fraction in [0, 1) (0 turns validation off)"
        )));
    }
    let n = data.len();
    let k = (n as f64 * frac).round() as usize;
    if k == 0 {
        return Ok((data, None));
    }
    if k >= n {
        return Err(Error::Config(format!(
            "--val-split {frac} leaves no training samples out of {n}"
        )));
    }
    let mut idx: Vec<u32> = (0..n as u32).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // A stream apart from the loader's epoch streams.
    rng.set_stream(u64::MAX);
    idx.shuffle(&mut rng);
    let (val, train) = idx.split_at(k);
    let (mut val, mut train) = (val.to_vec(), train.to_vec());
    // File order within each part, so unshuffled runs stay in file order.
    val.sort_unstable();
    train.sort_unstable();
    Ok((data.subset(&train)?, Some(data.subset(&val)?)))
}
