//! The graph-mode epoch (CUDA builds): the training step run eagerly for
//! [`WARMUP_STEPS`] steps, captured once as a CUDA graph, then replayed.
//! With the split on the device, a [`DeviceCursor`] inside the step draws
//! each batch; with streaming data, each full batch the loader delivers is
//! copied into two static buffers that the captured step reads (one copy
//! kernel before each replay, ordered on the compute stream after the
//! loader's own copy). docs/cuda-graphs.md has the rules a captured step
//! follows; `crate::graph::eligibility` checked them before the fit started.

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
use candle_core::cuda_backend::CudaDevice;
use candle_core::{Tensor, Var};
use redline_core::cuda::EventTimer;
use redline_core::Device;
use redline_data::{Batch, DeviceCursor, Loader, Split};
use redline_profile::{Action, GpuBusy, Profiler};

use super::{LoopState, Trainer};
use crate::error::{Error, Result};
use crate::graph::{GraphStatus, WARMUP_STEPS};
use crate::running::{Running, Tally};

/// Event tags of the replay timer: a replay, and the time between replays.
const REPLAY: usize = 0;
const BETWEEN: usize = 1;

/// Where the captured step's batch comes from.
enum Source {
    /// The cursor over the resident split, advanced on the device.
    Resident { cursor: DeviceCursor, split: Split },
    /// Static buffers each streamed full batch is copied into (made at the
    /// first full batch).
    Streaming { statics: Option<(Var, Var)> },
}

/// The step to run: the cursor's next batch, or the static buffers' one.
#[derive(Clone, Copy)]
enum Next {
    Cursor(usize),
    Static(usize),
}

/// A fit's graph: where its batches come from, and once captured, the graph
/// and what one replay adds to the host-side counts.
pub(super) struct Engine {
    source: Source,
    cuda: CudaDevice,
    graph: Option<Captured>,
    /// Eager steps run so far.
    warm: usize,
    /// Why the capture failed; the fit then stays eager.
    failed: Option<String>,
    /// Events around each replay, where no kernel trace measures GPU busy.
    replay_timer: Option<EventTimer>,
    /// Device milliseconds of the replays timed so far.
    replay_ms: f64,
}

struct Captured {
    graph: CudaGraph,
    /// One step's counts in the epoch sums and in the window.
    tally: (Tally, Tally),
    captured_at: usize,
    replays: usize,
    /// The graph's node count, when the driver said.
    nodes: Option<usize>,
}

/// How many nodes `graph` holds (`cuGraphGetNodes`), or `None` if the
/// driver would not say.
fn node_count(graph: &CudaGraph) -> Option<usize> {
    let mut n = 0usize;
    // SAFETY: a null node array asks only for the count; the graph is live.
    let r = unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut n) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(n)
}

impl Engine {
    /// The engine for `train` on `device`: a cursor over a resident split,
    /// or static buffers for streamed batches.
    pub(super) fn new(train: &Loader, device: &Device) -> Result<Self> {
        let candle_core::Device::Cuda(cuda) = device.candle() else {
            return Err(Error::Config(format!(
                "graph mode needs a CUDA device, not {device}"
            )));
        };
        let source = match train.resident() {
            Some(split) => Source::Resident {
                cursor: DeviceCursor::new(split.len(), train.config().batch_size, device.candle())?,
                split: split.clone(),
            },
            None => Source::Streaming { statics: None },
        };
        Ok(Self {
            source,
            cuda: cuda.clone(),
            graph: None,
            warm: 0,
            failed: None,
            replay_timer: None,
            replay_ms: 0.0,
        })
    }

    /// Times every later replay with CUDA events: GPU busy where the kernel
    /// trace is missing (see [`GpuBusy::from_replays`]).
    pub(super) fn time_replays(&mut self) {
        self.replay_timer = Some(EventTimer::new(&self.cuda));
    }

    /// Adds the replays timed since the last call (waits for the device to
    /// reach the last of them: at log points only).
    pub(super) fn collect_replay_time(&mut self) -> Result<()> {
        if let Some(t) = &mut self.replay_timer {
            let timed = t.drain()?;
            self.replay_ms += timed
                .iter()
                .filter(|(tag, _)| *tag == REPLAY)
                .map(|(_, ms)| ms)
                .sum::<f64>();
        }
        Ok(())
    }

    /// GPU busy from the timed replays over `wall_s`, when they were timed.
    pub(super) fn replay_busy(&self, wall_s: f64, steps: usize, why: &str) -> Option<GpuBusy> {
        let replays = self.graph.as_ref().map_or(0, |c| c.replays) as u64;
        self.replay_timer
            .as_ref()
            .filter(|_| replays > 0)
            .map(|_| GpuBusy::from_replays(self.replay_ms / 1e3, replays, wall_s, steps, why))
    }

    /// What happened, for the summary.
    pub(super) fn status(&self) -> GraphStatus {
        match (&self.graph, &self.failed) {
            (Some(c), _) => GraphStatus::Replayed {
                captured_at: c.captured_at,
                replays: c.replays,
                nodes: c.nodes,
            },
            (None, Some(why)) => GraphStatus::Failed(why.clone()),
            (None, None) => GraphStatus::Off(format!(
                "the fit ended within the {WARMUP_STEPS} eager warm-up steps"
            )),
        }
    }
}

impl Trainer {
    /// One epoch in graph mode: the full batches (eager warm-up, one
    /// capture, replays), then the shorter last batch eagerly.
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
                cursor.start_epoch(&train.order(epoch - 1))?;
                cursor.full_batches()
            }
            Source::Streaming { .. } => {
                return self.streaming_graph_epoch(engine, train, epoch, st, epoch_sums, prof);
            }
        };
        for index in 0..full {
            self.graph_step(engine, Next::Cursor(index), st, epoch_sums, prof)?;
            if self.after_step(st, epoch, prof)? {
                return Ok(());
            }
        }
        if let Source::Resident { cursor, split } = &engine.source {
            let Some((x, y)) = cursor.rest(split)? else {
                return Ok(());
            };
            let batch = Batch { x, y, index: full };
            self.micro_step(&batch, st, epoch_sums, prof)?;
            self.optimizer_step(st, epoch_sums, prof)?;
            self.after_step(st, epoch, prof)?;
        }
        Ok(())
    }

    /// A graph-mode epoch over streamed batches: each full batch is copied
    /// into the static buffers, then the step runs (warm-up, capture or
    /// replay); a shorter batch runs eagerly on its own tensors.
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
        let mut batches = train.epoch(epoch - 1);
        loop {
            prof.switch(Action::DataWait);
            let Some(batch) = batches.next() else { break };
            let batch = batch?;
            if batch.size() != size {
                self.micro_step(&batch, st, epoch_sums, prof)?;
                self.optimizer_step(st, epoch_sums, prof)?;
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
                self.graph_step(engine, Next::Static(batch.index), st, epoch_sums, prof)?;
            }
            if self.after_step(st, epoch, prof)? {
                break;
            }
        }
        Ok(())
    }

    /// One full-batch step in graph mode: a replay once captured, an eager
    /// warm-up step before, or the capture.
    fn graph_step(
        &mut self,
        engine: &mut Engine,
        next: Next,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        if let Some(c) = &mut engine.graph {
            prof.switch(Action::TrainingStep);
            self.optimizer.before_replay()?;
            if let Some(t) = &mut engine.replay_timer {
                t.mark(REPLAY)?;
            }
            c.graph
                .launch()
                .map_err(|e| Error::Config(format!("CUDA graph replay: {e}")))?;
            if let Some(t) = &mut engine.replay_timer {
                t.mark(BETWEEN)?;
            }
            epoch_sums.recount(&c.tally.0)?;
            st.window.recount(&c.tally.1)?;
            c.replays += 1;
        } else if engine.failed.is_some() || engine.warm < WARMUP_STEPS {
            // Warm-up fills candle's host-to-device cache for the capture.
            let _cache = engine
                .failed
                .is_none()
                .then(|| engine.cuda.enable_cuda_graph_htod_cache());
            self.run_step(&engine.source, next, st, epoch_sums, prof)?;
            engine.warm += 1;
        } else {
            prof.switch(Action::TrainingStep);
            self.capture(engine, next, st, epoch_sums, prof)?;
        }
        Ok(())
    }

    /// The step of `next`: from the cursor, or from the static buffers.
    fn run_step(
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
                self.micro_step(&batch, st, epoch_sums, prof)?;
                self.optimizer_step(st, epoch_sums, prof)
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
        self.micro_step(&batch, st, epoch_sums, prof)?;
        self.optimizer_step(st, epoch_sums, prof)?;
        cursor.advance()?;
        Ok(())
    }

    /// Captures one step and runs it by launching the graph; on failure,
    /// undoes the host-side counts of the step that never ran, runs it
    /// eagerly, and stays eager.
    fn capture(
        &mut self,
        engine: &mut Engine,
        next: Next,
        st: &mut LoopState,
        epoch_sums: &mut Running,
        prof: &mut Profiler,
    ) -> Result<()> {
        self.optimizer.sync_lr()?;
        let before = (epoch_sums.tally(), st.window.tally());
        let host_steps = self.optimizer.steps();
        let stream = engine.cuda.cuda_stream();
        let captured = {
            let _cache = engine.cuda.enable_cuda_graph_htod_cache();
            // No profiler switch inside: its device clock records events.
            let mut quiet = Profiler::new(redline_profile::Mode::Off, "capture");
            match stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) {
                Err(e) => Err(format!("begin capture: {e}")),
                Ok(()) => {
                    let stepped = self.run_step(&engine.source, next, st, epoch_sums, &mut quiet);
                    let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
                    match (stepped, ended) {
                        (Ok(()), Ok(Some(graph))) => Ok(graph),
                        (Err(e), _) => Err(e.to_string()),
                        (_, Err(e)) => Err(format!("end capture: {e}")),
                        (Ok(()), Ok(None)) => Err("the capture recorded nothing".into()),
                    }
                }
            }
        };
        match captured {
            Ok(graph) => {
                let after = (epoch_sums.tally(), st.window.tally());
                let tally = (after.0.since(&before.0)?, after.1.since(&before.1)?);
                // Capturing records the step; launching runs it.
                graph
                    .launch()
                    .map_err(|e| Error::Config(format!("CUDA graph launch: {e}")))?;
                let nodes = node_count(&graph);
                engine.graph = Some(Captured {
                    graph,
                    tally,
                    captured_at: st.step + 1,
                    replays: 1,
                    nodes,
                });
            }
            Err(why) => {
                // Buffers dropped inside the failed capture stored their
                // errors in the context (cudarc records errors from `Drop`),
                // and the next operation would return them: clear them, so
                // the eager step below runs (the context itself is usable).
                let why = match stream.context().check_err() {
                    Ok(()) => why,
                    Err(e) => format!("{why}; also, during the capture: {e}"),
                };
                tracing::warn!("CUDA graph capture failed, running eagerly: {why}");
                epoch_sums.restore(&before.0)?;
                st.window.restore(&before.1)?;
                self.optimizer.rewind(host_steps);
                engine.failed = Some(why);
                self.run_step(&engine.source, next, st, epoch_sums, prof)?;
            }
        }
        Ok(())
    }
}

/// The cursor's batch: with the fused kernels on a GPU, one launch
/// (`redline_kernels::cuda::cursor_gather`), else candle's ops (five
/// launches on a GPU).
fn draw(cursor: &DeviceCursor, split: &Split) -> Result<(Tensor, Tensor)> {
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
