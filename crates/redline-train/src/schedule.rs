//! Learning-rate schedules with `torch.optim.lr_scheduler`'s values: constant,
//! step, multi-step, exponential, cosine (with warm restarts) and one-cycle,
//! each after an optional linear warmup (`LinearLR` then the schedule, as
//! `SequentialLR` chains them), stepped per optimizer step or per epoch.
//!
//! A schedule is a pure function of the step (or epoch) count: the loop
//! asks it for the rate before each step, so a resumed run continues the
//! curve from its counters alone (no state to save beyond them).
//!
//! Written as flags: `cosine`, `cosine:warmup=500`, `step:size=10:gamma=0.5`,
//! `multistep:milestones=30/80`, `exp:gamma=0.95`,
//! `cosine-restarts:t0=10:mult=2`, `onecycle:max_lr=0.01:interval=step`.

use std::f64::consts::PI;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// When a schedule advances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interval {
    /// After every optimizer step (Lightning's `interval="step"`).
    Step,
    /// After every epoch (Lightning's default).
    Epoch,
}

/// The shape of the curve after warmup, with `torch.optim.lr_scheduler`'s
/// parameters (counts are in the schedule's [`Interval`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Shape {
    /// The base rate throughout.
    Constant,
    /// `StepLR`: times `gamma` every `size` intervals.
    Step {
        /// Intervals between decays (`step_size`).
        size: usize,
        /// Factor per decay.
        gamma: f64,
    },
    /// `MultiStepLR`: times `gamma` at each milestone.
    MultiStep {
        /// Increasing interval counts.
        milestones: Vec<usize>,
        /// Factor per milestone.
        gamma: f64,
    },
    /// `ExponentialLR`: times `gamma` every interval.
    Exponential {
        /// Factor per interval.
        gamma: f64,
    },
    /// `CosineAnnealingLR`: half a cosine from the base rate to `eta_min`
    /// over `t_max` intervals (`None`: the rest of the run after warmup).
    Cosine {
        /// Half-period; `None` fills the run.
        t_max: Option<usize>,
        /// The floor.
        eta_min: f64,
    },
    /// `CosineAnnealingWarmRestarts`: cosines of `t0`, `t0*mult`, ... intervals.
    CosineRestarts {
        /// The first period.
        t0: usize,
        /// Each period's growth factor.
        mult: usize,
        /// The floor.
        eta_min: f64,
    },
    /// `OneCycleLR` (cosine annealing, learning rate only): from
    /// `max_lr/div` up to `max_lr` over `pct_start` of the run, then down to
    /// `max_lr/div/final_div`.
    OneCycle {
        /// The peak (`None`: the optimizer's rate).
        max_lr: Option<f64>,
        /// Fraction of the run spent rising.
        pct_start: f64,
        /// `max_lr / initial rate`.
        div: f64,
        /// `initial rate / final rate`.
        final_div: f64,
        /// Intervals in the cycle (`None`: the rest of the run after warmup).
        total: Option<usize>,
    },
    /// The learning-rate range test (`redline tune lr`), as Lightning 2.x's
    /// exponential finder: interval 0 at `min_lr`, interval `t >= 1` at
    /// `min_lr * (max_lr / min_lr)^((t + 1) / steps)`, reaching `max_lr` at
    /// `steps - 1` and staying there. The base rate is not used.
    RangeTest {
        /// The first rate.
        min_lr: f64,
        /// The last rate.
        max_lr: f64,
        /// Intervals from the first to the last.
        steps: usize,
    },
}

/// A learning-rate schedule: an optional linear warmup, then a [`Shape`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// The curve after warmup.
    pub shape: Shape,
    /// Intervals of linear warmup (`LinearLR`; 0: none).
    pub warmup: usize,
    /// The warmup's first factor (`LinearLR`'s `start_factor`, in (0, 1]).
    pub warmup_start: f64,
    /// What one interval is.
    pub interval: Interval,
}

impl Default for LrSchedule {
    fn default() -> Self {
        Self {
            shape: Shape::Constant,
            warmup: 0,
            warmup_start: DEFAULT_WARMUP_START,
            interval: Interval::Epoch,
        }
    }
}

/// The warmup's default first factor: 1% of the base rate.
const DEFAULT_WARMUP_START: f64 = 0.01;

impl LrSchedule {
    /// True for the constant rate without warmup (nothing to do per step).
    pub fn is_constant(&self) -> bool {
        self.shape == Shape::Constant && self.warmup == 0
    }

    /// Refuses parameters the curve cannot use, naming the flag's field.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("--lr-schedule: {m}")));
        let positive = |name: &str, v: f64| -> Result<()> {
            match v.is_finite() && v > 0.0 {
                true => Ok(()),
                false => bad(format!("{name}={v}: give a finite number > 0")),
            }
        };
        if self.warmup > 0 && !(self.warmup_start > 0.0 && self.warmup_start <= 1.0) {
            return bad(format!(
                "warmup_start={}: give a factor in (0, 1]",
                self.warmup_start
            ));
        }
        match &self.shape {
            Shape::Constant => Ok(()),
            Shape::Step { size, gamma } => {
                if *size == 0 {
                    return bad("size=0: give at least 1 interval between decays".into());
                }
                positive("gamma", *gamma)
            }
            Shape::MultiStep { milestones, gamma } => {
                if milestones.is_empty() || milestones.windows(2).any(|w| w[0] >= w[1]) {
                    return bad(format!(
                        "milestones={}: give increasing counts, e.g. milestones=30/80",
                        join(milestones)
                    ));
                }
                positive("gamma", *gamma)
            }
            Shape::Exponential { gamma } => positive("gamma", *gamma),
            Shape::Cosine { t_max, eta_min } => {
                if *t_max == Some(0) {
                    return bad("t_max=0: give at least 1 interval".into());
                }
                nonneg("eta_min", *eta_min)
            }
            Shape::CosineRestarts { t0, mult, eta_min } => {
                if *t0 == 0 || *mult == 0 {
                    return bad(format!("t0={t0}, mult={mult}: both must be at least 1"));
                }
                nonneg("eta_min", *eta_min)
            }
            Shape::OneCycle {
                max_lr,
                pct_start,
                div,
                final_div,
                total,
            } => {
                if let Some(m) = max_lr {
                    positive("max_lr", *m)?;
                }
                if !(*pct_start > 0.0 && *pct_start < 1.0) {
                    return bad(format!("pct_start={pct_start}: give a fraction in (0, 1)"));
                }
                if *total == Some(0) {
                    return bad("total=0: give at least 1 interval".into());
                }
                positive("div", *div)?;
                positive("final_div", *final_div)
            }
            Shape::RangeTest {
                min_lr,
                max_lr,
                steps,
            } => {
                positive("min_lr", *min_lr)?;
                positive("max_lr", *max_lr)?;
                if min_lr >= max_lr || *steps < 2 {
                    return bad(format!(
                        "min_lr={min_lr}, max_lr={max_lr}, steps={steps}: give min_lr < max_lr \
                         and at least 2 steps"
                    ));
                }
                Ok(())
            }
        }
    }

    /// Refuses a one-cycle `total` shorter than the run it schedules: a
    /// run of `total_steps` steps in `epochs` epochs (PyTorch's OneCycleLR
    /// raises when stepped past its `total_steps`; the rate would otherwise
    /// sit at its floor for the rest of the run).
    pub fn check_length(&self, total_steps: usize, epochs: usize) -> Result<()> {
        let Shape::OneCycle {
            total: Some(total), ..
        } = self.shape
        else {
            return Ok(());
        };
        let (run, unit) = match self.interval {
            Interval::Step => (total_steps, "steps"),
            Interval::Epoch => (epochs, "epochs"),
        };
        let rest = run.saturating_sub(self.warmup);
        if total < rest {
            return Err(Error::Config(format!(
                "--lr-schedule {self}: total={total}, but the run has {rest} {unit} after its \
                 warm-up; the cycle would end at its floor rate {} {unit} early\nHINT: leave \
                 total out (the cycle then spans the run), or give total={rest}",
                rest - total
            )));
        }
        Ok(())
    }

    /// The rate of the step that follows `step` optimizer steps in epoch
    /// `epoch` (0-based), for a base rate `base` and a run of `total_steps`
    /// steps in `epochs` epochs (what `Cosine` and `OneCycle` fill).
    pub fn lr(
        &self,
        base: f64,
        step: usize,
        epoch: usize,
        total_steps: usize,
        epochs: usize,
    ) -> f64 {
        let (t, total) = match self.interval {
            Interval::Step => (step, total_steps),
            Interval::Epoch => (epoch, epochs),
        };
        if t < self.warmup {
            // LinearLR: start_factor to 1 over `warmup` intervals.
            let f = self.warmup_start + (1.0 - self.warmup_start) * t as f64 / self.warmup as f64;
            return base * f;
        }
        let t = t - self.warmup;
        let rest = total.saturating_sub(self.warmup).max(1);
        self.shape.lr(base, t, rest)
    }
}

impl Shape {
    /// The rate after `t` intervals from the base rate `base`; `rest` is the
    /// length of the run that `None` lengths fill.
    fn lr(&self, base: f64, t: usize, rest: usize) -> f64 {
        match self {
            Self::Constant => base,
            Self::Step { size, gamma } => base * gamma.powi((t / size.max(&1)) as i32),
            Self::MultiStep { milestones, gamma } => {
                base * gamma.powi(milestones.iter().filter(|&&m| m <= t).count() as i32)
            }
            Self::Exponential { gamma } => base * gamma.powi(t as i32),
            Self::RangeTest {
                min_lr,
                max_lr,
                steps,
            } => match t {
                0 => *min_lr,
                t => {
                    let r = (t + 1).min(*steps) as f64 / (*steps).max(1) as f64;
                    min_lr * (max_lr / min_lr).powf(r)
                }
            },
            Self::Cosine { t_max, eta_min } => {
                let t_max = t_max.unwrap_or(rest).max(1) as f64;
                eta_min + (base - eta_min) * (1.0 + (PI * t as f64 / t_max).cos()) / 2.0
            }
            Self::CosineRestarts { t0, mult, eta_min } => {
                let (mut t_cur, mut t_i) = (t, (*t0).max(1));
                if *mult == 1 {
                    t_cur %= t_i;
                } else {
                    while t_cur >= t_i {
                        t_cur -= t_i;
                        t_i = t_i.saturating_mul(*mult);
                    }
                }
                eta_min + (base - eta_min) * (1.0 + (PI * t_cur as f64 / t_i as f64).cos()) / 2.0
            }
            Self::OneCycle {
                max_lr,
                pct_start,
                div,
                final_div,
                total,
            } => {
                let max = max_lr.unwrap_or(base);
                let initial = max / div;
                let min = initial / final_div;
                let total = total.unwrap_or(rest).max(1) as f64;
                // OneCycleLR's two phases end at these step numbers (floats).
                let up_end = pct_start * total - 1.0;
                let down_end = total - 1.0;
                let t = t as f64;
                let anneal = |start: f64, end: f64, pct: f64| {
                    end + (start - end) / 2.0 * ((PI * pct).cos() + 1.0)
                };
                if t <= up_end {
                    anneal(initial, max, t / up_end.max(f64::MIN_POSITIVE))
                } else {
                    anneal(max, min, ((t - up_end) / (down_end - up_end)).min(1.0))
                }
            }
        }
    }
}

fn nonneg(name: &str, v: f64) -> Result<()> {
    match v.is_finite() && v >= 0.0 {
        true => Ok(()),
        false => Err(Error::Config(format!(
            "--lr-schedule: {name}={v}: give a finite number >= 0"
        ))),
    }
}

fn join(v: &[usize]) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join("/")
}

/// The flag's grammar, for messages.
const GRAMMAR: &str =
    "HINT: constant | step:size=N[:gamma=G] | multistep:milestones=A/B[:gamma=G] \
     | exp:gamma=G | cosine[:t_max=N][:eta_min=X] | cosine-restarts:t0=N[:mult=M][:eta_min=X] \
     | onecycle[:max_lr=X][:pct_start=P][:div=D][:final_div=F][:total=N]; any of them may add \
     :warmup=N[:warmup_start=F] and :interval=step|epoch";

impl FromStr for LrSchedule {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let mut parts = s.split(':');
        let name = parts.next().unwrap_or_default().trim();
        let bad = |m: String| Error::Config(format!("--lr-schedule {s}: {m}\n{GRAMMAR}"));
        let mut kv: Vec<(String, String)> = Vec::new();
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| bad(format!("`{p}` is not key=value")))?;
            let k = k.trim().replace('-', "_");
            if kv.iter().any(|(seen, _)| *seen == k) {
                return Err(bad(format!("`{k}` is given twice")));
            }
            kv.push((k, v.trim().to_string()));
        }
        let mut take = |key: &str| -> Option<String> {
            let i = kv.iter().position(|(k, _)| k == key)?;
            Some(kv.remove(i).1)
        };
        let num = |key: &str, v: Option<String>| -> Result<Option<f64>> {
            v.map(|v| {
                v.parse::<f64>()
                    .map_err(|_| bad(format!("{key}={v} is not a number")))
            })
            .transpose()
        };
        let count = |key: &str, v: Option<String>| -> Result<Option<usize>> {
            v.map(|v| {
                v.parse::<usize>()
                    .map_err(|_| bad(format!("{key}={v} is not a whole number")))
            })
            .transpose()
        };
        let warmup = count("warmup", take("warmup"))?.unwrap_or(0);
        let warmup_start =
            num("warmup_start", take("warmup_start"))?.unwrap_or(DEFAULT_WARMUP_START);
        let interval = match take("interval").as_deref() {
            None => None,
            Some("step") => Some(Interval::Step),
            Some("epoch") => Some(Interval::Epoch),
            Some(other) => return Err(bad(format!("interval={other}: give step or epoch"))),
        };
        let shape = match name {
            "" => return Err(bad("give a schedule, e.g. constant or cosine".into())),
            "constant" => Shape::Constant,
            "step" => Shape::Step {
                size: count("size", take("size"))?
                    .ok_or_else(|| bad("give size=N (intervals between decays)".into()))?,
                gamma: num("gamma", take("gamma"))?.unwrap_or(0.1),
            },
            "multistep" | "multi-step" => {
                let m = take("milestones").ok_or_else(|| bad("give milestones=A/B/...".into()))?;
                let milestones = m
                    .split('/')
                    .map(|x| {
                        x.trim().parse::<usize>().map_err(|_| {
                            bad(format!("milestones={m}: `{x}` is not a whole number"))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Shape::MultiStep {
                    milestones,
                    gamma: num("gamma", take("gamma"))?.unwrap_or(0.1),
                }
            }
            "exp" | "exponential" => Shape::Exponential {
                gamma: num("gamma", take("gamma"))?
                    .ok_or_else(|| bad("give gamma=G (factor per interval)".into()))?,
            },
            "cosine" => Shape::Cosine {
                t_max: count("t_max", take("t_max"))?,
                eta_min: num("eta_min", take("eta_min"))?.unwrap_or(0.0),
            },
            "cosine-restarts" | "cosine_restarts" => Shape::CosineRestarts {
                t0: count("t0", take("t0"))?
                    .ok_or_else(|| bad("give t0=N (the first period)".into()))?,
                mult: count("mult", take("mult"))?.unwrap_or(1),
                eta_min: num("eta_min", take("eta_min"))?.unwrap_or(0.0),
            },
            "onecycle" | "one-cycle" => Shape::OneCycle {
                max_lr: num("max_lr", take("max_lr"))?,
                pct_start: num("pct_start", take("pct_start"))?.unwrap_or(0.3),
                div: num("div", take("div"))?.unwrap_or(25.0),
                final_div: num("final_div", take("final_div"))?.unwrap_or(1e4),
                total: count("total", take("total"))?,
            },
            "range-test" | "range_test" => Shape::RangeTest {
                min_lr: num("min_lr", take("min_lr"))?.unwrap_or(1e-8),
                max_lr: num("max_lr", take("max_lr"))?.unwrap_or(1.0),
                steps: count("steps", take("steps"))?.unwrap_or(100),
            },
            other => return Err(bad(format!("unknown schedule `{other}`"))),
        };
        if let Some((k, _)) = kv.first() {
            return Err(bad(format!("`{k}` is not a parameter of `{name}`")));
        }
        // One-cycle is made for per-step use (torch's docs); the rest step
        // per epoch unless told, as Lightning's default interval.
        let interval = interval.unwrap_or(match shape {
            Shape::OneCycle { .. } => Interval::Step,
            _ => Interval::Epoch,
        });
        let sched = Self {
            shape,
            warmup,
            warmup_start,
            interval,
        };
        sched
            .check()
            .map_err(|e| Error::Config(format!("{e}\n{GRAMMAR}")))?;
        Ok(sched)
    }
}

impl fmt::Display for LrSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |k: &str, v: Option<String>| v.map(|v| format!(":{k}={v}")).unwrap_or_default();
        match &self.shape {
            Shape::Constant => write!(f, "constant")?,
            Shape::Step { size, gamma } => write!(f, "step:size={size}:gamma={gamma}")?,
            Shape::MultiStep { milestones, gamma } => {
                write!(f, "multistep:milestones={}:gamma={gamma}", join(milestones))?
            }
            Shape::Exponential { gamma } => write!(f, "exp:gamma={gamma}")?,
            Shape::RangeTest {
                min_lr,
                max_lr,
                steps,
            } => write!(
                f,
                "range-test:min_lr={min_lr}:max_lr={max_lr}:steps={steps}"
            )?,
            Shape::Cosine { t_max, eta_min } => write!(
                f,
                "cosine{}:eta_min={eta_min}",
                opt("t_max", t_max.map(|t| t.to_string()))
            )?,
            Shape::CosineRestarts { t0, mult, eta_min } => {
                write!(f, "cosine-restarts:t0={t0}:mult={mult}:eta_min={eta_min}")?
            }
            Shape::OneCycle {
                max_lr,
                pct_start,
                div,
                final_div,
                total,
            } => write!(
                f,
                "onecycle{}:pct_start={pct_start}:div={div}:final_div={final_div}{}",
                opt("max_lr", max_lr.map(|m| m.to_string())),
                opt("total", total.map(|t| t.to_string()))
            )?,
        }
        if self.warmup > 0 {
            write!(
                f,
                ":warmup={}:warmup_start={}",
                self.warmup, self.warmup_start
            )?;
        }
        let interval = match self.interval {
            Interval::Step => "step",
            Interval::Epoch => "epoch",
        };
        write!(f, ":interval={interval}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lrs(s: &str, base: f64, n: usize) -> Result<Vec<f64>> {
        let sched: LrSchedule = s.parse()?;
        Ok((0..n).map(|t| sched.lr(base, t, t, n, n)).collect())
    }

    #[test]
    fn step_and_multistep_decay_at_their_counts() -> Result<()> {
        let v = lrs("step:size=2:gamma=0.5", 1.0, 5)?;
        assert_eq!(v, [1.0, 1.0, 0.5, 0.5, 0.25]);
        let v = lrs("multistep:milestones=1/3", 1.0, 4)?;
        assert!((v[0] - 1.0).abs() < 1e-12 && (v[1] - 0.1).abs() < 1e-12);
        assert!((v[3] - 0.01).abs() < 1e-12);
        Ok(())
    }

    #[test]
    fn warmup_rises_linearly_then_hands_over() -> Result<()> {
        let v = lrs("cosine:warmup=4:warmup_start=0.2:interval=step", 1.0, 10)?;
        assert!((v[0] - 0.2).abs() < 1e-12 && (v[2] - 0.6).abs() < 1e-12);
        // The cosine starts at the base rate at the end of warmup, over 6 steps.
        assert!((v[4] - 1.0).abs() < 1e-12);
        assert!((v[7] - 0.5).abs() < 1e-12, "{v:?}");
        Ok(())
    }

    #[test]
    fn restarts_go_back_to_the_base_rate() -> Result<()> {
        let v = lrs("cosine-restarts:t0=2:mult=2", 1.0, 8)?;
        assert_eq!(v[0], 1.0);
        assert_eq!(v[2], 1.0);
        assert_eq!(v[6], 1.0);
        assert!(v[1] < 1.0 && v[5] < v[4]);
        Ok(())
    }

    #[test]
    fn one_cycle_peaks_at_max_lr_and_ends_near_zero() -> Result<()> {
        // The rise ends at step pct_start * total - 1 = 1, the fall at total - 1.
        let v = lrs("onecycle:max_lr=1:pct_start=0.4:total=5", 0.1, 5)?;
        assert!((v[0] - 1.0 / 25.0).abs() < 1e-12);
        assert!((v[1] - 1.0).abs() < 1e-12, "{v:?}");
        assert!((v[4] - 1.0 / 25.0 / 1e4).abs() < 1e-15, "{v:?}");
        Ok(())
    }

    /// Before: `onecycle:total=2` on a 6-step run held the rate at its floor
    /// (4e-9) after step 2; PyTorch's OneCycleLR raises there.
    #[test]
    fn a_one_cycle_shorter_than_the_run_is_refused() -> Result<()> {
        let s: LrSchedule = "onecycle:total=2".parse()?;
        let e = s.check_length(6, 1).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("total=2, but the run has 6 steps")),
            "{e:?}"
        );
        assert!(s.check_length(2, 1).is_ok());
        let warm: LrSchedule = "onecycle:total=4:warmup=2".parse()?;
        assert!(
            warm.check_length(6, 1).is_ok(),
            "warm-up steps are not the cycle's"
        );
        let epochs: LrSchedule = "onecycle:total=3:interval=epoch".parse()?;
        assert!(epochs.check_length(1000, 3).is_ok());
        assert!(epochs.check_length(1000, 4).is_err());
        let open: LrSchedule = "onecycle".parse()?;
        assert!(open.check_length(1000, 9).is_ok());
        Ok(())
    }

    #[test]
    fn bad_flags_are_refused_with_the_grammar() {
        for s in [
            "cosine:warmup",
            "step",
            "step:size=0",
            "multistep:milestones=5/3",
            "exp:gamma=-1",
            "onecycle:pct_start=1",
            "cosine:t_max=10:t_max=3",
            "cosine:gamma=0.5",
            "linear",
            "cosine:interval=batch",
            "cosine:warmup=5:warmup_start=0",
            // Before: taken as `constant`.
            "",
            " ",
        ] {
            let e = s
                .parse::<LrSchedule>()
                .map(|_| ())
                .map_err(|e| e.to_string());
            let msg = e.err().unwrap_or_default();
            assert!(
                msg.contains("--lr-schedule") && msg.contains("HINT"),
                "{s}: {msg}"
            );
        }
    }

    #[test]
    fn display_parses_back_to_the_same_schedule() -> Result<()> {
        for s in [
            "constant",
            "step:size=3",
            "multistep:milestones=2/5:gamma=0.3",
            "exp:gamma=0.9:interval=step",
            "cosine:warmup=10",
            "cosine:t_max=7:eta_min=0.001",
            "cosine-restarts:t0=3:mult=2",
            "onecycle:max_lr=0.1:total=100",
        ] {
            let a: LrSchedule = s.parse()?;
            let b: LrSchedule = a.to_string().parse()?;
            assert_eq!(a, b, "{s} -> {a}");
        }
        Ok(())
    }
}
