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
    /// Creates `path`, making its folder if needed; a file already there
    /// is appended to, never truncated (a user's file, or the same run's
    /// records before a `--resume`). [`JsonlMetrics::existing`] says which.
    pub fn create(path: &Path) -> Result<Self> {
        let bad = |e: std::io::Error| Error::Config(format!("--metrics {}: {e}", path.display()));
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(bad)?;
        }
        // Only a regular file: a device or FIFO at the path is refused by name.
        let out = match Self::existing(path) {
            Some(_) => {
                let mut out = LineFile::append_to(path).map_err(bad)?;
                // A last line without its newline is ended first, so the
                // first record starts a line of its own.
                let bytes = std::fs::read(path).map_err(bad)?;
                if bytes.last().is_some_and(|b| *b != b'\n') {
                    out.append("").map_err(bad)?;
                }
                out
            }
            None => LineFile::create(path).map_err(bad)?,
        };
        Ok(Self {
            path: path.to_path_buf(),
            out,
        })
    }

    /// The size in bytes of a non-empty regular file at `path`, which
    /// [`JsonlMetrics::create`] appends to.
    pub fn existing(path: &Path) -> Option<u64> {
        std::fs::metadata(path)
            .ok()
            .filter(|m| m.is_file() && m.len() > 0)
            .map(|m| m.len())
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
    if let (Some(f), Some(m)) = (s.flops_per_s, r.as_object_mut()) {
        m.insert("flops_per_s".into(), num(f));
    }
    if let (Some(u), Some(m)) = (s.mfu, r.as_object_mut()) {
        m.insert("mfu".into(), num(u));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An existing `--metrics` file keeps what it held and gets the run's
    /// records after it, each on its own line. Before, it was truncated.
    #[test]
    fn an_existing_file_is_appended_to_not_truncated() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("m.jsonl");
        std::fs::write(&path, "my own notes").unwrap();
        assert_eq!(JsonlMetrics::existing(&path), Some(12));
        let mut m = JsonlMetrics::create(&path).unwrap();
        m.write(json!({"kind": "test"})).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "my own notes\n{\"kind\":\"test\"}\n");
        let fresh = t.path().join("new/m.jsonl");
        assert_eq!(JsonlMetrics::existing(&fresh), None);
        JsonlMetrics::create(&fresh)
            .unwrap()
            .write(json!(1))
            .unwrap();
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), "1\n");
    }
}
