//! `breakdown.json` and `profile.json`: where the wall time went.
//!
//! Tolerant like the other records: unknown fields are ignored and `null`
//! reads as zero or empty.

use serde::Deserialize;

use crate::records::nullable;

/// The six categories of `breakdown.json`, in the documented order.
pub const CATEGORIES: [&str; 6] = [
    "compute",
    "data_wait",
    "transfer",
    "host_sync",
    "overhead",
    "idle",
];

/// One category of the time breakdown.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Category {
    /// One of [`CATEGORIES`].
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Seconds attributed to it.
    #[serde(deserialize_with = "nullable")]
    pub seconds: f64,
    /// Percent of `wall_s`.
    #[serde(deserialize_with = "nullable")]
    pub percent: f64,
}

/// One bin of the per-step timeline: mean milliseconds per step of its steps.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TimelineRow {
    /// First step of the bin.
    pub first_step: u64,
    /// Last step of the bin.
    pub last_step: u64,
    /// Compute per step, ms.
    #[serde(deserialize_with = "nullable")]
    pub compute_ms: f64,
    /// Waiting for data per step, ms.
    #[serde(deserialize_with = "nullable")]
    pub data_wait_ms: f64,
    /// Host-to-device copies per step, ms.
    #[serde(deserialize_with = "nullable")]
    pub transfer_ms: f64,
    /// Device-to-host reads per step, ms.
    #[serde(deserialize_with = "nullable")]
    pub host_sync_ms: f64,
    /// Framework overhead per step, ms.
    #[serde(deserialize_with = "nullable")]
    pub overhead_ms: f64,
}

impl TimelineRow {
    /// The five per-step values in [`CATEGORIES`] order (idle is not per step).
    pub fn values_ms(&self) -> [f64; 5] {
        [
            self.compute_ms,
            self.data_wait_ms,
            self.transfer_ms,
            self.host_sync_ms,
            self.overhead_ms,
        ]
    }
}

/// The per-step timeline of `breakdown.json`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Timeline {
    /// Steps per bin.
    pub bin_steps: u64,
    /// The bins, in step order.
    #[serde(deserialize_with = "nullable")]
    pub rows: Vec<TimelineRow>,
}

/// `breakdown.json`: where the wall time went.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Breakdown {
    /// Seconds the categories sum to.
    #[serde(deserialize_with = "nullable")]
    pub wall_s: f64,
    /// Optimizer steps measured.
    pub steps: Option<u64>,
    /// Device of the run.
    #[serde(deserialize_with = "nullable")]
    pub device: String,
    /// The attribution rule, in words.
    #[serde(deserialize_with = "nullable")]
    pub rule: String,
    /// The six categories.
    #[serde(deserialize_with = "nullable")]
    pub categories: Vec<Category>,
    /// Per-step timeline, if recorded.
    pub timeline: Option<Timeline>,
}

impl Breakdown {
    /// The category called `name`, if present.
    pub fn category(&self, name: &str) -> Option<&Category> {
        self.categories.iter().find(|c| c.name == name)
    }

    /// Percent of wall time in `name`, if present and finite.
    pub fn percent(&self, name: &str) -> Option<f64> {
        self.category(name)
            .map(|c| c.percent)
            .filter(|p| p.is_finite())
    }
}

/// One row of the profiler table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ProfileRow {
    /// What ran (`forward`, `backward`, ..., `other`).
    #[serde(deserialize_with = "nullable")]
    pub action: String,
    /// Times it ran.
    pub calls: Option<u64>,
    /// Mean milliseconds per call.
    pub mean_ms: Option<f64>,
    /// Total seconds (exclusive).
    pub total_s: Option<f64>,
    /// Percent of wall time.
    pub percent: Option<f64>,
}

/// `profile.json`: the profiler table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Profile {
    /// Seconds the rows sum to.
    pub wall_s: Option<f64>,
    /// `simple` or `detailed`.
    #[serde(deserialize_with = "nullable")]
    pub mode: String,
    /// The rows; the last is `other`.
    #[serde(deserialize_with = "nullable")]
    pub rows: Vec<ProfileRow>,
}
