//! The main-loop profiler: the loop says what it is doing now ([`Profiler::switch`]),
//! and the time since the previous switch goes to the previous action.
//!
//! Attribution rule (exclusive by construction): at every instant the loop's
//! thread is in exactly one action or in none (idle), so action times never
//! overlap and, with idle, sum to the wall time. Work on other threads (the
//! prefetch thread assembling batches, the monitor) overlaps the loop and is not
//! counted; only the loop's wait for it is (data wait). On the CPU kernels run
//! synchronously, so an action's host time is its compute time. On a GPU the
//! same `switch` calls are where device events get recorded (issue 5): call
//! sites do not change, only what a switch records.
//!
//! Cost: one monotonic clock read per switch (about ten per step), always on,
//! because the breakdown is printed for every run. `simple` adds nothing to the
//! loop; `detailed` also records a trace span per switch and per layer.

use std::time::Instant;

use redline_core::trace;

use crate::action::{Action, Category, Mode};
use crate::breakdown::{Breakdown, Timeline};
use crate::report::{ActionRow, Profile};

/// Steps are grouped into at most this many timeline bins.
const MAX_BINS: usize = 400;
/// Per-step categories (idle is not per step).
const STEP_CATS: usize = 6;

/// A clock on the device's queue (CUDA events on a GPU). The profiler marks a
/// boundary at every switch, without waiting; at log points it drains the
/// marks: the device time between consecutive boundaries is charged to the
/// action the loop switched to at the earlier one. A phase whose device time
/// exceeds its host time is where the device, not the host, is the bottleneck.
pub trait DeviceClock: Send {
    /// Records a boundary; `None` when the loop pauses.
    fn mark(&mut self, action: Option<Action>) -> std::result::Result<(), String>;
    /// Waits for the last boundary and returns `(action, device ms)` for each
    /// interval since the previous drain.
    fn drain(&mut self) -> std::result::Result<Vec<(Option<Action>, f64)>, String>;
}

/// Times the training loop's actions. See the module docs for the rule.
pub struct Profiler {
    mode: Mode,
    start: Instant,
    current: Option<(Action, Instant)>,
    totals: [f64; Action::ALL.len()],
    calls: [u64; Action::ALL.len()],
    step_ms: [f64; STEP_CATS],
    timeline: Timeline,
    bin_ms: [f64; STEP_CATS],
    bin_first: usize,
    steps: usize,
    device: String,
    clock: Option<Box<dyn DeviceClock>>,
    device_s: [f64; Action::ALL.len()],
    /// `detailed`: the tracer this thread records into while the profiler lives.
    tracing: Option<(trace::Tracer, trace::Attached)>,
}

impl Profiler {
    /// Starts the clock. `detailed` attaches this thread to a
    /// [`redline_core::trace::Tracer`]: the one it is already attached to (so a
    /// caller that started helper threads on it sees them in the trace), else
    /// a new one. Nothing is switched on for other threads.
    pub fn new(mode: Mode, device: &str) -> Self {
        trace::name_thread("main loop");
        let tracing = (mode == Mode::Detailed).then(|| {
            let tracer = trace::current().unwrap_or_default();
            let attached = tracer.attach();
            (tracer, attached)
        });
        Self {
            mode,
            start: Instant::now(),
            current: None,
            totals: [0.0; Action::ALL.len()],
            calls: [0; Action::ALL.len()],
            step_ms: [0.0; STEP_CATS],
            timeline: Timeline {
                bin_steps: 1,
                rows: Vec::new(),
            },
            bin_ms: [0.0; STEP_CATS],
            bin_first: 1,
            steps: 0,
            device: device.to_string(),
            clock: None,
            device_s: [0.0; Action::ALL.len()],
            tracing,
        }
    }

    /// Also times each action on the device's queue with `clock`.
    pub fn with_device_clock(mut self, clock: Box<dyn DeviceClock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Reads the device clock back (a host wait for the device: call at log
    /// points only). A failing clock is reported once and detached.
    pub fn sync_device_clock(&mut self) {
        let Some(clock) = &mut self.clock else { return };
        match clock.drain() {
            Ok(intervals) => {
                for (a, ms) in intervals {
                    if let Some(a) = a {
                        self.device_s[a.index()] += ms * 1e-3;
                    }
                }
            }
            Err(e) => {
                tracing::warn!("device timing stopped: {e}");
                self.clock = None;
            }
        }
    }

    fn mark_device(&mut self, action: Option<Action>) {
        if let Some(clock) = &mut self.clock {
            if let Err(e) = clock.mark(action) {
                tracing::warn!("device timing stopped: {e}");
                self.clock = None;
            }
        }
    }

    /// The mode it was built with.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Sizes the timeline bins for a run of `total_steps` steps.
    pub fn plan(&mut self, total_steps: usize) {
        self.timeline.bin_steps = total_steps.div_ceil(MAX_BINS).max(1);
    }

    /// The loop now does `action`; the time since the last switch goes to the
    /// action it was doing.
    #[inline]
    pub fn switch(&mut self, action: Action) {
        let now = Instant::now();
        self.close(now);
        self.current = Some((action, now));
        self.mark_device(Some(action));
    }

    /// The loop now does nothing it owns (the time counts as idle).
    pub fn pause(&mut self) {
        self.close(Instant::now());
        self.mark_device(None);
    }

    fn close(&mut self, now: Instant) {
        if let Some((a, since)) = self.current.take() {
            let secs = now.saturating_duration_since(since).as_secs_f64();
            self.totals[a.index()] += secs;
            self.calls[a.index()] += 1;
            let cat = a.category().index();
            if cat < STEP_CATS {
                self.step_ms[cat] += secs * 1e3;
            }
            if self.mode == Mode::Detailed {
                trace::record("step", a.label(), since, now);
            }
        }
    }

    /// Marks the end of one optimizer step: its per-category times go to the timeline.
    pub fn end_step(&mut self) {
        self.steps += 1;
        for (b, s) in self.bin_ms.iter_mut().zip(&mut self.step_ms) {
            *b += *s;
            *s = 0.0;
        }
        if self.steps - self.bin_first + 1 >= self.timeline.bin_steps {
            self.flush_bin();
        }
    }

    fn flush_bin(&mut self) {
        let n = self.steps + 1 - self.bin_first;
        if n == 0 {
            return;
        }
        let mean = self.bin_ms.map(|v| v / n as f64);
        self.timeline.push(
            self.bin_first,
            self.steps,
            mean[0],
            mean[1],
            mean[2],
            mean[3],
            mean[4],
            mean[5],
        );
        self.bin_ms = [0.0; STEP_CATS];
        self.bin_first = self.steps + 1;
    }

    /// Seconds in each category so far, in [`Category::ALL`] order (idle:
    /// the wall time no action covered).
    pub fn category_seconds(&self) -> [f64; 7] {
        self.category_seconds_at(self.elapsed_s())
    }

    /// Seconds since the profiler started.
    pub fn elapsed_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Stops the clock and builds the tables, the breakdown and (detailed) the trace.
    pub fn finish(mut self) -> Profile {
        self.pause();
        let timed_on_device = self.clock.is_some();
        self.sync_device_clock();
        if self.steps + 1 > self.bin_first {
            self.flush_bin();
        }
        let wall_s = self.elapsed_s();
        let trace = self.tracing.take().map(|(tracer, attached)| {
            drop(attached);
            tracer.take()
        });
        let pct = |s: f64| {
            if wall_s > 0.0 {
                100.0 * s / wall_s
            } else {
                0.0
            }
        };
        let mut rows = Vec::new();
        let mut other = None;
        for a in Action::ALL {
            let (calls, total_s) = (self.calls[a.index()], self.totals[a.index()]);
            if calls == 0 {
                continue;
            }
            let row = ActionRow {
                action: a.label().to_string(),
                calls,
                mean_ms: 1e3 * total_s / calls as f64,
                total_s,
                percent: pct(total_s),
                device_s: timed_on_device.then_some(self.device_s[a.index()]),
            };
            if a == Action::Other {
                other = Some(row);
            } else {
                rows.push(row);
            }
        }
        let seconds = self.category_seconds_at(wall_s);
        let idle = seconds[Category::Idle.index()];
        if idle > 0.0 {
            rows.push(ActionRow {
                action: "idle (no action)".into(),
                calls: 0,
                mean_ms: 0.0,
                total_s: idle,
                percent: pct(idle),
                device_s: None,
            });
        }
        rows.extend(other);
        let breakdown = Breakdown::new(wall_s, self.steps, &self.device, seconds, self.timeline);
        let device_compute_percent = timed_on_device.then(|| {
            let compute: f64 = Action::ALL
                .iter()
                .filter(|a| a.category() == Category::Compute)
                .map(|a| self.device_s[a.index()])
                .sum();
            pct(compute)
        });
        Profile {
            device_compute_percent,
            mode: self.mode,
            wall_s,
            steps: self.steps,
            rows,
            breakdown,
            trace,
        }
    }

    fn category_seconds_at(&self, wall_s: f64) -> [f64; 7] {
        let mut out = [0.0; 7];
        for a in Action::ALL {
            out[a.category().index()] += self.totals[a.index()];
        }
        let busy: f64 = out.iter().sum();
        out[Category::Idle.index()] = (wall_s - busy).max(0.0);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::sleep;
    use std::time::Duration;

    #[test]
    fn actions_are_exclusive_and_sum_to_wall() {
        let mut p = Profiler::new(Mode::Simple, "cpu");
        p.plan(3);
        for _ in 0..3 {
            p.switch(Action::DataWait);
            sleep(Duration::from_millis(2));
            p.switch(Action::TrainingStep);
            sleep(Duration::from_millis(3));
            p.switch(Action::Logging);
            p.end_step();
        }
        p.pause();
        sleep(Duration::from_millis(2));
        let prof = p.finish();
        let sum: f64 = prof.rows.iter().map(|r| r.total_s).sum();
        assert!((sum - prof.wall_s).abs() < 1e-6, "{sum} vs {}", prof.wall_s);
        let cats: f64 = prof.breakdown.categories.iter().map(|c| c.seconds).sum();
        assert!((cats - prof.wall_s).abs() < 1e-6);
        let fwd = prof
            .rows
            .iter()
            .find(|r| r.action == "training_step")
            .map(|r| r.calls);
        assert_eq!(fwd, Some(3));
        assert!(prof.breakdown.seconds(Category::Compute) >= 0.009);
        assert!(prof.breakdown.seconds(Category::DataWait) >= 0.006);
        assert!(prof.breakdown.seconds(Category::Idle) >= 0.002);
        assert_eq!(prof.breakdown.timeline.rows.len(), 3);
        assert!(prof.breakdown.timeline.rows[0].compute_ms >= 3.0);
        assert!(prof.trace.is_none());
    }

    /// A clock whose device time per interval is scripted: the logic under
    /// test is the profiler's bookkeeping, not the clock.
    struct Scripted {
        marks: Vec<Option<Action>>,
        ms_per_interval: f64,
    }

    impl DeviceClock for Scripted {
        fn mark(&mut self, action: Option<Action>) -> std::result::Result<(), String> {
            self.marks.push(action);
            Ok(())
        }

        fn drain(&mut self) -> std::result::Result<Vec<(Option<Action>, f64)>, String> {
            let out = self
                .marks
                .windows(2)
                .map(|w| (w[0], self.ms_per_interval))
                .collect();
            let last = self.marks.pop();
            self.marks.clear();
            self.marks.extend(last);
            Ok(out)
        }
    }

    #[test]
    fn device_time_is_charged_to_the_action_switched_to() {
        let clock = Scripted {
            marks: Vec::new(),
            ms_per_interval: 2.0,
        };
        let mut p = Profiler::new(Mode::Simple, "cuda:0").with_device_clock(Box::new(clock));
        for step in 0..4 {
            p.switch(Action::DataWait);
            p.switch(Action::TrainingStep);
            p.switch(Action::Backward);
            if step % 2 == 1 {
                p.switch(Action::HostSync);
                p.sync_device_clock();
            }
            p.end_step();
        }
        let prof = p.finish();
        let dev = |name: &str| {
            prof.rows
                .iter()
                .find(|r| r.action == name)
                .and_then(|r| r.device_s)
        };
        // Every interval is 2 ms and each action opened 4 of them.
        assert_eq!(dev("training_step"), Some(0.008));
        assert_eq!(dev("backward"), Some(0.008));
        assert_eq!(dev("waiting for data"), Some(0.008));
        assert!(prof.device_compute_percent.is_some());
        assert!(prof.table().contains("Device ms"));
    }

    #[test]
    fn two_detailed_profilers_on_two_threads_keep_their_own_traces() {
        // As two trainers in one process (or two parallel tests): each trace
        // holds its own thread's kernels and none of the other's.
        let run = |op: &'static str| {
            std::thread::spawn(move || {
                let mut p = Profiler::new(Mode::Detailed, "cpu");
                for _ in 0..3 {
                    p.switch(Action::TrainingStep);
                    trace::count(op);
                    p.end_step();
                }
                let t = p.finish().trace.expect("detailed keeps a trace");
                assert!(!trace::detailed(), "finish detaches the thread");
                t
            })
        };
        let (a, b) = (run("op.a"), run("op.b"));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!(a.counts.iter().collect::<Vec<_>>(), [(&"op.a", &3)]);
        assert_eq!(b.counts.iter().collect::<Vec<_>>(), [(&"op.b", &3)]);
        let steps = |t: &trace::Trace| {
            t.spans
                .iter()
                .filter(|s| &*s.name == "training_step")
                .count()
        };
        assert_eq!((steps(&a), steps(&b)), (3, 3));
    }

    #[test]
    fn without_a_clock_nothing_is_device_timed() {
        let mut p = Profiler::new(Mode::Simple, "cpu");
        p.switch(Action::TrainingStep);
        let prof = p.finish();
        assert!(prof.rows.iter().all(|r| r.device_s.is_none()));
        assert_eq!(prof.device_compute_percent, None);
        assert!(!prof.table().contains("Device ms"));
    }

    #[test]
    fn timeline_bins_cover_every_step_once() {
        let mut p = Profiler::new(Mode::Off, "cpu");
        p.plan(1000);
        for _ in 0..999 {
            p.switch(Action::TrainingStep);
            p.end_step();
        }
        let prof = p.finish();
        let t = &prof.breakdown.timeline;
        assert_eq!(t.bin_steps, 3);
        assert_eq!(t.rows.first().map(|r| r.first_step), Some(1));
        assert_eq!(t.rows.last().map(|r| r.last_step), Some(999));
        for w in t.rows.windows(2) {
            assert_eq!(w[1].first_step, w[0].last_step + 1);
        }
    }
}
