//! The trainer's side of checkpoints: snapshots of the loop's state taken
//! between steps, handed to a background writer so that the loop does not
//! wait for the disk, and a resume that puts every piece back.

use std::path::PathBuf;
use std::thread::JoinHandle;

use serde::Serialize;

use crate::checkpoint::{self, host_copy, CheckpointConfig, CheckpointMeta, Loaded, Snapshot};
use crate::early_stop::epoch_metric;
use crate::error::{Error, Result};
use crate::events::EpochLog;
use crate::optim::OptimizerState;
use crate::running::Running;

use super::{LoopState, Trainer};

/// What the fit's checkpoints came to (in [`crate::FitSummary`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckpointLog {
    /// Checkpoints written.
    pub written: usize,
    /// The newest one written.
    pub last: Option<PathBuf>,
    /// The best by the monitored metric: `(step, value)`.
    pub best: Option<(usize, f64)>,
    /// Each checkpoint that failed (a full disk), and why; the previous
    /// ones were kept.
    pub failed: Vec<String>,
    /// The checkpoint of a fit stopped by a signal ([`crate::Error::Interrupted`]):
    /// its folder, or why it could not be written; `None` where the stop
    /// wrote none (no checkpoints configured, or a stop during a test pass).
    #[serde(skip)]
    pub stop: Option<std::result::Result<PathBuf, String>>,
}

/// Writes snapshots on a background thread, one at a time.
#[derive(Default)]
pub(crate) struct Writer {
    pending: Option<JoinHandle<Result<PathBuf>>>,
    pub(crate) log: CheckpointLog,
}

impl Writer {
    /// Starts writing `snap` once the previous write has finished.
    fn submit(&mut self, cfg: &CheckpointConfig, snap: Snapshot) {
        self.wait();
        let (dir, keep) = (cfg.dir.clone(), cfg.keep_last);
        let best = self.log.best.map(|(step, _)| step);
        let spawned = std::thread::Builder::new()
            .name("redline-checkpoint".into())
            .spawn(move || {
                let path = checkpoint::write(&dir, snap)?;
                checkpoint::prune(&dir, keep, best)?;
                Ok(path)
            });
        match spawned {
            Ok(h) => self.pending = Some(h),
            Err(e) => self.failed(format!("the writer thread could not start: {e}")),
        }
    }

    /// Waits for the write in flight and records how it went.
    pub(crate) fn wait(&mut self) {
        let Some(h) = self.pending.take() else { return };
        match h.join() {
            Ok(Ok(path)) => {
                self.log.written += 1;
                self.log.last = Some(path);
            }
            Ok(Err(e)) => self.failed(e.to_string()),
            Err(_) => self.failed("the writer thread panicked".into()),
        }
    }

    fn failed(&mut self, why: String) {
        let kept = match &self.log.last {
            Some(p) => format!("the previous checkpoint {} is kept", p.display()),
            None => "no earlier checkpoint of this run exists".into(),
        };
        let line = format!("{why} ({kept})");
        tracing::warn!("checkpoint failed: {line}");
        self.log.failed.push(line);
    }
}

impl Trainer {
    /// A snapshot of the loop after `st.step` steps: the next batch is batch
    /// `batch` of epoch `epoch` (1-based), `sums` the epoch's so far (`None`
    /// at an epoch boundary).
    pub(super) fn snapshot(
        &self,
        st: &LoopState,
        epoch: usize,
        batch: usize,
        sums: Option<&Running>,
        monitor: Option<f64>,
    ) -> Result<Snapshot> {
        let Some(cfg) = &self.checkpoints else {
            return Err(Error::Config("no checkpoint folder was configured".into()));
        };
        let params = self.module.params();
        let weights = params
            .state()
            .map(|(n, v)| Ok((n.to_string(), host_copy(v.as_tensor())?)))
            .collect::<Result<Vec<_>>>()?;
        let OptimizerState { steps, lr, buffers } = self.optimizer.state()?;
        let (epoch_sums, window) = match sums {
            Some(s) => (s.state(&self.reads)?, st.window.state(&self.reads)?),
            None => Default::default(),
        };
        let start_loss = match (st.start_loss, &st.first_loss) {
            (Some(v), _) => Some(v),
            (None, Some(t)) => Some(f64::from(
                self.reads
                    .scalar::<f32>(&t.to_dtype(candle_core::DType::F32)?)?,
            )),
            (None, None) => None,
        };
        let meta = CheckpointMeta {
            format: checkpoint::FORMAT,
            step: st.step,
            epoch,
            batch,
            identity: cfg.identity.clone(),
            params: params
                .state()
                .map(|(n, v)| (n.to_string(), v.as_tensor().dims().to_vec()))
                .collect(),
            optimizer_steps: steps,
            lr,
            start_loss,
            epoch_sums,
            window,
            epoch_s: match sums {
                Some(_) => st.epoch_start.elapsed().as_secs_f64() + st.epoch_s_before,
                None => 0.0,
            },
            logs: st.done.logs.clone(),
            train_s: st.done.train_s,
            eval_s: st.done.eval_s,
            samples: st.done.samples,
            early_stop: st.done.early.clone(),
            rng: self
                .module
                .rng_state()
                .iter()
                .map(u128::to_string)
                .collect(),
            monitor,
            scaler: self.scaler.as_ref().map(|s| s.state()).transpose()?,
            written_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            files: Vec::new(),
        };
        Ok(Snapshot {
            meta,
            weights,
            optimizer: buffers,
        })
    }

    /// Mid-epoch: a checkpoint every `--checkpoint-every` steps.
    pub(super) fn step_checkpoint(
        &mut self,
        st: &LoopState,
        epoch: usize,
        sums: &Running,
    ) -> Result<()> {
        let Some(every) = self.checkpoints.as_ref().and_then(|c| c.every) else {
            return Ok(());
        };
        if st.step.is_multiple_of(every) {
            let snap = self.snapshot(st, epoch, st.batch, Some(sums), None)?;
            self.submit(snap);
        }
        Ok(())
    }

    /// An epoch that `--max-steps` ends before its last batch: a snapshot of
    /// the loop where it stopped (the epoch's sums, the finished epochs'
    /// logs), taken before the epoch's end is logged, so that a resume with
    /// more steps continues this epoch's batches in their order. `None`
    /// without checkpoints.
    pub(super) fn cut_snapshot(
        &self,
        st: &LoopState,
        epoch: usize,
        sums: &Running,
    ) -> Result<Option<Snapshot>> {
        if self.checkpoints.is_none() {
            return Ok(None);
        }
        self.snapshot(st, epoch, st.batch, Some(sums), None)
            .map(Some)
    }

    /// At an epoch's end (its validation and early stop done): a checkpoint
    /// that resumes at the next epoch, with the monitored value of `log`;
    /// or, for an epoch `--max-steps` cut short, `cut` ([`Self::cut_snapshot`])
    /// with that value, which resumes inside the epoch.
    pub(super) fn epoch_checkpoint(
        &mut self,
        st: &LoopState,
        log: &EpochLog,
        cut: Option<Snapshot>,
    ) -> Result<()> {
        let Some(cfg) = &self.checkpoints else {
            return Ok(());
        };
        let every_epoch = cfg.every.is_none();
        let monitor = cfg.monitor.as_ref().and_then(|(name, mode)| {
            let v = epoch_metric(log, name)?;
            Some((v, *mode))
        });
        if let Some((v, mode)) = monitor.filter(|(v, _)| v.is_finite()) {
            let better = self
                .writer
                .log
                .best
                .is_none_or(|(_, best)| mode.improves(v, best, 0.0));
            if better {
                self.writer.log.best = Some((st.step, v));
            }
        }
        // With a step interval, an epoch end checkpoints only when it is the
        // best so far (or the interval falls there).
        let best_now = self.writer.log.best.is_some_and(|(s, _)| s == st.step);
        if let Some(mut snap) = cut {
            // The fit's last position is always kept, whatever the interval.
            snap.meta.monitor = monitor.map(|m| m.0);
            self.submit(snap);
        } else if every_epoch || best_now {
            let snap = self.snapshot(st, log.epoch + 1, 0, None, monitor.map(|m| m.0))?;
            self.submit(snap);
        }
        Ok(())
    }

    /// After a signal: a checkpoint of where the loop stopped, written
    /// before the fit returns.
    pub(super) fn stop_checkpoint(
        &mut self,
        st: &LoopState,
        epoch: usize,
        sums: &Running,
    ) -> Result<()> {
        if self.checkpoints.is_none() {
            return Ok(());
        }
        // A periodic write still in flight is recorded first, as its own.
        self.writer.wait();
        let failures = self.writer.log.failed.len();
        let snap = self.snapshot(st, epoch, st.batch, Some(sums), None)?;
        self.submit(snap);
        self.writer.wait();
        let log = &mut self.writer.log;
        log.stop = Some(match (log.failed.get(failures), &log.last) {
            (Some(why), _) => Err(why.clone()),
            (None, Some(path)) => Ok(path.clone()),
            (None, None) => Err("the writer recorded nothing (internal)".into()),
        });
        Ok(())
    }

    fn submit(&mut self, snap: Snapshot) {
        if let Some(cfg) = &self.checkpoints {
            self.writer.submit(cfg, snap);
        }
    }

    /// Puts a checkpoint's weights, optimizer state and loop position back:
    /// the next [`Trainer::fit`] continues where that run was, with the same
    /// losses and weights, bit for bit, as a run never stopped (same
    /// machine, threads and device).
    pub fn resume_from(&mut self, loaded: Loaded) -> Result<()> {
        loaded
            .meta
            .check_max_steps(self.cfg.max_steps)
            .map_err(|message| Error::Checkpoint {
                path: loaded.dir.clone(),
                message,
            })?;
        let weights_path = loaded.dir.join(checkpoint::WEIGHTS);
        self.module
            .params()
            .assign(&loaded.weights, &weights_path)?;
        self.optimizer
            .load_state(&OptimizerState {
                steps: loaded.meta.optimizer_steps,
                lr: loaded.meta.lr,
                buffers: loaded.optimizer,
            })
            .map_err(|e| Error::Checkpoint {
                path: loaded.dir.join(checkpoint::OPTIMIZER),
                message: e.to_string(),
            })?;
        let rng = loaded
            .meta
            .rng
            .iter()
            .map(|s| s.parse::<u128>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Checkpoint {
                path: loaded.dir.join(checkpoint::STATE),
                message: format!("`rng`: not a stream position: {e}"),
            })?;
        self.module.load_rng_state(&rng)?;
        if let (Some(s), Some(st)) = (self.scaler.as_mut(), &loaded.meta.scaler) {
            s.load_state(st).map_err(|e| Error::Checkpoint {
                path: loaded.dir.join(checkpoint::STATE),
                message: e.to_string(),
            })?;
        }
        self.resume = Some((loaded.dir, loaded.meta));
        Ok(())
    }
}
