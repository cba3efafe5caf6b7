//! The trainer: fit, validate, test. Built by a by-value builder; the loop emits
//! [`Event`]s to callbacks and reads device values only at log points.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use redline_core::host::HostReads;
use redline_core::Device;
use redline_data::Loader;
use redline_models::Params;
use redline_profile::{Action, Mode, Profile, Profiler};

use crate::checkpoint::{CheckpointConfig, CheckpointMeta};
use crate::early_stop::EarlyStopState;
use crate::error::{Error, Result};
use crate::events::{Callback, EpochLog, Event, FitSummary};
use crate::graph::GraphStatus;
use crate::kernel_trace::KernelTrace;
use crate::optim::Optimizer;
use crate::running::Running;
use crate::step::TrainStep;
use crate::strategy::Strategy;

mod checkpointing;
mod config;
mod cursor_run;
mod evaluate;
#[cfg(feature = "cuda")]
mod graph_run;
mod monitored;
mod progress;
mod stepping;

use progress::check_finite;

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
    /// Graph mode's loop without a capture ([`TrainerBuilder::cursor_steps`]).
    cursor_steps: bool,
    /// The peak MFU is read against ([`TrainerBuilder::peak`]).
    peak: Option<crate::mfu::PeakResult>,
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

    /// The checkpoints this trainer wrote, the failed ones and, after a stop
    /// by a signal, that stop's own ([`CheckpointLog::stop`]).
    pub fn checkpoint_log(&self) -> &CheckpointLog {
        &self.writer.log
    }

    /// Stops the last fit's profiler and returns its tables and breakdown.
    pub fn finish_profile(&mut self) -> Option<Profile> {
        let mut p = self.profiler.take().map(Profiler::finish)?;
        p.breakdown.gpu = self.gpu_busy.take();
        Some(p)
    }

    /// Saves the model's weights (safetensors, PyTorch names), profiled as checkpointing.
    pub fn save_weights(&mut self, path: &std::path::Path) -> Result<()> {
        self.save_weights_with(path, &[])
    }

    /// [`Trainer::save_weights`] with string `metadata` in the file's header.
    pub fn save_weights_with(
        &mut self,
        path: &std::path::Path,
        metadata: &[(&str, &str)],
    ) -> Result<()> {
        self.after_fit(Action::Checkpointing, |t| {
            Ok(t.module.params().save_safetensors_with(path, metadata)?)
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
        self.check_watched(val.is_some() && self.cfg.validate)?;
        self.cfg.schedule.check_length(total_steps, epochs)?;
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
        // The capturable step's loop (cursor_run.rs): captured on a GPU, or
        // run eagerly where asked (`cursor_steps`, for tests of that loop).
        let cursor = plan.is_ok()
            || (self.cursor_steps
                && crate::graph::loop_eligibility(train, &self.cfg, self.module.as_ref()).is_ok());
        let mut engine = match cursor {
            true => Some(cursor_run::Engine::new(train, &self.device, plan.is_ok())?),
            false => None,
        };
        if let (Some(_), Err(why)) = (&engine, &plan) {
            graph_status = GraphStatus::Off(format!(
                "{why}; graph mode's loop ran uncaptured (cursor steps)"
            ));
        }
        // A captured step adds into the same buffers at every replay.
        let in_place = engine.is_some();
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
            if let Some(engine) = engine.as_mut() {
                self.graph_epoch(engine, train, epoch, &mut st, &mut epoch_sums, prof)?;
            } else {
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
            // `--max-steps` reached inside the epoch: its checkpoint resumes at
            // this batch with the epoch's shuffle, not at the next epoch.
            let cut = match st.step >= total_steps && st.batch < batches_per_epoch {
                true => self.cut_snapshot(&st, epoch, &epoch_sums)?,
                false => None,
            };
            // A loader that ended early leaves gradients no step took: drop
            // them rather than carry them into the next epoch.
            self.optimizer.zero_grad();
            prof.switch(Action::HostSync);
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
                    match self.validate(v) {
                        // A signal: the epoch's steps are all in a checkpoint
                        // that resumes at its end (this validation).
                        Err(Error::Interrupted { .. }) => {
                            self.stop_checkpoint(&st, epoch, &epoch_sums)?;
                            return Err(Error::Interrupted {
                                step: st.step,
                                epoch,
                            });
                        }
                        other => Some(other?),
                    }
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
            self.check_logged(&log)?;
            let stop = match (&self.cfg.early_stop, st.done.early.as_mut()) {
                (Some(es), Some(state)) => es.update(state, &log)?,
                _ => None,
            };
            st.done.logs.push(log.clone());
            self.epoch_checkpoint(&st, &log, cut)?;
            if let Some(reason) = stop {
                stopped_early = Some(reason);
                break;
            }
        }
        if let Some(status) = engine.as_ref().and_then(cursor_run::Engine::status) {
            graph_status = status;
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
        let mut gpu_busy = trace.finish(&self.device, step);
        // Without kernel records, a replayed graph's event times stand in.
        if let (Some(Err(why)), Some(engine)) = (&gpu_busy, &engine) {
            if let Some(b) = engine.replay_busy(wall_traced, step, why) {
                gpu_busy = Some(Ok(b));
            }
        }
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
            flops: self.flops_summary(samples, step, train_s),
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
            if self.step_end(st, epoch, epoch_sums, prof)? {
                break;
            }
        }
        Ok(())
    }

    /// After an optimizer step that left the loop at batch `st.batch`:
    /// [`Trainer::after_step`], then the periodic checkpoint; on a signal,
    /// the loop's state is written before the fit ends. `Ok(true)` once the
    /// fit has run its steps.
    fn step_end(
        &mut self,
        st: &mut LoopState,
        epoch: usize,
        epoch_sums: &Running,
        prof: &mut Profiler,
    ) -> Result<bool> {
        let done = match self.after_step(st, epoch, prof) {
            Err(e @ Error::Interrupted { .. }) => {
                self.stop_checkpoint(st, epoch, epoch_sums)?;
                return Err(e);
            }
            other => other?,
        };
        if !done {
            self.step_checkpoint(st, epoch, epoch_sums)?;
        }
        Ok(done)
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
