//! Math efficiency: busy is not the same as useful. A device can be busy
//! all the time running small kernels that use a sliver of its arithmetic;
//! MFU (the model's FLOPs per second over the device's peak) says how much
//! of it the run used. These rules read `summary.json`'s `flops` beside the
//! busy time (the GPU's kernel time, the CPU's compute share) and say why
//! the math is slow when the device is busy: fp32 where bf16 would do,
//! matrices too small to fill the device, or the batch size.

use super::{Advice, Level, COMPUTE_GOOD};
use crate::records::Category;
use crate::run::RunData;

/// MFU below this fraction, with the device busy, is worth a look.
const MFU_LOW: f64 = 0.3;
/// MFU at or above this fraction is good.
const MFU_GOOD: f64 = 0.5;
/// A step whose FLOPs take less than this many microseconds at the peak
/// is too small to fill the device: each kernel's fixed cost is several
/// microseconds (a launch is about 5 us on a GPU).
const SMALL_STEP_US: f64 = 100.0;
/// Batches up to this size are worth growing when the math is slow.
const SMALL_BATCH: u64 = 256;

/// How busy the device was, percent of wall time, and by what measure:
/// the GPU's kernel time, or the CPU's compute share.
fn busy(run: &RunData) -> Option<(f64, &'static str)> {
    if run.is_cpu() {
        let b = run.breakdown.as_ref()?;
        Some((b.listed_percent(Category::Compute)?, "compute"))
    } else {
        Some((run.gpu_busy()?.percent, "GPU busy (kernel time)"))
    }
}

/// The time breakdown's "math efficiency" line: MFU, and the share of
/// the peak the math reached while the device was busy.
pub(crate) fn efficiency_line(run: &RunData) -> Option<String> {
    let s = run.summary.as_ref()?;
    let Some(f) = &s.flops else {
        return s
            .flops_note
            .as_ref()
            .map(|why| format!("math efficiency: not known: {why}"));
    };
    let (Some(mfu), Some(peak)) = (f.mfu, f.peak_per_s) else {
        return Some(format!(
            "math efficiency: {} of model FLOPs; no MFU: {}",
            redline_train::mfu::rate(f.achieved_per_s),
            f.peak_source
        ));
    };
    let mut line = format!(
        "math efficiency: MFU {:.1}%, the model's {} of the {} peak ({})",
        100.0 * mfu,
        redline_train::mfu::rate(f.achieved_per_s),
        redline_train::mfu::rate(peak),
        f.peak_source
    );
    if let Some((p, what)) = busy(run).filter(|(p, _)| *p > 0.0) {
        line.push_str(&format!(
            "; {what} was {p:.1}% of wall time, so while busy the math ran at {:.1}% of peak",
            100.0 * mfu / (p / 100.0)
        ));
    }
    Some(line)
}

/// When the device was busy but the math was slow, why, with the numbers
/// and what to change; good news when MFU is high.
pub(super) fn mfu(run: &RunData) -> Option<Advice> {
    let s = run.summary.as_ref()?;
    let f = s.flops.as_ref()?;
    let (mfu, peak) = (f.mfu?, f.peak_per_s?);
    let pct = 100.0 * mfu;
    if mfu >= MFU_GOOD {
        return Some(Advice::new(
            Level::Good,
            format!("MFU is {pct:.1}%: the math uses most of the device's peak"),
        ));
    }
    let (busy_pct, what) = busy(run)?;
    if busy_pct < COMPUTE_GOOD || mfu >= MFU_LOW {
        return None;
    }
    let mut why = Vec::new();
    let fp32 = ["(fp32", "(tf32"].iter().any(|m| f.peak_source.contains(m));
    if !run.is_cpu() && fp32 {
        why.push(
            "the products run in fp32 (or TF32) where bf16 would do: --precision bf16-mixed \
             runs them on the tensor cores at about twice TF32's peak and many times fp32's"
                .to_string(),
        );
    }
    let step_us = 1e6 * f.per_step / peak;
    if step_us < SMALL_STEP_US {
        why.push(format!(
            "a step is {} of math, {step_us:.1} us at the peak: matrices this small cannot \
             fill the device, and each kernel's fixed cost outweighs its math",
            redline_train::mfu::amount(f.per_step)
        ));
    }
    match s.batch_size {
        Some(b) if b <= SMALL_BATCH => why.push(format!(
            "batch {b}: a larger --batch-size (e.g. {}; `redline tune batch-size` measures it) \
             gives each product more rows",
            b * 4
        )),
        _ => {}
    }
    if why.is_empty() {
        why.push(
            "the model's layers are narrow for the device: wider layers or a larger batch give \
             its products more work each"
                .into(),
        );
    }
    Some(Advice::new(
        Level::Warn,
        format!(
            "{what} is {busy_pct:.0}% of wall time, but MFU is only {pct:.1}% ({} of {}): the \
             device is busy with little math. Why: {}",
            redline_train::mfu::rate(f.achieved_per_s),
            redline_train::mfu::rate(peak),
            why.join("; ")
        ),
    ))
}
