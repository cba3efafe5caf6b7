//! [`Run`]: the run folder for a training run, as `redline train` leaves it,
//! for a program that uses the trainer as a library.

use std::path::{Path, PathBuf};
use std::time::Duration;

use redline_monitor::Sampler;
use redline_profile::Profile;
use redline_train::metrics::{num, prefixed};
use redline_train::{Callback, EvalResult, FitSummary, Trainer};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::folder::{self, unix_now, utc_stamp, write_atomic};
use crate::log::RunLog;
use crate::records::{RunStatus, Summary};

/// Renders the report page of a finished run folder (`redline_report::write_report`).
pub type ReportFn = Box<dyn FnOnce(&Path) -> std::result::Result<PathBuf, String>>;

/// How a run ended, for `summary.json`.
#[derive(Debug, Clone, Copy)]
pub enum Ending<'a> {
    /// The fit completed; `test` is the test pass after it, if there was one.
    Finished {
        /// What the fit returned.
        fit: &'a FitSummary,
        /// The test pass.
        test: Option<&'a EvalResult>,
    },
    /// Stopped by a signal after a whole step; the message says which.
    Interrupted(&'a str),
    /// Stopped by an error; the message says what.
    Failed(&'a str),
}

/// What [`Run::finish`] wrote.
pub struct Finished {
    /// The run folder.
    pub dir: PathBuf,
    /// `summary.json`, as written.
    pub summary: Summary,
    /// The trainer's profile (also written as `breakdown.json`, `profile.json`
    /// and, detailed, `trace.json`), if the trainer had run a fit.
    pub profile: Option<Profile>,
    /// `report.html`, or why it was not written; `None` without a report hook.
    pub report: Option<std::result::Result<PathBuf, String>>,
}

/// A run folder being filled: create it before the trainer, hand the
/// trainer [`Run::callback`], and call [`Run::finish`] after the fit.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (step, train, val, device): (redline_train::Classifier<Box<dyn redline_models::Model>>, redline_data::Loader, redline_data::Loader, redline_core::Device) = todo!();
/// use redline_run::{Ending, Run};
/// let mut run = Run::create(None, "mlp")?;          // runs/<date-time>-mlp
/// run.monitor(std::time::Duration::from_secs(1)); // system samples
/// let mut trainer = redline_train::Trainer::builder()
///     .callback(run.callback())
///     .build(step, device)?;
/// let fit = trainer.fit(&train, Some(&val))?;
/// let done = run.finish(&mut trainer, Ending::Finished { fit: &fit, test: None })?;
/// println!("{}", done.dir.display());
/// # Ok(()) }
/// ```
pub struct Run {
    dir: PathBuf,
    log: RunLog,
    sampler: Option<Sampler>,
    header: Map<String, Value>,
    report: Option<ReportFn>,
    /// Set by [`Run::finish`]; a run dropped without it is recorded as failed.
    done: bool,
}

impl Run {
    /// Creates the folder (`dir`, refused if it holds a run; else
    /// `runs/<date-time>-<model>`) and its record files, and notes the model,
    /// the start time and the folder for `summary.json`.
    pub fn create(dir: Option<&Path>, model: &str) -> Result<Self> {
        Self::create_in(dir, Path::new("runs"), model)
    }

    /// [`Run::create`] with the automatic folder under `base` instead of `runs`.
    pub fn create_in(dir: Option<&Path>, base: &Path, model: &str) -> Result<Self> {
        let started = unix_now();
        let dir = folder::create(dir, base, model, started)?;
        // Space kept for the end: on a disk that fills up mid-run, `finish`
        // frees it first, so `summary.json` can still say `failed` and why.
        write_atomic(&dir.join(RESERVE), &"\0".repeat(RESERVE_BYTES))?;
        let log = RunLog::create(&dir)?;
        // Until `finish`: `redline runs` tells a live run from a killed one by it.
        write_atomic(&dir.join("pid"), &std::process::id().to_string())?;
        let mut header = Map::new();
        header.insert("model".into(), json!(model));
        header.insert("started".into(), json!(utc_stamp(started).1));
        header.insert("started_unix".into(), json!(started));
        header.insert("run_dir".into(), json!(dir.display().to_string()));
        crate::segments::write(
            &dir,
            &[crate::segments::Segment {
                started_unix: started,
                ..Default::default()
            }],
        )?;
        Ok(Self::from_parts(dir, log, header))
    }

    /// A run over a folder whose writers and `summary.json` header are ready
    /// ([`Run::create`], [`Run::reopen`]).
    pub(crate) fn from_parts(dir: PathBuf, log: RunLog, header: Map<String, Value>) -> Self {
        Self {
            dir,
            log,
            sampler: None,
            header,
            report: None,
            done: false,
        }
    }

    /// The `summary.json` fields set so far.
    #[cfg(test)]
    pub(crate) fn finished_header(&self) -> &Map<String, Value> {
        &self.header
    }

    /// The run folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The trainer's observer that writes `metrics.jsonl`, `metrics.csv` and
    /// the TensorBoard scalars (one per trainer; they share the files).
    pub fn callback(&self) -> Box<dyn Callback> {
        Box::new(self.log.clone())
    }

    /// Samples the host and GPUs every `every` into the same records (the
    /// report's system charts) until [`Run::finish`].
    pub fn monitor(&mut self, every: Duration) {
        self.sampler = Some(Sampler::start_with(every, self.log.system_callback()));
    }

    /// Sets a `summary.json` field (`device`, `batch_size`, `threads`, or any
    /// key of your own). A value of the wrong type for a field the records
    /// type (`"threads": "four"`) is refused here, not when the summary is
    /// written at the end.
    pub fn set(&mut self, key: &str, value: Value) -> Result<()> {
        let mut one = Map::new();
        one.insert(key.to_string(), value.clone());
        serde_json::from_value::<Summary>(Value::Object(one)).map_err(|source| Error::Json {
            what: "a summary.json field",
            source,
        })?;
        self.header.insert(key.to_string(), value);
        Ok(())
    }

    /// Renders the report page with `render` at the end of [`Run::finish`]:
    /// `run.report(Box::new(|d| redline_report::write_report(d).map_err(|e| e.to_string())))`.
    pub fn report(&mut self, render: ReportFn) {
        self.report = Some(render);
    }

    /// Writes a file of the caller's into the folder whole (`config.toml`, ...).
    pub fn write_file(&self, name: &str, text: &str) -> Result<PathBuf> {
        let path = self.dir.join(name);
        write_atomic(&path, text)?;
        Ok(path)
    }

    /// Ends the run: stops the monitor, writes the trainer's profile and
    /// breakdown, `summary.json` (status, error, the fit's numbers, the last
    /// validation's and the test pass's metrics) and the report. Call it on
    /// failure too: a failed run's folder says why.
    pub fn finish(mut self, trainer: &mut Trainer, ending: Ending<'_>) -> Result<Finished> {
        self.done = true;
        self.free_reserve();
        let samples = self.sampler.take().map_or(0, |s| s.stop().len());
        let mut header = std::mem::take(&mut self.header);
        if let Ok(Some(mem)) = trainer.memory() {
            header.insert("device_memory".into(), mem.to_json());
        }
        header
            .entry("device")
            .or_insert_with(|| json!(trainer.device().to_string()));
        let profile = trainer.finish_profile();
        // A profile that cannot be written (a full disk) fails the run, and
        // the summary still says so.
        let not_written = profile
            .as_ref()
            .and_then(|p| p.write(&self.dir).err())
            .map(|e| format!("the run folder's profile was not written: {e}"));
        let ending = match &not_written {
            Some(why) if !matches!(ending, Ending::Failed(_)) => Ending::Failed(why),
            _ => ending,
        };
        let summary = summarize(header, ending, samples)?;
        write_summary(&self.dir, &summary)?;
        if let Some(why) = not_written {
            return Err(Error::Unfinished(why));
        }
        let report = self.report.take().map(|render| render(&self.dir));
        let pid = self.dir.join("pid");
        std::fs::remove_file(&pid).map_err(Error::io("removing", pid))?;
        Ok(Finished {
            dir: self.dir.clone(),
            summary,
            profile,
            report,
        })
    }
}

/// The file that keeps space for the end of a run (see [`Run::create`]).
pub(crate) const RESERVE: &str = ".space-reserve";

/// Its size: more than `summary.json` and the breakdown need.
pub(crate) const RESERVE_BYTES: usize = 256 << 10;

impl Run {
    /// Frees the space kept for the end of the run.
    fn free_reserve(&self) {
        let _ = std::fs::remove_file(self.dir.join(RESERVE));
    }
}

impl Drop for Run {
    /// A run dropped before [`Run::finish`] (an early `?` or a panic in the
    /// program) still says so: `summary.json` with status `failed`.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.free_reserve();
        let samples = self.sampler.take().map_or(0, |s| s.stop().len());
        let ending = Ending::Failed(
            "the program ended the run before it finished (an error before or after the fit, \
             or a panic); its own output says which",
        );
        let written = summarize(std::mem::take(&mut self.header), ending, samples)
            .and_then(|s| write_summary(&self.dir, &s));
        if let Err(e) = written {
            tracing::warn!("{}: summary.json not written: {e}", self.dir.display());
        }
        let _ = std::fs::remove_file(self.dir.join("pid"));
    }
}

fn write_summary(dir: &Path, summary: &Summary) -> Result<()> {
    let text = serde_json::to_string_pretty(summary).map_err(|source| Error::Json {
        what: "writing summary.json",
        source,
    })?;
    write_atomic(&dir.join("summary.json"), &text)
}

/// `summary.json` from the header fields and how the run ended, typed as the
/// report reads it.
pub fn summarize(mut m: Map<String, Value>, ending: Ending<'_>, samples: usize) -> Result<Summary> {
    let (status, error) = match ending {
        Ending::Finished { .. } => (RunStatus::Finished, Value::Null),
        Ending::Interrupted(e) => (RunStatus::Interrupted, json!(e)),
        Ending::Failed(e) => (RunStatus::Failed, json!(e)),
    };
    m.insert("status".into(), json!(status.to_string()));
    m.insert("error".into(), error);
    m.insert("system_samples".into(), json!(samples));
    let ended = unix_now();
    m.insert("ended_unix".into(), json!(ended));
    let steps = match &ending {
        Ending::Finished { fit, .. } => Some(fit.steps as u64),
        _ => None,
    };
    // A resumed run: its segments, this one ended now.
    let mut segments: Option<Vec<crate::segments::Segment>> = m
        .get("segments")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .filter(|s: &Vec<crate::segments::Segment>| s.len() > 1);
    if let Some(last) = segments.as_mut().and_then(|s| s.last_mut()) {
        last.ended = Some(status.to_string());
        last.ended_unix = Some(ended);
        last.to_step = steps;
    }
    if let Ending::Finished { fit: f, test } = ending {
        let evals = f
            .val
            .iter()
            .flat_map(|v| prefixed("val_", v.loss, &v.metrics));
        let tests = test
            .into_iter()
            .flat_map(|t| prefixed("test_", t.loss, &t.metrics));
        m.extend(evals.chain(tests).map(|(k, v)| (k, num(v))));
        for (k, v) in [
            ("epochs", json!(f.epochs)),
            ("steps", json!(f.steps)),
            ("samples", json!(f.samples)),
            ("wall_s", num(f.wall_s)),
            ("train_s", num(f.train_s)),
            ("eval_s", num(f.eval_s)),
            ("samples_per_s", num(f.samples_per_s)),
            ("host_syncs_per_step", num(f.host_syncs_per_step)),
            ("cuda_graph", json!(f.cuda_graph.to_string())),
        ] {
            m.insert(k.into(), v);
        }
        if let Some(why) = &f.stopped_early {
            m.insert(
                "stopped_early".into(),
                json!(format!(
                    "stopped after epoch {}: {}",
                    why.epoch, why.message
                )),
            );
        }
        if let Some(c) = &f.checkpoints {
            m.insert("checkpoints".into(), json!(c));
        }
        if !f.ranks.is_empty() {
            m.insert("ranks".into(), json!(f.ranks));
        }
        if let Some(best) = &f.best {
            m.insert("best_epoch".into(), json!(best.best_epoch));
            m.insert("best_value".into(), num(best.best));
        }
        if let Some(p) = f.matmul_precision {
            m.insert("matmul_precision".into(), json!(p.describe()));
        }
        if let Some(c) = &f.gpu_conv {
            m.insert("gpu_conv".into(), json!(c));
        }
        if let Some(s) = &f.loss_scale {
            // Through the record: an infinite scale is written as "inf".
            let record = crate::records::LossScaleRecord {
                scale: s.scale,
                growth_tracker: u64::from(s.growth_tracker),
                skipped_steps: s.skipped_steps,
            };
            m.insert("loss_scale".into(), json!(record));
        }
        if let Some(mem) = &f.memory {
            m.insert("memory".into(), json!(mem));
        }
        match &f.flops {
            Some(Ok(fl)) => {
                m.insert("flops".into(), json!(fl));
            }
            Some(Err(why)) => {
                m.insert("flops_note".into(), json!(why));
            }
            None => {}
        }
        match &f.gpu_busy {
            Some(Ok(g)) => {
                m.insert("gpu_busy".into(), json!(g));
            }
            Some(Err(why)) => {
                m.insert(
                    "gpu_busy_note".into(),
                    json!(format!("not measured: {why}")),
                );
            }
            None => {}
        }
    }
    if let Some(segs) = segments {
        // The run's wall time is every segment's, each counted to its end
        // (a killed one to the checkpoint the next resumed from).
        if let Some(this) = m.get("wall_s").cloned() {
            m.insert("segment_wall_s".into(), this);
        }
        m.insert("wall_s".into(), num(crate::segments::total_wall_s(&segs)));
        m.insert("segments".into(), json!(segs));
    }
    serde_json::from_value(Value::Object(m)).map_err(|source| Error::Json {
        what: "writing summary.json",
        source,
    })
}
