//! What bounds a streamed run, the model or its data: the decode workers'
//! own rate (from their busy time) set against the rate training took. A
//! pipeline whose workers were busy nearly the whole fit could not have fed
//! the model faster; one with idle workers was waiting for the model.

use redline_data::PipelineStats;
use redline_train::{EvalResult, FitSummary};
use serde_json::{json, Value};

/// Workers busy at least this share of the fit make the data the bound.
pub const DATA_BOUND_BUSY: f64 = 0.9;

/// `summary.json`'s `data_pipeline` and the line said after the fit, for
/// the workers' totals `stats` over a fit (and its test pass).
pub fn describe(
    stats: PipelineStats,
    (fit, test): (&FitSummary, Option<&EvalResult>),
) -> Option<(Value, String)> {
    let rate = stats.images_per_s()?;
    // The workers decoded for training, validation and the test pass.
    let wall = fit.train_s + fit.eval_s + test.map_or(0.0, |t| t.seconds);
    let busy = stats.busy_share(wall)?;
    let took = fit.samples_per_s;
    let data_bound = busy >= DATA_BOUND_BUSY;
    let record = json!({
        "workers": stats.workers,
        "images": stats.images,
        "busy_s": stats.busy_s,
        "images_per_s": rate,
        "workers_busy": busy,
        "samples_per_s": took,
        "bound": if data_bound { "data" } else { "model" },
    });
    let head = format!(
        "data pipeline: {} workers make {rate:.0} images/s with all busy (their busy time: {} \
         images in {:.2} worker-seconds); they were busy {:.0}% of the fit, which trained \
         {took:.0} samples/s",
        stats.workers,
        stats.images,
        stats.busy_s,
        100.0 * busy
    );
    let cores = redline_core::threads::usable_cores();
    let line = if data_bound {
        format!(
            "{head}: the data bounds this run\nHINT: {}`redline pack SRC DEST --max-side 256` \
             makes smaller images to decode, and a split whose decoded size fits in memory \
             trains resident (--stream off) with no decoding per epoch",
            if stats.workers < cores {
                format!("more --workers (this machine has {cores} cores), ")
            } else {
                String::new()
            }
        )
    } else {
        format!(
            "{head}: the model bounds this run (the pipeline could make {:.1}x what it took)",
            rate / took.max(1e-9)
        )
    };
    Some((record, line))
}
