//! Reopening a stopped run's folder to resume it (`redline train --resume`):
//! the records the stopped run wrote after its checkpoint are cut (the
//! resumed run writes them again, bit for bit), the writers append from
//! there, and the folder reads as running again.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::folder::{unix_now, utc_stamp, write_atomic};
use crate::log::RunLog;
use crate::records::Summary;
use crate::run::{Run, RESERVE, RESERVE_BYTES};

/// The most `metrics.jsonl` read back: as `redline report` reads.
const MAX_METRICS_BYTES: u64 = 1 << 30;

/// The most `summary.json` read back (it is a page of numbers).
const MAX_SUMMARY_BYTES: u64 = 16 << 20;

/// Where the resumed run picks up: the checkpoint's counters.
#[derive(Debug, Clone)]
pub struct ResumePoint {
    /// Optimizer steps the checkpoint holds.
    pub step: usize,
    /// Epochs it had finished.
    pub epochs: usize,
    /// When it was written (Unix seconds): system samples after it are cut.
    pub written_unix_s: f64,
    /// The checkpoint's folder, recorded in `summary.json` `resumed`.
    pub checkpoint: String,
}

/// What reopening kept and cut.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reopened {
    /// Records kept from `metrics.jsonl`.
    pub kept: usize,
    /// Records after the checkpoint, cut (the resumed run writes them again).
    pub cut: usize,
    /// Lines that were not records (half a line from a kill, an edit), dropped.
    pub unreadable: usize,
}

impl Reopened {
    /// One line for the user.
    pub fn line(&self) -> String {
        let mut s = format!(
            "metrics.jsonl: kept {} records up to the checkpoint, cut {} after it",
            self.kept, self.cut
        );
        if self.unreadable > 0 {
            s.push_str(&format!(
                ", dropped {} unreadable lines (half a line from a kill, or an edit)",
                self.unreadable
            ));
        }
        s
    }
}

/// Whether the record `v` was written before the checkpoint `at`.
fn before(v: &Map<String, Value>, at: &ResumePoint) -> bool {
    let int = |k: &str| v.get(k).and_then(Value::as_u64);
    match v.get("kind").and_then(Value::as_str) {
        Some("step") => int("step").is_some_and(|s| s <= at.step as u64),
        Some("epoch") => int("epoch").is_some_and(|e| e <= at.epochs as u64),
        Some("system") => v
            .get("unix_time")
            .and_then(Value::as_f64)
            .is_some_and(|t| t <= at.written_unix_s),
        // The test pass ends a run; a resumed run has not reached it yet.
        _ => false,
    }
}

/// Splits `metrics.jsonl`'s text into the records to keep, and counts.
fn cut_records(text: &str, at: &ResumePoint) -> (Vec<Map<String, Value>>, Reopened) {
    let mut out = (Vec::new(), Reopened::default());
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(m)) if before(&m, at) => {
                out.1.kept += 1;
                out.0.push(m);
            }
            Ok(Value::Object(_)) => out.1.cut += 1,
            _ => out.1.unreadable += 1,
        }
    }
    out
}

/// The process a run folder's `pid` file names, when it is alive (Linux).
fn live_pid(dir: &Path) -> Option<u32> {
    let text = redline_core::files::read_input_text(&dir.join("pid"), 64).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    let alive = cfg!(target_os = "linux") && Path::new(&format!("/proc/{pid}")).exists();
    (alive && pid != std::process::id()).then_some(pid)
}

impl Run {
    /// Reopens the run folder `dir` to resume it from the checkpoint `at`:
    /// refuses a folder whose run is still alive; keeps the records of
    /// `metrics.jsonl` up to the checkpoint and rebuilds `metrics.csv` from
    /// them; opens a new TensorBoard event file (TensorBoard drops the old
    /// file's points after the resume point when the steps go back); and
    /// records the resume in `summary.json` `resumed` when the run ends.
    pub fn reopen(dir: &Path, model: &str, at: &ResumePoint) -> Result<(Self, Reopened)> {
        if let Some(pid) = live_pid(dir) {
            return Err(Error::Running {
                dir: dir.to_path_buf(),
                pid,
            });
        }
        let metrics = dir.join("metrics.jsonl");
        let text = match redline_core::files::read_input(&metrics, MAX_METRICS_BYTES) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(Error::io("reading", metrics)(e)),
        };
        let (records, counts) = cut_records(&text, at);
        let previous = read_summary(dir);
        let started = unix_now();
        write_atomic(&dir.join(RESERVE), &"\0".repeat(RESERVE_BYTES))?;
        let log = RunLog::resume(dir, &records, at.step)?;
        write_atomic(&dir.join("pid"), &std::process::id().to_string())?;
        // The old ending no longer holds: until this run ends, the folder
        // reads as running (or, killed again, as killed).
        match std::fs::remove_file(dir.join("summary.json")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io("removing", dir.join("summary.json"))(e))
            }
            _ => {}
        }
        let mut header = Map::new();
        header.insert("model".into(), json!(model));
        let first = previous.as_ref().and_then(|s| s.started_unix);
        let first_text = previous.as_ref().map(|s| s.started.clone());
        match (first, first_text) {
            (Some(t), Some(text)) if !text.is_empty() => {
                header.insert("started".into(), json!(text));
                header.insert("started_unix".into(), json!(t));
            }
            _ => {
                header.insert("started".into(), json!(utc_stamp(started).1));
                header.insert("started_unix".into(), json!(started));
            }
        }
        header.insert("run_dir".into(), json!(dir.display().to_string()));
        let previous_summary = previous.clone();
        let mut resumed: Vec<Value> = previous
            .and_then(|s| s.other.get("resumed").cloned())
            .and_then(|v| match v {
                Value::Array(a) => Some(a),
                _ => None,
            })
            .unwrap_or_default();
        resumed.push(json!({
            "step": at.step,
            "checkpoint": at.checkpoint,
            "at": utc_stamp(started).1,
        }));
        header.insert("resumed".into(), Value::Array(resumed));
        let segments = crate::segments::resumed(
            dir,
            previous_summary.as_ref(),
            (at.step as u64, at.written_unix_s, &at.checkpoint),
            started,
        );
        crate::segments::write(dir, &segments)?;
        header.insert("segments".into(), json!(segments));
        Ok((Self::from_parts(dir.to_path_buf(), log, header), counts))
    }
}

/// The old `summary.json`, when it reads (an interrupted run has one; a
/// killed one, or an edited one, may not: the resume goes on without it).
fn read_summary(dir: &Path) -> Option<Summary> {
    let text =
        redline_core::files::read_input_text(&dir.join("summary.json"), MAX_SUMMARY_BYTES).ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> ResumePoint {
        ResumePoint {
            step: 20,
            epochs: 1,
            written_unix_s: 100.0,
            checkpoint: "c".into(),
        }
    }

    #[test]
    fn records_after_the_checkpoint_are_cut_and_junk_dropped() {
        let text = [
            r#"{"kind":"step","step":10,"epoch":1,"loss":1.0}"#,
            r#"{"kind":"system","unix_time":99.0}"#,
            r#"{"kind":"epoch","epoch":1,"train_loss":1.0}"#,
            r#"{"kind":"step","step":20,"epoch":2,"loss":0.5}"#,
            r#"{"kind":"step","step":30,"epoch":2,"loss":0.4}"#,
            r#"{"kind":"system","unix_time":101.0}"#,
            r#"{"kind":"epoch","epoch":2,"train_loss":0.4}"#,
            r#"{"kind":"test","test_loss":0.4}"#,
            r#"[1,2]"#,
            r#"{"kind":"step","step":"#,
        ]
        .join("\n");
        let (kept, counts) = cut_records(&text, &at());
        assert_eq!(
            counts,
            Reopened {
                kept: 4,
                cut: 4,
                unreadable: 2
            }
        );
        let steps: Vec<_> = kept.iter().filter_map(|m| m.get("step")).collect();
        assert_eq!(steps, [&json!(10), &json!(20)]);
    }

    #[test]
    fn a_folder_is_reopened_with_its_records_cut_and_a_live_run_refused() -> anyhow::Result<()> {
        let t = tempfile::tempdir()?;
        let dir = t.path();
        std::fs::write(
            dir.join("metrics.jsonl"),
            "{\"kind\":\"step\",\"step\":10,\"epoch\":1,\"loss\":1.0}\n\
             {\"kind\":\"step\",\"step\":30,\"epoch\":2,\"loss\":0.4}\n{\"kind\":\"st",
        )?;
        std::fs::write(
            dir.join("summary.json"),
            r#"{"model":"mlp","started":"1970-01-01 00:00:07 UTC","started_unix":7.0,"status":"interrupted"}"#,
        )?;
        let (run, counts) = Run::reopen(dir, "mlp", &at())?;
        assert_eq!((counts.kept, counts.cut, counts.unreadable), (1, 1, 1));
        assert!(!dir.join("summary.json").exists(), "the old ending stays");
        let jsonl = std::fs::read_to_string(dir.join("metrics.jsonl"))?;
        assert_eq!(jsonl.lines().count(), 1, "{jsonl}");
        let csv = std::fs::read_to_string(dir.join("metrics.csv"))?;
        assert_eq!(csv.lines().count(), 2, "{csv}");
        assert_eq!(
            std::fs::read_to_string(dir.join("pid"))?,
            std::process::id().to_string()
        );
        // A run folder whose process is alive is not taken over.
        std::fs::write(dir.join("pid"), "1")?;
        let refused = Run::reopen(dir, "mlp", &at()).err().map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|e| e.contains("still running") && e.contains("pid 1")),
            "{refused:?}"
        );
        std::fs::write(dir.join("pid"), std::process::id().to_string())?;
        let finished = run.finished_header();
        assert_eq!(finished.get("started_unix"), Some(&json!(7.0)));
        assert_eq!(
            finished
                .get("resumed")
                .and_then(|r| r.get(0))
                .and_then(|r| r.get("step")),
            Some(&json!(20))
        );
        Ok(())
    }
}
