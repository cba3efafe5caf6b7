//! Advice: rules that read the measured numbers of a run and say what to change.
//!
//! Each rule fires only on a measured number and cites it, so a reader can
//! check the claim against the charts. Thresholds are plain constants below.

use crate::records::{Breakdown, Category};
use crate::run::RunData;

pub(crate) use math::efficiency_line;

/// How a piece of advice should be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Something to fix: the accelerator waits.
    Warn,
    /// Worth knowing; may or may not matter.
    Info,
    /// A measurement that says this part is fine.
    Good,
}

impl Level {
    /// Lowercase name, used as the CSS class.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Good => "good",
            Level::Info => "info",
            Level::Warn => "warn",
        }
    }
}

/// One finding, with the number it rests on in `text`.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// Warn, info or good.
    pub level: Level,
    /// The finding and the fix, citing the measured number.
    pub text: String,
}

impl Advice {
    fn new(level: Level, text: String) -> Self {
        Self { level, text }
    }
}

/// Data wait at or above this percent of wall time is worth fixing.
const DATA_WAIT_WARN: f64 = 10.0;
/// Host syncs per step up to this are read-backs at log points only.
const SYNCS_GOOD: f64 = 0.05;
/// Host syncs per step above this mean a read-back in every step.
const SYNCS_WARN: f64 = 0.5;
/// Host-sync time at or above this percent of wall time.
const HOST_SYNC_WARN: f64 = 5.0;
/// Framework overhead at or above this percent of wall time.
const OVERHEAD_WARN: f64 = 15.0;
/// Percent of wall time in the gradient all-reduce that earns a warning.
const COMMUNICATION_WARN: f64 = 20.0;
/// Idle at or above this percent of wall time.
const IDLE_WARN: f64 = 20.0;
/// Mean GPU utilization below this percent.
pub(super) const GPU_UTIL_WARN: f64 = 60.0;
/// Compute threads busy below this fraction of `threads * 100` process CPU.
const THREADS_BUSY_WARN: f64 = 0.6;
/// Batches up to this size, with compute per step below [`SHORT_STEP_MS`], are small.
const SMALL_BATCH: u64 = 64;
/// Compute per step below this many milliseconds is short.
const SHORT_STEP_MS: f64 = 1.0;
/// Compute at or above this percent of wall time means the device is kept busy.
pub(super) const COMPUTE_GOOD: f64 = 80.0;

/// Formats a number without a trailing `.0` (`2`, `1.9`).
fn short(x: f64) -> String {
    if (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// `"(1.10 s of 3.52 s)"` for the category `cat`.
fn seconds_of(b: &Breakdown, cat: Category) -> String {
    match b.share(cat) {
        Some(c) => format!("{:.2} s of {:.2} s", c.seconds, b.wall_s),
        None => String::new(),
    }
}

fn data_wait(run: &RunData, b: &Breakdown) -> Option<Advice> {
    let p = b
        .listed_percent(Category::DataWait)
        .filter(|&p| p >= DATA_WAIT_WARN)?;
    let now = run
        .summary
        .as_ref()
        .and_then(|s| s.prefetch)
        .map(|n| format!("; --prefetch is {n} now"))
        .unwrap_or_default();
    Some(Advice::new(
        Level::Warn,
        format!(
            "data wait is {p:.0}% of step time: raise --prefetch or keep the dataset on the \
             device ({}{now})",
            seconds_of(b, Category::DataWait)
        ),
    ))
}

fn host_syncs(run: &RunData) -> Option<Advice> {
    let n = run.summary.as_ref()?.host_syncs_per_step?;
    if !n.is_finite() {
        return None;
    }
    Some(if n == 0.0 {
        Advice::new(
            Level::Good,
            "0 host syncs per step: the loop never waits on a device read-back".into(),
        )
    } else if n <= SYNCS_GOOD {
        Advice::new(
            Level::Good,
            format!("{n:.2} host syncs per step: read-backs only at log points"),
        )
    } else if n > SYNCS_WARN {
        Advice::new(
            Level::Warn,
            format!(
                "{n:.2} host syncs per step: a device value is read back (an .item()-style read \
                 of loss or accuracy) in every step, so the host waits for the device each time; \
                 keep running sums on the device and read them at log points"
            ),
        )
    } else {
        Advice::new(
            Level::Info,
            format!(
                "{n:.2} host syncs per step: a read-back every {:.0} steps; read values back only \
                 at log points",
                1.0 / n
            ),
        )
    })
}

/// A warning when category `cat` takes at least `limit` percent of wall time.
fn category_warn(
    b: &Breakdown,
    cat: Category,
    limit: f64,
    what: &str,
    fix: &str,
) -> Option<Advice> {
    let p = b.listed_percent(cat).filter(|&p| p >= limit)?;
    Some(Advice::new(
        Level::Warn,
        format!(
            "{what} is {p:.0}% of wall time ({}): {fix}",
            seconds_of(b, cat)
        ),
    ))
}

fn threads_busy(run: &RunData) -> Option<Advice> {
    if !run.is_cpu() {
        return None;
    }
    let threads = run.summary.as_ref()?.threads.filter(|&t| t > 0)?;
    let cpu: Vec<f64> = run
        .system
        .iter()
        .filter_map(|r| r.host.as_ref()?.process_cpu_percent)
        .filter(|c| c.is_finite())
        .collect();
    if cpu.is_empty() {
        return None;
    }
    let mean = cpu.iter().sum::<f64>() / cpu.len() as f64;
    let full = threads as f64 * 100.0;
    let busy = mean / full;
    (busy < THREADS_BUSY_WARN).then(|| {
        Advice::new(
            Level::Warn,
            format!(
                "compute threads busy only {:.0}%: the process averaged {mean:.0}% CPU where \
                 {threads} threads could use {full:.0}%; the rest of the time they wait on data, \
                 syncs or per-step overhead",
                100.0 * busy
            ),
        )
    })
}

fn oversubscribed(run: &RunData) -> Option<Advice> {
    let s = run.summary.as_ref()?;
    let (threads, free) = (s.threads?, s.free_cores.filter(|f| f.is_finite())?);
    if (threads as f64) <= free + 0.5 {
        return None;
    }
    let m = free.round().max(1.0);
    Some(Advice::new(
        Level::Warn,
        format!(
            "threads oversubscribed: {threads} compute threads on {} free cores: use --threads {}",
            short(free),
            short(m)
        ),
    ))
}

/// A 16-bit run that measured itself slower than fp32 on its device at
/// start (`precision_vs_fp32` over 1.05): both numbers, and the fix.
fn precision_slower(run: &RunData) -> Option<Advice> {
    let s = run.summary.as_ref()?;
    let ratio = s.other.get("precision_vs_fp32")?.as_f64()?;
    let line = s.other.get("precision_timing")?.as_str()?;
    (ratio.is_finite() && ratio > 1.05).then(|| {
        Advice::new(
            Level::Warn,
            format!(
                "{line}. This device has no faster 16-bit path in Redline yet: train in \
                 --precision 32-true here for speed, or keep the 16-bit run for numerics that \
                 match a GPU's"
            ),
        )
    })
}

/// What a 16-bit run's activations came to against fp32's, both measured
/// at start on the run's own batch (`precision_activations`): the larger
/// batch that now fits in fp32's activation memory, or, where the 16-bit
/// run holds about as much, that it saves none here.
fn precision_memory(run: &RunData) -> Option<Advice> {
    let s = run.summary.as_ref()?;
    let a = s.other.get("precision_activations")?;
    let (half, full) = (a.get("bytes")?.as_f64()?, a.get("fp32_bytes")?.as_f64()?);
    let batch = a.get("batch")?.as_u64()?;
    let p = s.other.get("precision")?.as_str()?;
    if !(half > 0.0 && full > 0.0) {
        return None;
    }
    let (ratio, mib) = (half / full, |b: f64| b / 1048576.0);
    let both = format!(
        "{p} holds {:.2} MiB of activations per batch of {batch} against {:.2} MiB in 32-true \
         ({:.0}%)",
        mib(half),
        mib(full),
        100.0 * ratio
    );
    if ratio <= 0.8 {
        let fits = (batch as f64 / ratio).floor() as u64;
        return Some(Advice::new(
            Level::Info,
            format!(
                "{both}: where memory bounds the batch, a batch of about {fits} now fits in the \
                 activation memory fp32's batch of {batch} took (--batch-size {fits}; `redline \
                 tune batch-size --precision {p}` measures it)"
            ),
        ));
    }
    (ratio >= 0.95).then(|| {
        Advice::new(
            Level::Info,
            format!(
                "{both}: it saves no activation memory on this device (the CPU's 16-bit path \
                 keeps fp32 copies of the rounded operands for the backward), so no larger \
                 batch fits than in fp32"
            ),
        )
    })
}

/// A `bf16-true` run's weights, gradients and optimizer state (`memory`,
/// measured at its first step) against what the same values take in fp32
/// (4 bytes each instead of 2): where the rest of the memory went.
fn true_state_memory(run: &RunData) -> Option<Advice> {
    let s = run.summary.as_ref()?;
    if s.other.get("precision")?.as_str()? != "bf16-true" {
        return None;
    }
    let m = s.other.get("memory")?;
    let part = |k: &str| m.get(k).and_then(serde_json::Value::as_f64);
    let state = part("parameters")? + part("gradients")? + part("optimizer")?;
    let mib = |b: f64| b / 1048576.0;
    (state > 0.0).then(|| {
        Advice::new(
            Level::Info,
            format!(
                "bf16-true holds the weights, gradients and optimizer state in {:.2} MiB, where \
                 32-true holds {:.2} MiB (2 bytes per value instead of 4); the activations are \
                 bf16-mixed's",
                mib(state),
                mib(2.0 * state)
            ),
        )
    })
}

fn small_batch(run: &RunData, b: &Breakdown) -> Option<Advice> {
    let batch = run.summary.as_ref()?.batch_size?;
    let steps = run.step_count()?;
    let compute = b.share(Category::Compute)?.seconds;
    let ms = 1000.0 * compute / steps as f64;
    (batch <= SMALL_BATCH && ms.is_finite() && ms < SHORT_STEP_MS).then(|| {
        Advice::new(
            Level::Info,
            format!(
                "compute is {ms:.2} ms per step at batch {batch}: steps this short pay the fixed \
                 per-step costs often; a larger --batch-size such as {} keeps the device busier",
                batch * 4
            ),
        )
    })
}

/// A high compute share. On the CPU kernels run on the loop's thread, so it
/// means the CPU is kept busy. On a GPU it is host time spent issuing the
/// step's work; whether the GPU was busy is a separate measurement (the
/// kernel trace, else NVML), and the advice says which it has.
fn compute(run: &RunData, b: &Breakdown) -> Option<Advice> {
    let p = b
        .listed_percent(Category::Compute)
        .filter(|&p| p >= COMPUTE_GOOD)?;
    if run.is_cpu() {
        return Some(Advice::new(
            Level::Good,
            format!("compute is {p:.0}% of wall time: the device is kept busy"),
        ));
    }
    Some(gpu::nvml_compute(run, b, p))
}

/// Runs every rule on `run`; warnings first, then info, then good news.
pub fn advice(run: &RunData) -> Vec<Advice> {
    let mut out = Vec::new();
    let traced = run.gpu_busy();
    if let Some(b) = &run.breakdown {
        out.extend(data_wait(run, b));
        out.extend(category_warn(
            b,
            Category::HostSync,
            HOST_SYNC_WARN,
            "host sync",
            "the host blocks on device results; read values back less often",
        ));
        out.extend(category_warn(
            b,
            Category::Communication,
            COMMUNICATION_WARN,
            "gradient all-reduce",
            "each step waits for the ranks to exchange gradients; a larger per-rank \
             --batch-size, or --accumulate N (one all-reduce per N micro-batches), spreads it",
        ));
        out.extend(category_warn(
            b,
            Category::Overhead,
            OVERHEAD_WARN,
            "framework overhead",
            "a fixed cost per step; a larger --batch-size spreads it over more samples",
        ));
        out.extend(category_warn(
            b,
            Category::Idle,
            IDLE_WARN,
            "idle",
            "time outside training steps (start-up, evaluation, logging, checkpoints)",
        ));
        out.extend(small_batch(run, b));
        out.extend(precision_slower(run));
        out.extend(precision_memory(run));
        out.extend(true_state_memory(run));
        if traced.is_none() {
            out.extend(compute(run, b));
        }
    }
    // With the GPU's kernel time measured, one rule says how busy it was
    // and names the cause; NVML's rules stand in without it.
    match traced {
        Some(g) => out.push(gpu::kernel_time(run, run.breakdown.as_ref(), g)),
        None => out.extend(gpu::nvml_utilization_low(run)),
    }
    out.extend(math::mfu(run));
    out.extend(pipeline::bound(run));
    out.extend(host_syncs(run));
    out.extend(threads_busy(run));
    out.extend(oversubscribed(run));
    out.sort_by_key(|a| a.level);
    out
}

mod gpu;
mod math;
mod pipeline;
#[cfg(test)]
mod tests;
