//! `redline tune workers`: the streamed image pipeline timed alone (read,
//! decode, augment, normalise, batch; no model) at 1, 2, 4, ... decode
//! threads up to the usable cores, each with the process's peak resident
//! memory; the choice is the fewest threads within 5% of the fastest.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use redline_data::{Dataset, Loader, LoaderConfig, Samples};
use serde::Serialize;

use crate::plan::Plan;

/// Each count is timed for at least this long (and 4 batches).
const TRIAL: Duration = Duration::from_secs(3);
/// The fewest workers within this share of the fastest rate are chosen.
const WITHIN: f64 = 0.05;

/// One worker count's measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    /// Decode threads.
    pub workers: usize,
    /// Images per second through the whole pipeline.
    pub images_per_s: f64,
    /// Peak resident memory of the process during the trial (Linux VmHWM,
    /// reset before it), bytes.
    pub peak_rss_bytes: Option<u64>,
}

/// The search's result.
#[derive(Debug, Clone, Serialize)]
pub struct WorkersChoice {
    /// Every count timed.
    pub trials: Vec<Trial>,
    /// The choice.
    pub workers: usize,
    /// Samples per batch of the trials.
    pub batch_size: usize,
}

impl WorkersChoice {
    /// The trials as a text table.
    pub fn table(&self) -> String {
        let mut s = String::from("  workers  images/s  peak RSS\n");
        for t in &self.trials {
            s.push_str(&format!(
                "  {:>7}  {:>8.1}  {:>8}{}\n",
                t.workers,
                t.images_per_s,
                t.peak_rss_bytes
                    .map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0)),
                if t.workers == self.workers {
                    "  <- chosen"
                } else {
                    ""
                }
            ));
        }
        s
    }

    /// The line that states the choice.
    pub fn line(&self) -> String {
        format!(
            "workers: {} (the fewest within {:.0}% of the fastest, batch {}; train with --workers {})",
            self.workers,
            WITHIN * 100.0,
            self.batch_size,
            self.workers
        )
    }

    /// The trials as CSV.
    pub fn csv(&self) -> String {
        let mut s = String::from("workers,images_per_s,peak_rss_bytes,chosen\n");
        for t in &self.trials {
            s.push_str(&format!(
                "{},{},{},{}\n",
                t.workers,
                t.images_per_s,
                t.peak_rss_bytes.map_or(String::new(), |b| b.to_string()),
                t.workers == self.workers
            ));
        }
        s
    }
}

/// Resets the kernel's peak-RSS mark of this process (Linux); false where
/// it cannot.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The peak resident memory since the last reset (VmHWM), bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The worker counts tried: powers of two below `cores`, and `cores`.
fn counts(cores: usize) -> Vec<usize> {
    let mut c: Vec<usize> = std::iter::successors(Some(1usize), |n| Some(n * 2))
        .take_while(|&n| n < cores)
        .collect();
    c.push(cores.max(1));
    c
}

/// Times the plan's streamed training split at each worker count.
pub fn search(plan: &Plan, prefetch: usize) -> anyhow::Result<WorkersChoice> {
    let Some(stream) = plan.prepared.train.streamed() else {
        bail!(
            "the training images are decoded into memory once (resident), so no decode workers \
             run while training\nHINT: pass --stream on (with the run's --augment) to tune the \
             streamed pipeline"
        );
    };
    let batch = plan.batch_size.clamp(1, stream.len().max(1));
    let mut trials = Vec::new();
    for workers in counts(redline_core::threads::usable_cores()) {
        plan.stop.check("timing the data workers")?;
        let data = Samples::Streamed(Box::new(stream.with_workers(workers)?));
        let cfg = LoaderConfig {
            batch_size: batch,
            shuffle: true,
            seed: plan.seed,
            prefetch,
            drop_last: false,
        };
        let cpu = redline_core::Device::cpu();
        let loader = Loader::from_dataset(Arc::new(data), cpu.candle(), cfg)?;
        let reset = reset_peak_rss();
        let (mut seen, mut start, mut epoch) = (0usize, None::<(Instant, usize)>, 0usize);
        'trial: loop {
            for b in loader.epoch(epoch) {
                seen += b.context("the pipeline")?.size();
                match start {
                    // The first batch warms the pool and the page cache.
                    None => start = Some((Instant::now(), seen)),
                    Some((t, s0)) if t.elapsed() >= TRIAL && seen - s0 >= 4 * batch => {
                        break 'trial;
                    }
                    Some(_) => {}
                }
            }
            epoch += 1;
        }
        let (t, s0) = start.unwrap_or((Instant::now(), 0));
        trials.push(Trial {
            workers,
            images_per_s: (seen - s0) as f64 / t.elapsed().as_secs_f64().max(1e-9),
            peak_rss_bytes: reset.then(peak_rss).flatten(),
        });
    }
    let best = trials.iter().map(|t| t.images_per_s).fold(0.0, f64::max);
    let workers = trials
        .iter()
        .find(|t| t.images_per_s >= (1.0 - WITHIN) * best)
        .map_or(1, |t| t.workers);
    Ok(WorkersChoice {
        trials,
        workers,
        batch_size: batch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_double_up_to_the_cores() {
        assert_eq!(counts(1), vec![1]);
        assert_eq!(counts(2), vec![1, 2]);
        assert_eq!(counts(6), vec![1, 2, 4, 6]);
        assert_eq!(counts(16), vec![1, 2, 4, 8, 16]);
    }

    #[test]
    fn the_peak_rss_reads_back_after_a_reset() {
        // Linux keeps VmHWM; the reset may be refused in a sandbox.
        let _ = reset_peak_rss();
        assert!(peak_rss().is_some_and(|b| b > 1 << 20));
    }
}
