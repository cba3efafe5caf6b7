//! The metrics a fit is told to watch (`--monitor` for the best checkpoint,
//! `--early-stop`) checked against what the fit will log: before its first
//! step where the step names its metrics, else at the first epoch end.
//! Lightning's `ModelCheckpoint` raises at its first check in the same way;
//! a name that is never logged otherwise trains to the end with no best
//! checkpoint and no word about it.

use crate::clip::GradClip;
use crate::early_stop::{epoch_metric, logged_names};
use crate::error::{Error, Result};
use crate::events::EpochLog;

use super::Trainer;

impl Trainer {
    /// The watched names with the flag that set each.
    fn watched(&self) -> Vec<(&'static str, &str)> {
        let mut out = Vec::new();
        if let Some((name, _)) = self.checkpoints.as_ref().and_then(|c| c.monitor.as_ref()) {
            out.push(("--monitor", name.as_str()));
        }
        if let Some(es) = &self.cfg.early_stop {
            out.push(("--early-stop", es.monitor.as_str()));
        }
        out
    }

    /// What every epoch of this fit logs, where the step names its metrics:
    /// `train_loss`, `train_<m>` (with `grad_norm` when the norm is taken),
    /// and with `validating`, `val_loss` and `val_<m>`.
    fn will_log(&self, validating: bool) -> Option<Vec<String>> {
        let metrics = self.module.metric_names()?;
        let mut names = vec!["train_loss".to_string()];
        names.extend(metrics.iter().map(|m| format!("train_{m}")));
        if self.cfg.log_grad_norm || matches!(self.cfg.clip, Some(GradClip::Norm { .. })) {
            names.push("train_grad_norm".into());
        }
        if validating {
            names.push("val_loss".into());
            names.extend(metrics.iter().map(|m| format!("val_{m}")));
        }
        Some(names)
    }

    /// Before the first step: a watched name the fit will never log is
    /// refused, with the names it will log (nothing is checked for a step
    /// that does not name its metrics; [`Trainer::check_logged`] then does).
    pub(super) fn check_watched(&self, validating: bool) -> Result<()> {
        let Some(names) = self.will_log(validating) else {
            return Ok(());
        };
        for (flag, name) in self.watched() {
            if !names.iter().any(|n| n == name) {
                let why = match name.starts_with("val_") && !validating {
                    true => " (this fit does not validate)",
                    false => "",
                };
                return Err(unlogged(flag, name, &format!("{}{why}", names.join(", "))));
            }
        }
        Ok(())
    }

    /// At an epoch's end: a watched name that `log` lacks is an error
    /// naming what it holds.
    pub(super) fn check_logged(&self, log: &EpochLog) -> Result<()> {
        for (flag, name) in self.watched() {
            if epoch_metric(log, name).is_none() {
                return Err(unlogged(flag, name, &logged_names(log).join(", ")));
            }
        }
        Ok(())
    }
}

fn unlogged(flag: &str, name: &str, logged: &str) -> Error {
    Error::Config(format!(
        "{flag} {name}: this run never logs `{name}`; it logs {logged}\nHINT: give one of \
         those to {flag}"
    ))
}
