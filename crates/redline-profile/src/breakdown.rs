//! Where the time went: six exclusive categories that sum to wall time, and a
//! per-step timeline of the five that happen inside steps.

use serde::{Deserialize, Serialize};

use crate::action::Category;

/// The attribution rule, written into every `breakdown.json`.
pub const RULE: &str = "Each instant of the fit's wall time counts once, in the category of what \
the training loop's thread was doing: compute (forward, loss, backward, optimizer, on-device \
metrics, validation), data wait (blocked on the loader), transfer (waiting for host-to-device \
copies), host sync (reading values back from the device), overhead (logging, callbacks, \
checkpoints, loop bookkeeping) or idle (inside the fit but in none of these). Work on other \
threads overlaps the loop and counts only through the loop's wait for it. On the CPU kernels run \
synchronously, so compute is host time spent in them.";

/// One category's share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoryShare {
    /// `compute`, `data_wait`, `transfer`, `host_sync`, `overhead` or `idle`.
    pub name: String,
    /// Seconds.
    pub seconds: f64,
    /// Percent of wall time.
    pub percent: f64,
}

/// Mean milliseconds per step of the steps `first_step..=last_step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineRow {
    /// First step of the bin (1-based).
    pub first_step: usize,
    /// Last step of the bin.
    pub last_step: usize,
    /// Compute.
    pub compute_ms: f64,
    /// Data wait.
    pub data_wait_ms: f64,
    /// Transfer.
    pub transfer_ms: f64,
    /// Host sync.
    pub host_sync_ms: f64,
    /// Overhead.
    pub overhead_ms: f64,
}

/// Steps grouped into bins of `bin_steps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Steps per bin (the last bin may hold fewer).
    pub bin_steps: usize,
    /// The bins in step order.
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
        overhead_ms: f64,
    ) {
        self.rows.push(TimelineRow {
            first_step,
            last_step,
            compute_ms,
            data_wait_ms,
            transfer_ms,
            host_sync_ms,
            overhead_ms,
        });
    }
}

/// The whole breakdown of one fit (the `breakdown.json` of a run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// Wall time covered.
    pub wall_s: f64,
    /// Optimizer steps in it.
    pub steps: usize,
    /// The device the run used.
    pub device: String,
    /// How time was attributed ([`RULE`]).
    pub rule: String,
    /// The six categories in [`Category::ALL`] order.
    pub categories: Vec<CategoryShare>,
    /// Per-step timeline.
    pub timeline: Timeline,
}

impl Breakdown {
    /// Builds it from per-category seconds in [`Category::ALL`] order.
    pub fn new(
        wall_s: f64,
        steps: usize,
        device: &str,
        seconds: [f64; 6],
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

    fn share(&self, cat: Category) -> Option<&CategoryShare> {
        self.categories.iter().find(|c| c.name == cat.key())
    }

    /// The one line printed at the end of every run.
    pub fn line(&self) -> String {
        let parts: Vec<String> = Category::ALL
            .iter()
            .map(|c| format!("{} {:.1}%", c.label(), self.percent(*c)))
            .collect();
        let per_step = if self.steps > 0 {
            format!(", {:.3} ms/step", 1e3 * self.wall_s / self.steps as f64)
        } else {
            String::new()
        };
        format!(
            "time: {} (of {:.2} s{per_step})",
            parts.join(" | "),
            self.wall_s
        )
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
        let b = Breakdown::new(2.0, 4, "cpu", [1.0, 0.5, 0.0, 0.1, 0.3, 0.1], t);
        assert!((b.percent(Category::Compute) - 50.0).abs() < 1e-9);
        assert!((b.seconds(Category::Idle) - 0.1).abs() < 1e-9);
        let line = b.line();
        assert!(line.contains("compute 50.0%"), "{line}");
        assert!(line.contains("data wait 25.0%"), "{line}");
        assert!(line.contains("500.000 ms/step"), "{line}");
        let json = serde_json::to_string(&b).unwrap_or_default();
        let back: Breakdown = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, b);
    }
}
