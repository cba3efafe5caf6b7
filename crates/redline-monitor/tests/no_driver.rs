#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Without an NVIDIA driver (this CI machine), GPU stats are off with a note and
//! everything else works. Where a driver is present the same tests check the
//! other side: GPUs are listed and no note is given.

use redline_monitor::{Gpus, Monitor};

fn driver_present() -> bool {
    Gpus::open().is_ok()
}

#[test]
fn open_says_nvml_is_unavailable_in_one_line() {
    if let Ok(gpus) = Gpus::open() {
        assert!(gpus.count() > 0, "a driver without GPUs should not open");
        assert!(gpus.inventory().iter().all(|g| !g.name.is_empty()));
        return;
    }
    let note = Gpus::open().unwrap_err();
    assert!(note.contains("NVML"), "{note}");
    assert!(note.contains("GPU stats off"), "{note}");
    assert!(!note.contains('\n'), "{note}");
}

#[test]
fn monitor_samples_the_host_and_carries_the_note() {
    let mut monitor = Monitor::new();
    let sample = monitor.sample();
    assert!(sample.host.memory_total > 0);
    assert!(!sample.host.cpu_percent_per_core.is_empty());
    assert!(sample.unix_time > 1.0e9 && sample.t_s >= 0.0);
    if driver_present() {
        assert!(sample.gpu_note.is_none());
        assert!(!sample.gpus.is_empty());
    } else {
        assert!(sample.gpus.is_empty());
        assert!(monitor.driver_summary().is_none());
        let note = sample.gpu_note.as_deref().unwrap();
        assert!(note.contains("NVML"), "{note}");
        assert_eq!(monitor.gpu_note(), Some(note));
    }
    // The record round-trips through JSON as metrics.jsonl stores it.
    let json = serde_json::to_string(&sample).unwrap();
    let back: redline_monitor::Sample = serde_json::from_str(&json).unwrap();
    assert_eq!(back, sample);
}

#[test]
fn monitor_and_sampler_can_move_between_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<Monitor>();
    assert_send::<redline_monitor::Sampler>();
    assert_send::<redline_monitor::Sample>();
}
