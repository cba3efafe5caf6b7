//! Machine-readable metrics: one JSON object per line.
//!
//! `{"kind":"step",...}` at each log point, `{"kind":"epoch",...}` at each
//! epoch end and `{"kind":"test",...}` after a test pass, flushed as written
//! so a killed run keeps what it logged.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::error::{Error, Result};
use crate::events::{Callback, EpochLog, EvalResult, Event, StepLog};

/// Writes metrics as JSON lines.
pub struct JsonlMetrics {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JsonlMetrics {
    /// Creates (truncates) `path`, making its folder if needed.
    pub fn create(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Config(format!("--metrics {}: {e}", path.display())))?;
        }
        let f = File::create(path)
            .map_err(|e| Error::Config(format!("--metrics {}: {e}", path.display())))?;
        Ok(Self {
            path: path.to_path_buf(),
            out: BufWriter::new(f),
        })
    }

    fn write(&mut self, v: serde_json::Value) -> std::result::Result<(), String> {
        writeln!(self.out, "{v}")
            .and_then(|_| self.out.flush())
            .map_err(|e| format!("{}: {e}", self.path.display()))
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
    json!({
        "kind": "step", "step": s.step, "epoch": s.epoch, "loss": num(s.loss),
        "lr": s.lr, "samples_per_s": num(s.samples_per_s), "elapsed_s": s.elapsed_s,
    })
}

/// The `{"kind":"epoch",...}` record of an epoch end: `train_loss` and
/// `train_<metric>` for each of the step's metrics, `val_loss` and
/// `val_<metric>` when the epoch was validated, then timings and counts.
pub fn epoch_record(e: &EpochLog) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("kind".into(), json!("epoch"));
    m.insert("epoch".into(), json!(e.epoch));
    m.insert("train_loss".into(), num(e.train_loss));
    for (name, v) in e.train.iter() {
        m.insert(format!("train_{name}"), num(v));
    }
    if let Some(val) = &e.val {
        m.insert("val_loss".into(), num(val.loss));
        for (name, v) in val.metrics.iter() {
            m.insert(format!("val_{name}"), num(v));
        }
    }
    m.insert("epoch_s".into(), json!(e.epoch_s));
    m.insert("eval_s".into(), json!(e.eval_s));
    m.insert("steps".into(), json!(e.steps));
    m.insert("samples".into(), json!(e.samples));
    serde_json::Value::Object(m)
}

/// The `{"kind":"test",...}` record of a test pass: `test_loss`,
/// `test_<metric>` for each metric, samples and seconds.
pub fn test_record(t: &EvalResult) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("kind".into(), json!("test"));
    for (k, v) in eval_fields("test", t) {
        m.insert(k, v);
    }
    m.insert("samples".into(), json!(t.samples));
    m.insert("eval_s".into(), json!(t.seconds));
    serde_json::Value::Object(m)
}

/// `<prefix>_loss` and `<prefix>_<metric>` of an evaluation pass, as JSON
/// numbers (null for NaN): the keys of test records and of `summary.json`.
pub fn eval_fields(prefix: &str, r: &EvalResult) -> Vec<(String, serde_json::Value)> {
    std::iter::once((format!("{prefix}_loss"), num(r.loss)))
        .chain(
            r.metrics
                .iter()
                .map(|(name, v)| (format!("{prefix}_{name}"), num(v))),
        )
        .collect()
}

impl Callback for JsonlMetrics {
    fn name(&self) -> &str {
        "metrics"
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
