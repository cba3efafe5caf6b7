//! Graph mode on a GPU (CUDA builds): the step that cursor_run.rs drives,
//! run eagerly for [`WARMUP_STEPS`] steps, captured once as a CUDA graph,
//! then replayed; a capture that fails leaves the fit eager and says why.

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
use candle_core::cuda_backend::CudaDevice;
use redline_core::cuda::EventTimer;
use redline_core::Device;
use redline_profile::{Action, GpuBusy, Profiler};

use super::cursor_run::{Next, Source};
use super::{LoopState, Trainer};
use crate::error::{Error, Result};
use crate::graph::{GraphNodes, GraphStatus, WARMUP_STEPS};
use crate::running::{Running, Tally};

/// Event tags of the replay timer: a replay, and the time between replays.
const REPLAY: usize = 0;
const BETWEEN: usize = 1;

/// A fit's graph: its warm-up count, and once captured, the graph and what
/// one replay adds to the host-side counts.
pub(super) struct Graph {
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
    /// The graph's nodes by kind, when the driver said.
    nodes: Option<GraphNodes>,
}

/// `graph`'s nodes by kind, or `None` if the driver would not say.
fn graph_nodes(graph: &CudaGraph) -> Option<GraphNodes> {
    redline_kernels::cuda::graph_node_kinds(graph)
        .map(|(n, kinds)| GraphNodes::from_kinds(n, kinds))
}

impl Graph {
    /// A graph yet to be captured, on `device`.
    pub(super) fn new(device: &Device) -> Result<Self> {
        let candle_core::Device::Cuda(cuda) = device.candle() else {
            return Err(Error::Config(format!(
                "graph mode needs a CUDA device, not {device}"
            )));
        };
        Ok(Self {
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
    /// One full-batch step in graph mode: a replay once captured, an eager
    /// warm-up step before, or the capture.
    pub(super) fn graph_step(
        &mut self,
        engine: &mut Graph,
        source: &Source,
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
            self.run_step(source, next, st, epoch_sums, prof)?;
            engine.warm += 1;
        } else {
            prof.switch(Action::TrainingStep);
            self.capture(engine, source, next, st, epoch_sums, prof)?;
        }
        Ok(())
    }

    /// Captures one step and runs it by launching the graph; on failure,
    /// undoes the host-side counts of the step that never ran, runs it
    /// eagerly, and stays eager.
    fn capture(
        &mut self,
        engine: &mut Graph,
        source: &Source,
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
                    let stepped = self.run_step(source, next, st, epoch_sums, &mut quiet);
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
                let nodes = graph_nodes(&graph);
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
                self.run_step(source, next, st, epoch_sums, prof)?;
            }
        }
        Ok(())
    }
}
