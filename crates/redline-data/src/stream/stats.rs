//! What the decode workers did: images made and the seconds spent making
//! them, summed over the workers. From these come the pipeline's own rate
//! (images a second it could make with every worker busy) and how busy the
//! workers were while the model trained: a pipeline whose workers were busy
//! nearly all the time is what bounds the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters shared by a streamed source and its clones and splits.
#[derive(Debug, Default)]
pub struct Counters {
    images: AtomicU64,
    busy_ns: AtomicU64,
}

impl Counters {
    /// One image made in `took` on a worker.
    pub fn add(&self, took: Duration) {
        self.images.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The counts so far, for `workers` workers.
    pub fn read(&self, workers: usize) -> PipelineStats {
        PipelineStats {
            workers,
            images: self.images.load(Ordering::Relaxed),
            busy_s: self.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// The decode workers' totals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipelineStats {
    /// Decode threads.
    pub workers: usize,
    /// Images read, decoded, transformed and normalised.
    pub images: u64,
    /// Seconds the workers spent on them, summed over the workers.
    pub busy_s: f64,
}

impl PipelineStats {
    /// Images a second the pipeline makes with every worker busy (`None`
    /// before it has made any).
    pub fn images_per_s(&self) -> Option<f64> {
        (self.busy_s > 0.0 && self.images > 0)
            .then(|| self.workers as f64 * self.images as f64 / self.busy_s)
    }

    /// The share of `wall_s` seconds the workers were busy (0..=1, or a
    /// little above where timing rounds).
    pub fn busy_share(&self, wall_s: f64) -> Option<f64> {
        (wall_s > 0.0 && self.workers > 0).then(|| self.busy_s / (self.workers as f64 * wall_s))
    }

    /// The difference of two readings: what happened between them.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            workers: self.workers,
            images: self.images.saturating_sub(before.images),
            busy_s: (self.busy_s - before.busy_s).max(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_per_busy_second_times_the_workers() {
        let c = Counters::default();
        for _ in 0..10 {
            c.add(Duration::from_millis(20));
        }
        let s = c.read(4);
        assert_eq!(s.images, 10);
        assert!((s.busy_s - 0.2).abs() < 1e-9);
        // 10 images in 0.2 worker-seconds: 50 a second per worker, 200 for 4.
        assert!((s.images_per_s().unwrap_or(0.0) - 200.0).abs() < 1e-6);
        assert!((s.busy_share(0.1).unwrap_or(0.0) - 0.5).abs() < 1e-9);
        let before = PipelineStats {
            workers: 4,
            images: 4,
            busy_s: 0.05,
        };
        assert_eq!(s.since(&before).images, 6);
        assert_eq!(Counters::default().read(2).images_per_s(), None);
    }
}
