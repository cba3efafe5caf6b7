//! Where the time went: six exclusive categories that sum to wall time, and a
//! per-step timeline of the five that happen inside steps.

use serde::{Deserialize, Serialize};

use crate::action::Category;
use crate::kernels::GpuBusy;
use crate::nullable::nullable;

/// The attribution rule, written into every `breakdown.json`.
pub const RULE: &str = "Each instant of the fit's wall time counts once, in the category of what \
the training loop's thread was doing: compute (forward, loss, backward, optimizer, on-device \
metrics, validation), data wait (blocked on the loader), transfer (waiting for host-to-device \
copies), host sync (reading values back from the device), overhead (logging, callbacks, \
checkpoints, loop bookkeeping) or idle (inside the fit but in none of these). Work on other \
threads overlaps the loop and counts only through the loop's wait for it. On the CPU kernels run \
synchronously, so compute is host time spent in them.";

// The types below are both what the profiler writes and what `redline-report` reads back.
// Reading is tolerant: a missing or `null` field is its default, unknown fields are ignored.

/// One category's share.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CategoryShare {
    /// `compute`, `data_wait`, `transfer`, `host_sync`, `overhead` or `idle`.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Seconds.
    #[serde(deserialize_with = "nullable")]
    pub seconds: f64,
    /// Percent of wall time.
    #[serde(deserialize_with = "nullable")]
    pub percent: f64,
}

/// Mean milliseconds per step of the steps `first_step..=last_step`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TimelineRow {
    /// First step of the bin (1-based).
    #[serde(deserialize_with = "nullable")]
    pub first_step: usize,
    /// Last step of the bin.
    #[serde(deserialize_with = "nullable")]
    pub last_step: usize,
    /// Compute.
    #[serde(deserialize_with = "nullable")]
    pub compute_ms: f64,
    /// Data wait.
    #[serde(deserialize_with = "nullable")]
    pub data_wait_ms: f64,
    /// Transfer.
    #[serde(deserialize_with = "nullable")]
    pub transfer_ms: f64,
    /// Host sync.
    #[serde(deserialize_with = "nullable")]
    pub host_sync_ms: f64,
    /// Gradient all-reduce (data-parallel; absent in older records: 0).
    #[serde(deserialize_with = "nullable")]
    pub communication_ms: f64,
    /// Overhead.
    #[serde(deserialize_with = "nullable")]
    pub overhead_ms: f64,
}

impl TimelineRow {
    /// The six per-step values in [`Category::ALL`] order (idle is not per step).
    pub fn values_ms(&self) -> [f64; 6] {
        [
            self.compute_ms,
            self.data_wait_ms,
            self.transfer_ms,
            self.host_sync_ms,
            self.communication_ms,
            self.overhead_ms,
        ]
    }
}

/// Steps grouped into bins of `bin_steps`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Timeline {
    /// Steps per bin (the last bin may hold fewer).
    #[serde(deserialize_with = "nullable")]
    pub bin_steps: usize,
    /// The bins in step order.
    #[serde(deserialize_with = "nullable")]
    pub rows: Vec<TimelineRow>,
}

impl Timeline {
    /// Appends a bin.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push(
        &mut self,
        first_step: usize,
        last_step: usize,
        compute_ms: f64,
        data_wait_ms: f64,
        transfer_ms: f64,
        host_sync_ms: f64,
        communication_ms: f64,
        overhead_ms: f64,
    ) {
        self.rows.push(TimelineRow {
            first_step,
            last_step,
            compute_ms,
            data_wait_ms,
            transfer_ms,
            host_sync_ms,
            communication_ms,
            overhead_ms,
        });
    }
}

/// The whole breakdown of one fit (the `breakdown.json` of a run).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Breakdown {
    /// Wall time covered.
    #[serde(deserialize_with = "nullable")]
    pub wall_s: f64,
    /// Optimizer steps in it (0 when a file does not say).
    #[serde(deserialize_with = "nullable")]
    pub steps: usize,
    /// The device the run used.
    #[serde(deserialize_with = "nullable")]
    pub device: String,
    /// How time was attributed ([`RULE`]).
    #[serde(deserialize_with = "nullable")]
    pub rule: String,
    /// The six categories in [`Category::ALL`] order.
    #[serde(deserialize_with = "nullable")]
    pub categories: Vec<CategoryShare>,
    /// Per-step timeline (no rows when a file has none).
    #[serde(deserialize_with = "nullable")]
    pub timeline: Timeline,
    /// On a GPU: how long kernels actually ran, which splits compute into
    /// the GPU computing and the GPU waiting while the host launches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuBusy>,
}

impl Breakdown {
    /// Builds it from per-category seconds in [`Category::ALL`] order.
    pub fn new(
        wall_s: f64,
        steps: usize,
        device: &str,
        seconds: [f64; 7],
        timeline: Timeline,
    ) -> Self {
        let categories = Category::ALL
            .iter()
            .map(|c| {
                let s = seconds[c.index()];
                CategoryShare {
                    name: c.key().to_string(),
                    seconds: s,
                    percent: if wall_s > 0.0 {
                        100.0 * s / wall_s
                    } else {
                        0.0
                    },
                }
            })
            .collect();
        Self {
            wall_s,
            steps,
            device: device.to_string(),
            rule: RULE.to_string(),
            categories,
            timeline,
            gpu: None,
        }
    }

    /// Seconds in `cat`.
    pub fn seconds(&self, cat: Category) -> f64 {
        self.share(cat).map_or(0.0, |c| c.seconds)
    }

    /// Percent of wall time in `cat`.
    pub fn percent(&self, cat: Category) -> f64 {
        self.share(cat).map_or(0.0, |c| c.percent)
    }

    /// The share of `cat`, if the breakdown lists it.
    pub fn share(&self, cat: Category) -> Option<&CategoryShare> {
        self.categories.iter().find(|c| c.name == cat.key())
    }

    /// Percent of wall time in `cat`, if listed and finite (for a breakdown read from a file).
    pub fn listed_percent(&self, cat: Category) -> Option<f64> {
        self.share(cat).map(|c| c.percent).filter(|p| p.is_finite())
    }

    /// The one line printed at the end of every run.
    pub fn line(&self) -> String {
        // Communication only where ranks exchanged anything.
        let parts: Vec<String> = Category::ALL
            .iter()
            .filter(|c| **c != Category::Communication || self.seconds(**c) > 0.0)
            .map(|c| format!("{} {:.1}%", c.label(), self.percent(*c)))
            .collect();
        let per_step = if self.steps > 0 {
            format!(", {:.3} ms/step", 1e3 * self.wall_s / self.steps as f64)
        } else {
            String::new()
        };
        let gpu = self.gpu_split().map_or(String::new(), |(busy, waiting)| {
            format!(
                "\n      GPU: kernels ran {busy:.1}% of wall; the host issued compute while the GPU \
                 had none for at least {waiting:.1}%"
            )
        });
        format!(
            "time: {} (of {:.2} s{per_step}){gpu}",
            parts.join(" | "),
            self.wall_s
        )
    }

    /// On a GPU with a kernel trace: the percent of wall time in which
    /// kernels ran, and a lower bound on the percent in which the host was
    /// issuing compute while the GPU ran nothing (compute minus kernel time:
    /// kernels that ran while the host waited on something else only make
    /// the true figure larger).
    pub fn gpu_split(&self) -> Option<(f64, f64)> {
        let g = self.gpu.as_ref()?;
        let compute = self.percent(Category::Compute);
        Some((g.percent, (compute - g.percent).max(0.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_line() {
        let t = Timeline {
            bin_steps: 1,
            rows: vec![],
        };
        let b = Breakdown::new(
            2.0,
            4,
            "cpu",
            [1.0, 0.5, 0.0, 0.1, 0.0, 0.3, 0.1],
            t.clone(),
        );
        assert!((b.percent(Category::Compute) - 50.0).abs() < 1e-9);
        assert!((b.seconds(Category::Idle) - 0.1).abs() < 1e-9);
        let line = b.line();
        // One process exchanges nothing: no communication in the line.
        assert!(!line.contains("communication"), "{line}");
        let ddp = Breakdown::new(2.0, 4, "cpu", [1.0, 0.2, 0.0, 0.1, 0.3, 0.3, 0.1], t);
        assert!(ddp.line().contains("communication 15.0%"), "{}", ddp.line());
        assert!(line.contains("compute 50.0%"), "{line}");
        assert!(line.contains("data wait 25.0%"), "{line}");
        assert!(line.contains("500.000 ms/step"), "{line}");
        let json = serde_json::to_string(&b).unwrap_or_default();
        assert!(!json.contains("gpu"), "no GPU section on the CPU: {json}");
        let back: Breakdown = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, b);
        assert_eq!(b.gpu_split(), None);
    }

    #[test]
    fn a_kernel_trace_splits_compute() {
        // The issue's H100 run: compute 95.8% of wall, kernels 32%.
        let t = Timeline::default();
        let mut b = Breakdown::new(
            10.0,
            100,
            "cuda:0",
            [9.58, 0.0, 0.0, 0.1, 0.0, 0.3, 0.02],
            t,
        );
        let mut tally = crate::KernelTally::new(0);
        let k = tally.name_id("k");
        tally.add(&mut [crate::KernelSpan {
            start_ns: 0,
            end_ns: 3_200_000_000,
            name: k,
        }]);
        b.gpu = Some(tally.finish(10_000_000_000, 100, "cupti"));
        let (busy, waiting) = b.gpu_split().unwrap_or_default();
        assert!((busy - 32.0).abs() < 1e-9);
        assert!((waiting - 63.8).abs() < 1e-9);
        let line = b.line();
        assert!(line.contains("GPU: kernels ran 32.0% of wall"), "{line}");
        assert!(line.contains("GPU had none for at least 63.8%"), "{line}");
        let json = serde_json::to_string(&b).unwrap_or_default();
        let back: Breakdown = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, b);
    }

    #[test]
    fn reads_partial_and_null_files() {
        let b: Breakdown = serde_json::from_str(
            r#"{"wall_s":null,"categories":[{"name":"compute","percent":40.5},{"name":"idle","percent":null}],"timeline":null,"extra":1}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.wall_s, 0.0);
        assert_eq!(b.steps, 0);
        assert!(b.timeline.rows.is_empty());
        assert_eq!(b.listed_percent(Category::Compute), Some(40.5));
        assert_eq!(b.listed_percent(Category::Idle), Some(0.0));
        assert_eq!(b.listed_percent(Category::Transfer), None);
        assert!(serde_json::from_str::<Breakdown>(r#"{"steps":-1}"#).is_err());
    }
}
