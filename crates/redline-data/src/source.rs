//! `--data PATH`: detect the format (the first of
//! [`READERS`](crate::readers::READERS) that recognises the path), read the
//! splits, decide the task, and hold out a validation split.
//!
//! | path | format |
//! |---|---|
//! | a folder with `train-images-idx3-ubyte[.gz]` | MNIST family (IDX) |
//! | a folder with `data_batch_1.bin` or `train.bin`+`test.bin` (or their `cifar-*` sub-folder) | CIFAR-10 / CIFAR-100 binary |
//! | `*.csv`, `*.tsv` | a numeric table |
//! | `*.npz`, `*.safetensors`, a folder with `x.npy` / `x_train.npy` | named arrays |
//! | a folder of class sub-folders of PNG/JPEG (optionally under `train/`, `test/`) | image folder |

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::arrays::RawSplit;
use crate::dataset::{Dataset, HostData, TargetKind, Targets};
use crate::error::{Error, Result};
use crate::mnist::Normalize;
use crate::readers;
pub use crate::readers::{Format, Found};
use crate::samples::Samples;
pub use crate::stream::ChannelNorm;
use crate::table::{Header, Standardize, TargetColumn};

/// Targets as a file stores them, before the task decides what they are.
#[derive(Debug, Clone)]
pub struct RawTargets {
    /// Values, `n * width`, in fp32 (the type training uses; readers refuse
    /// values beyond its range).
    pub values: Vec<f32>,
    /// Values per sample.
    pub width: usize,
    /// Stored with an integer type (a strong hint of class ids).
    pub integer: bool,
    /// Every value is a whole number as the file holds it (checked before the
    /// conversion to fp32, which would round 3.0000001 to 3).
    pub whole: bool,
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

/// How `--data` is read.
#[derive(Debug, Clone, PartialEq)]
pub struct DataOptions {
    /// The task (`auto` decides from the targets).
    pub task: Task,
    /// Classes the labels must lie in (`None`: one more than the largest label).
    pub classes: Option<usize>,
    /// The target column of a table.
    pub target: TargetColumn,
    /// Whether a table's first row is its header.
    pub header: Header,
    /// Pixel normalisation of images (IDX, CIFAR, byte arrays).
    pub norm: Normalize,
    /// Standardise table features with the training rows' statistics.
    pub standardize: bool,
    /// Fraction of the training samples held out for validation (seeded,
    /// stratified by class); `None`: [`DEFAULT_VAL_SPLIT`]. The test split is
    /// never used for validation.
    pub val_split: Option<f64>,
    /// Seed of the hold-out draw.
    pub seed: u64,
    /// Resize every image of an image folder to this square size.
    pub image_size: Option<u32>,
    /// How image folders and tar shards are read: streamed or resident.
    pub stream: StreamOptions,
    /// Token data's window length (a language model's `block_size`).
    pub block: Option<usize>,
    /// A Hugging Face `tokenizer.json` that text is tokenised with (into a
    /// cached token file); `None`: text is its UTF-8 bytes.
    pub tokenizer: Option<PathBuf>,
}

/// `--stream`: whether an image split is decoded into memory once or read
/// from disk batch by batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamMode {
    /// Streamed when its decoded size exceeds the host-memory budget, or
    /// when a random-resized crop needs a fresh decode every epoch.
    #[default]
    Auto,
    /// Always streamed.
    On,
    /// Always decoded into memory (refused with a random-resized crop).
    Off,
}

impl std::str::FromStr for StreamMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "on" | "true" | "yes" => Ok(Self::On),
            "off" | "false" | "no" => Ok(Self::Off),
            _ => Err(Error::Config(format!(
                "--stream {s:?}: expected auto, on or off"
            ))),
        }
    }
}

/// How image folders and tar shards are read.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamOptions {
    /// Streamed, resident, or decided by size.
    pub mode: StreamMode,
    /// In `auto`, a split streams when its decoded size exceeds this many
    /// bytes (`None`: never on size alone).
    pub budget: Option<u64>,
    /// Decode threads.
    pub workers: usize,
    /// `random-resized-crop=SIZE`: training crops at random and resizes to
    /// SIZE (evaluation: resize to SIZE/0.875 and centre-crop).
    pub crop: Option<u32>,
    /// A random horizontal flip after the crop.
    pub hflip: bool,
    /// Per-channel normalisation (`None`: ImageNet's for RGB images, the
    /// scalar `norm` for grey ones).
    pub norm: Option<ChannelNorm>,
    /// Skip undecodable images instead of stopping (`--bad-samples skip`).
    pub skip_bad: bool,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            mode: StreamMode::Auto,
            budget: None,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            crop: None,
            hflip: false,
            norm: None,
            skip_bad: false,
        }
    }
}

impl Default for DataOptions {
    fn default() -> Self {
        Self {
            task: Task::Auto,
            classes: None,
            target: TargetColumn::Last,
            header: Header::Auto,
            norm: Normalize::default(),
            standardize: true,
            val_split: None,
            seed: 0,
            image_size: None,
            stream: StreamOptions::default(),
            block: None,
            tokenizer: None,
        }
    }
}

/// The splits of `--data`, ready for loaders.
#[derive(Debug)]
pub struct Prepared {
    /// The format detected.
    pub format: Format,
    /// Training samples.
    pub train: Samples,
    /// Validation samples held out of the training data (`None`:
    /// `--val-split 0`, no validation).
    pub val: Option<Samples>,
    /// The test split the file provides, for the test pass after fit.
    pub test: Option<Samples>,
    /// What was decided and why (task, hold-out, scaling), for the run's header.
    pub notes: Vec<String>,
}

/// The format of `path` and the folder or file that holds it: the first
/// of [`READERS`](crate::readers::READERS) that recognises it.
pub fn detect(path: &Path) -> Result<Found> {
    readers::detect(path)
}

/// The input shape of one sample of `--data`, where it can be read without
/// reading the data (a table's first row): enough to check the model the data
/// implies before materialising a large file. `None` for other formats.
pub fn peek_inputs(path: &Path, opts: &DataOptions) -> Result<Option<Vec<usize>>> {
    let found = detect(path)?;
    found.format.reader.peek_inputs(&found.at, opts)
}

/// Reads `--data`, decides the task and prepares train, validation and test splits.
pub fn prepare(path: &Path, opts: &DataOptions) -> Result<Prepared> {
    prepare_until(path, opts, &AtomicBool::new(false))
}

/// [`prepare`], giving up with [`Error::Interrupted`] once `stop` is set (a
/// signal while a large file loads): looked at while a table is parsed and
/// images are decoded, and after each phase of the others.
pub fn prepare_until(path: &Path, opts: &DataOptions, stop: &AtomicBool) -> Result<Prepared> {
    let stopped = || match stop.load(Ordering::Relaxed) {
        true => Err(Error::Interrupted),
        false => Ok(()),
    };
    let Found { mut format, at } = detect(path)?;
    format.name = format.reader.name_under(format.name, opts);
    if opts.stream.norm.is_some_and(|n| !n.is_uniform())
        && !matches!(format.id(), "images" | "shards")
    {
        return Err(Error::Config(format!(
            "--mean/--std per channel (R,G,B) apply to image folders and tar shards; {} takes \
             one value each",
            format.name
        )));
    }
    let mut notes = Vec::new();
    let (train, test) = format.reader.open(&at, opts, &mut notes, stop)?;
    stopped()?;
    // Validation is never the test split: the test split is read only by
    // the test pass after training.
    let frac = opts.val_split.unwrap_or(DEFAULT_VAL_SPLIT);
    let (train, val) = holdout(train, frac, opts.seed)?;
    notes.push(match &val {
        Some(Samples::Tokens(v)) => format!(
            "validation: the last {} token ids ({}%; --val-split sets the fraction), {} \
             consecutive windows",
            v.tokens(),
            frac * 100.0,
            v.len()
        ),
        Some(v) => format!(
            "validation: {} samples held out of the training split ({}%, {}seed {}; \
             --val-split sets the fraction)",
            v.len(),
            frac * 100.0,
            if v.target().classes().is_some() {
                "stratified by class, "
            } else {
                ""
            },
            opts.seed
        ),
        None => "validation: none (--val-split 0)".into(),
    });
    let (mut train, mut val, mut test) = (train, val, test);
    if let (true, true, Samples::Host(t)) = (format.reader.standardizes(), opts.standardize, &train)
    {
        let cols = t.input_dims.iter().product();
        let s = Standardize::fit(&t.x, cols);
        for d in std::iter::once(&mut train)
            .chain(val.iter_mut())
            .chain(test.iter_mut())
        {
            if let Samples::Host(d) = d {
                s.apply(&mut d.x);
            }
        }
        notes.push(
            "features standardised with the training rows' mean and std (--no-standardize \
             turns it off)"
                .into(),
        );
    }
    // Checked now, not after a whole epoch of training.
    for (split, d) in [("validation", val.as_ref()), ("test", test.as_ref())] {
        if let Some(d) = d.filter(|d| d.input_dims() != train.input_dims()) {
            return Err(Error::Invalid {
                path: d.source().to_path_buf(),
                msg: format!(
                    "the {split} samples are {:?} but the training samples are {:?}; both \
                     splits must hold inputs of one shape",
                    d.input_dims(),
                    train.input_dims()
                ),
            });
        }
    }
    Ok(Prepared {
        format,
        train,
        val,
        test,
        notes,
    })
}

/// Why `raw`'s values cannot be class ids, or `None` when they can.
fn not_class_ids(raw: &RawTargets) -> Option<String> {
    if raw.width != 1 {
        return Some(format!("{} values per sample", raw.width));
    }
    if !raw.whole {
        return Some("values that are not whole numbers".into());
    }
    let min = raw.values.iter().fold(f32::INFINITY, |m, &v| m.min(v));
    if min < 0.0 {
        return Some(format!(
            "the negative value {min} (class ids are 0, 1, ..., K-1)"
        ));
    }
    let max = raw.values.iter().fold(0f32, |m, &v| m.max(v));
    if max as f64 >= MAX_CLASSES as f64 {
        return Some(format!(
            "the value {max}, beyond the {MAX_CLASSES} classes a head can have"
        ));
    }
    None
}

/// The most classes a classification target may imply (a head of this many
/// outputs is already far beyond any data set's).
const MAX_CLASSES: u32 = 1 << 24;

/// Value targets whose square overflows fp32 (the MSE) are refused: the loss
/// would be infinite, and blamed on the learning rate.
const MAX_TARGET: f32 = 1.0e18;

/// Regression targets beyond this magnitude get a warning: the loss is of
/// the order of their square and Adam's steps of the order of the rate.
const LARGE_TARGET: f32 = 1.0e4;

/// Decides the target kind of the training split (`notes` says why).
fn decide(raw: &RawTargets, opts: &DataOptions, notes: &mut Vec<String>) -> Result<TargetKind> {
    let n = raw.values.len() / raw.width.max(1);
    // Distinct values, counted up to 101 only: no copy of the targets (a
    // table of two columns would otherwise peak a third above its values).
    let distinct = || {
        let mut seen = std::collections::HashSet::new();
        for v in &raw.values {
            seen.insert(v.to_bits());
            if seen.len() > 100 {
                break;
            }
        }
        seen.len()
    };
    let max = raw.values.iter().fold(0f32, |m, &v| m.max(v));
    let as_classes = || -> Result<TargetKind> {
        if let Some(why) = not_class_ids(raw) {
            return Err(Error::Config(format!(
                "--task classification: target `{}` holds {why}; classes are one whole number \
                 0..K-1 per sample\nHINT: map the labels to 0..K-1, or use --task regression \
                 for value targets",
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
    let regression = |notes: &mut Vec<String>| -> Result<TargetKind> {
        let peak = raw.values.iter().fold(0f32, |m, &v| m.max(v.abs()));
        if peak > MAX_TARGET {
            return Err(Error::Config(format!(
                "target `{}` reaches {peak:e}: its squared error overflows fp32, where the loss \
                 is computed\nHINT: rescale the target (divide it by a constant, or take its \
                 logarithm)",
                raw.name
            )));
        }
        if peak > LARGE_TARGET {
            notes.push(format!(
                "warning: target `{}` reaches {peak:e}; the loss will be of the order of its \
                 square and training slow to converge: rescale it to about 1 for a stable fit",
                raw.name
            ));
        }
        Ok(TargetKind::Values(raw.width))
    };
    match opts.task {
        Task::Classification => as_classes(),
        Task::Regression => regression(notes),
        Task::Auto => {
            // As AutoGluon: integer targets with few distinct values are classes.
            let d = distinct();
            let few = d <= 100 && d * 10 <= n.max(20);
            let why_not = not_class_ids(raw);
            if why_not.is_none() && (raw.integer || few) {
                let kind = as_classes()?;
                notes.push(format!(
                    "task: classification, {kind} (auto: target `{}` holds {}whole numbers from \
                     0 to {max}; --task regression to change)",
                    raw.name,
                    match raw.integer {
                        true => "integer-typed ".to_string(),
                        false => format!("{d} distinct "),
                    }
                ));
                Ok(kind)
            } else {
                let why = why_not.unwrap_or_else(|| {
                    let count = match d > 100 {
                        true => "more than 100".to_string(),
                        false => d.to_string(),
                    };
                    format!(
                        "{count} distinct whole numbers in {n} samples: auto takes whole numbers \
                         as classes when there are at most 100 and a tenth of the samples"
                    )
                });
                // Integer-typed or few whole values that still cannot be
                // classes: the user most likely meant classes. Said loudly.
                let looks_like_classes = raw.width == 1 && raw.whole && (raw.integer || few);
                notes.push(format!(
                    "{}task: regression (auto: target `{}` holds {why}; --task classification \
                     to change{})",
                    if looks_like_classes { "warning: " } else { "" },
                    raw.name,
                    if looks_like_classes {
                        " after mapping the labels to 0..K-1"
                    } else {
                        ""
                    }
                ));
                regression(notes)
            }
        }
    }
}

/// Host data from a raw split whose target kind is known.
pub(crate) fn finish(
    path: &Path,
    raw: RawSplit,
    kind: TargetKind,
    first: &str,
) -> Result<HostData> {
    let y = match kind {
        TargetKind::Classes(_) | TargetKind::Tokens { .. } => {
            if let Some(why) = not_class_ids(&raw.y) {
                return Err(Error::Invalid {
                    path: path.to_path_buf(),
                    msg: format!(
                        "`{}` holds {why} while `{first}` holds class ids",
                        raw.y.name
                    ),
                });
            }
            // In place: f32 and u32 have one layout.
            Targets::Classes(raw.y.values.into_iter().map(|v| v as u32).collect())
        }
        TargetKind::Values(_) => Targets::Values(raw.y.values),
    };
    HostData::new(raw.x, raw.input_dims, y, kind, path.to_path_buf())
}

pub(crate) fn host(
    path: &Path,
    raw: RawSplit,
    opts: &DataOptions,
    notes: &mut Vec<String>,
) -> Result<HostData> {
    let kind = decide(&raw.y, opts, notes)?;
    let first = raw.y.name.clone();
    finish(path, raw, kind, &first)
}

/// The fraction of the training split held out for validation by default.
pub const DEFAULT_VAL_SPLIT: f64 = 0.1;

/// Splits off `frac` of the samples (a seeded draw) for validation. Class
/// ids are stratified: each class gives its share (largest remainders make
/// up the rounding), so a rare class is in both parts when it can be.
pub fn holdout(data: Samples, frac: f64, seed: u64) -> Result<(Samples, Option<Samples>)> {
    if !(0.0..1.0).contains(&frac) {
        return Err(Error::Config(format!(
            "--val-split {frac}: give a fraction in [0, 1) (0 turns validation off)"
        )));
    }
    if let Samples::Tokens(t) = &data {
        // A text's tail, as nanoGPT holds out its last 10%.
        if frac == 0.0 {
            return Ok((data, None));
        }
        let (train, val) = t.split_tail(frac)?;
        return Ok((
            Samples::Tokens(std::sync::Arc::new(train)),
            Some(Samples::Tokens(std::sync::Arc::new(val))),
        ));
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
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // A stream apart from the loader's epoch streams.
    rng.set_stream(u64::MAX);
    let mut val = match data.class_ids() {
        Some(ids) => stratified(&ids, k, &mut rng),
        None => {
            let mut idx: Vec<u32> = (0..n as u32).collect();
            idx.shuffle(&mut rng);
            idx.truncate(k);
            idx
        }
    };
    // File order within each part, so unshuffled runs stay in file order.
    val.sort_unstable();
    let (train, val) = data.split_rows(&val)?;
    Ok((train, Some(val)))
}

/// `k` sample indices drawn from `ids`' classes in proportion to their
/// sizes: each class gives the floor of its share, and the classes with the
/// largest remainders (then the lower ids) one more, until `k` are drawn.
fn stratified(ids: &[u32], k: usize, rng: &mut ChaCha8Rng) -> Vec<u32> {
    let mut by_class: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for (i, &c) in ids.iter().enumerate() {
        by_class.entry(c).or_default().push(i as u32);
    }
    let n = ids.len() as f64;
    let mut take: Vec<(u32, usize, f64)> = by_class
        .iter()
        .map(|(&c, members)| {
            let share = members.len() as f64 * k as f64 / n;
            (c, share.floor() as usize, share - share.floor())
        })
        .collect();
    let mut left = k.saturating_sub(take.iter().map(|t| t.1).sum::<usize>());
    let mut order: Vec<usize> = (0..take.len()).collect();
    order.sort_by(|&a, &b| take[b].2.total_cmp(&take[a].2).then(a.cmp(&b)));
    for i in order {
        if left == 0 {
            break;
        }
        take[i].1 += 1;
        left -= 1;
    }
    let mut val = Vec::with_capacity(k);
    for (c, count, _) in take {
        if let Some(members) = by_class.get_mut(&c) {
            members.shuffle(rng);
            val.extend_from_slice(&members[..count.min(members.len())]);
        }
    }
    val
}
