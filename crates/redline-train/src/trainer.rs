//! The trainer: fit, validate, test. Built by a by-value builder; the loop emits
//! [`Event`]s to callbacks and reads device values only at log points.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use redline_core::host::HostReads;
use redline_core::Device;
use redline_data::{Batch, Loader};
use redline_models::Params;
use redline_profile::{Action, Mode, Profile, Profiler};

use crate::checkpoint::{CheckpointConfig, CheckpointMeta};
use crate::clip;
use crate::early_stop::EarlyStopState;
use crate::error::{Error, Result};
use crate::events::{Callback, EpochLog, EvalResult, Event, FitSummary, StepLog};
use crate::graph::GraphStatus;
use crate::kernel_trace::KernelTrace;
use crate::optim::Optimizer;
use crate::running::{batch_loss_sum, Means, Running};
use crate::step::{StepOutput, TrainStep};
use crate::strategy::Strategy;

mod checkpointing;
mod config;
#[cfg(feature = "cuda")]
mod graph_run;

pub use checkpointing::CheckpointLog;
pub use config::{set_cpu_bf16_gemm, set_gpu_conv, TrainConfig, TrainerBuilder};

/// Fits a model with an optimizer, telling callbacks what happens.
pub struct Trainer {
    cfg: TrainConfig,
    module: Box<dyn TrainStep>,
    optimizer: Optimizer,
    callbacks: Vec<Option<Box<dyn Callback>>>,
    device: Device,
    model_name: String,
    profile_mode: Mode,
    /// The last fit's profiler, kept running (paused) so that work after the fit,
    /// such as saving weights, is profiled too; see [`Trainer::finish_profile`].
    profiler: Option<Profiler>,
    /// The last fit's GPU busy figure, for its breakdown.
    gpu_busy: Option<redline_profile::GpuBusy>,
    /// This trainer's reads of tensors to the host (`host_syncs_per_step`).
    reads: HostReads,
    /// Set from outside to stop the fit after the current step.
    stop: Option<Arc<AtomicBool>>,
    /// This trainer's compute threads, if it has its own count.
    threads: Option<usize>,
    /// The optimizer's configured rate: the schedule's base.
    base_lr: f64,
    /// Where and when to checkpoint.
    checkpoints: Option<CheckpointConfig>,
    /// The checkpoint writer's thread and record.
    writer: checkpointing::Writer,
    /// The loop position to continue from ([`Trainer::resume_from`]).
    resume: Option<(std::path::PathBuf, CheckpointMeta)>,
    /// One process or data-parallel ranks ([`TrainerBuilder::strategy`]).
    strategy: Strategy,
    /// Whether any rank asked to stop, as the last gradient all-reduce
    /// said: ranks stop after the same step.
    ranks_stop: bool,
    /// The loss scaler of `16-mixed` ([`TrainConfig::loss_scale`]).
    scaler: Option<crate::scaler::GradScaler>,
    /// This fit's memory split, measured at its first step.
    memory: Option<crate::memory::MemorySplit>,
}

impl Trainer {
    /// A builder with PyTorch-tutorial defaults (5 epochs, Adam 1e-3).
    pub fn builder() -> TrainerBuilder {
        TrainerBuilder::new()
    }

    /// The module being trained (its step and parameters).
    pub fn module(&self) -> &dyn TrainStep {
        self.module.as_ref()
    }

    /// The trained parameters (PyTorch `state_dict()` names).
    pub fn params(&self) -> &Params {
        self.module.params()
    }

    /// Sends an event to every live callback. A failing observer is reported
    /// and detached; a failing writer of a result the user asked for
    /// ([`Callback::required`]: the run folder's records, `--metrics`) ends
    /// the fit with [`Error::Output`].
    fn emit(&mut self, event: &Event<'_>) -> Result<()> {
        for slot in &mut self.callbacks {
            if let Some(cb) = slot {
                if let Err(e) = cb.on_event(event) {
                    if cb.required() {
                        return Err(Error::Output {
                            callback: cb.name().to_string(),
                            message: e,
                        });
                    }
                    tracing::warn!("callback `{}` failed and was detached: {e}", cb.name());
                    *slot = None;
                }
            }
        }
        Ok(())
    }

    /// Trains on `train`, validating on `val` after each epoch when given.
    pub fn fit(&mut self, train: &Loader, val: Option<&Loader>) -> Result<FitSummary> {
        let _threads = self.threads.map(redline_core::threads::scoped);
        self.gpu_busy = None;
        let mut prof = Profiler::new(self.profile_mode, &self.device.to_string());
        // Events at every switch cost a few microseconds each: only when a
        // profile was asked for (the breakdown itself is host-timed).
        if self.profile_mode != Mode::Off {
            if let Some(clock) = crate::device_clock::for_device(&self.device) {
                prof = prof.with_device_clock(clock);
            }
        }
        prof.switch(Action::Other);
        let result = self
            .fit_profiled(train, val, &mut prof)
            .map_err(|e| e.with_oom_context(&self.device.to_string(), train.config().batch_size));
        prof.pause();
        self.profiler = Some(prof);
        let trimmed = redline_core::memory::empty_cache(&self.device);
        let summary = result?;
        trimmed?;
        Ok(summary)
    }

    /// How the fit spreads over processes.
    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }

    /// The device the trainer runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device's memory now (allocated, peak, pool); `None` on the CPU.
    pub fn memory(&self) -> Result<Option<redline_core::memory::MemoryStats>> {
        Ok(redline_core::memory::stats(&self.device)?)
    }

    /// Stops the last fit's profiler and returns its tables and breakdown.
    pub fn finish_profile(&mut self) -> Option<Profile> {
        let mut p = self.profiler.take().map(Profiler::finish)?;
        p.breakdown.gpu = self.gpu_busy.take();
        Some(p)
    }

    /// Saves the model's weights (safetensors, PyTorch names), profiled as checkpointing.
    pub fn save_weights(&mut self, path: &std::path::Path) -> Result<()> {
        self.after_fit(Action::Checkpointing, |t| {
            Ok(t.module.params().save_safetensors(path)?)
        })
    }

    /// Runs `f` after a fit, timed as `action` by the fit's (paused) profiler.
    fn after_fit<T>(&mut self, action: Action, f: impl FnOnce(&Self) -> Result<T>) -> Result<T> {
        if let Some(p) = &mut self.profiler {
            p.switch(action);
        }
        let result = f(self);
        if let Some(p) = &mut self.profiler {
            p.pause();
        }
        result
    }

    fn fit_profiled(
        &mut self,
        train: &Loader,
        val: Option<&Loader>,
        prof: &mut Profiler,
    ) -> Result<FitSummary> {
        let fit_start = Instant::now();
        let reads_before = self.reads.count();
        // Which backend ran this fit's convolutions, for `gpu_conv` below.
        redline_kernels::fused_gpu::take_conv_ran();
        self.memory = None;
        let batches_per_epoch = train.batches_per_epoch();
        let steps_per_epoch = batches_per_epoch.div_ceil(self.cfg.accumulate);
        let planned = steps_per_epoch.saturating_mul(self.cfg.epochs);
        let total_steps = self.cfg.max_steps.map_or(planned, |m| {
            if self.cfg.epochs == 0 {
                m
            } else {
                m.min(planned)
            }
        });
        let epochs = if self.cfg.epochs == 0 {
            total_steps.div_ceil(steps_per_epoch.max(1))
        } else {
            self.cfg.epochs
        };
        let (name, dev) = (self.model_name.clone(), self.device.to_string());
        self.join_ranks(train, batches_per_epoch)?;
        prof.plan(total_steps);
        prof.switch(Action::Logging);
        self.emit(&Event::FitStart {
            model: &name,
            device: &dev,
            params: self.module.params().numel(),
            epochs,
            steps_per_epoch,
            total_steps,
        })?;

        // Graph mode is decided once, before any step: `--cuda-graph on` that
        // cannot capture stops here, `auto` runs eagerly and says why.
        let plan = crate::graph::decide(
            self.cfg.cuda_graph,
            &self.device,
            train,
            &self.cfg,
            self.module.as_ref(),
        )?;
        let mut graph_status = match &plan {
            Err(why) => GraphStatus::Off(why.clone()),
            Ok(()) => GraphStatus::Unknown,
        };
        #[cfg(feature = "cuda")]
        let mut engine = match plan {
            Ok(()) => Some(graph_run::Engine::new(train, &self.device)?),
            Err(_) => None,
        };
        let resume = match self.resume.take() {
            Some((dir, meta)) => {
                // A state.json someone edited may name any position: one this
                // loop cannot be at is refused by name, before any step.
                meta.check_position(batches_per_epoch, self.cfg.accumulate)
                    .map_err(|message| Error::Checkpoint {
                        path: dir.join(crate::checkpoint::STATE),
                        message,
                    })?;
                Some(meta)
            }
            None => None,
        };
        // The graph's device cursor starts an epoch at its first batch.
        let plan = match (&resume, plan) {
            (Some(r), Ok(())) if r.batch > 0 => Err(format!(
                "resumed mid-epoch (epoch {}, batch {}): the captured step starts epochs at \
                 batch 0",
                r.epoch, r.batch
            )),
            (_, plan) => plan,
        };
        if let (Err(why), GraphStatus::Unknown) = (&plan, &graph_status) {
            graph_status = GraphStatus::Off(why.clone());
        }
        // A captured step adds into the same buffers at every replay.
        let in_place = plan.is_ok();
        let candle_dev = self.device.candle().clone();
        let mut st = LoopState {
            step: 0,
            total_steps,
            start_loss: None,
            first_loss: None,
            window: Running::with(&candle_dev, in_place)?,
            window_start: Instant::now(),
            fit_start,
            epochs,
            batch: 0,
            epoch_start: Instant::now(),
            epoch_s_before: 0.0,
            done: Done {
                early: self
                    .cfg
                    .early_stop
                    .as_ref()
                    .map(|es| EarlyStopState::new(es.mode)),
                ..Done::default()
            },
        };
        let mut stopped_early = None;
        let mut epoch_sums = Running::with(&candle_dev, in_place)?;
        let mut first_epoch = 1;
        if let Some(r) = &resume {
            st.step = r.step;
            st.start_loss = r.start_loss;
            st.done = Done {
                logs: r.logs.clone(),
                train_s: r.train_s,
                eval_s: r.eval_s,
                samples: r.samples,
                early: match (&self.cfg.early_stop, &r.early_stop) {
                    (Some(_), Some(e)) => Some(e.clone()),
                    _ => st.done.early.take(),
                },
            };
            first_epoch = r.epoch;
        }
        // Dropped unfinished on an error, which stops it.
        let trace = KernelTrace::start(&self.device, self.cfg.kernel_trace);
        let trace_start = Instant::now();
        #[cfg(feature = "cuda")]
        if let (Some(engine), KernelTrace::Unavailable(_)) = (engine.as_mut(), &trace) {
            engine.time_replays();
        }
        for epoch in first_epoch..=epochs {
            if st.step >= total_steps {
                break;
            }
            prof.switch(Action::Logging);
            self.emit(&Event::EpochStart { epoch })?;
            prof.switch(Action::Other);
            self.apply_schedule(&st, epoch)?;
            st.epoch_start = Instant::now();
            epoch_sums.reset()?;
            st.window.reset()?;
            st.window_start = Instant::now();
            st.batch = 0;
            st.epoch_s_before = 0.0;
            // Resumed mid-epoch: that epoch's sums and position come back.
            if let Some(r) = resume.as_ref().filter(|r| r.epoch == epoch && r.batch > 0) {
                epoch_sums.load_state(&r.epoch_sums, &candle_dev)?;
                st.window.load_state(&r.window, &candle_dev)?;
                st.batch = r.batch;
                st.epoch_s_before = r.epoch_s;
            }
            let first_step = st.step - st.batch.div_ceil(self.cfg.accumulate);
            #[cfg(feature = "cuda")]
            let graphed = match engine.as_mut() {
                Some(engine) => {
                    self.graph_epoch(engine, train, epoch, &mut st, &mut epoch_sums, prof)?;
                    true
                }
                None => false,
            };
            #[cfg(not(feature = "cuda"))]
            let graphed = false;
            if !graphed {
                self.eager_epoch(
                    train,
                    batches_per_epoch,
                    epoch,
                    &mut st,
                    &mut epoch_sums,
                    prof,
                )?;
            }
            let epoch_steps = st.step - first_step;
            // A loader that ended early leaves gradients no step took: drop
            // them rather than carry them into the next epoch.
            self.optimizer.zero_grad();
            prof.switch(Action::HostSync);
            #[cfg(feature = "cuda")]
            if let Some(engine) = engine.as_mut() {
                engine.collect_replay_time()?;
            }
            let train = epoch_sums.read_across(
                &self.reads,
                &self.strategy,
                true,
                &format!("the sums of epoch {epoch}"),
            )?;
            let epoch_s = st.epoch_start.elapsed().as_secs_f64() + st.epoch_s_before;
            let step = st.step;
            check_finite(train.loss, step, epoch, self.optimizer.lr())?;
            self.check_divergence(train.loss, &st.first_loss, &mut st.start_loss, step, epoch)?;
            st.done.train_s += epoch_s;
            // Every rank's samples (the sums were read across the ranks).
            st.done.samples += train.samples;
            if self.cfg.empty_cache {
                redline_core::memory::empty_cache(&self.device)?;
            }

            let eval = match val.filter(|_| self.cfg.validate) {
                Some(v) => {
                    prof.switch(Action::Logging);
                    self.emit(&Event::ValidationStart { epoch })?;
                    prof.switch(Action::Validation);
                    Some(self.validate(v)?)
                }
                None => None,
            };
            prof.switch(Action::Logging);
            let log = EpochLog {
                epoch,
                train_loss: train.loss,
                train: train.metrics,
                eval_s: eval.as_ref().map_or(0.0, |e| e.seconds),
                val: eval,
                epoch_s,
                steps: epoch_steps,
                samples: train.samples,
            };
            st.done.eval_s += log.eval_s;
            self.emit(&Event::EpochEnd(&log))?;
            let stop = match (&self.cfg.early_stop, st.done.early.as_mut()) {
                (Some(es), Some(state)) => es.update(state, &log)?,
                _ => None,
            };
            st.done.logs.push(log.clone());
            self.epoch_checkpoint(&st, &log)?;
            if let Some(reason) = stop {
                stopped_early = Some(reason);
                break;
            }
        }
        #[cfg(feature = "cuda")]
        if let Some(engine) = &engine {
            graph_status = engine.status();
        }
        if graph_status == GraphStatus::Unknown {
            graph_status = GraphStatus::Off("no step ran".into());
        }
        let step = st.step;
        if !self.device.is_cpu() {
            // Waiting for the device's queue to drain before the trace ends.
            prof.switch(Action::HostSync);
        }
        let wall_traced = trace_start.elapsed().as_secs_f64();
        #[allow(unused_mut)]
        let mut gpu_busy = trace.finish(&self.device, step);
        // Without kernel records, a replayed graph's event times stand in.
        #[cfg(feature = "cuda")]
        if let (Some(Err(why)), Some(engine)) = (&gpu_busy, &engine) {
            if let Some(b) = engine.replay_busy(wall_traced, step, why) {
                gpu_busy = Some(Ok(b));
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = wall_traced;
        match &gpu_busy {
            Some(Ok(g)) => self.gpu_busy = Some(g.clone()),
            Some(Err(why)) => tracing::info!("GPU busy not measured: {why}"),
            None => {}
        }
        self.writer.wait();
        let ranks = self
            .strategy
            .gather_times(st.done.train_s, prof.category_seconds())?;
        let Done {
            logs,
            train_s,
            eval_s: eval_s_total,
            samples,
            early,
        } = std::mem::take(&mut st.done);
        let summary = FitSummary {
            epochs: logs.len(),
            steps: step,
            samples,
            train_s,
            eval_s: eval_s_total,
            wall_s: fit_start.elapsed().as_secs_f64(),
            samples_per_s: if train_s > 0.0 {
                samples as f64 / train_s
            } else {
                0.0
            },
            val: logs.last().and_then(|l| l.val.clone()),
            host_syncs_per_step: (self.reads.count() - reads_before) as f64 / step.max(1) as f64,
            epochs_log: logs,
            cuda_graph: graph_status,
            best: early.filter(|e| e.best_epoch > 0),
            stopped_early,
            checkpoints: self
                .checkpoints
                .is_some()
                .then(|| std::mem::take(&mut self.writer.log)),
            gpu_busy,
            matmul_precision: (!self.device.is_cpu()).then(redline_core::matmul_precision),
            gpu_conv: config::gpu_conv_ran(redline_kernels::fused_gpu::take_conv_ran()),
            ranks,
            // Read once, after the per-step count above.
            loss_scale: self.scaler.as_ref().map(|s| s.state()).transpose()?,
            memory: self.memory.take().map(|mut m| {
                m.optimizer = self.optimizer.state_bytes();
                m
            }),
        };
        prof.switch(Action::Logging);
        self.emit(&Event::FitEnd(&summary))?;
        Ok(summary)
    }

    /// Data-parallel start (PyTorch DDP's constructor): the training loader
    /// must be this rank's shard; every rank must run the same configuration
    /// on the same model and data (compared by an all-gather, the first
    /// difference named); rank 0's parameters and buffers are copied to all.
    fn join_ranks(&mut self, train: &Loader, batches_per_epoch: usize) -> Result<()> {
        if !self.strategy.is_distributed() {
            return Ok(());
        }
        let (rank, world) = (self.strategy.rank(), self.strategy.world_size());
        match train.sharding() {
            Some(s) if s.rank == rank && s.world == world => {}
            other => {
                return Err(Error::Config(format!(
                    "data-parallel rank {rank} of {world} was given a training loader {}\nHINT: \
                     shard it with `loader.shard(Shard {{ rank: {rank}, world: {world}, pad: \
                     true }})` (PyTorch's DistributedSampler)",
                    match other {
                        Some(s) => format!("sharded for rank {} of {}", s.rank, s.world),
                        None => "that is not sharded".to_string(),
                    }
                )))
            }
        }
        let mut text = format!(
            "model {}\nloop {:?}\noptimizer {:?}\ntraining samples {} (batch {}, {} batches an \
             epoch)\n",
            self.model_name,
            self.cfg,
            self.optimizer.config(),
            train.data_len(),
            train.config().batch_size,
            batches_per_epoch
        );
        for (name, var) in self.module.params().state() {
            text.push_str(&format!(
                "parameter {name} {:?} {:?}\n",
                var.as_tensor().dims(),
                var.as_tensor().dtype()
            ));
        }
        self.strategy
            .check_same("configurations, models or data", &text)?;
        self.strategy.broadcast_params(self.module.params())
    }

    /// One epoch of eagerly launched steps over the loader's batches
    /// (accumulating micro-batches when configured).
    fn eager_epoch(
        &mut self,
        train: &Loader,
        batches_per_epoch: usize,
        epoch: usize,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        // A resumed epoch continues at its batch `st.batch`.
        let mut batches = train.epoch_from(epoch - 1, st.batch);
        // Micro-batches this epoch, and since the last optimizer step.
        let (mut seen, mut pending) = (st.batch, 0usize);
        loop {
            // The step: batch, forward, loss, backward (N times when
            // accumulating), update. Each switch tells the profiler what
            // the loop does from here on.
            prof.switch(Action::DataWait);
            let Some(batch) = batches.next() else { break };
            let batch = batch?;
            seen += 1;
            self.micro_step(&batch, st, epoch_sums, prof)?;
            pending += 1;
            if pending < self.cfg.accumulate && seen < batches_per_epoch {
                continue;
            }
            pending = 0;
            self.optimizer_step(st, epoch_sums, prof)?;
            st.batch = seen;
            let done = match self.after_step(st, epoch, prof) {
                // A signal: the loop's state is written before the fit ends.
                Err(e @ Error::Interrupted { .. }) => {
                    self.stop_checkpoint(st, epoch, epoch_sums)?;
                    return Err(e);
                }
                other => other?,
            };
            if done {
                break;
            }
            self.step_checkpoint(st, epoch, epoch_sums)?;
        }
        Ok(())
    }

    /// Forward, loss and backward of one (micro-)batch, and its sums.
    fn micro_step(
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
        let loss_sum = batch_loss_sum(&out.loss, out.samples)?;
        epoch_sums.add(&loss_sum, out.samples, &out.metrics)?;
        st.window.add_loss(&loss_sum, out.samples)?;
        Ok(())
    }

    /// The memory split's forward side, at a fit's first step: the
    /// parameters, and the activations of `samples` samples (by the
    /// allocator on a GPU that reports it, where `before` is what was
    /// allocated before the forward; else by the graph's tensor sizes).
    fn measure_forward(
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
    fn optimizer_step(
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
            epoch_sums.add_extra(&m)?;
            st.window.add_extra(&m)?;
        }
        Ok(())
    }

    /// After an optimizer step: counts it, tells the callbacks, reads the
    /// window back at log points. `Ok(true)` once the fit has run its steps.
    fn after_step(
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
    fn apply_schedule(&mut self, st: &LoopState, epoch: usize) -> Result<()> {
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
    fn check_stop(&self, step: usize, epoch: usize) -> Result<()> {
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
    fn check_divergence(
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

    /// Back-propagates a micro-batch's loss into the parameters' gradients,
    /// divided by the accumulation count (Lightning's normalisation).
    /// With a loss scaler, the loss is scaled first (the same scale for
    /// every micro-batch of a step: it changes only at the update).
    fn backward(&self, loss: &candle_core::Tensor) -> Result<()> {
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
    fn update(&mut self) -> Result<Option<candle_core::Tensor>> {
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

    fn log_point(
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
            samples_per_s: if secs > 0.0 {
                samples as f64 / secs
            } else {
                f64::NAN
            },
            elapsed_s: fit_start.elapsed().as_secs_f64(),
        })
    }

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

/// What the loop carries from step to step across epochs.
struct LoopState {
    /// Optimizer steps taken.
    step: usize,
    /// Steps the fit will run.
    total_steps: usize,
    /// The first step's loss, read at the first log point (divergence).
    start_loss: Option<f64>,
    /// The first step's loss tensor, until it is read.
    first_loss: Option<candle_core::Tensor>,
    /// Sums since the last log point.
    window: Running,
    /// When the window started.
    window_start: Instant,
    /// When the fit started.
    fit_start: Instant,
    /// Epochs the fit will run.
    epochs: usize,
    /// Batches of the current epoch trained on.
    batch: usize,
    /// When the current epoch started (in this process).
    epoch_start: Instant,
    /// Seconds the current epoch trained before a resume.
    epoch_s_before: f64,
    /// The finished epochs.
    done: Done,
}

/// What the finished epochs add up to (restored on resume).
#[derive(Default)]
struct Done {
    /// Their logs.
    logs: Vec<EpochLog>,
    /// Training seconds.
    train_s: f64,
    /// Validation seconds.
    eval_s: f64,
    /// Training samples.
    samples: usize,
    /// The early stop's standing.
    early: Option<EarlyStopState>,
}

/// Refuses a step output the loop cannot use (host-side shape checks only).
fn checked(out: StepOutput) -> Result<StepOutput> {
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

fn check_finite(loss: f64, step: usize, epoch: usize, lr: f64) -> Result<()> {
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
