//! The data shape a run's model was built for: one sample's inputs and the
//! targets (classes, or values), recorded in `summary.json` at the start of
//! a run, so `redline test` and `redline predict` on other data build the
//! run's model (its head, not the other data's) and refuse data it cannot
//! take, with both numbers named.

use std::path::Path;

use anyhow::bail;
use redline_data::TargetKind;
use serde_json::{json, Value};

/// One sample's inputs and the target kind of a run's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunShape {
    /// One sample's input dimensions.
    pub inputs: Vec<usize>,
    /// Classes, or values per sample.
    pub target: TargetKind,
}

impl RunShape {
    /// `summary.json`'s `inputs` and `target` entries.
    pub fn to_json(&self) -> [(&'static str, Value); 2] {
        let target = match self.target {
            TargetKind::Classes(c) => json!({ "classes": c }),
            TargetKind::Values(w) => json!({ "values": w }),
            TargetKind::Tokens { vocab, len } => json!({ "tokens": vocab, "positions": len }),
        };
        [("inputs", json!(self.inputs)), ("target", target)]
    }

    /// The shape `summary` records; `None` for a run from before it was
    /// recorded, or a summary that does not hold one.
    pub fn from_summary(summary: &Value) -> Option<Self> {
        let inputs = summary
            .get("inputs")?
            .as_array()?
            .iter()
            .map(|v| v.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<Vec<usize>>>()?;
        let target = summary.get("target")?;
        let count = |k: &str| -> Option<usize> { usize::try_from(target.get(k)?.as_u64()?).ok() };
        let target = match (count("classes"), count("values"), count("tokens")) {
            (Some(c), None, None) => TargetKind::Classes(c),
            (None, Some(w), None) => TargetKind::Values(w),
            (None, None, Some(vocab)) => TargetKind::Tokens {
                vocab,
                len: count("positions")?,
            },
            _ => return None,
        };
        Some(Self { inputs, target })
    }

    /// The shape the run folder `dir` recorded (its `summary.json`).
    pub fn of_run(dir: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(dir.join("summary.json")).ok()?;
        Self::from_summary(&serde_json::from_str(&text).ok()?)
    }

    /// Refuses `data` (read from `path`) that this run's model cannot take:
    /// other inputs, another kind of target, more classes than its head has,
    /// or another number of values. Fewer classes are fine: the head's
    /// other outputs go unused.
    pub fn check(&self, path: &Path, data: &Self) -> anyhow::Result<()> {
        let at = path.display();
        if data.inputs != self.inputs {
            bail!(
                "--data {at}: its samples are {:?}, but the run's model takes {:?}\nHINT: give \
                 data of the shape the run was trained on",
                data.inputs,
                self.inputs
            );
        }
        match (data.target, self.target) {
            (TargetKind::Classes(d), TargetKind::Classes(r)) if d > r => bail!(
                "--data {at}: its labels need {d} classes, but the run's head has {r}\nHINT: \
                 give data whose labels lie in 0..{r}"
            ),
            (TargetKind::Values(d), TargetKind::Values(r)) if d != r => bail!(
                "--data {at}: it has {d} target values a sample, but the run's model predicts \
                 {r}"
            ),
            (TargetKind::Tokens { vocab: d, .. }, TargetKind::Tokens { vocab: r, .. }) if d > r => {
                bail!(
                    "--data {at}: its token ids need a vocabulary of {d}, but the run's model \
                     has {r}\nHINT: give data tokenised as the run's was"
                )
            }
            (TargetKind::Tokens { .. }, TargetKind::Tokens { .. }) => Ok(()),
            (TargetKind::Tokens { .. }, _) | (_, TargetKind::Tokens { .. }) => bail!(
                "--data {at}: its targets are {}, but the run's model was trained on {}",
                data.target,
                self.target
            ),
            (TargetKind::Classes(_), TargetKind::Values(_))
            | (TargetKind::Values(_), TargetKind::Classes(_)) => bail!(
                "--data {at}: its targets are {}, but the run's model was trained on {}\nHINT: \
                 --task classification or --task regression reads them the run's way",
                data.target,
                self.target
            ),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(inputs: &[usize], target: TargetKind) -> RunShape {
        RunShape {
            inputs: inputs.to_vec(),
            target,
        }
    }

    #[test]
    fn the_summary_round_trips_and_old_summaries_have_none() {
        for s in [
            shape(&[1, 28, 28], TargetKind::Classes(10)),
            shape(&[13], TargetKind::Values(2)),
            shape(
                &[64],
                TargetKind::Tokens {
                    vocab: 50257,
                    len: 64,
                },
            ),
        ] {
            let summary: serde_json::Map<String, Value> = s
                .to_json()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            assert_eq!(RunShape::from_summary(&Value::Object(summary)), Some(s));
        }
        assert_eq!(RunShape::from_summary(&json!({"model": "mlp"})), None);
        let bad = json!({"inputs": [1, -2], "target": {"classes": 3}});
        assert_eq!(RunShape::from_summary(&bad), None);
        let both = json!({"inputs": [1], "target": {"classes": 3, "values": 1}});
        assert_eq!(RunShape::from_summary(&both), None);
    }

    /// Any `summary.json` (the summary corpus, mutated) gives a shape or
    /// none, never a panic.
    #[test]
    fn fuzz_summary_shapes() {
        redline_testkit::fuzz::fuzz("summary", |bytes| {
            if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
                let _ = RunShape::from_summary(&v);
            }
        });
    }

    #[test]
    fn data_the_head_cannot_take_is_refused_with_both_numbers() {
        let run = shape(&[13], TargetKind::Classes(3));
        let p = Path::new("d.csv");
        assert!(run.check(p, &shape(&[13], TargetKind::Classes(2))).is_ok());
        assert!(run.check(p, &shape(&[13], TargetKind::Classes(3))).is_ok());
        let e = |d: RunShape| {
            run.check(p, &d)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let more = e(shape(&[13], TargetKind::Classes(10)));
        assert!(
            more.contains("need 10 classes, but the run's head has 3"),
            "{more}"
        );
        let wide = e(shape(&[64], TargetKind::Classes(3)));
        assert!(
            wide.contains("are [64], but the run's model takes [13]"),
            "{wide}"
        );
        let kind = e(shape(&[13], TargetKind::Values(1)));
        assert!(
            kind.contains("1 value, but the run's model was trained on 3 classes"),
            "{kind}"
        );
        // Token data: a larger vocabulary than the run's is refused.
        let lm = shape(&[8], TargetKind::Tokens { vocab: 256, len: 8 });
        let fewer = shape(&[8], TargetKind::Tokens { vocab: 65, len: 8 });
        assert!(lm.check(p, &fewer).is_ok());
        let more = lm
            .check(
                p,
                &shape(
                    &[8],
                    TargetKind::Tokens {
                        vocab: 50257,
                        len: 8,
                    },
                ),
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            more.contains("vocabulary of 50257, but the run's model has 256"),
            "{more}"
        );
        assert!(lm.check(p, &shape(&[8], TargetKind::Classes(3))).is_err());
    }
}
