//! The records a run writes as it goes (format: docs/run-dir.md): metrics as
//! JSON lines, CSV and TensorBoard scalars, and system samples.

use std::path::{Path, PathBuf};

use redline_core::files::LineFile;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use redline_monitor::{Sample, SampleCallback};
use redline_tensorboard::EventWriter;
use redline_train::{epoch_record, prefixed, step_record, test_record, Callback, Event};
use serde_json::{json, Map, Value};
use std::io::Write as _;

use crate::csv::CsvLog;
use crate::error::{Error, Result};
use crate::folder::unix_now;

/// The first columns of `metrics.csv`; the step's metrics add theirs.
const CSV_HEADER: [&str; 10] = [
    "kind",
    "step",
    "epoch",
    "loss",
    "lr",
    "samples_per_s",
    "elapsed_s",
    "train_loss",
    "epoch_s",
    "eval_s",
];

struct Writers {
    dir: PathBuf,
    jsonl: LineFile,
    csv: CsvLog,
    tb: EventWriter,
}

impl Writers {
    /// Writes `v` to `metrics.jsonl` and, with `csv`, to `metrics.csv`
    /// (with `step` set on records that lack it).
    fn line(&mut self, v: &Value, csv: Option<usize>) -> std::result::Result<(), String> {
        let err = |e: std::io::Error| format!("{}: {e}", self.dir.display());
        self.jsonl.append(&v.to_string()).map_err(err)?;
        if let Some(step) = csv {
            let mut row = v.clone();
            if let Value::Object(m) = &mut row {
                m.entry("step").or_insert(json!(step));
            }
            self.csv.append(&row).map_err(err)?;
        }
        Ok(())
    }
}

/// Writes the run's metrics as they happen; the training loop's observer and
/// the system sampler share it.
#[derive(Clone)]
pub struct RunLog {
    writers: Arc<Mutex<Writers>>,
    /// The latest global step, so system samples land on the step axis too.
    step: Arc<AtomicUsize>,
}

impl RunLog {
    /// Creates `metrics.jsonl`, `metrics.csv` and the TensorBoard event file in `dir`.
    pub fn create(dir: &Path) -> Result<Self> {
        let open = |name: &str| {
            let p = dir.join(name);
            LineFile::create(&p).map_err(Error::io("creating", p))
        };
        let csv_path = dir.join("metrics.csv");
        let csv =
            CsvLog::create(&csv_path, &CSV_HEADER).map_err(Error::io("creating", &csv_path))?;
        let tb = EventWriter::create(dir)?;
        Ok(Self {
            writers: Arc::new(Mutex::new(Writers {
                dir: dir.to_path_buf(),
                jsonl: open("metrics.jsonl")?,
                csv,
                tb,
            })),
            step: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Continues the records of `dir` for a resumed run: `metrics.jsonl` is
    /// rewritten whole with `records` (those up to the checkpoint at `step`),
    /// `metrics.csv` rebuilt from them, and a new TensorBoard event file
    /// opened beside the old ones.
    pub fn resume(dir: &Path, records: &[Map<String, Value>], step: usize) -> Result<Self> {
        let jsonl_path = dir.join("metrics.jsonl");
        redline_core::files::write_atomic_with(&jsonl_path, |w| {
            for r in records {
                writeln!(w, "{}", Value::Object(r.clone()))?;
            }
            Ok(())
        })
        .map_err(Error::io("writing", &jsonl_path))?;
        let jsonl = LineFile::append_to(&jsonl_path).map_err(Error::io("opening", &jsonl_path))?;
        let csv_path = dir.join("metrics.csv");
        let mut csv =
            CsvLog::create(&csv_path, &CSV_HEADER).map_err(Error::io("creating", &csv_path))?;
        // The CSV's `step` of an epoch or system row is the step the run had
        // reached when it was written: the last step record's before it.
        let mut at = 0;
        for r in records {
            if r.get("kind").and_then(Value::as_str) == Some("system") {
                continue;
            }
            let mut row = r.clone();
            match row.get("step").and_then(Value::as_u64) {
                Some(s) => at = s,
                None => {
                    row.insert("step".into(), json!(at));
                }
            }
            csv.append(&Value::Object(row))
                .map_err(Error::io("writing", &csv_path))?;
        }
        let tb = EventWriter::create(dir)?;
        Ok(Self {
            writers: Arc::new(Mutex::new(Writers {
                dir: dir.to_path_buf(),
                jsonl,
                csv,
                tb,
            })),
            step: Arc::new(AtomicUsize::new(step)),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Writers) -> std::result::Result<T, String>,
    ) -> std::result::Result<T, String> {
        let mut w = self
            .writers
            .lock()
            .map_err(|_| "metrics writer poisoned".to_string())?;
        f(&mut w)
    }

    /// A sampler callback that appends each system sample to the same files.
    pub fn system_callback(&self) -> SampleCallback {
        let (writers, step) = (Arc::clone(&self.writers), Arc::clone(&self.step));
        Box::new(move |s: &Sample| {
            let Ok(mut w) = writers.lock() else { return };
            if let Err(e) = write_system(&mut w, s, step.load(Ordering::Relaxed)) {
                tracing::warn!("system sample not written: {e}");
            }
        })
    }
}

fn write_system(w: &mut Writers, s: &Sample, step: usize) -> std::result::Result<(), String> {
    let mut v = serde_json::to_value(s).map_err(|e| e.to_string())?;
    if let Value::Object(m) = &mut v {
        m.insert("kind".into(), json!("system"));
    }
    w.line(&v, None)?;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut scalars: Vec<(String, f64)> = vec![
        ("system/cpu_percent".into(), s.host.cpu_percent),
        (
            "system/process_cpu_percent".into(),
            s.host.process_cpu_percent,
        ),
        ("system/memory_used_gib".into(), gib(s.host.memory_used)),
    ];
    for g in &s.gpus {
        if let Some(u) = g.utilization_gpu_percent {
            scalars.push((format!("gpu{}/utilization_percent", g.index), u));
        }
        if let Some(m) = g.memory_used {
            scalars.push((format!("gpu{}/memory_used_gib", g.index), gib(m)));
        }
    }
    let refs: Vec<(&str, f64)> = scalars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    w.tb.add_scalars(step as i64, &refs, s.unix_time)
        .map_err(|e| e.to_string())?;
    w.tb.flush().map_err(|e| e.to_string())
}

impl Callback for RunLog {
    fn name(&self) -> &str {
        "run folder"
    }

    /// The run's records: a run that cannot write them (a full disk) fails
    /// and says so, rather than finishing with half its records.
    fn required(&self) -> bool {
        true
    }

    fn on_event(&mut self, event: &Event<'_>) -> std::result::Result<(), String> {
        match event {
            Event::StepEnd { step, .. } => {
                self.step.store(*step, Ordering::Relaxed);
                Ok(())
            }
            Event::Log(s) => self.with(|w| {
                w.line(&step_record(s), Some(s.step))?;
                let mut scalars = vec![
                    ("train/loss", s.loss),
                    ("train/lr", s.lr),
                    ("train/samples_per_s", s.samples_per_s),
                ];
                if let Some(g) = s.grad_norm {
                    scalars.push(("train/grad_norm", g));
                }
                if let Some(g) = s.loss_scale {
                    scalars.push(("train/loss_scale", g));
                }
                // TFLOP/s, so the chart's axis reads as the summary does.
                if let Some(f) = s.flops_per_s {
                    scalars.push(("train/tflops", f / 1e12));
                }
                if let Some(u) = s.mfu {
                    scalars.push(("train/mfu", u));
                }
                w.tb.add_scalars(s.step as i64, &scalars, unix_now())
                    .map_err(|e| e.to_string())
            }),
            Event::EpochEnd(e) => self.with(|w| {
                let step = self.step.load(Ordering::Relaxed);
                w.line(&epoch_record(e), Some(step))?;
                let mut scalars = prefixed("epoch/train_", e.train_loss, &e.train);
                let per_s = e.samples as f64 / e.epoch_s.max(1e-9);
                scalars.push(("epoch/samples_per_s".into(), per_s));
                if let Some(val) = &e.val {
                    scalars.extend(prefixed("val/", val.loss, &val.metrics));
                }
                add_scalars(w, step, &scalars)
            }),
            Event::Test(t) => self.with(|w| {
                let step = self.step.load(Ordering::Relaxed);
                w.line(&test_record(t), Some(step))?;
                add_scalars(w, step, &prefixed("test/", t.loss, &t.metrics))
            }),
            Event::FitEnd(_) => self.with(|w| w.tb.flush().map_err(|e| e.to_string())),
            _ => Ok(()),
        }
    }
}

/// Writes finite `scalars` to TensorBoard at `step` and flushes.
fn add_scalars(
    w: &mut Writers,
    step: usize,
    scalars: &[(String, f64)],
) -> std::result::Result<(), String> {
    let refs: Vec<(&str, f64)> = scalars
        .iter()
        .filter(|(_, v)| v.is_finite())
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    w.tb.add_scalars(step as i64, &refs, unix_now())
        .and_then(|()| w.tb.flush())
        .map_err(|e| e.to_string())
}
