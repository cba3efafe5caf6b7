//! The process's one thread policy: compute threads = free cores (measured),
//! `--threads N` overrides. Both candle's kernels (which read
//! `RAYON_NUM_THREADS` on every call) and Redline's fused kernels follow it.
//! The prefetch thread blocks on a channel, so it does not count.

use std::time::Duration;

/// Cores this process may run on.
pub fn usable_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// (busy, total) jiffies summed over all CPUs, from `/proc/stat` (Linux).
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    let total: u64 = v.iter().take(8).sum();
    Some((total - idle, total))
}

/// Cores not busy with other work, measured over `window` (at least 1).
/// Falls back to all usable cores where the load cannot be read.
pub fn free_cores(window: Duration) -> usize {
    let cores = usable_cores();
    let Some((b0, t0)) = cpu_jiffies() else {
        return cores;
    };
    std::thread::sleep(window);
    let Some((b1, t1)) = cpu_jiffies() else {
        return cores;
    };
    if t1 <= t0 {
        return cores;
    }
    let busy = (b1 - b0) as f64 / (t1 - t0) as f64 * cores as f64;
    (cores as f64 - busy).round().clamp(1.0, cores as f64) as usize
}

/// Applies the policy: `requested` threads, or the free cores when `None`.
/// Call once at start, before any tensor work. Returns the thread count chosen.
pub fn configure(requested: Option<usize>) -> usize {
    let n = requested
        .unwrap_or_else(|| free_cores(Duration::from_millis(100)))
        .max(1);
    // candle (matmul, conv) and rayon's global pool read this; set before first use.
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    crate::ops::gemm::set_threads(n);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_cores_is_within_bounds() {
        let n = free_cores(Duration::from_millis(20));
        assert!(n >= 1 && n <= usable_cores());
    }
}
