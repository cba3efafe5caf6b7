//! [`LanguageModel`]: the ready step for next-token prediction (issue 50).
//!
//! `model(x)` gives logits `(B, T, vocab)` for ids `(B, T)`; the targets are
//! the next ids `(B, T)` u32 ([`redline_data::TargetKind::Tokens`]). The loss
//! is the mean cross-entropy over every position of the batch (nanoGPT's
//! `F.cross_entropy(logits.view(-1, V), targets.view(-1))`); the metric is
//! `token_accuracy`, the top-1 accuracy over positions. Perplexity is the
//! exponential of the loss, and bits per byte (byte-level data) the loss
//! over ln 2: both follow from the mean loss the trainer reports
//! ([`perplexity`], [`bits_per_token`]).

use candle_core::{DType, Tensor};
use redline_data::Batch;
use redline_models::Model;

use crate::error::{Error, Result};
use crate::step::{cross_entropy_and_hits, from_model, output, Metric, StepOutput, TrainStep};

/// Next-token prediction over a model's `(B, T, vocab)` logits.
pub struct LanguageModel<M> {
    model: M,
}

impl<M: Model> LanguageModel<M> {
    /// Wraps a model whose output is next-token logits `(B, T, vocab)`.
    pub fn new(model: M) -> Self {
        Self { model }
    }

    /// The wrapped model.
    pub fn model(&self) -> &M {
        &self.model
    }

    fn outputs(logits: &Tensor, batch: &Batch) -> Result<StepOutput> {
        let y = &batch.y;
        let (b, t) = match (y.dtype(), y.dims()) {
            (DType::U32, &[b, t]) => (b, t),
            _ => {
                return Err(Error::Config(format!(
                    "a language model needs next-token ids (B, T) u32 as targets, the batch \
                     has {:?} {:?}",
                    y.dims(),
                    y.dtype()
                )))
            }
        };
        let vocab = match logits.dims() {
            &[lb, lt, v] if (lb, lt) == (b, t) => v,
            other => {
                return Err(Error::Config(format!(
                    "a language model's output must be logits ({b}, {t}, vocab) for targets \
                     ({b}, {t}); the model gave {other:?}"
                )))
            }
        };
        let flat = logits.reshape((b * t, vocab))?;
        let ids = y.reshape(b * t)?;
        let (loss, correct) = cross_entropy_and_hits(&flat, &ids)?;
        Ok(StepOutput {
            loss,
            samples: b,
            metrics: vec![Metric::mean("token_accuracy", correct, (b * t) as f64)],
        })
    }
}

/// Perplexity of a mean next-token cross-entropy (nats): `exp(loss)`.
pub fn perplexity(loss: f64) -> f64 {
    loss.exp()
}

/// Bits per token of a mean cross-entropy (nats): `loss / ln 2`; for
/// byte-level data (one token a byte), bits per byte.
pub fn bits_per_token(loss: f64) -> f64 {
    loss / std::f64::consts::LN_2
}

impl<M: Model> TrainStep for LanguageModel<M> {
    from_model!();

    fn metric_names(&self) -> Option<Vec<String>> {
        Some(vec!["token_accuracy".into()])
    }

    fn training_step(&self, batch: &Batch) -> Result<StepOutput> {
        Self::outputs(&output(&self.model, batch, true)?, batch)
    }

    fn validation_step(&self, batch: &Batch) -> Result<StepOutput> {
        Self::outputs(&output(&self.model, batch, false)?, batch)
    }
}
