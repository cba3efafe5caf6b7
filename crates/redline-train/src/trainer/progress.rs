//! Between steps: the step count, the callbacks' step events, the log points
//! (the only reads of the loss during a fit), the learning-rate schedule,
//! the stop flag, and the checks that stop a fit whose loss is not finite or
//! has diverged.

use std::sync::atomic::Ordering;
use std::time::Instant;

use redline_profile::{Action, Profiler};

use crate::error::{Error, Result};
use crate::events::{Event, StepLog};
use crate::running::{Means, Running};

use super::{LoopState, Trainer};

impl Trainer {
    /// After an optimizer step: counts it, tells the callbacks, reads the
    /// window back at log points. `Ok(true)` once the fit has run its steps.
    pub(super) fn after_step(
        &mut self,
        st: &mut LoopState,
        epoch: usize,
        prof: &mut Profiler,
    ) -> Result<bool> {
        prof.switch(Action::Logging);
        st.step += 1;
        let step = st.step;
        self.emit(&Event::StepEnd { step, epoch })?;
        if step.is_multiple_of(self.cfg.log_every) || step == st.total_steps {
            prof.switch(Action::HostSync);
            let log = self.log_point(&st.window, step, epoch, st.window_start, st.fit_start)?;
            self.check_divergence(log.loss, &st.first_loss, &mut st.start_loss, step, epoch)?;
            prof.sync_device_clock();
            prof.switch(Action::Logging);
            self.emit(&Event::Log(&log))?;
            prof.switch(Action::Other);
            st.window.reset()?;
            st.window_start = Instant::now();
        }
        self.apply_schedule(st, epoch)?;
        prof.end_step();
        self.check_stop(step, epoch)?;
        Ok(step >= st.total_steps)
    }

    /// Sets the rate of the next step from the schedule: after `st.step`
    /// steps, in `epoch` (1-based). A no-op for the constant rate.
    pub(super) fn apply_schedule(&mut self, st: &LoopState, epoch: usize) -> Result<()> {
        let s = &self.cfg.schedule;
        if s.is_constant() {
            return Ok(());
        }
        let lr = s.lr(
            self.base_lr,
            st.step,
            epoch.saturating_sub(1),
            st.total_steps,
            st.epochs,
        );
        self.optimizer.set_lr(lr)
    }

    /// [`Error::Interrupted`] once the stop flag is set (data-parallel: once
    /// any rank's was, as the last gradient all-reduce said).
    pub(super) fn check_stop(&self, step: usize, epoch: usize) -> Result<()> {
        if self.strategy.is_distributed() && step > 0 {
            return match self.ranks_stop {
                true => Err(Error::Interrupted { step, epoch }),
                false => Ok(()),
            };
        }
        match &self.stop {
            Some(flag) if flag.load(Ordering::Relaxed) => Err(Error::Interrupted { step, epoch }),
            _ => Ok(()),
        }
    }

    /// Stops the fit when `loss` exceeds the divergence threshold times the
    /// fit's first step's loss (`first`, read back once into `start`).
    pub(super) fn check_divergence(
        &self,
        loss: f64,
        first: &Option<candle_core::Tensor>,
        start: &mut Option<f64>,
        step: usize,
        epoch: usize,
    ) -> Result<()> {
        let (Some(factor), true) = (self.cfg.divergence_threshold, loss.is_finite()) else {
            return Ok(());
        };
        let first = match (*start, first) {
            (Some(v), _) => v,
            (None, Some(t)) => {
                let mut v = [f64::from(
                    self.reads
                        .scalar::<f32>(&t.to_dtype(candle_core::DType::F32)?)?,
                )];
                // Every rank measures against the same start: the ranks' mean.
                self.strategy.reduce_sums(&mut v, "the first step's loss")?;
                let v = v[0] / self.strategy.world_size() as f64;
                *start = Some(v);
                v
            }
            (None, None) => return Ok(()),
        };
        // A start at zero (or below, for a loss of your own) has no scale to grow from.
        if first > 0.0 && loss > factor * first {
            return Err(Error::Diverged {
                value: loss,
                start: first,
                ratio: loss / first,
                factor,
                step,
                epoch,
                lr: self.optimizer.lr(),
            });
        }
        Ok(())
    }

    /// The log point after `step`: the window's mean loss and gradient
    /// norm, read back (across the ranks), with the rate, the loss scale
    /// and the window's throughput.
    pub(super) fn log_point(
        &self,
        window: &Running,
        step: usize,
        epoch: usize,
        window_start: Instant,
        fit_start: Instant,
    ) -> Result<StepLog> {
        let Means {
            loss,
            metrics: grad_norm,
            samples,
        } = window.read_across(
            &self.reads,
            &self.strategy,
            false,
            &format!("the log point of step {step}"),
        )?;
        check_finite(loss, step, epoch, self.optimizer.lr())?;
        let secs = window_start.elapsed().as_secs_f64();
        let samples_per_s = if secs > 0.0 {
            samples as f64 / secs
        } else {
            f64::NAN
        };
        let (flops_per_s, mfu) = crate::mfu::window_mfu(
            self.module.flops(),
            self.peak.as_ref(),
            samples_per_s,
            self.strategy.world_size(),
        );
        Ok(StepLog {
            step,
            epoch,
            loss,
            grad_norm: grad_norm.get("grad_norm"),
            lr: self.optimizer.lr(),
            loss_scale: self
                .scaler
                .as_ref()
                .map(|s| s.read_scale(&self.reads))
                .transpose()?,
            samples_per_s,
            flops_per_s,
            mfu,
            elapsed_s: fit_start.elapsed().as_secs_f64(),
        })
    }
}

impl Trainer {
    /// The fit's FLOPs and MFU ([`crate::FitSummary::flops`]): `samples`
    /// (all ranks) trained in `steps` over `train_s` seconds. `None`
    /// without a peak ([`crate::TrainerBuilder::peak`]).
    pub(super) fn flops_summary(
        &self,
        samples: usize,
        steps: usize,
        train_s: f64,
    ) -> Option<std::result::Result<crate::mfu::FlopsSummary, String>> {
        let peak = self.peak.as_ref()?;
        Some(match self.module.flops() {
            Some(f) => Ok(crate::mfu::FlopsSummary::new(
                f,
                peak,
                (samples, steps, train_s),
                self.strategy.world_size(),
            )),
            None => Err(
                "the model does not count its FLOPs (a model of your own: implement \
                 Model::flops, or TrainStep::flops)"
                    .into(),
            ),
        })
    }
}

/// [`Error::NonFiniteLoss`] for a loss read back as inf or NaN.
pub(super) fn check_finite(loss: f64, step: usize, epoch: usize, lr: f64) -> Result<()> {
    if loss.is_finite() {
        Ok(())
    } else {
        Err(Error::NonFiniteLoss {
            value: loss,
            step,
            epoch,
            lr,
        })
    }
}
