//! Checkpoints: the files, written atomically, and read back with every
//! check a resume needs (docs/checkpoints.md).
//!
//! One checkpoint is a folder `checkpoints/step-00000123/` holding
//! `weights.safetensors` (the model's `state_dict`, PyTorch names),
//! `optimizer.safetensors` (its moments, PyTorch's buffer names per
//! parameter index) and `state.json` ([`CheckpointMeta`]: counters, loader
//! position, the partial epoch's sums, the metrics so far, the early stop,
//! the run's identity, and each file's size and CRC-32). It is written into
//! a hidden temporary folder, every file fsynced, then renamed into place
//! and the parent fsynced: a crash or a full disk leaves the previous
//! checkpoints and no half one under a `step-` name.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::early_stop::{Direction, EarlyStopState};
use crate::error::{Error, Result};
use crate::events::EpochLog;
use crate::running::RunningState;

/// The layout version of `state.json`.
pub const FORMAT: u32 = 1;

/// The files of a checkpoint folder.
pub const WEIGHTS: &str = "weights.safetensors";
/// The optimizer's state.
pub const OPTIMIZER: &str = "optimizer.safetensors";
/// Counters, positions and checks.
pub const STATE: &str = "state.json";

/// The largest `state.json` read (the metrics of a very long run fit easily).
const MAX_STATE_BYTES: u64 = 64 << 20;

/// How a fit checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointConfig {
    /// The folder the checkpoints go in (`RUN_DIR/checkpoints`).
    pub dir: PathBuf,
    /// Every this many optimizer steps; `None`: at each epoch end.
    pub every: Option<usize>,
    /// The newest checkpoints kept (the best one is kept besides).
    pub keep_last: usize,
    /// The metric whose best epoch-end checkpoint is kept, and its direction.
    pub monitor: Option<(String, Direction)>,
    /// What must match for a resume (the settings that shape the run:
    /// model, data, batch, optimizer, seed, ...), by name.
    pub identity: BTreeMap<String, Value>,
}

impl CheckpointConfig {
    /// Refuses intervals and counts of zero.
    pub fn check(&self) -> Result<()> {
        if self.every == Some(0) {
            return Err(Error::Config(
                "--checkpoint-every 0: give a number of optimizer steps (at least 1)".into(),
            ));
        }
        if self.keep_last == 0 {
            return Err(Error::Config(
                "--keep-last 0: keep at least 1 checkpoint (the resume point)".into(),
            ));
        }
        Ok(())
    }
}

/// One file of a checkpoint and its check values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSum {
    /// The file's name in the checkpoint folder.
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// CRC-32 of its bytes.
    pub crc32: u32,
}

/// `state.json`: everything of a checkpoint that is not a tensor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// [`FORMAT`].
    pub format: u32,
    /// Optimizer steps taken.
    pub step: usize,
    /// The epoch (1-based) the next batch belongs to.
    pub epoch: usize,
    /// Batches of that epoch already trained on (0: it starts afresh).
    pub batch: usize,
    /// The settings that must match for a resume.
    pub identity: BTreeMap<String, Value>,
    /// Every parameter and buffer, `(name, shape)`, in order.
    pub params: Vec<(String, Vec<usize>)>,
    /// The optimizer's step count.
    pub optimizer_steps: u64,
    /// The learning rate of the last step.
    pub lr: f64,
    /// The first step's loss (the divergence check's reference).
    pub start_loss: Option<f64>,
    /// The sums of the epoch in progress.
    pub epoch_sums: RunningState,
    /// The sums since the last log point.
    pub window: RunningState,
    /// Seconds the epoch in progress has trained so far.
    pub epoch_s: f64,
    /// The finished epochs' logs.
    pub logs: Vec<EpochLog>,
    /// Training seconds of the finished epochs.
    pub train_s: f64,
    /// Validation seconds of the finished epochs.
    pub eval_s: f64,
    /// Training samples of the finished epochs.
    pub samples: usize,
    /// The early stop's standing.
    pub early_stop: Option<EarlyStopState>,
    /// The monitored metric's value at this checkpoint (epoch ends only).
    pub monitor: Option<f64>,
    /// The positions of the model's random streams (dropout), as decimal
    /// strings (JSON numbers stop at 2^53).
    #[serde(default)]
    pub rng: Vec<String>,
    /// The loss scaler's standing (`16-mixed`).
    #[serde(default)]
    pub scaler: Option<crate::scaler::ScalerState>,
    /// When it was written (seconds since the Unix epoch).
    pub written_unix_s: f64,
    /// The tensor files and their check values (filled by [`write`]).
    #[serde(default)]
    pub files: Vec<FileSum>,
}

impl CheckpointMeta {
    /// Whether a fit limited to `max_steps` (`--max-steps`) can go on from
    /// this checkpoint; `Err` names both steps for a limit below its step
    /// (the fit would end at once, its numbers a segment of nothing, and
    /// the lower limit recorded as the run's). A limit at its step resumes
    /// a run that had finished, for its ending (test pass, summary) alone.
    pub fn check_max_steps(&self, max_steps: Option<usize>) -> std::result::Result<(), String> {
        match max_steps {
            Some(m) if m < self.step => Err(format!(
                "--max-steps {m} is below step {} of the checkpoint, so the resumed run \
                 would train nothing\nHINT: pass a --max-steps above {} to train further",
                self.step, self.step
            )),
            _ => Ok(()),
        }
    }

    /// Whether a loop of `batches_per_epoch` batches, stepping every
    /// `accumulate`, can be where this checkpoint says it was; `Err` says
    /// what does not fit.
    pub fn check_position(
        &self,
        batches_per_epoch: usize,
        accumulate: usize,
    ) -> std::result::Result<(), String> {
        let accumulate = accumulate.max(1);
        if self.epoch == 0 {
            return Err("`epoch` 0: epochs count from 1".into());
        }
        if self.logs.len() != self.epoch - 1 {
            return Err(format!(
                "`epoch` {} but `logs` holds {} finished epochs (it must hold {})",
                self.epoch,
                self.logs.len(),
                self.epoch - 1
            ));
        }
        // `batch` == the epoch's batches: its steps all ran and its end
        // (validation, its log) had not (a signal or a periodic checkpoint at
        // the epoch's last step; its last step may take fewer micro-batches).
        let inside = self.batch < batches_per_epoch;
        if self.batch > batches_per_epoch || (inside && !self.batch.is_multiple_of(accumulate)) {
            return Err(format!(
                "`batch` {}: an epoch of this data has {batches_per_epoch} batches, and a step \
                 every {accumulate} (was the data or --batch-size changed?)",
                self.batch
            ));
        }
        if self.step < self.batch.div_ceil(accumulate) {
            return Err(format!(
                "`step` {} is fewer than the {} steps of the epoch so far",
                self.step,
                self.batch.div_ceil(accumulate)
            ));
        }
        // The steps its finished epochs logged and its position account for:
        // an edited `step` (10^15) would skip the run's end.
        let logged = self
            .logs
            .iter()
            .try_fold(0usize, |a, l| a.checked_add(l.steps))
            .and_then(|s| s.checked_add(self.batch.div_ceil(accumulate)));
        if logged != Some(self.step) {
            return Err(format!(
                "`step` {} does not match the {} steps its `logs` and `batch` account for",
                self.step,
                logged.map_or("overflowing".to_string(), |s| s.to_string())
            ));
        }
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(format!("`lr` {}: not a learning rate", self.lr));
        }
        Ok(())
    }
}

/// A checkpoint in memory: host copies of the tensors, taken on the loop's
/// thread so that training can go on while another thread writes them.
pub struct Snapshot {
    /// Counters and positions.
    pub meta: CheckpointMeta,
    /// The model's parameters and buffers (CPU copies).
    pub weights: Vec<(String, Tensor)>,
    /// The optimizer's buffers (CPU copies).
    pub optimizer: Vec<(String, Tensor)>,
}

/// A copy of `t` on the CPU that later in-place updates of `t` cannot reach.
pub(crate) fn host_copy(t: &Tensor) -> Result<Tensor> {
    let t = t.contiguous()?;
    Ok(if t.device().is_cpu() {
        t.copy()?
    } else {
        t.to_device(&Device::Cpu)?
    })
}

/// The folder name of the checkpoint at `step`.
pub fn folder_name(step: usize) -> String {
    format!("step-{step:08}")
}

/// The step of a checkpoint folder's name.
fn step_of(name: &str) -> Option<usize> {
    name.strip_prefix("step-")?.parse().ok()
}

/// The checkpoint folders in `dir`, oldest first, as `(step, path)`.
pub fn list(dir: &Path) -> Vec<(usize, PathBuf)> {
    let mut out: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((step_of(&e.file_name().to_string_lossy())?, e.path())))
        .collect();
    out.sort();
    out
}

fn io_err(path: &Path, what: &str) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    let what = what.to_string();
    move |e| Error::Checkpoint {
        path,
        message: format!("{what}: {e}"),
    }
}

/// Writes `bytes` to a new file at `path` and fsyncs it; its check values.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<FileSum> {
    let mut f = std::fs::File::create(path).map_err(io_err(path, "creating"))?;
    f.write_all(bytes).map_err(io_err(path, "writing"))?;
    f.sync_all().map_err(io_err(path, "syncing"))?;
    Ok(FileSum {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        bytes: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
    })
}

fn serialize(tensors: &[(String, Tensor)], path: &Path) -> Result<Vec<u8>> {
    let map: BTreeMap<&str, &Tensor> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    safetensors::serialize(map, None).map_err(|e| Error::Checkpoint {
        path: path.to_path_buf(),
        message: format!("cannot be serialised: {e}"),
    })
}

/// Writes `snap` as `dir/step-<step>` atomically (see the module docs) and
/// returns that folder. On any failure the temporary folder is removed and
/// the checkpoints already there are untouched.
pub fn write(dir: &Path, snap: Snapshot) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io_err(dir, "creating the checkpoints folder"))?;
    let name = folder_name(snap.meta.step);
    let tmp = dir.join(format!(".tmp-{name}-{}", std::process::id()));
    let result = write_into(&tmp, snap);
    let result = result.and_then(|()| {
        let target = dir.join(&name);
        // A resumed run that reaches the same step again replaces it.
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(io_err(&target, "replacing"))?;
        }
        std::fs::rename(&tmp, &target).map_err(io_err(&target, "renaming into place"))?;
        sync_dir(dir)?;
        Ok(target)
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

fn write_into(tmp: &Path, mut snap: Snapshot) -> Result<()> {
    if tmp.exists() {
        std::fs::remove_dir_all(tmp).map_err(io_err(tmp, "clearing"))?;
    }
    std::fs::create_dir(tmp).map_err(io_err(tmp, "creating"))?;
    let mut files = Vec::new();
    for (file, tensors) in [(WEIGHTS, &snap.weights), (OPTIMIZER, &snap.optimizer)] {
        let path = tmp.join(file);
        files.push(write_synced(&path, &serialize(tensors, &path)?)?);
    }
    snap.meta.files = files;
    let path = tmp.join(STATE);
    let json = serde_json::to_vec_pretty(&snap.meta).map_err(|e| Error::Checkpoint {
        path: path.clone(),
        message: format!("cannot be serialised: {e}"),
    })?;
    write_synced(&path, &json)?;
    sync_dir(tmp)
}

/// Makes a rename or new file in `dir` durable (a no-op where directories
/// cannot be opened).
fn sync_dir(dir: &Path) -> Result<()> {
    if let Ok(d) = std::fs::File::open(dir) {
        d.sync_all().map_err(io_err(dir, "syncing"))?;
    }
    Ok(())
}

/// Removes all but the newest `keep_last` checkpoints in `dir`, keeping
/// `best` (a step) too, and any temporary folder a killed writer left. A
/// `step-N` folder holding anything a checkpoint does not (a user's own
/// files) is left whole: only what a checkpoint writer wrote is deleted.
pub fn prune(dir: &Path, keep_last: usize, best: Option<usize>) -> Result<()> {
    let all = list(dir);
    let cut = all.len().saturating_sub(keep_last);
    for (step, path) in all.into_iter().take(cut) {
        if Some(step) != best {
            remove_checkpoint(&path)?;
        }
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = format!("-{}", std::process::id());
        // Another process's temporary folder may be a live writer's.
        if name.starts_with(".tmp-step-") && name.ends_with(&ours) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    Ok(())
}

/// Deletes the checkpoint folder `path` if it holds only the files a
/// checkpoint writes (regular files named [`WEIGHTS`], [`OPTIMIZER`],
/// [`STATE`]); anything else there means it is not (only) ours, and it is
/// left as it is, with a warning.
fn remove_checkpoint(path: &Path) -> Result<()> {
    let entries: Vec<std::fs::DirEntry> = std::fs::read_dir(path)
        .map_err(io_err(path, "listing"))?
        .collect::<std::io::Result<_>>()
        .map_err(io_err(path, "listing"))?;
    let ours = |e: &std::fs::DirEntry| {
        let name = e.file_name();
        e.file_type().is_ok_and(|t| t.is_file())
            && [WEIGHTS, OPTIMIZER, STATE].iter().any(|f| name == *f)
    };
    if let Some(other) = entries.iter().find(|e| !ours(e)) {
        tracing::warn!(
            "{}: not pruned: it holds {:?}, which no checkpoint writes",
            path.display(),
            other.file_name()
        );
        return Ok(());
    }
    for e in &entries {
        std::fs::remove_file(e.path()).map_err(io_err(&e.path(), "removing"))?;
    }
    std::fs::remove_dir(path).map_err(io_err(path, "removing"))
}

/// Before a resume from the checkpoint at `step`: renames every newer
/// checkpoint folder (refused by [`latest_good`]) to `refused-step-N`, so
/// it is kept for a look but never counted, resumed from or pruned in place
/// of a good one; and removes the temporary folders of writers that are no
/// longer alive (a `kill -9` mid-write). Returns the renamed folders.
pub fn set_aside(dir: &Path, step: usize) -> Result<Vec<PathBuf>> {
    let mut moved = Vec::new();
    for (s, path) in list(dir).into_iter().filter(|(s, _)| *s > step) {
        let base = format!("refused-{}", folder_name(s));
        let mut to = dir.join(&base);
        let mut n = 1;
        while to.exists() {
            n += 1;
            to = dir.join(format!("{base}-{n}"));
        }
        std::fs::rename(&path, &to).map_err(io_err(&path, "setting aside"))?;
        moved.push(to);
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(".tmp-step-")
            .and_then(|r| r.rsplit('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        let alive = |p: u32| p == std::process::id() || Path::new(&format!("/proc/{p}")).exists();
        if pid.is_some_and(|p| !alive(p)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    sync_dir(dir)?;
    Ok(moved)
}

/// A checkpoint read back and checked.
pub struct Loaded {
    /// Its folder.
    pub dir: PathBuf,
    /// `state.json`.
    pub meta: CheckpointMeta,
    /// The model's parameters and buffers (on the CPU).
    pub weights: std::collections::HashMap<String, Tensor>,
    /// The optimizer's buffers (on the CPU).
    pub optimizer: Vec<(String, Tensor)>,
}

/// Reads the checkpoint in `path` and checks it: its files are whole (sizes
/// and CRC-32s), it was written by a run with this `identity`, and its
/// tensors fit `params` (`(name, shape)`). The error names the file and
/// what differs.
pub fn read(
    path: &Path,
    identity: &BTreeMap<String, Value>,
    params: &[(String, Vec<usize>)],
) -> Result<Loaded> {
    let bad = |file: &str, message: String| Error::Checkpoint {
        path: path.join(file),
        message,
    };
    let state = path.join(STATE);
    let text = redline_core::files::read_input_text(&state, MAX_STATE_BYTES)
        .map_err(|e| bad(STATE, format!("cannot be read: {e}")))?;
    let meta: CheckpointMeta = serde_json::from_str(&text)
        .map_err(|e| bad(STATE, format!("not a checkpoint's state (truncated?): {e}")))?;
    if meta.format != FORMAT {
        return Err(bad(
            STATE,
            format!("format {} (this build reads {FORMAT})", meta.format),
        ));
    }
    let differs: Vec<String> = identity
        .keys()
        .chain(meta.identity.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| identity.get(*k) != meta.identity.get(*k))
        .map(|k| {
            let show = |v: Option<&Value>| v.map_or("(unset)".into(), Value::to_string);
            format!(
                "{k}: {} in the checkpoint, {} now",
                show(meta.identity.get(k)),
                show(identity.get(k))
            )
        })
        .collect();
    if !differs.is_empty() {
        return Err(bad(
            STATE,
            format!("written by a different run: {}", differs.join("; ")),
        ));
    }
    if meta.params != params {
        let show = |p: &[(String, Vec<usize>)]| {
            p.iter()
                .map(|(n, s)| format!("{n} {s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(bad(
            STATE,
            format!(
                "written for another model: it holds {}; this model has {}",
                show(&meta.params),
                show(params)
            ),
        ));
    }
    let mut tensors = Vec::new();
    for file in [WEIGHTS, OPTIMIZER] {
        let sum = meta
            .files
            .iter()
            .find(|f| f.name == file)
            .ok_or_else(|| bad(STATE, format!("lists no {file}")))?;
        let bytes = redline_core::files::read_input(&path.join(file), sum.bytes.saturating_add(1))
            .map_err(|e| bad(file, format!("cannot be read: {e}")))?;
        if bytes.len() as u64 != sum.bytes {
            return Err(bad(
                file,
                format!(
                    "{} bytes, but {} were written (truncated or replaced)",
                    bytes.len(),
                    sum.bytes
                ),
            ));
        }
        if crc32fast::hash(&bytes) != sum.crc32 {
            return Err(bad(
                file,
                "its contents changed since it was written (CRC-32 mismatch)".into(),
            ));
        }
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| bad(file, format!("not a safetensors file: {e}")))?;
        let mut out = Vec::new();
        for (name, view) in st.tensors() {
            let t = candle_core::safetensors::Load::load(&view, &Device::Cpu)
                .map_err(|e| bad(file, format!("tensor `{name}`: {e}")))?;
            out.push((name, t));
        }
        tensors.push(out);
    }
    let optimizer = tensors.pop().unwrap_or_default();
    let weights = tensors.pop().unwrap_or_default().into_iter().collect();
    Ok(Loaded {
        dir: path.to_path_buf(),
        meta,
        weights,
        optimizer,
    })
}

/// The newest checkpoint in `dir` that passes [`read`]'s checks, and a line
/// for each newer one refused (the fallback says why it fell back). An
/// error lists every refusal when none is good.
pub fn latest_good(
    dir: &Path,
    identity: &BTreeMap<String, Value>,
    params: &[(String, Vec<usize>)],
) -> Result<(Loaded, Vec<String>)> {
    let mut refused = Vec::new();
    for (_, path) in list(dir).into_iter().rev() {
        match read(&path, identity, params) {
            Ok(l) => return Ok((l, refused)),
            Err(e) => refused.push(e.to_string()),
        }
    }
    // Something other than a folder at the path (a file, a FIFO) says so.
    let what = match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some("does not exist (the run wrote no checkpoint)".to_string())
        }
        Ok(m) if !m.is_dir() => Some(format!(
            "is not a folder (it is {}), so it holds no checkpoint",
            redline_core::files::kind_of(&m)
        )),
        _ => None,
    };
    Err(Error::Checkpoint {
        path: dir.to_path_buf(),
        message: if let Some(what) = what {
            what
        } else if refused.is_empty() {
            "holds no checkpoint to resume from".into()
        } else {
            format!("no usable checkpoint:\n  {}", refused.join("\n  "))
        },
    })
}
