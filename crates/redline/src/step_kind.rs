//! `--loss` against the data's targets: which ready step trains the model.

use anyhow::bail;
use redline_data::TargetKind;
use redline_models::Model;
use redline_train::{Classifier, LanguageModel, RegressionLoss, Regressor, TrainStep};

/// The ready step `redline train` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Cross-entropy and accuracy over class ids.
    Classify,
    /// A regression loss and the mean absolute error over values.
    Regress(RegressionLoss),
    /// Next-token cross-entropy and token accuracy over every position.
    LanguageModel,
}

impl StepKind {
    /// Checks `--loss` against the targets; `auto` picks cross-entropy for
    /// classes and MSE for values.
    pub fn resolve(loss: &str, target: TargetKind) -> anyhow::Result<Self> {
        let loss = loss.trim().to_ascii_lowercase();
        Ok(match (loss.as_str(), target) {
            ("auto" | "ce" | "cross-entropy", TargetKind::Classes(_)) => Self::Classify,
            ("auto" | "ce" | "cross-entropy", TargetKind::Tokens { .. }) => Self::LanguageModel,
            (other, TargetKind::Tokens { .. }) => bail!(
                "--loss {other}: the targets are next-token ids; a language model trains with \
                 cross-entropy\nHINT: leave out --loss, or --loss ce"
            ),
            ("auto", TargetKind::Values(_)) => Self::Regress(RegressionLoss::Mse),
            ("ce" | "cross-entropy", TargetKind::Values(_)) => bail!(
                "--loss ce needs class targets; the data's targets are values\n\
                 HINT: --loss mse or l1, or --task classification if they are class ids"
            ),
            (other, TargetKind::Classes(_)) => {
                other.parse::<RegressionLoss>()?;
                bail!(
                    "--loss {other}: the targets are class ids\nHINT: --task regression to \
                     treat them as values, or --loss ce"
                )
            }
            (other, TargetKind::Values(_)) => Self::Regress(other.parse()?),
        })
    }

    /// The step wrapping `model`.
    pub fn step(self, model: Box<dyn Model>) -> Box<dyn TrainStep> {
        match self {
            Self::Classify => Box::new(Classifier::new(model)),
            Self::Regress(loss) => Box::new(Regressor::new(model, loss)),
            Self::LanguageModel => Box::new(LanguageModel::new(model)),
        }
    }
}

impl std::fmt::Display for StepKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Classify => "cross-entropy",
            Self::LanguageModel => "next-token cross-entropy",
            Self::Regress(RegressionLoss::Mse) => "mse",
            Self::Regress(RegressionLoss::L1) => "l1",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_must_fit_the_targets() -> anyhow::Result<()> {
        let classes = TargetKind::Classes(3);
        let values = TargetKind::Values(1);
        assert_eq!(StepKind::resolve("auto", classes)?, StepKind::Classify);
        assert_eq!(
            StepKind::resolve("auto", values)?,
            StepKind::Regress(RegressionLoss::Mse)
        );
        assert_eq!(
            StepKind::resolve("L1", values)?,
            StepKind::Regress(RegressionLoss::L1)
        );
        let err = |l, t| {
            StepKind::resolve(l, t)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("ce", values).contains("needs class targets"));
        assert!(err("mse", classes).contains("the targets are class ids"));
        assert!(err("hinge", values).contains("not a regression loss"));
        let tokens = TargetKind::Tokens { vocab: 256, len: 8 };
        assert_eq!(StepKind::resolve("auto", tokens)?, StepKind::LanguageModel);
        assert_eq!(StepKind::resolve("ce", tokens)?, StepKind::LanguageModel);
        assert!(err("mse", tokens).contains("next-token ids"));
        Ok(())
    }
}
