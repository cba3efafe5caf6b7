//! A streamed run's bound: `summary.json`'s `data_pipeline` holds the
//! decode workers' own rate (from their busy time), how busy they were over
//! the fit, and the rate training took. Workers busy nearly the whole fit
//! could not have fed the model faster: the data bounds the run, and the
//! advice says what to change. Idle workers mean the model is the bound.

use super::{Advice, Level};
use crate::run::RunData;

/// The fields of `data_pipeline` the rule reads.
#[derive(serde::Deserialize)]
struct Pipeline {
    workers: u64,
    images_per_s: f64,
    workers_busy: f64,
    samples_per_s: f64,
    bound: String,
}

/// The bound of a streamed run, with its numbers; `None` for resident data.
pub(super) fn bound(run: &RunData) -> Option<Advice> {
    let v = run.summary.as_ref()?.other.get("data_pipeline")?;
    let p: Pipeline = serde_json::from_value(v.clone()).ok()?;
    let numbers = format!(
        "{} decode workers make {:.0} images/s with all busy and were busy {:.0}% of the fit, \
         which trained {:.0} samples/s",
        p.workers,
        p.images_per_s,
        100.0 * p.workers_busy,
        p.samples_per_s
    );
    Some(if p.bound == "data" {
        Advice::new(
            Level::Warn,
            format!(
                "the data bounds this run: {numbers}. More --workers (up to the cores the \
                 step leaves; `redline tune workers` measures each count), `redline pack \
                 --max-side 256` for smaller images to decode, or resident data (--stream \
                 off) when the decoded split fits in memory"
            ),
        )
    } else {
        Advice::new(
            Level::Good,
            format!(
                "the model bounds this run, not its data: {numbers} ({:.1}x what training took)",
                p.images_per_s / p.samples_per_s.max(1e-9)
            ),
        )
    })
}
