//! Finders, measured rather than guessed (Lightning's `BatchSizeFinder` and
//! `LearningRateFinder`): [`BatchSizeSearch`] grows the batch while it fits
//! and samples/s still rises; [`LrRangeTest`] trains with an exponentially
//! rising rate and suggests the point where the loss falls fastest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use redline_core::Device;
use redline_data::Loader;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::events::{Callback, Event};
use crate::graph::GraphMode;
use crate::optim::OptimizerConfig;
use crate::schedule::{Interval, LrSchedule, Shape};
use crate::step::TrainStep;
use crate::trainer::{TrainConfig, Trainer};

/// One batch size tried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchTrial {
    /// Samples per step.
    pub batch_size: usize,
    /// Training throughput after warm-up.
    pub samples_per_s: f64,
    /// Milliseconds per optimizer step.
    pub step_ms: f64,
    /// Peak memory during the trial: the GPU allocator's peak, or on the CPU
    /// the process's peak resident set (bytes); `None` where unmeasured.
    pub peak_bytes: Option<u64>,
    /// GPU busy % (kernel time / wall) during the trial, on a GPU.
    pub gpu_busy_pct: Option<f64>,
}

/// What a trial of one batch size gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Trial {
    /// It ran: its numbers.
    Ran(BatchTrial),
    /// The device ran out of memory (the error's text).
    OutOfMemory(String),
}

/// Lightning's `BatchSizeFinder` in `binsearch` mode, with throughput as a
/// second limit: double the batch from `start` while it fits (in the
/// device's memory, and on the CPU within `memory_budget` by the measured
/// growth) and samples/s rises by more than `min_gain`; after an
/// out-of-memory, binary-search the largest batch that fits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchSizeSearch {
    /// The first batch size tried.
    pub start: usize,
    /// The largest batch size tried (the training set's size, say).
    pub max: usize,
    /// The relative rise in samples/s a larger batch must bring (0.05).
    pub min_gain: f64,
    /// Bytes a trial's peak may reach; the next batch is not tried when
    /// the peaks so far, extrapolated, would pass it.
    pub memory_budget: Option<u64>,
    /// Trials at most (Lightning's `max_trials`, 25).
    pub max_trials: usize,
}

impl Default for BatchSizeSearch {
    fn default() -> Self {
        Self {
            start: 2,
            max: 1 << 20,
            min_gain: 0.05,
            memory_budget: None,
            max_trials: 25,
        }
    }
}

/// The search's result: the choice, why the search stopped, every trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchSizeChoice {
    /// The batch size chosen: the largest whose samples/s beat the smaller
    /// chosen one's by more than the minimum gain.
    pub batch_size: usize,
    /// Why the search stopped growing.
    pub stopped: String,
    /// Every batch size tried, in the order tried.
    pub trials: Vec<BatchTrial>,
    /// Batch sizes that ran out of memory.
    pub out_of_memory: Vec<usize>,
}

impl BatchSizeSearch {
    /// Runs the search, calling `trial` for each batch size.
    pub fn run(&self, mut trial: impl FnMut(usize) -> Result<Trial>) -> Result<BatchSizeChoice> {
        let max = self.max.max(1);
        let mut ran: Vec<BatchTrial> = Vec::new();
        let mut oom = Vec::new();
        let mut b = self.start.clamp(1, max);
        let gain = |from: &BatchTrial, to: &BatchTrial| to.samples_per_s / from.samples_per_s - 1.0;
        let stopped;
        loop {
            if ran.len() + oom.len() >= self.max_trials {
                stopped = format!("{} trials, the most allowed", self.max_trials);
                break;
            }
            if let Some(need) = self.predicted_peak(&ran, b) {
                if self.memory_budget.is_some_and(|m| need > m) {
                    stopped = format!(
                        "memory: batch {b} would peak near {:.2} GiB, past the {:.2} GiB available",
                        gib(need),
                        gib(self.memory_budget.unwrap_or_default())
                    );
                    break;
                }
            }
            match trial(b)? {
                Trial::OutOfMemory(why) => {
                    oom.push(b);
                    stopped = format!("memory: batch {b} ran out of device memory ({why})");
                    // The largest that fits, between the last that did and this one.
                    let (mut lo, mut hi) = (ran.last().map_or(0, |t| t.batch_size), b);
                    while hi - lo > (lo / 16).max(1) && ran.len() + oom.len() < self.max_trials {
                        let mid = lo + (hi - lo) / 2;
                        match trial(mid)? {
                            Trial::Ran(t) => {
                                lo = mid;
                                ran.push(t);
                            }
                            Trial::OutOfMemory(_) => {
                                hi = mid;
                                oom.push(mid);
                            }
                        }
                    }
                    break;
                }
                Trial::Ran(t) => {
                    let prev = ran.last().cloned();
                    ran.push(t.clone());
                    if let Some(p) = prev {
                        let g = gain(&p, &t);
                        if g <= self.min_gain {
                            stopped = format!(
                                "samples/s rose {:+.1}% from batch {} to {} (growing needs more \
                                 than {:.0}%)",
                                100.0 * g,
                                p.batch_size,
                                t.batch_size,
                                100.0 * self.min_gain
                            );
                            break;
                        }
                    }
                    if b >= max {
                        stopped = format!("batch {b} is the largest (the training set's size)");
                        break;
                    }
                    b = (b * 2).min(max);
                }
            }
        }
        let Some(batch_size) = choose(&ran, self.min_gain) else {
            return Err(Error::Config(format!(
                "the batch-size search found no batch that fits: {stopped}"
            )));
        };
        Ok(BatchSizeChoice {
            batch_size,
            stopped,
            trials: ran,
            out_of_memory: oom,
        })
    }

    /// The peak a batch of `b` would reach, by a line through the last two
    /// measured peaks (the memory a step needs grows linearly in the batch).
    fn predicted_peak(&self, ran: &[BatchTrial], b: usize) -> Option<u64> {
        let mut measured = ran
            .iter()
            .rev()
            .filter_map(|t| Some((t.batch_size as f64, t.peak_bytes? as f64)));
        let (b2, p2) = measured.next()?;
        let (b1, p1) = measured.next()?;
        if b2 == b1 || b <= b2 as usize {
            return None;
        }
        let slope = ((p2 - p1) / (b2 - b1)).max(0.0);
        Some((p2 + slope * (b as f64 - b2)) as u64)
    }
}

/// The largest batch whose samples/s beat the previously chosen (smaller)
/// one's by more than `min_gain`, over the trials sorted by batch size.
fn choose(trials: &[BatchTrial], min_gain: f64) -> Option<usize> {
    let mut sorted: Vec<&BatchTrial> = trials.iter().collect();
    sorted.sort_by_key(|t| t.batch_size);
    let mut best = *sorted.first()?;
    for t in sorted {
        if t.samples_per_s > best.samples_per_s * (1.0 + min_gain) {
            best = t;
        }
    }
    Some(best.batch_size)
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

impl BatchSizeChoice {
    /// The table of trials, one line each, the choice marked.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut s = format!(
            "{:>10} {:>12} {:>10} {:>11} {:>9}\n",
            "batch", "samples/s", "step ms", "peak MiB", "GPU busy"
        );
        let mut rows: Vec<&BatchTrial> = self.trials.iter().collect();
        rows.sort_by_key(|t| t.batch_size);
        for t in rows {
            let _ = writeln!(
                s,
                "{:>10} {:>12.0} {:>10.3} {:>11} {:>9}{}",
                t.batch_size,
                t.samples_per_s,
                t.step_ms,
                t.peak_bytes
                    .map_or("-".into(), |b| format!("{:.1}", b as f64 / 1048576.0)),
                t.gpu_busy_pct.map_or("-".into(), |g| format!("{g:.0}%")),
                if t.batch_size == self.batch_size {
                    "  <- chosen"
                } else {
                    ""
                }
            );
        }
        for b in &self.out_of_memory {
            let _ = writeln!(s, "{b:>10} {:>12}", "out of memory");
        }
        s
    }
}

/// Lightning's learning-rate range test (`Tuner.lr_find`, exponential
/// mode): `steps` steps from `min_lr` to `max_lr` ([`Shape::RangeTest`]),
/// the loss smoothed by an exponential average (`beta`), stopped when the
/// smoothed loss passes `stop_factor` times the best.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LrRangeTest {
    /// The first rate (1e-8).
    pub min_lr: f64,
    /// The last rate (1).
    pub max_lr: f64,
    /// Steps (100).
    pub steps: usize,
    /// The smoothing (0.98).
    pub beta: f64,
    /// Stop once the smoothed loss exceeds this times the best (4; `None`:
    /// never).
    pub stop_factor: Option<f64>,
}

impl Default for LrRangeTest {
    fn default() -> Self {
        Self {
            min_lr: 1e-8,
            max_lr: 1.0,
            steps: 100,
            beta: 0.98,
            stop_factor: Some(4.0),
        }
    }
}

/// The curve a range test measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LrCurve {
    /// The rate of each step.
    pub lr: Vec<f64>,
    /// Its loss.
    pub loss: Vec<f64>,
    /// The smoothed loss.
    pub smoothed: Vec<f64>,
    /// Why it ended before its steps, if it did.
    pub stopped: Option<String>,
}

/// The smoothing and divergence check of Lightning's `_LRCallback`.
#[derive(Debug, Clone)]
pub struct Smoother {
    beta: f64,
    stop_factor: Option<f64>,
    avg: f64,
    best: f64,
}

impl Smoother {
    /// A smoother with `beta` and the divergence factor.
    pub fn new(beta: f64, stop_factor: Option<f64>) -> Self {
        Self {
            beta,
            stop_factor,
            avg: 0.0,
            best: 0.0,
        }
    }

    /// Adds the loss of optimizer step `step` (1 for the first): the
    /// smoothed loss, and whether the test should stop there. As Lightning,
    /// the bias correction uses `step + 1`.
    pub fn push(&mut self, step: usize, loss: f64) -> (f64, bool) {
        self.avg = self.beta * self.avg + (1.0 - self.beta) * loss;
        let smoothed = self.avg / (1.0 - self.beta.powi(step as i32 + 1));
        let diverged = self
            .stop_factor
            .is_some_and(|f| step > 1 && smoothed > f * self.best);
        if smoothed < self.best || step == 1 {
            self.best = smoothed;
        }
        (smoothed, diverged || !smoothed.is_finite())
    }
}

impl LrRangeTest {
    /// The most steps a range test takes: its curve is held whole (a few
    /// numbers a step), and Lightning's default is 100.
    pub const MAX_STEPS: usize = 100_000;

    /// Refuses rates and step counts the test cannot run, naming the flag
    /// that sets each (`--min-lr`, `--max-lr`, `--steps`).
    pub fn check(&self) -> Result<()> {
        let hint = "HINT: the defaults are --min-lr 1e-8 --max-lr 1 --steps 100";
        for (flag, v) in [("--min-lr", self.min_lr), ("--max-lr", self.max_lr)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::Config(format!(
                    "{flag} {v}: give a finite rate > 0\n{hint}"
                )));
            }
        }
        if self.min_lr >= self.max_lr {
            return Err(Error::Config(format!(
                "--min-lr {} is not below --max-lr {}: the test raises the rate from the first \
                 to the second\n{hint}",
                self.min_lr, self.max_lr
            )));
        }
        if !(2..=Self::MAX_STEPS).contains(&self.steps) {
            return Err(Error::Config(format!(
                "--steps {}: give 2 to {} steps\n{hint}",
                self.steps,
                Self::MAX_STEPS
            )));
        }
        Ok(())
    }

    /// The schedule that drives the test's rates.
    pub fn schedule(&self) -> LrSchedule {
        LrSchedule {
            shape: Shape::RangeTest {
                min_lr: self.min_lr,
                max_lr: self.max_lr,
                steps: self.steps,
            },
            warmup: 0,
            interval: Interval::Step,
            ..LrSchedule::default()
        }
    }

    /// Runs the test on a fresh step from `make` (the caller's model keeps
    /// its weights), over `train`, on `device`.
    pub fn run(
        &self,
        make: &dyn Fn() -> Result<Box<dyn TrainStep>>,
        device: &Device,
        train: &Loader,
        optimizer: &OptimizerConfig,
    ) -> Result<LrCurve> {
        let never = Arc::new(AtomicBool::new(false));
        self.run_until(make, device, train, optimizer, &never)
    }

    /// [`LrRangeTest::run`], stopped after the step in which `interrupt`
    /// is set (a signal's flag): [`Error::Interrupted`], as a fit stops.
    pub fn run_until(
        &self,
        make: &dyn Fn() -> Result<Box<dyn TrainStep>>,
        device: &Device,
        train: &Loader,
        optimizer: &OptimizerConfig,
        interrupt: &Arc<AtomicBool>,
    ) -> Result<LrCurve> {
        self.check()?;
        let schedule = self.schedule();
        schedule.check()?;
        let per_epoch = train.batches_per_epoch().max(1);
        let cfg = TrainConfig {
            epochs: self.steps.div_ceil(per_epoch),
            max_steps: Some(self.steps),
            log_every: 1,
            validate: false,
            divergence_threshold: None,
            cuda_graph: GraphMode::Off,
            kernel_trace: false,
            schedule,
            ..TrainConfig::default()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let curve = Arc::new(Mutex::new(LrCurve::default()));
        let interrupted = Arc::new(AtomicBool::new(false));
        let watch = Watch {
            smoother: Smoother::new(self.beta, self.stop_factor),
            curve: Arc::clone(&curve),
            stop: Arc::clone(&stop),
            interrupt: Arc::clone(interrupt),
            interrupted: Arc::clone(&interrupted),
        };
        let mut trainer = Trainer::builder()
            .config(cfg)
            .optimizer(optimizer.clone())
            .stop_when(stop)
            .callback(Box::new(watch))
            .build(make()?, device.clone())?;
        let end = trainer.fit(train, None);
        let mut out = curve
            .lock()
            .map_err(|_| Error::Config("the range test's record was poisoned".into()))?
            .clone();
        if interrupted.load(Ordering::Relaxed) {
            return Err(Error::Interrupted {
                step: out.lr.len(),
                epoch: out.lr.len().div_ceil(per_epoch),
            });
        }
        match end {
            Ok(_) | Err(Error::Interrupted { .. }) => {}
            // A loss that blew up ends the test where it did.
            Err(e) if !out.loss.is_empty() => out.stopped = Some(e.to_string()),
            Err(e) => return Err(e),
        }
        if out.lr.len() < self.steps && out.stopped.is_none() {
            out.stopped = Some(format!(
                "the smoothed loss passed {} times its best after {} steps",
                self.stop_factor.unwrap_or(f64::INFINITY),
                out.lr.len()
            ));
        }
        Ok(out)
    }
}

/// Records each step's rate and loss; sets the stop flag on divergence,
/// and on `interrupt` (noting it in `interrupted`).
struct Watch {
    smoother: Smoother,
    curve: Arc<Mutex<LrCurve>>,
    stop: Arc<AtomicBool>,
    interrupt: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
}

impl Callback for Watch {
    fn name(&self) -> &str {
        "lr range test"
    }

    fn required(&self) -> bool {
        true
    }

    fn on_event(&mut self, event: &Event<'_>) -> std::result::Result<(), String> {
        if let Event::Log(s) = event {
            let (smoothed, stop) = self.smoother.push(s.step, s.loss);
            let mut c = self.curve.lock().map_err(|e| e.to_string())?;
            c.lr.push(s.lr);
            c.loss.push(s.loss);
            c.smoothed.push(smoothed);
            if stop {
                self.stop.store(true, Ordering::Relaxed);
            }
            if self.interrupt.load(Ordering::Relaxed) {
                self.interrupted.store(true, Ordering::Relaxed);
                self.stop.store(true, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// Lightning's suggestion: the step of the steepest fall of the smoothed
/// loss against the rate (`torch.gradient` with the rates as coordinates),
/// skipping the first `skip_begin` and last `skip_end` points and any
/// non-finite loss. `None` with fewer than 2 points left.
pub fn suggestion(
    lr: &[f64],
    smoothed: &[f64],
    skip_begin: usize,
    skip_end: usize,
) -> Option<usize> {
    let n = lr.len().min(smoothed.len());
    let end = n.checked_sub(skip_end)?;
    let kept: Vec<usize> = (skip_begin..end)
        .filter(|&i| smoothed[i].is_finite())
        .collect();
    if kept.len() < 2 {
        return None;
    }
    let (x, y): (Vec<f64>, Vec<f64>) = kept.iter().map(|&i| (lr[i], smoothed[i])).unzip();
    let g = gradient(&y, &x);
    let best = (0..g.len()).min_by(|&a, &b| g[a].total_cmp(&g[b]))?;
    Some(kept[best])
}

/// `torch.gradient(y, spacing=[x])` (edge order 1): second-order central
/// differences on uneven coordinates inside, one-sided at the ends.
fn gradient(y: &[f64], x: &[f64]) -> Vec<f64> {
    let n = y.len();
    let mut g = vec![0.0; n];
    if n < 2 {
        return g;
    }
    g[0] = (y[1] - y[0]) / (x[1] - x[0]);
    g[n - 1] = (y[n - 1] - y[n - 2]) / (x[n - 1] - x[n - 2]);
    for i in 1..n - 1 {
        let (hl, hr) = (x[i] - x[i - 1], x[i + 1] - x[i]);
        g[i] = (hl * hl * y[i + 1] - hr * hr * y[i - 1] + (hr * hr - hl * hl) * y[i])
            / (hl * hr * (hl + hr));
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each bad range names the flag the user typed. Before, `--min-lr 1
    /// --max-lr 0.1` answered with `--lr-schedule: min_lr=1, ...`, and
    /// `--steps 100000000000` ran for ever.
    #[test]
    fn a_bad_range_names_its_flags() {
        let err = |min_lr: f64, max_lr: f64, steps: usize| {
            let t = LrRangeTest {
                min_lr,
                max_lr,
                steps,
                ..LrRangeTest::default()
            };
            t.check().err().map(|e| e.to_string()).unwrap_or_default()
        };
        let e = err(1.0, 0.1, 100);
        assert!(e.contains("--min-lr 1 is not below --max-lr 0.1"), "{e}");
        assert!(!e.contains("--lr-schedule"), "{e}");
        assert!(err(f64::NAN, 1.0, 100).contains("--min-lr NaN"));
        assert!(err(1e-8, f64::INFINITY, 100).contains("--max-lr inf"));
        assert!(err(1e-8, 1.0, 100_000_000_000).contains("--steps 100000000000"));
        assert!(err(1e-8, 1.0, 1).contains("--steps 1"));
        assert_eq!(err(1e-8, 1.0, 100), "");
    }

    /// A trial of `b` with throughput `sps(b)` and peak `mem(b)`, or out of
    /// memory past `fits`.
    fn fake(fits: usize, sps: impl Fn(usize) -> f64) -> impl FnMut(usize) -> Result<Trial> {
        move |b| {
            Ok(match b > fits {
                true => Trial::OutOfMemory("CUDA_ERROR_OUT_OF_MEMORY".into()),
                false => Trial::Ran(BatchTrial {
                    batch_size: b,
                    samples_per_s: sps(b),
                    step_ms: 1.0,
                    peak_bytes: Some(1000 + 100 * b as u64),
                    gpu_busy_pct: None,
                }),
            })
        }
    }

    #[test]
    fn growth_stops_where_throughput_flattens() -> Result<()> {
        // Throughput saturates at 512: 1024 brings 2%.
        let sps = |b: usize| 1e5 * (b.min(512) as f64).sqrt() * (1.0 + (b as f64 / 1e5));
        let c = BatchSizeSearch::default().run(fake(1 << 20, sps))?;
        assert_eq!(c.batch_size, 512, "{}", c.table());
        assert_eq!(c.trials.last().map(|t| t.batch_size), Some(1024));
        assert!(
            c.stopped.contains("from batch 512 to 1024"),
            "{}",
            c.stopped
        );
        Ok(())
    }

    #[test]
    fn an_out_of_memory_is_binary_searched() -> Result<()> {
        // Throughput keeps rising; memory ends at 300.
        let c = BatchSizeSearch::default().run(fake(300, |b| b as f64))?;
        assert!(c.out_of_memory.contains(&512), "{c:?}");
        assert!((282..=300).contains(&c.batch_size), "{}", c.table());
        assert!(c.stopped.contains("ran out of device memory"));
        Ok(())
    }

    #[test]
    fn a_memory_budget_stops_before_the_trial_that_would_pass_it() -> Result<()> {
        // Peaks are 1000 + 100 b: batch 64 would need 7400 bytes.
        let s = BatchSizeSearch {
            memory_budget: Some(7000),
            ..BatchSizeSearch::default()
        };
        let c = s.run(fake(1 << 20, |b| b as f64))?;
        assert_eq!(c.batch_size, 32, "{}", c.table());
        assert!(c.stopped.contains("batch 64 would peak"), "{}", c.stopped);
        // And the first batch that does not fit at all is an error.
        let none = BatchSizeSearch::default().run(fake(0, |b| b as f64));
        assert!(none.is_err());
        Ok(())
    }

    #[test]
    fn the_gradient_is_torchs_on_uneven_coordinates() {
        // torch.gradient(torch.tensor([1., 4., 9., 25.]), spacing=[torch.tensor([1., 2., 3., 5.])])
        // -> tensor([3., 4., 6., 8.])
        let g = gradient(&[1.0, 4.0, 9.0, 25.0], &[1.0, 2.0, 3.0, 5.0]);
        let want = [3.0, 4.0, 6.0, 8.0];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{g:?}");
        }
    }
}
