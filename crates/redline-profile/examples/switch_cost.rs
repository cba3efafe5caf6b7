//! What the always-on part of the profiler costs: nanoseconds per `switch`
//! (one clock read and a few adds) and per traced span when detailed.
//!
//! `cargo run --release -p redline-profile --example switch_cost`

use std::time::Instant;

use redline_profile::{Action, Mode, Profiler};

fn per_switch_ns(mode: Mode, n: usize) -> f64 {
    let mut p = Profiler::new(mode, "cpu");
    p.plan(n / 10);
    let t = Instant::now();
    for i in 0..n {
        p.switch(if i % 2 == 0 {
            Action::TrainingStep
        } else {
            Action::Backward
        });
        if i % 10 == 9 {
            p.end_step();
        }
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / n as f64;
    drop(p.finish());
    ns
}

fn main() {
    let n = 2_000_000;
    // Warm up, then take the median of 5.
    per_switch_ns(Mode::Off, n / 10);
    for mode in [Mode::Off, Mode::Simple, Mode::Detailed] {
        let n = if mode == Mode::Detailed { n / 10 } else { n };
        let mut v: Vec<f64> = (0..5).map(|_| per_switch_ns(mode, n)).collect();
        v.sort_by(f64::total_cmp);
        println!(
            "{mode:>8}: {:.1} ns per switch (median of 5, {n} switches each)",
            v[2]
        );
    }
    println!("a training step switches 9 times (10 at log points)");
}
