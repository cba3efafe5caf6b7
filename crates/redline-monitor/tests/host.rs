#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The real host sampler on this machine.

use redline_monitor::{HostSampler, CPU_WINDOW};

#[test]
fn samples_every_core_memory_and_this_process() {
    let mut host = HostSampler::new();
    assert_eq!(host.note(), None);
    std::thread::sleep(CPU_WINDOW);
    // Some work of our own, so the process has CPU time to show.
    let mut x = 0u64;
    for i in 0..5_000_000u64 {
        x = x.wrapping_mul(31).wrapping_add(i);
    }
    std::hint::black_box(x);
    let s = host.sample();

    let logical = std::thread::available_parallelism().unwrap().get();
    // sysinfo lists every online core; the affinity mask may allow fewer.
    assert!(s.cpu_percent_per_core.len() >= logical, "{s:?}");
    for &pct in &s.cpu_percent_per_core {
        assert!((0.0..=100.5).contains(&pct), "per-core {pct}");
    }
    assert!((0.0..=100.5).contains(&s.cpu_percent), "{}", s.cpu_percent);
    assert!(
        s.memory_total > 0 && s.memory_used <= s.memory_total,
        "{s:?}"
    );
    let cores = s.cpu_percent_per_core.len() as f64;
    assert!(
        (0.0..=100.5 * cores).contains(&s.process_cpu_percent),
        "{s:?}"
    );
    assert!(s.process_rss > 0);

    let me = std::process::id();
    let mine = s
        .processes
        .iter()
        .find(|p| p.pid == me)
        .expect("own pid listed");
    assert!(mine.rss > 0);
    assert!(!mine.name.is_empty());
}

#[test]
fn a_second_sample_still_reads_real_values() {
    let mut host = HostSampler::new();
    std::thread::sleep(CPU_WINDOW);
    let _ = host.sample();
    std::thread::sleep(CPU_WINDOW);
    let s = host.sample();
    assert!(!s.cpu_percent_per_core.is_empty());
    assert!(s.memory_total > 0);
    assert!(s.processes.iter().any(|p| p.pid == std::process::id()));
}
