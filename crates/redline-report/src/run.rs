//! [`RunData`]: everything in one run directory, read and typed.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::records::{Breakdown, GpuBusy, ProfileFile};
use crate::records::{EpochRecord, Record, StepRecord, Summary, SystemRecord};

/// The files of a run directory (docs/run-dir.md), each `None`/empty when absent.
#[derive(Debug, Clone, Default)]
pub struct RunData {
    /// The folder it was read from.
    pub dir: PathBuf,
    /// `summary.json`.
    pub summary: Option<Summary>,
    /// `config.toml`, verbatim.
    pub config: Option<String>,
    /// Whether `metrics.jsonl` exists (it may exist and hold no records yet).
    pub has_metrics: bool,
    /// Step records of `metrics.jsonl`, in file order.
    pub steps: Vec<StepRecord>,
    /// Epoch records of `metrics.jsonl`, in file order.
    pub epochs: Vec<EpochRecord>,
    /// System records of `metrics.jsonl`, in file order.
    pub system: Vec<SystemRecord>,
    /// `breakdown.json`.
    pub breakdown: Option<Breakdown>,
    /// `profile.json`.
    pub profile: Option<ProfileFile>,
    /// `tune_lr.json` (`--lr auto`): the range test's curve.
    pub lr_finder: Option<LrFinderFile>,
    /// What the loader tolerated (an incomplete last line), shown in the report.
    pub notes: Vec<String>,
}

/// The parts of `tune_lr.json` the report draws.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct LrFinderFile {
    /// The curve.
    pub curve: LrFinderCurve,
    /// The suggested step.
    pub index: Option<usize>,
}

/// The range test's rates and smoothed losses.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct LrFinderCurve {
    /// The rate of each step.
    pub lr: Vec<f64>,
    /// The smoothed loss of each step (null where it was not finite).
    pub smoothed: Vec<Option<f64>>,
}

/// The most a run-folder file may hold: `metrics.jsonl` of a week-long run
/// with a system sample a second is about 300 MB.
pub(crate) const MAX_RUN_FILE: u64 = 1 << 30;

/// Reads `path` to a string; `Ok(None)` when it does not exist. A run folder
/// may have been edited or copied by hand: a file that is not a regular file
/// (a FIFO, a link to `/dev/zero`) or larger than [`MAX_RUN_FILE`] is an
/// error naming it, never an endless read.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>> {
    match redline_core::files::read_input(path, MAX_RUN_FILE) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path)(e)),
    }
}

/// Parses a whole JSON file, naming the file, line and column on failure.
pub(crate) fn parse_json<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        line: source.line(),
        column: source.column(),
        source,
    })
}

/// Reads and parses an optional JSON file.
pub(crate) fn load_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    read_optional(path)?
        .map(|text| parse_json(path, &text))
        .transpose()
}

/// The records of `metrics.jsonl`, split by kind.
#[derive(Default)]
struct Metrics {
    steps: Vec<StepRecord>,
    epochs: Vec<EpochRecord>,
    system: Vec<SystemRecord>,
    notes: Vec<String>,
}

/// Parses `metrics.jsonl`. A last line without its newline that does not parse
/// is what a killed run leaves; it is skipped with a note. Any other bad line
/// (an edit, a damaged disk) is skipped and counted in a note naming the
/// first ones, as `--resume` does: one line never costs the whole report.
fn parse_metrics(path: &Path, text: &str) -> Result<Metrics> {
    let mut m = Metrics::default();
    let mut bad: Vec<(usize, serde_json::Error)> = Vec::new();
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record = match serde_json::from_str::<Record>(line) {
            Ok(r) => r,
            Err(_) if !complete && i + 1 == lines.len() => {
                m.notes.push(format!(
                    "{}: line {} is incomplete (the run was stopped while writing it) and was skipped",
                    path.display(),
                    i + 1
                ));
                continue;
            }
            Err(source) => {
                bad.push((i + 1, source));
                continue;
            }
        };
        match record {
            Record::Step(s) => m.steps.push(s),
            Record::Epoch(e) => m.epochs.push(e),
            Record::System(s) => m.system.push(s),
            Record::Other => {}
        }
    }
    if let Some((first, why)) = bad.first() {
        let lines: Vec<String> = bad.iter().take(5).map(|(l, _)| l.to_string()).collect();
        let more = if bad.len() > 5 { ", ..." } else { "" };
        m.notes.push(format!(
            "{}: {} {} skipped (line{} {}{more}; line {first}: {})",
            path.display(),
            bad.len(),
            if bad.len() == 1 {
                "line is not a record and was"
            } else {
                "lines are not records and were"
            },
            if bad.len() == 1 { "" } else { "s" },
            lines.join(", "),
            redline_core::text::clip(&why.to_string(), 120)
        ));
    }
    Ok(m)
}

impl RunData {
    /// Reads every file of the run directory `dir`. Missing files are `None` or
    /// empty; a file that exists but does not parse is an error naming it.
    pub fn load(dir: &Path) -> Result<RunData> {
        let meta = std::fs::metadata(dir).map_err(Error::io(dir))?;
        if !meta.is_dir() {
            return Err(Error::NotARunDir {
                dir: dir.to_path_buf(),
            });
        }
        let summary = load_json::<Summary>(&dir.join("summary.json"))?;
        let config = read_optional(&dir.join("config.toml"))?;
        let metrics_path = dir.join("metrics.jsonl");
        let metrics_text = read_optional(&metrics_path)?;
        let metrics = match &metrics_text {
            Some(text) => parse_metrics(&metrics_path, text)?,
            None => Metrics::default(),
        };
        let breakdown = load_json::<Breakdown>(&dir.join("breakdown.json"))?;
        let profile = load_json::<ProfileFile>(&dir.join("profile.json"))?;
        let mut notes = metrics.notes;
        // The finder's curve is an extra: a damaged file is a note, not a failed report.
        let lr_finder = match load_json::<LrFinderFile>(&dir.join("tune_lr.json")) {
            Ok(f) => f,
            Err(e) => {
                notes.push(format!(
                    "the learning-rate finder's curve is not shown: {e}"
                ));
                None
            }
        };
        if summary.is_none() && config.is_none() && metrics_text.is_none() && breakdown.is_none() {
            return Err(Error::NotARunDir {
                dir: dir.to_path_buf(),
            });
        }
        Ok(RunData {
            dir: dir.to_path_buf(),
            summary,
            config,
            has_metrics: metrics_text.is_some(),
            steps: metrics.steps,
            epochs: metrics.epochs,
            system: metrics.system,
            breakdown,
            profile,
            lr_finder,
            notes,
        })
    }

    /// The run's device: from `summary.json`, else `breakdown.json`, else `""`.
    pub fn device(&self) -> &str {
        self.summary
            .as_ref()
            .map(|s| s.device.as_str())
            .filter(|d| !d.is_empty())
            .or_else(|| self.breakdown.as_ref().map(|b| b.device.as_str()))
            .unwrap_or("")
    }

    /// Whether the run computed on the CPU.
    pub fn is_cpu(&self) -> bool {
        self.device().starts_with("cpu")
    }

    /// On a GPU run, the kernel trace's busy figure: the breakdown's, else the summary's.
    pub fn gpu_busy(&self) -> Option<&GpuBusy> {
        if self.is_cpu() {
            return None;
        }
        self.breakdown
            .as_ref()
            .and_then(|b| b.gpu.as_ref())
            .or_else(|| self.summary.as_ref()?.gpu_busy.as_ref())
            .filter(|g| g.percent.is_finite() && g.wall_s > 0.0)
    }

    /// On a GPU run, the mean of NVML's utilization samples and their number.
    pub fn nvml_utilization(&self) -> Option<(f64, usize)> {
        if self.is_cpu() {
            return None;
        }
        let util: Vec<f64> = self
            .system
            .iter()
            .flat_map(|r| r.gpus.iter())
            .filter_map(|g| g.utilization_gpu_percent)
            .filter(|u| u.is_finite())
            .collect();
        (!util.is_empty()).then(|| (util.iter().sum::<f64>() / util.len() as f64, util.len()))
    }

    /// Optimizer steps: from `breakdown.json`, else `summary.json`, else the last step record.
    pub fn step_count(&self) -> Option<u64> {
        self.breakdown
            .as_ref()
            .map(|b| b.steps as u64)
            .filter(|&n| n > 0)
            .or_else(|| self.summary.as_ref().and_then(|s| s.steps))
            .or_else(|| self.steps.last().map(|s| s.step))
            .filter(|&n| n > 0)
    }

    /// The step at which each epoch record's epoch ended, for plotting epoch
    /// values on a step axis: the running sum of the epochs' `steps`, or where a
    /// count is missing, the last step record of that epoch.
    pub fn epoch_end_steps(&self) -> Vec<Option<u64>> {
        let mut total = Some(0u64);
        self.epochs
            .iter()
            .map(|e| {
                total = total.zip(e.steps).map(|(a, b)| a + b);
                total.or_else(|| {
                    self.steps
                        .iter()
                        .filter(|s| s.epoch == e.epoch)
                        .map(|s| s.step)
                        .max()
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn metrics_split_by_kind_and_skip_unknown_kinds() {
        let text = concat!(
            r#"{"kind":"step","step":50,"epoch":1,"loss":1.02,"lr":0.001,"samples_per_s":91000.0,"elapsed_s":0.04}"#,
            "\n",
            r#"{"kind":"epoch","epoch":1,"train_loss":null,"test_accuracy":0.84,"steps":938}"#,
            "\n",
            r#"{"kind":"system","t_s":1.0,"host":{"cpu_percent":50.0,"extra":1,"cpu_percent_per_core":[40.0,null],"#,
            r#""processes":[{"pid":7,"name":"redline","cpu_percent":99.5,"rss":1024}]},"gpus":null,"gpu_note":"NVML unavailable"}"#,
            "\n",
            r#"{"kind":"future","x":1}"#,
            "\n",
        );
        let m = parse_metrics(Path::new("metrics.jsonl"), text).unwrap();
        assert_eq!(m.steps.len(), 1);
        assert_eq!(m.epochs[0].train_loss, None);
        // An older writer's `test_accuracy` of an epoch is its validation.
        assert_eq!(m.epochs[0].metric("val", "accuracy"), Some(0.84));
        assert_eq!(m.epochs[0].metric_names(), ["accuracy"]);
        assert_eq!(m.system[0].host.as_ref().unwrap().cpu_percent, Some(50.0));
        assert!(m.system[0].gpus.is_empty());
        let host = m.system[0].host.as_ref().unwrap();
        assert_eq!(host.cpu_percent_per_core, [Some(40.0), None]);
        assert_eq!(host.processes[0].name, "redline");
        assert!(m.notes.is_empty());
    }

    #[test]
    fn epoch_records_carry_any_metric_the_step_returned() {
        let text = concat!(
            r#"{"kind":"epoch","epoch":1,"train_loss":0.5,"train_mae":0.4,"val_loss":0.6,"#,
            r#""val_mae":0.45,"epoch_s":1.0}"#,
            "\n",
            r#"{"kind":"test","test_loss":0.7,"test_mae":0.5}"#,
            "\n",
        );
        let m = parse_metrics(Path::new("metrics.jsonl"), text).unwrap();
        let e = &m.epochs[0];
        assert_eq!(e.metric_names(), ["mae"]);
        assert_eq!(
            (e.metric("train", "mae"), e.metric("val", "mae")),
            (Some(0.4), Some(0.45))
        );
        assert_eq!(e.val_loss, Some(0.6));
        assert_eq!(e.metric("val", "accuracy"), None);
    }

    #[test]
    fn incomplete_last_line_is_skipped_with_a_note() {
        let text = "{\"kind\":\"step\",\"step\":1,\"epoch\":1}\n{\"kind\":\"st";
        let m = parse_metrics(Path::new("metrics.jsonl"), text).unwrap();
        assert_eq!(m.steps.len(), 1);
        assert!(m.notes[0].contains("line 2 is incomplete"), "{:?}", m.notes);
    }

    /// Before: one bad line refused the whole report (and the error
    /// suggested deleting the file).
    #[test]
    fn bad_lines_in_the_middle_are_skipped_and_counted() {
        let text = "{\"kind\":\"step\",\"step\":1,\"epoch\":1}\n{oops\n{\"kind\":\"step\"}\n[]\n";
        let m = parse_metrics(Path::new("metrics.jsonl"), text).unwrap();
        assert_eq!(m.steps.len(), 2);
        assert_eq!(m.notes.len(), 1, "{:?}", m.notes);
        assert!(
            m.notes[0].starts_with(
                "metrics.jsonl: 2 lines are not records and were skipped (lines 2, 4;"
            ),
            "{:?}",
            m.notes
        );
    }

    #[test]
    fn epoch_end_steps_sum_counts_or_fall_back_to_step_records() {
        let mut run = RunData {
            epochs: vec![
                EpochRecord {
                    epoch: 1,
                    steps: Some(10),
                    ..Default::default()
                },
                EpochRecord {
                    epoch: 2,
                    steps: Some(10),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(run.epoch_end_steps(), vec![Some(10), Some(20)]);
        run.epochs[1].steps = None;
        run.steps = vec![StepRecord {
            step: 18,
            epoch: 2,
            ..Default::default()
        }];
        assert_eq!(run.epoch_end_steps(), vec![Some(10), Some(18)]);
    }
}
