//! Machine-readable metrics: one JSON object per line.
//!
//! `{"kind":"step",...}` at each log point, `{"kind":"epoch",...}` at each
//! epoch end and `{"kind":"test",...}` after a test pass, flushed as written
//! so a killed run keeps what it logged.

use std::path::{Path, PathBuf};

use redline_core::files::LineFile;

use serde_json::json;

use crate::error::{Error, Result};
use crate::events::{Callback, EpochLog, EvalResult, Event, MetricValues, StepLog};

/// Writes metrics as JSON lines.
pub struct JsonlMetrics {
    path: PathBuf,
    out: LineFile,
}

impl JsonlMetrics {
    /// Creates (truncates) `path`, making its folder if needed.
    pub fn create(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Config(format!("--metrics {}: {e}", path.display())))?;
        }
        // Only a regular file: a device or FIFO at the path is refused by name.
        let out = LineFile::create(path)
            .map_err(|e| Error::Config(format!("--metrics {}: {e}", path.display())))?;
        Ok(Self {
            path: path.to_path_buf(),
            out,
        })
    }

    fn write(&mut self, v: serde_json::Value) -> std::result::Result<(), String> {
        self.out
            .append(&v.to_string())
            .map_err(|e| format!("--metrics {}: {e}", self.path.display()))
    }
}

/// JSON cannot hold NaN; absent values are written as null.
pub fn num(x: f64) -> serde_json::Value {
    if x.is_finite() {
        json!(x)
    } else {
        serde_json::Value::Null
    }
}

/// The `{"kind":"step",...}` record of a log point.
pub fn step_record(s: &StepLog) -> serde_json::Value {
    let mut r = json!({
        "kind": "step", "step": s.step, "epoch": s.epoch, "loss": num(s.loss),
        "lr": s.lr, "samples_per_s": num(s.samples_per_s), "elapsed_s": s.elapsed_s,
    });
    if let (Some(g), Some(m)) = (s.grad_norm, r.as_object_mut()) {
        m.insert("grad_norm".into(), num(g));
    }
    if let (Some(g), Some(m)) = (s.loss_scale, r.as_object_mut()) {
        m.insert("loss_scale".into(), num(g));
    }
    r
}

/// `{prefix}loss` and `{prefix}{name}` for each of the step's metrics: the
/// one key scheme of records (`train_`, `val_`, `test_`), `summary.json` and
/// TensorBoard tags (`val/`, `test/`, `epoch/train_`).
pub fn prefixed(prefix: &str, loss: f64, metrics: &MetricValues) -> Vec<(String, f64)> {
    std::iter::once((format!("{prefix}loss"), loss))
        .chain(
            metrics
                .iter()
                .map(|(name, v)| (format!("{prefix}{name}"), v)),
        )
        .collect()
}

/// A record: `kind`, the `fields` (NaN as null) and the `extra` values.
fn record<const N: usize>(
    kind: &str,
    fields: Vec<(String, f64)>,
    extra: [(&str, serde_json::Value); N],
) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("kind".into(), json!(kind));
    m.extend(fields.into_iter().map(|(k, v)| (k, num(v))));
    m.extend(extra.map(|(k, v)| (k.to_string(), v)));
    serde_json::Value::Object(m)
}

/// The `{"kind":"epoch",...}` record of an epoch end: `train_loss` and
/// `train_<metric>` for each of the step's metrics, `val_loss` and
/// `val_<metric>` when the epoch was validated, then timings and counts.
pub fn epoch_record(e: &EpochLog) -> serde_json::Value {
    let mut fields = prefixed("train_", e.train_loss, &e.train);
    if let Some(val) = &e.val {
        fields.extend(prefixed("val_", val.loss, &val.metrics));
    }
    record(
        "epoch",
        fields,
        [
            ("epoch", json!(e.epoch)),
            ("epoch_s", json!(e.epoch_s)),
            ("eval_s", json!(e.eval_s)),
            ("steps", json!(e.steps)),
            ("samples", json!(e.samples)),
        ],
    )
}

/// The `{"kind":"test",...}` record of a test pass: `test_loss`,
/// `test_<metric>` for each metric, samples and seconds.
pub fn test_record(t: &EvalResult) -> serde_json::Value {
    record(
        "test",
        prefixed("test_", t.loss, &t.metrics),
        [("samples", json!(t.samples)), ("eval_s", json!(t.seconds))],
    )
}

impl Callback for JsonlMetrics {
    fn name(&self) -> &str {
        "metrics"
    }

    /// The file the user asked for: a run that cannot write it fails.
    fn required(&self) -> bool {
        true
    }

    fn on_event(&mut self, event: &Event<'_>) -> std::result::Result<(), String> {
        match event {
            Event::Log(s) => self.write(step_record(s)),
            Event::EpochEnd(e) => self.write(epoch_record(e)),
            Event::Test(t) => self.write(test_record(t)),
            _ => Ok(()),
        }
    }
}
