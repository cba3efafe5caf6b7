//! The training-step contract: what the user writes (Lightning's
//! `training_step`/`validation_step`, burn's `TrainStep`/`ValidStep`).
//!
//! A [`TrainStep`] takes a batch and returns a [`StepOutput`]: the mean loss
//! of the batch (tracked for backward in training) and a small open set of
//! named [`Metric`]s. Metrics stay on the device as sums: the trainer adds
//! them into running totals and reads every total back in one host sync at a
//! log point or an epoch end, so a step never waits for the device.
//!
//! [`Classifier`] (cross-entropy + accuracy) and [`Regressor`] (MSE or L1 +
//! MAE) are the ready implementations the zoo models use.

use std::borrow::Cow;

use candle_core::{DType, Tensor};
use redline_data::Batch;
use redline_models::{Model, Params};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::loss;

/// A named metric of one batch, as a sum and the count it is a sum over: the
/// value over many batches is `sum(sums) / sum(counts)`. Accuracy is
/// (correct predictions, samples); a mean absolute error is (|errors| summed,
/// elements).
#[derive(Debug, Clone)]
pub struct Metric {
    /// The name records and charts use (`accuracy`, `mae`): `train_<name>`,
    /// `val_<name>`, `test_<name>`.
    pub name: Cow<'static, str>,
    /// The batch's sum, a scalar on the device (any float dtype; detached).
    pub sum: Tensor,
    /// What `sum` is a sum over (samples, elements): a host number.
    pub count: f64,
}

impl Metric {
    /// A metric whose value is `sum / count` over all batches.
    pub fn mean(name: impl Into<Cow<'static, str>>, sum: Tensor, count: f64) -> Self {
        Self {
            name: name.into(),
            sum,
            count,
        }
    }
}

/// What a step returns.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// The batch's mean loss, a scalar; in training it must be tracked (the
    /// trainer calls `backward` on it).
    pub loss: Tensor,
    /// Samples in the batch: the loss's weight in running means.
    pub samples: usize,
    /// Named metrics, the same names in the same order every step.
    pub metrics: Vec<Metric>,
}

/// The user's part of training: batch in, loss and metrics out.
///
/// The trainer calls [`TrainStep::training_step`], then `backward` on the
/// loss and the optimizer update over [`TrainStep::params`];
/// [`TrainStep::validation_step`] runs in validation and test passes, where
/// nothing is trained (run the model with `train = false` and detach).
pub trait TrainStep: Send + Sync {
    /// The parameters the optimizer updates and `--save` writes.
    fn params(&self) -> &Params;
    /// Loss and metrics of a training batch (model in training mode).
    fn training_step(&self, batch: &Batch) -> Result<StepOutput>;
    /// Loss and metrics of a validation or test batch (model in eval mode).
    fn validation_step(&self, batch: &Batch) -> Result<StepOutput>;
    /// Whether [`TrainStep::training_step`] can be captured once as a CUDA
    /// graph and replayed with the same result (device ops only: no host
    /// randomness, no read-back); `Err` says why not. A step of your own is
    /// not assumed safe: return `Ok(())` (or your model's
    /// [`Model::capture_safe`]) to opt in.
    fn capture_safe(&self) -> std::result::Result<(), String> {
        Err(
            "a training step of your own: implement TrainStep::capture_safe to declare it \
             capturable"
                .into(),
        )
    }
    /// The names of the metrics the step returns (`accuracy`), known before
    /// any batch runs; `None`, the default, when only its output says. With
    /// names, a `--monitor` or `--early-stop` on a metric that is never
    /// logged is refused before training, not after an epoch.
    fn metric_names(&self) -> Option<Vec<String>> {
        None
    }
    /// FLOPs per training sample, forward and backward ([`Model::flops`]),
    /// for the run's MFU; `None`, the default, means unknown, and no MFU
    /// is shown rather than a guessed one.
    fn flops(&self) -> Option<redline_models::Flops> {
        None
    }
    /// The positions of the step's random streams (its model's dropout), saved
    /// in checkpoints ([`Model::rng_state`]); empty by default.
    fn rng_state(&self) -> Vec<u128> {
        Vec::new()
    }
    /// Puts back positions [`TrainStep::rng_state`] gave.
    fn load_rng_state(&self, state: &[u128]) -> Result<()> {
        match state.len() {
            0 => Ok(()),
            n => Err(Error::Config(format!(
                "the checkpoint holds {n} random stream positions (dropout), but this training \
                 step declares none: implement TrainStep::rng_state and load_rng_state"
            ))),
        }
    }
}

impl<S: TrainStep + ?Sized> TrainStep for Box<S> {
    fn params(&self) -> &Params {
        (**self).params()
    }
    fn training_step(&self, batch: &Batch) -> Result<StepOutput> {
        (**self).training_step(batch)
    }
    fn validation_step(&self, batch: &Batch) -> Result<StepOutput> {
        (**self).validation_step(batch)
    }
    fn capture_safe(&self) -> std::result::Result<(), String> {
        (**self).capture_safe()
    }
    fn metric_names(&self) -> Option<Vec<String>> {
        (**self).metric_names()
    }
    fn flops(&self) -> Option<redline_models::Flops> {
        (**self).flops()
    }
    fn rng_state(&self) -> Vec<u128> {
        (**self).rng_state()
    }
    fn load_rng_state(&self, state: &[u128]) -> Result<()> {
        (**self).load_rng_state(state)
    }
}

/// The model's output for a batch: in training mode and tracked for
/// backward (`train`), or in eval mode and detached, as validation and test
/// passes need it. The ready steps use it; a step of your own can too.
pub fn output<M: Model + ?Sized>(model: &M, batch: &Batch, train: bool) -> Result<Tensor> {
    let y = model.forward_t(&batch.x, train)?;
    // Losses and metrics run in fp32 (autocast's rule): a 16-bit model's
    // output is cast up, and the cast's backward casts the gradient down.
    let y = match y.dtype() {
        candle_core::DType::F32 => y,
        _ => y.to_dtype(candle_core::DType::F32)?,
    };
    Ok(if train { y } else { y.detach() })
}

/// Mean cross-entropy of `logits (N, classes)` against ids `(N,)` and the
/// count of top-1 hits (a detached scalar): the fused kernels count the
/// hits in the loss's pass, other devices take an argmax.
pub(crate) fn cross_entropy_and_hits(logits: &Tensor, ids: &Tensor) -> Result<(Tensor, Tensor)> {
    let (loss, counted) = redline_kernels::cross_entropy_counted(logits, ids)?;
    let correct = match counted {
        Some(c) => c,
        None => logits
            .detach()
            .argmax(1)?
            .eq(ids)?
            .to_dtype(DType::F32)?
            .sum_all()?,
    };
    Ok((loss, correct))
}

/// The [`TrainStep`] methods a ready step takes from its wrapped model
/// (`self.model`): parameters, capture safety, FLOPs and random streams.
macro_rules! from_model {
    () => {
        fn params(&self) -> &redline_models::Params {
            self.model.params()
        }

        fn capture_safe(&self) -> std::result::Result<(), String> {
            self.model.capture_safe()
        }

        fn flops(&self) -> Option<redline_models::Flops> {
            self.model.flops()
        }

        fn rng_state(&self) -> Vec<u128> {
            self.model.rng_state()
        }

        fn load_rng_state(&self, state: &[u128]) -> crate::error::Result<()> {
            Ok(self.model.load_rng_state(state)?)
        }
    };
}
pub(crate) use from_model;

/// Classification: `model(x)` gives logits `(B, classes)`, targets are class
/// ids `(B,)` u32; loss is mean cross-entropy (PyTorch's `F.cross_entropy`),
/// the metric is top-1 `accuracy`.
pub struct Classifier<M> {
    model: M,
}

impl<M: Model> Classifier<M> {
    /// Wraps a model whose output is logits.
    pub fn new(model: M) -> Self {
        Self { model }
    }

    /// The wrapped model.
    pub fn model(&self) -> &M {
        &self.model
    }

    fn outputs(logits: &Tensor, batch: &Batch) -> Result<StepOutput> {
        let samples = batch.size();
        let y = &batch.y;
        if y.dtype() != DType::U32 || y.rank() != 1 {
            return Err(Error::Config(format!(
                "classification needs class ids (B,) u32 as targets, the batch has {:?} {:?}\n\
                 HINT: for float targets use --task regression",
                y.dims(),
                y.dtype()
            )));
        }
        let (loss, correct) = cross_entropy_and_hits(logits, y)?;
        Ok(StepOutput {
            loss,
            samples,
            metrics: vec![Metric::mean("accuracy", correct, samples as f64)],
        })
    }
}

impl<M: Model> TrainStep for Classifier<M> {
    from_model!();

    fn metric_names(&self) -> Option<Vec<String>> {
        Some(vec!["accuracy".into()])
    }

    fn training_step(&self, batch: &Batch) -> Result<StepOutput> {
        Self::outputs(&output(&self.model, batch, true)?, batch)
    }

    fn validation_step(&self, batch: &Batch) -> Result<StepOutput> {
        Self::outputs(&output(&self.model, batch, false)?, batch)
    }
}

/// The loss of a regression.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegressionLoss {
    /// Mean squared error (PyTorch's `MSELoss`).
    #[default]
    Mse,
    /// Mean absolute error (PyTorch's `L1Loss`).
    L1,
}

impl std::str::FromStr for RegressionLoss {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mse" => Ok(Self::Mse),
            "l1" | "mae" => Ok(Self::L1),
            other => Err(Error::Config(format!(
                "--loss {other:?}: not a regression loss; available: mse, l1"
            ))),
        }
    }
}

/// Regression: `model(x)` gives predictions shaped as the targets `y`
/// (f32, `(B, K)` or `(B,)`); loss is MSE or L1 (mean over elements), the
/// metric is `mae`, the mean absolute error over elements.
pub struct Regressor<M> {
    model: M,
    loss: RegressionLoss,
}

impl<M: Model> Regressor<M> {
    /// Wraps a model whose output is the prediction.
    pub fn new(model: M, loss: RegressionLoss) -> Self {
        Self { model, loss }
    }

    /// The wrapped model.
    pub fn model(&self) -> &M {
        &self.model
    }

    fn outputs(&self, pred: &Tensor, batch: &Batch) -> Result<StepOutput> {
        let y = &batch.y;
        // A (B,) target against a (B, 1) prediction is the usual single-output case.
        let pred = if pred.dims() != y.dims() && pred.elem_count() == y.elem_count() {
            pred.reshape(y.shape())?
        } else {
            pred.clone()
        };
        if pred.dims() != y.dims() || !y.dtype().is_float() {
            return Err(Error::Config(format!(
                "regression needs float targets shaped as the model output: output {:?}, \
                 targets {:?} {:?}",
                pred.dims(),
                y.dims(),
                y.dtype()
            )));
        }
        let y = y.to_dtype(pred.dtype())?;
        let loss = match self.loss {
            RegressionLoss::Mse => loss::mse(&pred, &y)?,
            RegressionLoss::L1 => loss::l1(&pred, &y)?,
        };
        let abs_err = (pred.detach() - &y)?.abs()?.sum_all()?;
        Ok(StepOutput {
            loss,
            samples: batch.size(),
            metrics: vec![Metric::mean("mae", abs_err, y.elem_count() as f64)],
        })
    }
}

impl<M: Model> TrainStep for Regressor<M> {
    from_model!();

    fn metric_names(&self) -> Option<Vec<String>> {
        Some(vec!["mae".into()])
    }

    fn training_step(&self, batch: &Batch) -> Result<StepOutput> {
        self.outputs(&output(&self.model, batch, true)?, batch)
    }

    fn validation_step(&self, batch: &Batch) -> Result<StepOutput> {
        self.outputs(&output(&self.model, batch, false)?, batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// `y = x w` with one weight, no bias.
    struct Scale {
        params: Params,
        w: Tensor,
    }

    impl Scale {
        fn new(w: f32) -> Result<Self> {
            let var = Var::new(&[[w]], &Device::Cpu)?;
            let mut params = Params::new();
            let w = var.as_tensor().clone();
            params.push("w", var)?;
            Ok(Self { params, w })
        }
    }

    impl Model for Scale {
        fn forward_t(&self, x: &Tensor, _train: bool) -> redline_models::Result<Tensor> {
            Ok(x.matmul(&self.w)?)
        }
        fn params(&self) -> &Params {
            &self.params
        }
    }

    fn batch(x: &[f32], y: Tensor) -> Result<Batch> {
        Ok(Batch {
            x: Tensor::from_slice(x, (x.len(), 1), &Device::Cpu)?,
            y,
            index: 0,
        })
    }

    #[test]
    fn regressor_mse_and_mae_match_hand_values() -> Result<()> {
        // Predictions 2x for x = 1, 2, 3 against targets 1, 5, 6: errors 1, -1, 0.
        let b = batch(
            &[1.0, 2.0, 3.0],
            Tensor::new(&[1f32, 5.0, 6.0], &Device::Cpu)?,
        )?;
        for (loss, want) in [
            (RegressionLoss::Mse, 2.0 / 3.0),
            (RegressionLoss::L1, 2.0 / 3.0),
        ] {
            let out = Regressor::new(Scale::new(2.0)?, loss).training_step(&b)?;
            let l = out.loss.to_scalar::<f32>()?;
            assert!((l - want).abs() < 1e-6, "{loss:?}: {l}");
            assert_eq!(out.metrics[0].name, "mae");
            assert_eq!(out.metrics[0].sum.to_scalar::<f32>()?, 2.0);
            assert_eq!(out.metrics[0].count, 3.0);
            assert!(out.loss.track_op(), "the training loss is tracked");
        }
        // Errors 1, -1, 2: MSE 2, L1 4/3.
        let b = batch(
            &[1.0, 2.0, 3.0],
            Tensor::new(&[1f32, 5.0, 4.0], &Device::Cpu)?,
        )?;
        let mse = Regressor::new(Scale::new(2.0)?, RegressionLoss::Mse).validation_step(&b)?;
        assert!((mse.loss.to_scalar::<f32>()? - 2.0).abs() < 1e-6);
        assert!(!mse.loss.track_op(), "validation is detached");
        Ok(())
    }

    #[test]
    fn classifier_counts_correct_predictions() -> Result<()> {
        // Logits x * w for 1 class are not useful: two classes through a (1, 2) weight.
        struct Two(Params, Tensor);
        impl Model for Two {
            fn forward_t(&self, x: &Tensor, _: bool) -> redline_models::Result<Tensor> {
                Ok(x.matmul(&self.1)?)
            }
            fn params(&self) -> &Params {
                &self.0
            }
        }
        let var = Var::new(&[[1f32, -1.0]], &Device::Cpu)?;
        let m = Two(Params::new(), var.as_tensor().clone());
        // x > 0 predicts class 0, x < 0 class 1.
        let b = batch(
            &[1.0, -2.0, 3.0, -1.0],
            Tensor::new(&[0u32, 1, 1, 0], &Device::Cpu)?,
        )?;
        let out = Classifier::new(m).validation_step(&b)?;
        assert_eq!(out.metrics[0].name, "accuracy");
        assert_eq!(out.metrics[0].sum.to_scalar::<f32>()?, 2.0);
        assert_eq!(out.samples, 4);
        Ok(())
    }

    #[test]
    fn wrong_target_kinds_are_refused_with_a_hint() -> Result<()> {
        let floats = batch(&[1.0], Tensor::new(&[1f32], &Device::Cpu)?)?;
        let err = Classifier::new(Scale::new(1.0)?)
            .training_step(&floats)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("--task regression")));
        let ids = batch(&[1.0, 2.0], Tensor::new(&[1u32, 0], &Device::Cpu)?)?;
        let err = Regressor::new(Scale::new(1.0)?, RegressionLoss::Mse)
            .training_step(&ids)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.is_some_and(|e| e.contains("float targets")),
            "u32 targets"
        );
        assert!("huber".parse::<RegressionLoss>().is_err());
        assert_eq!("L1".parse::<RegressionLoss>()?, RegressionLoss::L1);
        Ok(())
    }
}
