//! The thread policy: compute threads = free cores (measured), `--threads N`
//! overrides. Both candle's kernels (which read `RAYON_NUM_THREADS` on every
//! call) and Redline's fused kernels follow the process's setting
//! ([`configure`]). A trainer (or any caller) can narrow the fused kernels to
//! its own count on its own thread with [`scoped`], so two trainers in one
//! process do not change each other's setting. The prefetch thread blocks on
//! a channel, so it does not count. The thread that applies the policy (the
//! one that runs the training loop) becomes the first thread of rayon's pool,
//! so that a kernel's fork starts at once instead of waiting on a wake-up.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// The most compute threads a setting may ask for (each is an OS thread).
pub const MAX_THREADS: usize = 1024;

/// Refuses a thread count outside 1..=[`MAX_THREADS`], naming `--threads`.
pub fn check(n: usize) -> Result<(), String> {
    let what = match n {
        0 => format!("give 1 to {MAX_THREADS} compute threads"),
        n if n > MAX_THREADS => {
            format!("at most {MAX_THREADS} (each is an OS thread of the compute pool)")
        }
        _ => return Ok(()),
    };
    Err(format!(
        "--threads {n}: {what}\nHINT: leave it out to use the free cores"
    ))
}

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

/// The free cores measured by the last [`configure`] (as f64 bits; NaN: not measured).
static LAST_FREE: AtomicU64 = AtomicU64::new(0x7ff8_0000_0000_0000);

/// Cores not busy with other work, measured over `window`, unrounded (0..=cores).
/// Falls back to all usable cores where the load cannot be read.
pub fn measure_free_cores(window: Duration) -> f64 {
    let cores = usable_cores() as f64;
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
    let busy = (b1 - b0) as f64 / (t1 - t0) as f64 * cores;
    (cores - busy).clamp(0.0, cores)
}

/// Cores not busy with other work, measured over `window` (at least 1).
pub fn free_cores(window: Duration) -> usize {
    let free = measure_free_cores(window);
    LAST_FREE.store(free.to_bits(), Ordering::Relaxed);
    free.round().clamp(1.0, usable_cores() as f64) as usize
}

/// The free cores (unrounded) the last thread-policy measurement saw, if any.
pub fn last_free_cores() -> Option<f64> {
    let v = f64::from_bits(LAST_FREE.load(Ordering::Relaxed));
    v.is_finite().then_some(v)
}

/// Applies the policy: `requested` threads, or the free cores when `None`.
/// Call once at start, before any tensor work. Returns the thread count chosen.
pub fn configure(requested: Option<usize>) -> usize {
    let n = requested
        .unwrap_or_else(|| free_cores(Duration::from_millis(100)))
        .max(1);
    // candle (matmul, conv) and rayon's global pool read this; set before first use.
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    // candle's elementwise ops over 64K elements or more split over a pool of
    // their own (`CANDLE_NUM_THREADS`, else `RAYON_NUM_THREADS`, less one),
    // whose workers spin after each op while the compute pool runs the next
    // kernel. In a training step those ops are candle's gradient
    // accumulation (`zeros + grad` per activation in `backward`). Where the
    // compute threads take every core, that pool only takes their time: on a
    // 2-core VM at --threads 2, one thread for it made the CNN's steps 21%
    // faster in fp32 and 12% in bf16-mixed, the MLP's 28% at batch 512
    // (bench/results/2026-11-26-vm-candle-threads.md); on a 16-core host at
    // --threads 16, 22% faster for the CNN (5.07 s/epoch against 6.51 s).
    // Where cores are left over it is worth having: at --threads 4 on that
    // host, a pool of 4 made the CNN's epoch 11% faster (9.16 s against
    // 10.25 s; bench/results/h100-2026-11-26/cpu/). So it gets the cores the
    // compute threads leave, up to their count ([`candle_threads`]). A
    // user's own setting stands.
    candle_threads_unless_set(n);
    set_compute_threads(n);
    join_the_pool(n);
    n
}

/// Makes the calling thread (the one that will run the training loop) the
/// first of rayon's global pool's `n` threads, where `n > 1` and the pool
/// is not built yet. A parallel kernel called from outside the pool hands
/// its work to the pool and sleeps until a pool thread has woken, taken it
/// and signalled back: on the 2-core VM a `join` of two empty closures took
/// 113-173 us after a millisecond idle, against 14 us from inside the pool
/// (`examples/fork_cost.rs`), a few times in every layer's step. From inside
/// the pool, a fork runs its first half at once and a sibling steals the
/// rest when it wakes: the MLP's step at batch 512 took 0.85x the time, the
/// bf16 CNN's 0.91x (`bench/results/2026-11-26-vm-fork-in-pool.md`,
/// alternating runs against the binary before). The calling thread does not
/// run the pool's stealing loop when it is idle (rayon's
/// `use_current_thread`), so at one thread (no other pool thread to take
/// work that other threads submit) the pool is left as it was.
fn join_the_pool(n: usize) {
    if n > 1 {
        // An error means the pool was built already (by an earlier call or
        // a library): it keeps its threads, and forks cost as before.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .use_current_thread()
            .build_global();
    }
}

/// Sets [`CANDLE_THREADS`] to [`candle_threads`] beside `n` compute threads
/// where the environment does not set it.
fn candle_threads_unless_set(n: usize) {
    if std::env::var_os(CANDLE_THREADS).is_none() {
        std::env::set_var(
            CANDLE_THREADS,
            candle_threads(n, usable_cores()).to_string(),
        );
    }
}

/// The thread count [`configure`] gives candle's elementwise pool beside `n`
/// compute threads on `cores` cores: the cores they leave, at least 1 and at
/// most `n`.
pub fn candle_threads(n: usize, cores: usize) -> usize {
    cores.saturating_sub(n).clamp(1, n.max(1))
}

/// candle's own thread count for its elementwise ops ([`configure`] sets
/// [`candle_threads`] unless the user set it).
pub const CANDLE_THREADS: &str = "CANDLE_NUM_THREADS";

/// Compute threads for the fused kernels (0 = not set).
static COMPUTE_THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's own count (0 = follow the process's).
    static LOCAL_THREADS: Cell<usize> = const { Cell::new(0) };
}

/// Restores the thread's previous count when dropped; see [`scoped`].
#[must_use = "the count applies only while the guard lives"]
#[derive(Debug)]
pub struct ScopedThreads {
    prev: usize,
}

impl Drop for ScopedThreads {
    fn drop(&mut self) {
        LOCAL_THREADS.with(|c| c.set(self.prev));
    }
}

/// Makes the fused kernels called from this thread split their work over `n`
/// threads (at least 1) until the guard drops, whatever the process's setting.
/// Candle's own CPU kernels keep following `RAYON_NUM_THREADS`, which is
/// process-wide by nature.
pub fn scoped(n: usize) -> ScopedThreads {
    let prev = LOCAL_THREADS.with(|c| c.replace(n.max(1)));
    ScopedThreads { prev }
}

/// Sets the number of compute threads the fused kernels split work over.
pub fn set_compute_threads(n: usize) {
    COMPUTE_THREADS.store(n.max(1), Ordering::Relaxed);
}

/// Compute threads the fused kernels may use: this thread's [`scoped`] count,
/// else as set for the process, else `RAYON_NUM_THREADS` (what candle's
/// kernels follow), else all available cores.
pub fn compute_threads() -> usize {
    let local = LOCAL_THREADS.with(Cell::get);
    if local > 0 {
        return local;
    }
    match COMPUTE_THREADS.load(Ordering::Relaxed) {
        0 => std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        n => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scoped_count_holds_on_its_thread_only_and_nests() {
        let process = compute_threads();
        let other = std::thread::spawn(|| {
            let _g = scoped(5);
            std::thread::sleep(Duration::from_millis(20));
            compute_threads()
        });
        {
            let _outer = scoped(3);
            assert_eq!(compute_threads(), 3);
            {
                let _inner = scoped(0);
                assert_eq!(compute_threads(), 1, "at least one thread");
            }
            assert_eq!(compute_threads(), 3);
        }
        assert_eq!(compute_threads(), process);
        assert_eq!(other.join().unwrap(), 5);
    }

    /// candle's pool gets the cores the compute threads leave: none left
    /// (every core computing, as on the 2-core VM or --threads 16 on 16
    /// cores) gives it one thread; spare cores give it up to the compute
    /// threads' count.
    #[test]
    fn candles_pool_gets_the_cores_left_over() {
        assert_eq!(candle_threads(2, 2), 1);
        assert_eq!(candle_threads(16, 16), 1);
        assert_eq!(candle_threads(32, 16), 1, "more threads than cores");
        assert_eq!(candle_threads(4, 16), 4);
        assert_eq!(candle_threads(12, 16), 4);
        assert_eq!(candle_threads(1, 2), 1);
        assert_eq!(candle_threads(0, 8), 1);
    }

    #[test]
    fn thread_counts_are_bounded() {
        assert!(check(1).is_ok() && check(MAX_THREADS).is_ok());
        assert!(check(0).is_err_and(|e| e.contains("--threads 0: give 1 to 1024")));
        assert!(check(MAX_THREADS + 1).is_err_and(|e| e.contains("at most 1024")));
    }

    #[test]
    fn candles_elementwise_ops_get_the_spare_cores_unless_set() {
        // The only test in this crate that touches the variable.
        std::env::remove_var(CANDLE_THREADS);
        candle_threads_unless_set(usable_cores());
        assert_eq!(std::env::var(CANDLE_THREADS).as_deref(), Ok("1"));
        std::env::set_var(CANDLE_THREADS, "3");
        candle_threads_unless_set(1);
        assert_eq!(std::env::var(CANDLE_THREADS).as_deref(), Ok("3"));
    }

    #[test]
    fn free_cores_is_within_bounds() {
        let n = free_cores(Duration::from_millis(20));
        assert!(n >= 1 && n <= usable_cores());
    }
}
