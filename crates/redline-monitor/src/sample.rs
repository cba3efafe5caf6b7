//! One reading of the whole machine ([`Sample`]) and the [`Monitor`] that takes it.
//!
//! A `Sample` is what `metrics.jsonl` stores as a `system` record (see
//! `docs/run-dir.md`), so its field names are part of the run-directory format.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::gpu::{GpuSample, Gpus};
use crate::host::{HostSample, HostSampler};

/// Host and GPU readings taken together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the monitor was created.
    pub t_s: f64,
    /// Seconds since the Unix epoch (UTC) when the sample was taken.
    pub unix_time: f64,
    /// CPU, memory and redline processes.
    pub host: HostSample,
    /// One entry per GPU; empty where NVML is unavailable.
    pub gpus: Vec<GpuSample>,
    /// Why `gpus` is empty (no driver, no GPUs), or `None`.
    pub gpu_note: Option<String>,
}

/// Host sampler plus NVML, where present. Creating one never fails: without a
/// driver it samples the host alone and says why in each sample's `gpu_note`.
#[derive(Debug)]
pub struct Monitor {
    host: HostSampler,
    gpus: Option<Gpus>,
    gpu_note: Option<String>,
    start: Instant,
}

impl Default for Monitor {
    fn default() -> Self {
        Self::new()
    }
}

impl Monitor {
    /// Primes the host sampler and opens NVML. `t_s` counts from here; the first
    /// sample's CPU figures are meaningful after [`crate::CPU_WINDOW`].
    pub fn new() -> Self {
        let host = HostSampler::new();
        if let Some(note) = host.note() {
            tracing::warn!("{note}");
        }
        let (gpus, gpu_note) = match Gpus::open() {
            Ok(gpus) => (Some(gpus), None),
            Err(note) => {
                tracing::debug!("{note}");
                (None, Some(note))
            }
        };
        Self {
            host,
            gpus,
            gpu_note,
            start: Instant::now(),
        }
    }

    /// The open NVML session, where there is one.
    pub fn gpus(&self) -> Option<&Gpus> {
        self.gpus.as_ref()
    }

    /// Why there is no GPU data, where there is none.
    pub fn gpu_note(&self) -> Option<&str> {
        self.gpu_note.as_deref()
    }

    /// `driver 550.54.15, CUDA 12.4` for a header line, where NVML is open.
    pub fn driver_summary(&self) -> Option<String> {
        let gpus = self.gpus.as_ref()?;
        let driver = gpus.driver_version().unwrap_or("?");
        Some(match gpus.cuda_driver_version() {
            Some(cuda) => format!("driver {driver}, CUDA {cuda}"),
            None => format!("driver {driver}"),
        })
    }

    /// Reads host and GPUs now.
    pub fn sample(&mut self) -> Sample {
        let host = self.host.sample();
        let gpus = self.gpus.as_ref().map(Gpus::sample).unwrap_or_default();
        Sample {
            t_s: self.start.elapsed().as_secs_f64(),
            unix_time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            host,
            gpus,
            gpu_note: self.gpu_note.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    /// `metrics.jsonl` must give back the exact times it stored. serde_json's
    /// default fast float parser reads about one in eight of these neighbours
    /// of a real timestamp back an ulp or two off (it failed CI at stop 8);
    /// its `float_roundtrip` feature fixes that.
    #[test]
    fn unix_times_round_trip_exactly_through_json() {
        let mut t = 1_795_332_176.505_013_5_f64;
        for _ in 0..10_000 {
            let json = serde_json::to_string(&t).unwrap();
            let back: f64 = serde_json::from_str(&json).unwrap();
            assert_eq!(back.to_bits(), t.to_bits(), "{json}");
            t = f64::from_bits(t.to_bits() + 1);
        }
    }
}
