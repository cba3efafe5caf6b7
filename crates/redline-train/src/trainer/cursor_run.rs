//! The loop of a fit whose step could be captured: with the split on the
//! device, a [`DeviceCursor`] inside the step draws each batch; with streaming
//! data, each full batch the loader delivers is copied into two static
//! buffers that the step reads. On a GPU the step is captured once as a CUDA
//! graph and replayed (graph_run.rs); without one
//! ([`super::TrainerBuilder::cursor_steps`]) the same steps run eagerly, so
//! this loop's positions, checkpoints, stops and resumes are tested on any
//! machine. docs/cuda-graphs.md has the rules a captured step follows;
//! `crate::graph::eligibility` checked them before the fit started.

use candle_core::{Tensor, Var};
use redline_core::Device;
use redline_data::{Batch, DeviceCursor, Loader, Split};
use redline_profile::{Action, GpuBusy, Profiler};

use super::{LoopState, Trainer};
use crate::error::{Error, Result};
use crate::graph::GraphStatus;
use crate::running::Running;

/// Where the step's batch comes from.
pub(super) enum Source {
    /// The cursor over the resident split, advanced on the device.
    Resident { cursor: DeviceCursor, split: Split },
    /// Static buffers each streamed full batch is copied into (made at the
    /// first full batch).
    Streaming { statics: Option<(Var, Var)> },
}

/// The step to run: the cursor's next batch, or the static buffers' one.
#[derive(Clone, Copy)]
pub(super) enum Next {
    Cursor(usize),
    Static(usize),
}

/// A fit's batch source and, on a GPU, its CUDA graph.
pub(super) struct Engine {
    pub(super) source: Source,
    /// Warm-up, capture and replays; `None` runs every step eagerly.
    #[cfg(feature = "cuda")]
    pub(super) graph: Option<super::graph_run::Graph>,
}

impl Engine {
    /// The engine for `train` on `device`: a cursor over a resident split,
    /// or static buffers for streamed batches; `capture` captures the step
    /// (a CUDA device and build).
    pub(super) fn new(train: &Loader, device: &Device, capture: bool) -> Result<Self> {
        let source = match train.resident() {
            Some(split) => Source::Resident {
                cursor: DeviceCursor::new(split.len(), train.config().batch_size, device.candle())?,
                split: split.clone(),
            },
            None => Source::Streaming { statics: None },
        };
        #[cfg(feature = "cuda")]
        let graph = match capture {
            true => Some(super::graph_run::Graph::new(device)?),
            false => None,
        };
        #[cfg(not(feature = "cuda"))]
        if capture {
            return Err(Error::Config(format!(
                "graph mode needs a CUDA build and device, not {device}"
            )));
        }
        Ok(Self {
            source,
            #[cfg(feature = "cuda")]
            graph,
        })
    }

    /// Times every later replay with CUDA events (where no kernel trace
    /// measures GPU busy).
    pub(super) fn time_replays(&mut self) {
        #[cfg(feature = "cuda")]
        if let Some(g) = &mut self.graph {
            g.time_replays();
        }
    }

    /// Adds the replays timed since the last call (a device wait: at epoch
    /// ends only).
    pub(super) fn collect_replay_time(&mut self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &mut self.graph {
            g.collect_replay_time()?;
        }
        Ok(())
    }

    /// GPU busy from the timed replays over `wall_s`, when they were timed.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub(super) fn replay_busy(&self, wall_s: f64, steps: usize, why: &str) -> Option<GpuBusy> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.graph {
            return g.replay_busy(wall_s, steps, why);
        }
        None
    }

    /// What happened to the capture, for the summary; `None` where nothing
    /// was to be captured.
    pub(super) fn status(&self) -> Option<GraphStatus> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.graph {
            return Some(g.status());
        }
        None
    }
}

impl Trainer {
    /// One epoch of the capturable step: the full batches (on a GPU: eager
    /// warm-up, one capture, replays) from the loop's position `st.batch`,
    /// then the shorter last batch eagerly.
    pub(super) fn graph_epoch(
        &mut self,
        engine: &mut Engine,
        train: &Loader,
        epoch: usize,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        let full = match &mut engine.source {
            Source::Resident { cursor, .. } => {
                // A resumed epoch continues at its batch `st.batch` (past the
                // full batches when only the epoch's end was left to run).
                let full = cursor.full_batches();
                cursor.start_epoch_at(&train.order(epoch - 1), st.batch.min(full))?;
                full
            }
            Source::Streaming { .. } => {
                return self.streaming_graph_epoch(engine, train, epoch, st, epoch_sums, prof);
            }
        };
        for index in st.batch..full {
            self.engine_step(engine, Next::Cursor(index), st, epoch_sums, prof)?;
            st.batch = index + 1;
            if self.step_end(st, epoch, epoch_sums, prof)? {
                return Ok(());
            }
        }
        // The last, shorter batch, unless a resumed epoch had already run it.
        let rest = match (&engine.source, st.batch == full) {
            (Source::Resident { cursor, split }, true) => cursor.rest(split)?,
            _ => None,
        };
        if let Some((x, y)) = rest {
            let batch = Batch { x, y, index: full };
            self.whole_step(&batch, st, epoch_sums, prof)?;
            st.batch = full + 1;
            self.step_end(st, epoch, epoch_sums, prof)?;
        }
        Ok(())
    }

    /// A capturable epoch over streamed batches, from the loop's position
    /// `st.batch`: each full batch is copied into the static buffers, then
    /// the step runs (on a GPU: warm-up, capture or replay); a shorter batch
    /// runs eagerly on its own tensors.
    fn streaming_graph_epoch(
        &mut self,
        engine: &mut Engine,
        train: &Loader,
        epoch: usize,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        let size = train.config().batch_size;
        let mut batches = train.epoch_from(epoch - 1, st.batch);
        loop {
            prof.switch(Action::DataWait);
            let Some(batch) = batches.next() else { break };
            let batch = batch?;
            if batch.size() != size {
                self.whole_step(&batch, st, epoch_sums, prof)?;
            } else {
                prof.switch(Action::Transfer);
                if let Source::Streaming { statics } = &mut engine.source {
                    match statics {
                        Some((x, y)) => {
                            x.set(&batch.x)?;
                            y.set(&batch.y)?;
                        }
                        None => {
                            *statics = Some((
                                Var::from_tensor(&batch.x.copy()?)?,
                                Var::from_tensor(&batch.y.copy()?)?,
                            ));
                        }
                    }
                }
                self.engine_step(engine, Next::Static(batch.index), st, epoch_sums, prof)?;
            }
            st.batch += 1;
            if self.step_end(st, epoch, epoch_sums, prof)? {
                break;
            }
        }
        Ok(())
    }

    /// One full-batch step: on a GPU, through the graph (warm-up, capture
    /// or replay); else eagerly.
    fn engine_step(
        &mut self,
        engine: &mut Engine,
        next: Next,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(g) = engine.graph.as_mut() {
            return self.graph_step(g, &engine.source, next, st, epoch_sums, prof);
        }
        self.run_step(&engine.source, next, st, epoch_sums, prof)
    }

    /// The step of `next`, launched eagerly: from the cursor, or from the
    /// static buffers.
    pub(super) fn run_step(
        &mut self,
        source: &Source,
        next: Next,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        match (source, next) {
            (Source::Resident { cursor, split }, Next::Cursor(index)) => {
                self.cursor_step(cursor, split, index, st, epoch_sums, prof)
            }
            (
                Source::Streaming {
                    statics: Some((x, y)),
                },
                Next::Static(index),
            ) => {
                let batch = Batch {
                    x: x.as_tensor().clone(),
                    y: y.as_tensor().clone(),
                    index,
                };
                self.whole_step(&batch, st, epoch_sums, prof)
            }
            _ => Err(Error::Config(
                "graph mode: a step without its batch source (internal)".into(),
            )),
        }
    }

    /// The step drawn by the cursor: gather, forward, backward, sums, update,
    /// and the cursor's advance, all device work with nothing read back.
    fn cursor_step(
        &mut self,
        cursor: &DeviceCursor,
        split: &Split,
        index: usize,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        prof.switch(Action::DataWait);
        let (x, y) = draw(cursor, split)?;
        let batch = Batch { x, y, index };
        self.whole_step(&batch, st, epoch_sums, prof)?;
        advance(cursor)
    }

    /// One batch's step and its update (graph mode takes no accumulation).
    fn whole_step(
        &mut self,
        batch: &Batch,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        self.micro_step(batch, st, epoch_sums, prof)?;
        self.optimizer_step(st, epoch_sums, prof)
    }
}

/// The cursor's batch: with the fused kernels on a GPU, one launch
/// (`redline_kernels::cuda::cursor_gather`), else candle's ops (five
/// launches on a GPU).
fn draw(cursor: &DeviceCursor, split: &Split) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if redline_kernels::fused_gpu::enabled() && split.len() == cursor.perm().elem_count() {
        if let Some(xy) = redline_kernels::cuda::cursor_gather(
            cursor.perm(),
            cursor.counter(),
            cursor.batch_size(),
            &split.x,
            &split.y,
        )? {
            return Ok(xy);
        }
    }
    Ok(cursor.gather(split)?)
}

/// The cursor's next batch number: with the fused kernels on a GPU, one
/// launch in place (`redline_kernels::cuda::count_up`), else candle's ops
/// (an add and a copy back).
fn advance(cursor: &DeviceCursor) -> Result<()> {
    #[cfg(feature = "cuda")]
    if redline_kernels::fused_gpu::enabled() && redline_kernels::cuda::count_up(cursor.counter())? {
        return Ok(());
    }
    Ok(cursor.advance()?)
}
