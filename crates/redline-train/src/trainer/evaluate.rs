//! Validation and test passes: the model's validation step over a loader,
//! summed on the device and read once at the end (across the ranks where the
//! loader is sharded).

use std::time::Instant;

use redline_data::Loader;
use redline_profile::Action;

use crate::error::Result;
use crate::events::{EvalResult, Event};
use crate::running::{batch_loss_sum, Running};

use super::stepping::checked;
use super::Trainer;

impl Trainer {
    /// One validation pass over `loader`: the step's mean loss and metrics
    /// (model in eval mode, nothing trained).
    pub fn validate(&self, loader: &Loader) -> Result<EvalResult> {
        let _threads = self.threads.map(redline_core::threads::scoped);
        self.evaluate_inner(loader)
            .map_err(|e| e.with_oom_context(&self.device.to_string(), loader.config().batch_size))
    }

    /// A test pass over `loader` (as [`Trainer::validate`]), reported to the
    /// callbacks as [`Event::Test`]: `test_*` in the records.
    /// After a fit, the pass is profiled (as validation) by the fit's profiler.
    pub fn test(&mut self, loader: &Loader) -> Result<EvalResult> {
        let result = self.after_fit(Action::Validation, |t| t.validate(loader))?;
        self.emit(&Event::Test(&result))?;
        Ok(result)
    }

    fn evaluate_inner(&self, loader: &Loader) -> Result<EvalResult> {
        let start = Instant::now();
        let mut sums = Running::new(self.device.candle())?;
        for batch in loader.epoch(0) {
            self.check_stop(0, 0)?;
            let out = checked(self.module.validation_step(&batch?)?)?;
            let loss_sum = batch_loss_sum(&out.loss, out.samples)?;
            sums.add(&loss_sum, out.samples, &out.metrics)?;
        }
        // A sharded loader saw this rank's part: the ranks' sums add up to
        // the whole split's (an unsharded one saw all of it on every rank).
        let means = match loader.sharding() {
            Some(_) => sums.read_across(&self.reads, &self.strategy, true, "evaluation")?,
            None => sums.read(&self.reads)?,
        };
        let samples = means.samples;
        Ok(EvalResult {
            loss: means.loss,
            metrics: means.metrics,
            samples,
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}
