//! What a kernel's fork costs: `join` of two empty closures from a thread
//! outside a 2-thread rayon pool (the work is handed over and the caller
//! sleeps until a pool thread has run it) against the same from a thread
//! that is the pool's first (rayon's `use_current_thread`, what
//! `redline_core::threads::configure` makes of the training loop's thread),
//! after the caller was busy for 0 to 5000 us (pool threads go to sleep when
//! idle). Median and 90th percentile microseconds of 200 forks.
//!
//! `cargo run --release -p redline-kernels --example fork_cost`

use std::time::{Duration, Instant};

fn busy(us: u64) {
    let s = Instant::now();
    while s.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

fn forks(pool: &rayon::ThreadPool, idle_us: u64) -> (f64, f64) {
    let mut t: Vec<f64> = (0..200)
        .map(|_| {
            busy(idle_us);
            let s = Instant::now();
            pool.join(|| std::hint::black_box(1), || std::hint::black_box(2));
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[100], t[180])
}

fn main() -> Result<(), rayon::ThreadPoolBuildError> {
    let outside = rayon::ThreadPoolBuilder::new().num_threads(2).build()?;
    // The registry of a local pool built this way is leaked (rayon's note):
    // fine for a one-shot measurement.
    let inside = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .use_current_thread()
        .build()?;
    println!(
        "{:>12} {:>22} {:>22}",
        "busy before", "outside: median p90", "inside: median p90"
    );
    for idle in [0u64, 100, 1000, 5000] {
        let (om, o9) = forks(&outside, idle);
        let (im, i9) = forks(&inside, idle);
        println!("{idle:>9} us {om:>12.1} {o9:>9.1} {im:>12.1} {i9:>9.1}");
    }
    Ok(())
}
