//! One optimizer step's parts, in the loop's order: a (micro-)batch's
//! forward, loss, backward and sums ([`Trainer::micro_step`]), then the
//! gradient all-reduce, clipping and the update ([`Trainer::optimizer_step`]),
//! with the loss scaler between backward and update.

use std::sync::atomic::Ordering;

use redline_data::Batch;
use redline_profile::{Action, Profiler};

use crate::clip;
use crate::error::{Error, Result};
use crate::running::{paired, Running};
use crate::step::StepOutput;

use super::{LoopState, Trainer};

impl Trainer {
    /// Forward, loss and backward of one (micro-)batch, and its sums.
    pub(super) fn micro_step(
        &mut self,
        batch: &Batch,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        let measure = self.memory.is_none();
        let before = match measure {
            true => redline_core::memory::stats(&self.device)?.map(|m| m.allocated),
            false => None,
        };
        prof.switch(Action::TrainingStep);
        let out = checked(self.module.training_step(batch)?)?;
        if st.first_loss.is_none() {
            st.first_loss = Some(out.loss.detach());
        }
        if measure {
            self.memory = Some(self.measure_forward(&out.loss, before, out.samples)?);
        }
        prof.switch(Action::Backward);
        self.backward(&out.loss)?;
        if let (true, Some(m)) = (measure, self.memory.as_mut()) {
            m.gradients = crate::memory::gradient_bytes(self.module.params());
        }
        prof.switch(Action::Metrics);
        paired::add_step(
            epoch_sums,
            &mut st.window,
            &out.loss,
            out.samples,
            &out.metrics,
            &paired::device_sums,
        )
    }

    /// The memory split's forward side, at a fit's first step: the
    /// parameters, and the activations of `samples` samples (by the
    /// allocator on a GPU that reports it, where `before` is what was
    /// allocated before the forward; else by the graph's tensor sizes).
    pub(super) fn measure_forward(
        &self,
        loss: &candle_core::Tensor,
        before: Option<u64>,
        samples: usize,
    ) -> Result<crate::memory::MemorySplit> {
        let params = self.module.params();
        let after = match before {
            Some(_) => redline_core::memory::stats(&self.device)?.map(|m| m.allocated),
            None => None,
        };
        let (activations, measured_by) = match (before, after) {
            (Some(b), Some(a)) => (a.saturating_sub(b), "allocator"),
            _ => (
                crate::memory::activation_bytes(loss, params),
                "tensor sizes",
            ),
        };
        Ok(crate::memory::MemorySplit {
            parameters: crate::memory::parameter_bytes(params),
            activations,
            batch: samples,
            measured_by: measured_by.into(),
            ..Default::default()
        })
    }

    /// Clipping and the optimizer update; the gradient norm into the sums.
    pub(super) fn optimizer_step(
        &mut self,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        if self.strategy.is_distributed() {
            prof.switch(Action::AllReduce);
            let params: Vec<&redline_kernels::grad::Param> = self.optimizer.params().collect();
            let local = self
                .stop
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Relaxed));
            self.ranks_stop = self
                .strategy
                .reduce_gradients(&params, local, st.step + 1)?;
        }
        prof.switch(Action::OptimizerStep);
        if let Some(norm) = self.update()? {
            prof.switch(Action::Metrics);
            let m = crate::step::Metric::mean("grad_norm", norm, 1.0);
            paired::add_extra(epoch_sums, &mut st.window, &m, &paired::device_sums)?;
        }
        Ok(())
    }

    /// Back-propagates a micro-batch's loss into the parameters' gradients,
    /// divided by the accumulation count (Lightning's normalisation).
    /// With a loss scaler, the loss is scaled first (the same scale for
    /// every micro-batch of a step: it changes only at the update).
    pub(super) fn backward(&self, loss: &candle_core::Tensor) -> Result<()> {
        let n = self.cfg.accumulate;
        let params = self.module.params();
        let scaled;
        let loss = match &self.scaler {
            Some(s) => {
                scaled = s.scale_loss(loss)?;
                &scaled
            }
            None => loss,
        };
        if n > 1 {
            params.backward(&loss.affine(1.0 / n as f64, 0.0)?)?;
        } else {
            params.backward(loss)?;
        }
        Ok(())
    }

    /// Clips the accumulated gradients and applies one optimizer update;
    /// returns the gradient norm before clipping when it was computed. With
    /// a loss scaler (PyTorch's order): unscale, clip, step unless the
    /// gradients overflowed, update the scale; the norm is then of the
    /// unscaled gradients (inf or NaN on a skipped step).
    pub(super) fn update(&mut self) -> Result<Option<candle_core::Tensor>> {
        let (clip, want_norm) = (self.cfg.clip, self.cfg.log_grad_norm);
        // A plain step (no scaler, no clipping, no norm) lists no parameters.
        if self.scaler.is_none() && clip.is_none() && !want_norm {
            self.optimizer.step()?;
            return Ok(None);
        }
        let params: Vec<&redline_kernels::grad::Param> = self.optimizer.params().collect();
        let found_inf = self
            .scaler
            .as_ref()
            .map(|s| s.unscale(&params))
            .transpose()?;
        let norm = clip::prepare(&params, clip, want_norm)?;
        drop(params);
        match (&found_inf, &self.scaler) {
            (Some(f), Some(s)) => {
                self.optimizer.step_skipping(f)?;
                s.update(f)?;
            }
            _ => self.optimizer.step()?,
        }
        Ok(norm)
    }
}

/// Refuses a step output the loop cannot use (host-side shape checks only).
pub(super) fn checked(out: StepOutput) -> Result<StepOutput> {
    if out.loss.rank() != 0 {
        return Err(Error::Config(format!(
            "the step returned a loss of shape {:?}: it must be a scalar (the batch mean)",
            out.loss.dims()
        )));
    }
    if let Some(m) = out.metrics.iter().find(|m| m.sum.rank() != 0) {
        return Err(Error::Config(format!(
            "the step's metric `{}` has shape {:?}: a metric sum must be a scalar",
            m.name,
            m.sum.dims()
        )));
    }
    Ok(out)
}
