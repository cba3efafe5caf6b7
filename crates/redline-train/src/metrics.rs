//! Machine-readable metrics: one JSON object per line.
//!
//! `{"kind":"step",...}` at each log point and `{"kind":"epoch",...}` at each
//! epoch end, flushed as written so a killed run keeps what it logged.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::error::{Error, Result};
use crate::events::{Callback, EpochLog, Event, StepLog};

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

/// The `{"kind":"epoch",...}` record of an epoch end.
pub fn epoch_record(e: &EpochLog) -> serde_json::Value {
    json!({
        "kind": "epoch", "epoch": e.epoch, "train_loss": num(e.train_loss),
        "train_accuracy": num(e.train_accuracy), "test_loss": num(e.test_loss),
        "test_accuracy": num(e.test_accuracy), "epoch_s": e.epoch_s, "eval_s": e.eval_s,
        "steps": e.steps, "samples": e.samples,
    })
}

impl Callback for JsonlMetrics {
    fn name(&self) -> &str {
        "metrics"
    }

    fn on_event(&mut self, event: &Event<'_>) -> std::result::Result<(), String> {
        match event {
            Event::Log(s) => self.write(step_record(s)),
            Event::EpochEnd(e) => self.write(epoch_record(e)),
            _ => Ok(()),
        }
    }
}
