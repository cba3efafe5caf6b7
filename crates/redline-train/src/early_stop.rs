//! Early stopping with Lightning's `EarlyStopping` semantics: after each
//! epoch (its validation included) the monitored metric either improves on
//! the best by more than `min_delta`, or the wait grows; the fit stops once
//! the wait reaches `patience`, or at once on a non-finite value
//! (`check_finite`).
//!
//! Written as a flag: `val_loss:min:patience=3:min_delta=0.001`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::events::EpochLog;

/// Whether smaller or larger is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Smaller is better (losses).
    Min,
    /// Larger is better (accuracy).
    Max,
}

impl Direction {
    /// `min` or `max`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Min => "min",
            Self::Max => "max",
        }
    }

    /// Whether `value` improves on `best` by more than `min_delta`. As
    /// Lightning's, which compares the logged float32 tensors: in f32, so a
    /// difference at the edge of `min_delta` rounds the same way.
    pub fn improves(self, value: f64, best: f64, min_delta: f64) -> bool {
        let (value, best, min_delta) = (value as f32, best as f32, min_delta as f32);
        match self {
            Self::Min => value + min_delta < best,
            Self::Max => value - min_delta > best,
        }
    }

    /// The starting best (`inf` for `min`, `-inf` for `max`).
    pub fn worst(self) -> f64 {
        match self {
            Self::Min => f64::INFINITY,
            Self::Max => f64::NEG_INFINITY,
        }
    }
}

/// `--early-stop`: the monitored metric and how patient to be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EarlyStop {
    /// A logged metric: `val_loss`, `val_accuracy`, `train_loss`, `train_<metric>`.
    pub monitor: String,
    /// Whether smaller or larger is better.
    pub mode: Direction,
    /// Epochs without improvement before stopping.
    pub patience: usize,
    /// The least change that counts as an improvement.
    pub min_delta: f64,
}

impl EarlyStop {
    /// Refuses a negative or non-finite `min_delta`.
    pub fn check(&self) -> Result<()> {
        if !(self.min_delta.is_finite() && self.min_delta >= 0.0) {
            return Err(Error::Config(format!(
                "--early-stop: min_delta={}: give a finite number >= 0",
                self.min_delta
            )));
        }
        if self.monitor.is_empty() {
            return Err(Error::Config(
                "--early-stop: name the metric to monitor, e.g. val_loss:min".into(),
            ));
        }
        Ok(())
    }
}

/// The names [`epoch_metric`] finds in `log`: `train_loss`, `train_<m>`,
/// and `val_loss`, `val_<m>` after a validation.
pub fn logged_names(log: &EpochLog) -> Vec<String> {
    let mut names = vec!["train_loss".to_string()];
    names.extend(log.train.iter().map(|(n, _)| format!("train_{n}")));
    if let Some(v) = &log.val {
        names.push("val_loss".into());
        names.extend(v.metrics.iter().map(|(n, _)| format!("val_{n}")));
    }
    names
}

/// The metric `name` of an epoch's log (`train_loss`, `train_<m>`,
/// `val_loss`, `val_<m>`), or `None` when the epoch did not log it.
pub fn epoch_metric(log: &EpochLog, name: &str) -> Option<f64> {
    if name == "train_loss" {
        return Some(log.train_loss);
    }
    if let Some(m) = name.strip_prefix("train_") {
        return log.train.get(m);
    }
    let val = log.val.as_ref()?;
    match name.strip_prefix("val_")? {
        "loss" => Some(val.loss),
        m => val.metrics.get(m),
    }
}

/// Where an early stop stands, carried from epoch to epoch (and saved in
/// checkpoints, so a resumed run keeps its patience).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EarlyStopState {
    /// The best value so far.
    pub best: f64,
    /// The epoch (1-based) that logged it; 0 before any.
    pub best_epoch: usize,
    /// Epochs since the last improvement.
    pub wait: usize,
}

impl EarlyStopState {
    /// Before any epoch.
    pub fn new(mode: Direction) -> Self {
        Self {
            best: mode.worst(),
            best_epoch: 0,
            wait: 0,
        }
    }
}

/// Why an early stop ended the fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StopReason {
    /// The epoch (1-based) after which the fit stopped.
    pub epoch: usize,
    /// The sentence the summary prints.
    pub message: String,
}

impl EarlyStop {
    /// Updates `state` with epoch `log`; `Ok(Some(reason))` when the fit
    /// should stop now. A metric the epoch did not log is an error naming
    /// what it did log.
    pub fn update(&self, state: &mut EarlyStopState, log: &EpochLog) -> Result<Option<StopReason>> {
        let value = epoch_metric(log, &self.monitor).ok_or_else(|| {
            Error::Config(format!(
                "--early-stop {}: epoch {} logged no `{}`; it logged {}",
                self,
                log.epoch,
                self.monitor,
                logged_names(log).join(", ")
            ))
        })?;
        if !value.is_finite() {
            return Ok(Some(StopReason {
                epoch: log.epoch,
                message: format!(
                    "{} is {value} at epoch {}: not finite (best {:.6} at epoch {})",
                    self.monitor, log.epoch, state.best, state.best_epoch
                ),
            }));
        }
        if self.mode.improves(value, state.best, self.min_delta) {
            state.best = value;
            state.best_epoch = log.epoch;
            state.wait = 0;
            return Ok(None);
        }
        state.wait += 1;
        if state.wait >= self.patience {
            return Ok(Some(StopReason {
                epoch: log.epoch,
                message: format!(
                    "early stop: {} did not improve by more than {} for {} epoch{} (best {:.6} \
                     at epoch {})",
                    self.monitor,
                    self.min_delta,
                    state.wait,
                    if state.wait == 1 { "" } else { "s" },
                    state.best,
                    state.best_epoch
                ),
            }));
        }
        Ok(None)
    }
}

const GRAMMAR: &str =
    "HINT: METRIC[:min|max][:patience=N][:min_delta=X], e.g. val_loss:min:patience=3:min_delta=0.001";

impl FromStr for EarlyStop {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |m: String| Error::Config(format!("--early-stop {s}: {m}\n{GRAMMAR}"));
        let mut parts = s.split(':');
        let monitor = parts.next().unwrap_or_default().trim().to_string();
        if monitor.is_empty() || monitor.contains('=') {
            return Err(bad("start with the metric's name".into()));
        }
        // Lightning's default mode is min; `*accuracy` is obviously max.
        let mut mode = if monitor.contains("acc") {
            Direction::Max
        } else {
            Direction::Min
        };
        let (mut patience, mut min_delta) = (3usize, 0.0f64);
        // Each setting once: `val_loss:max:min` or two `patience=` is a typo,
        // not a choice of the last.
        let mut seen: Vec<String> = Vec::new();
        let mut once = |key: &str| -> Result<()> {
            if seen.iter().any(|k| k == key) {
                return Err(bad(format!("{key} is given twice")));
            }
            seen.push(key.to_string());
            Ok(())
        };
        for p in parts {
            match p.trim() {
                "min" => {
                    once("the mode (min|max)")?;
                    mode = Direction::Min
                }
                "max" => {
                    once("the mode (min|max)")?;
                    mode = Direction::Max
                }
                kv => {
                    let (k, v) = kv
                        .split_once('=')
                        .ok_or_else(|| bad(format!("`{kv}` is neither min, max nor key=value")))?;
                    let key = k.trim().replace('-', "_");
                    once(&key)?;
                    match key.as_str() {
                        "patience" => {
                            patience = v
                                .parse()
                                .map_err(|_| bad(format!("patience={v} is not a whole number")))?
                        }
                        "min_delta" => {
                            min_delta = v
                                .parse()
                                .map_err(|_| bad(format!("min_delta={v} is not a number")))?
                        }
                        other => return Err(bad(format!("unknown parameter `{other}`"))),
                    }
                }
            }
        }
        let stop = Self {
            monitor,
            mode,
            patience,
            min_delta,
        };
        stop.check().map_err(|e| bad(e.to_string()))?;
        Ok(stop)
    }
}

impl fmt::Display for EarlyStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:patience={}:min_delta={}",
            self.monitor,
            self.mode.as_str(),
            self.patience,
            self.min_delta
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EvalResult, MetricValues};

    fn epoch(epoch: usize, val_loss: f64) -> EpochLog {
        EpochLog {
            epoch,
            train_loss: 1.0,
            train: MetricValues::default(),
            val: Some(EvalResult {
                loss: val_loss,
                metrics: MetricValues(vec![("accuracy".into(), 0.5)]),
                samples: 10,
                seconds: 0.0,
            }),
            eval_s: 0.0,
            epoch_s: 0.0,
            steps: 1,
            samples: 10,
        }
    }

    /// The epoch it stops at for `values`, or `None`.
    fn stops_at(flag: &str, values: &[f64]) -> Result<Option<usize>> {
        let es: EarlyStop = flag.parse()?;
        let mut st = EarlyStopState::new(es.mode);
        for (i, v) in values.iter().enumerate() {
            if es.update(&mut st, &epoch(i + 1, *v))?.is_some() {
                return Ok(Some(i + 1));
            }
        }
        Ok(None)
    }

    /// Against Lightning's own `EarlyStopping` (48 sequences and settings,
    /// `tools/reference/make_golden_early_stop.py`): the same stop epoch.
    #[test]
    fn stops_where_lightnings_early_stopping_does() -> Result<()> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/golden/early_stop.json"
        );
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config(e.to_string()))?;
        let golden: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Config(e.to_string()))?;
        let cases = golden["cases"].as_array().cloned().unwrap_or_default();
        assert_eq!(cases.len(), 48);
        for c in cases {
            let values: Vec<f64> = c["values"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|v| match v {
                    serde_json::Value::String(s) => s.parse().unwrap_or(f64::NAN),
                    v => v.as_f64().unwrap_or(f64::NAN),
                })
                .collect();
            let flag = format!(
                "val_loss:{}:patience={}:min_delta={}",
                c["mode"].as_str().unwrap_or_default(),
                c["patience"],
                c["min_delta"]
            );
            let want = c["stop_epoch"].as_u64().map(|e| e as usize);
            assert_eq!(stops_at(&flag, &values)?, want, "{} with {flag}", c["name"]);
        }
        Ok(())
    }

    #[test]
    fn stops_after_patience_epochs_without_improvement() -> Result<()> {
        let v = [1.0, 0.9, 0.95, 0.91, 0.92];
        assert_eq!(stops_at("val_loss:min:patience=3", &v)?, Some(5));
        assert_eq!(stops_at("val_loss:min:patience=4", &v)?, None);
        // Each is better than the last, but never by more than min_delta
        // 0.1 than the best (1.0), as Lightning compares.
        let v = [1.0, 0.95, 0.92, 0.91];
        assert_eq!(stops_at("val_loss:patience=2:min_delta=0.1", &v)?, Some(3));
        // 0.85 is 0.15 better than the best 1.0: the wait starts again.
        let v = [1.0, 0.95, 0.85, 0.84];
        assert_eq!(stops_at("val_loss:patience=2:min_delta=0.1", &v)?, None);
        assert_eq!(
            stops_at("val_loss:max:patience=1", &[0.1, 0.2, 0.15])?,
            Some(3)
        );
        assert_eq!(stops_at("val_loss:patience=9", &[1.0, f64::NAN])?, Some(2));
        Ok(())
    }

    #[test]
    fn an_unlogged_metric_names_what_was_logged() {
        let e = stops_at("val_f1", &[1.0]).err().map(|e| e.to_string());
        let msg = e.unwrap_or_default();
        assert!(
            msg.contains("val_accuracy") && msg.contains("val_loss"),
            "{msg}"
        );
    }

    #[test]
    fn bad_flags_are_refused() {
        for s in [
            "",
            "patience=3",
            "val_loss:sideways",
            "val_loss:patience=x",
            "val_loss:min_delta=-1",
            // Before: accepted, the last one winning.
            "val_loss:max:min",
            "val_loss:patience=2:patience=5",
            "val_loss:min_delta=0.1:min-delta=0.2",
        ] {
            assert!(s.parse::<EarlyStop>().is_err(), "{s}");
        }
        let e = "val_loss:patience=2:patience=5"
            .parse::<EarlyStop>()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("patience is given twice"), "{e}");
        let es: Result<EarlyStop> = "val_accuracy".parse();
        assert!(matches!(
            es,
            Ok(EarlyStop {
                mode: Direction::Max,
                ..
            })
        ));
    }
}
