#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The background sampler: collects, calls back, stops on request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redline_monitor::Sampler;

/// Waits (sleeping) until `done`, for at most 200 polls of 50 ms.
fn wait_for(mut done: impl FnMut() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn collects_samples_and_stops() {
    let sampler = Sampler::start(Duration::from_millis(50));
    wait_for(|| sampler.latest().is_some());
    let latest = sampler.latest().expect("a sample within 10 s");
    let samples = sampler.stop();
    assert!(!samples.is_empty());
    assert!(samples.windows(2).all(|w| w[0].t_s <= w[1].t_s));
    assert!(samples.iter().any(|s| s.t_s == latest.t_s));
    assert!(samples[0].host.memory_total > 0);
}

#[test]
fn stop_before_the_first_sample_returns_nothing() {
    // A long interval: stop must wake the thread rather than wait it out.
    let sampler = Sampler::start(Duration::from_secs(3600));
    assert!(sampler.latest().is_none());
    assert!(sampler.stop().is_empty());
}

#[test]
fn the_callback_sees_every_sample_and_a_panicking_one_is_contained() {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    let sampler = Sampler::start_with(
        Duration::from_millis(50),
        Box::new(move |s| {
            assert!(s.host.memory_total > 0);
            counter.fetch_add(1, Ordering::SeqCst);
        }),
    );
    wait_for(|| seen.load(Ordering::SeqCst) >= 2);
    let samples = sampler.stop();
    assert_eq!(samples.len(), seen.load(Ordering::SeqCst));
    assert!(samples.len() >= 2);

    let panicking = Sampler::start_with(Duration::from_millis(50), Box::new(|_| panic!("boom")));
    wait_for(|| panicking.latest().is_some());
    let first = panicking.latest().unwrap().t_s;
    wait_for(|| panicking.latest().is_some_and(|s| s.t_s > first));
    let samples = panicking.stop();
    assert!(
        samples.len() >= 2,
        "sampling goes on after the callback panics"
    );
}

#[test]
fn dropping_a_sampler_ends_its_thread() {
    // The callback owns a clone of `alive`: only the sampling thread holds it,
    // so the count falls back to 1 exactly when that thread has ended, and no
    // sample is taken after the drop returns.
    let alive = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let in_thread = alive.clone();
    let sampler = Sampler::start_with(
        Duration::from_millis(20),
        Box::new(move |_| {
            in_thread.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }),
    );
    wait_for(|| alive.load(std::sync::atomic::Ordering::SeqCst) > 0);
    drop(sampler);
    assert_eq!(
        std::sync::Arc::strong_count(&alive),
        1,
        "thread still alive"
    );
    let taken = alive.load(std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(alive.load(std::sync::atomic::Ordering::SeqCst), taken);
}
