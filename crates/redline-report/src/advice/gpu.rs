//! Rules for GPU runs. The GPU's own busy time (kernel time over wall time,
//! from the run's kernel trace) decides whether the GPU was busy and why
//! not; NVML's utilization samples stand in where there was no trace.

use super::{Advice, Level, COMPUTE_GOOD, GPU_UTIL_WARN};
use crate::records::{Breakdown, Category, GpuBusy};
use crate::run::RunData;

/// What kept the GPU waiting, by the breakdown's largest share outside
/// the kernels' time: `(category, percent of wall)`. Compute counts only its
/// part beyond the kernel time (the host issuing work the GPU did not have yet).
fn cause(b: &Breakdown, busy: f64) -> Option<(Category, f64)> {
    Category::ALL
        .iter()
        .filter_map(|&c| {
            let p = b.listed_percent(c)?;
            Some((c, if c == Category::Compute { p - busy } else { p }))
        })
        .filter(|(_, p)| *p > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// How busy the GPU was by its kernel time, and the measured cause when it
/// was not: launch-bound (with the kernels per step and their mean time),
/// data-bound, sync-bound, or time outside the steps.
pub(super) fn kernel_time(run: &RunData, b: Option<&Breakdown>, g: &GpuBusy) -> Advice {
    let busy = g.percent;
    let nvml = run
        .nvml_utilization()
        .map(|(u, n)| format!("; NVML mean utilization {u:.0}% over {n} samples"))
        .unwrap_or_default();
    let measured = format!(
        "kernel time {:.2} s of {:.2} s wall, from {}{nvml}",
        g.kernel_s, g.wall_s, g.source
    );
    if busy >= COMPUTE_GOOD {
        // Busy and exact: the next lever is the tensor cores' TF32 path.
        let exact = run
            .summary
            .as_ref()
            .and_then(|s| s.matmul_precision.as_deref())
            .is_some_and(|p| p.starts_with("highest"));
        let tf32 = if exact {
            "; its matrix products run in full fp32: --matmul-precision high lets the tensor \
             cores take them as TF32 (about 1e-3 relative error) where that is precise enough"
        } else {
            ""
        };
        return Advice::new(
            Level::Good,
            format!("the GPU ran kernels {busy:.0}% of wall time ({measured}){tf32}"),
        );
    }
    let level = if busy < GPU_UTIL_WARN {
        Level::Warn
    } else {
        Level::Info
    };
    let head = format!("the GPU ran kernels only {busy:.0}% of wall time ({measured})");
    let text = match b.and_then(|b| cause(b, busy)) {
        Some((Category::Compute, waiting)) => {
            let per_step = if g.kernels > 0 {
                format!(
                    "{:.0} kernels per step, {:.1} µs each on average",
                    g.kernels_per_step, g.mean_kernel_us
                )
            } else {
                "kernels not counted".to_string()
            };
            let replayed = run
                .summary
                .as_ref()
                .and_then(|s| s.cuda_graph.as_deref())
                .is_some_and(|g| g.starts_with("on ("));
            let graph = if replayed {
                ""
            } else {
                "capture the step as one CUDA graph (--cuda-graph on), or "
            };
            format!(
                "launch-bound: {head}: {per_step}; for at least {waiting:.0}% of wall time the \
                 host was issuing compute while the GPU had none; {graph}give each launch more \
                 work with a larger --batch-size"
            )
        }
        Some((Category::DataWait, p)) => format!(
            "data-bound: {head}; the loop waited for data {p:.0}% of wall time: keep the \
             dataset on the device (--data-on-device on) or raise --prefetch"
        ),
        Some((Category::HostSync, p)) => format!(
            "sync-bound: {head}; the host blocked on device read-backs {p:.0}% of wall time: \
             read values back only at log points"
        ),
        Some((Category::Transfer, p)) => format!(
            "transfer-bound: {head}; host-to-device copies held the loop {p:.0}% of wall time: \
             keep the dataset on the device (--data-on-device on)"
        ),
        Some((c, p)) => format!(
            "{head}; the largest share of the rest is {} ({p:.0}% of wall time)",
            c.label()
        ),
        None => head,
    };
    Advice::new(level, text)
}

/// Without a kernel trace: a high compute share on a GPU, judged by NVML.
pub(super) fn nvml_compute(run: &RunData, b: &Breakdown, p: f64) -> Advice {
    let per_step = run
        .step_count()
        .and_then(|n| {
            b.share(Category::Compute)
                .map(|c| 1e3 * c.seconds / n as f64)
        })
        .filter(|ms| ms.is_finite())
        .map(|ms| format!(", {ms:.2} ms of it per step"))
        .unwrap_or_default();
    let Some((util, samples)) = run.nvml_utilization() else {
        return Advice::new(
            Level::Info,
            format!(
                "the host spent {p:.0}% of wall time issuing compute{per_step}; GPU \
                 utilization was not sampled (no NVML), so this does not show that the GPU \
                 was busy"
            ),
        );
    };
    let measured = format!("mean NVML utilization {util:.0}% over {samples} samples");
    if util < GPU_UTIL_WARN {
        Advice::new(
            Level::Warn,
            format!(
                "launch-bound: the host spent {p:.0}% of wall time issuing compute{per_step}, \
                 but the GPU was busy only {util:.0}% ({measured}): the GPU waits while the \
                 host launches many small kernels one at a time; a larger --batch-size gives \
                 each launch more work"
            ),
        )
    } else if util >= COMPUTE_GOOD {
        Advice::new(
            Level::Good,
            format!(
                "the GPU was busy {util:.0}% of the time ({measured}); compute is {p:.0}% of \
                 wall time"
            ),
        )
    } else {
        Advice::new(
            Level::Info,
            format!("compute is {p:.0}% of wall time and the GPU was busy {util:.0}% ({measured})"),
        )
    }
}

/// Without a kernel trace: low NVML utilization, when compute does not explain it.
pub(super) fn nvml_utilization_low(run: &RunData) -> Option<Advice> {
    let (mean, samples) = run.nvml_utilization()?;
    if mean >= GPU_UTIL_WARN {
        return None;
    }
    // A host busy issuing compute while the GPU idles is launch-bound:
    // [`nvml_compute`] says so, with the cause, instead.
    let compute = run
        .breakdown
        .as_ref()
        .and_then(|b| b.listed_percent(Category::Compute));
    if compute.is_some_and(|p| p >= COMPUTE_GOOD) {
        return None;
    }
    let idle = 100.0 - mean;
    let text = match run.summary.as_ref().and_then(|s| s.batch_size) {
        Some(b) => format!(
            "batch {b} leaves the GPU {idle:.0}% idle: try a larger --batch-size such as {} \
             (mean utilization {mean:.0}% over {samples} samples)",
            b * 4
        ),
        None => format!(
            "the GPU is {idle:.0}% idle (mean utilization {mean:.0}% over {samples} samples): \
             try a larger --batch-size"
        ),
    };
    Some(Advice::new(Level::Warn, text))
}
