//! A background thread that samples the machine at a fixed interval.
//!
//! The thread, named `redline-monitor`, waits on a channel with a timeout
//! between samples, so it sleeps rather than spins and [`Sampler::stop`] wakes
//! it at once. It never takes the process down: a panic in sampling or in the
//! callback is caught, logged, and ends sampling (or just the callback).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::host::CPU_WINDOW;
use crate::sample::{Monitor, Sample};

/// Called on the sampling thread with each new sample.
pub type SampleCallback = Box<dyn FnMut(&Sample) + Send>;

/// Samples the machine on a background thread until stopped.
///
/// Every sample is kept until [`Sampler::stop`] (a few KiB each: about 10 MB an
/// hour at one sample a second on a 64-core host); stream them with
/// [`Sampler::start_with`] instead for very long runs at short intervals.
#[derive(Debug)]
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop_tx: mpsc::Sender<()>,
    handle: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling every `interval`. The first sample comes after one
    /// interval, and no sooner than [`CPU_WINDOW`], so its CPU figures are real.
    /// NVML is opened on the sampling thread, so this returns at once.
    pub fn start(interval: Duration) -> Sampler {
        Self::spawn(interval, None)
    }

    /// As [`Sampler::start`], also calling `callback` with each sample on the
    /// sampling thread (keep it short: it delays the next sample).
    pub fn start_with(interval: Duration, callback: SampleCallback) -> Sampler {
        Self::spawn(interval, Some(callback))
    }

    /// The most recent sample, if one has been taken.
    pub fn latest(&self) -> Option<Sample> {
        lock(&self.samples).last().cloned()
    }

    /// Stops the thread (it wakes at once) and returns every sample, oldest first.
    pub fn stop(mut self) -> Vec<Sample> {
        // The receiver may already be gone if the thread ended early; either way it stops.
        let _ = self.stop_tx.send(());
        if let Some(handle) = self.handle.take() {
            if handle.join().is_err() {
                tracing::warn!("the redline-monitor thread ended abnormally");
            }
        }
        std::mem::take(&mut *lock(&self.samples))
    }

    fn spawn(interval: Duration, callback: Option<SampleCallback>) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (stop_tx, stop_rx) = mpsc::channel();
        let store = Arc::clone(&samples);
        // Traced with the thread that starts it (`--profiler detailed`).
        let tracer = redline_core::trace::current();
        let spawned = std::thread::Builder::new()
            .name("redline-monitor".into())
            .spawn(move || {
                let _traced = tracer.as_ref().map(redline_core::trace::Tracer::attach);
                sample_loop(interval, &stop_rx, &store, callback);
            });
        let handle = match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!("cannot start the redline-monitor thread ({e}); system stats off");
                None
            }
        };
        Sampler {
            samples,
            stop_tx,
            handle,
        }
    }
}

impl Drop for Sampler {
    /// A sampler dropped without `stop` still ends its thread.
    fn drop(&mut self) {
        let _ = self.stop_tx.send(());
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

fn sample_loop(
    interval: Duration,
    stop_rx: &mpsc::Receiver<()>,
    store: &Mutex<Vec<Sample>>,
    mut callback: Option<SampleCallback>,
) {
    // A zero interval would spin; sysinfo would not refresh CPU that fast anyway.
    let interval = interval.max(Duration::from_millis(1));
    // Its own track in `--profiler detailed` traces.
    redline_core::trace::name_thread("monitor");
    let Ok(mut monitor) = catch_unwind(Monitor::new) else {
        tracing::warn!("the system monitor failed to start; system stats off");
        return;
    };
    let mut next = Instant::now() + interval.max(CPU_WINDOW);
    loop {
        match stop_rx.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let span = redline_core::trace::span("monitor", "sample");
        let Ok(sample) = catch_unwind(AssertUnwindSafe(|| monitor.sample())) else {
            tracing::warn!("system sampling failed; system stats off for the rest of the run");
            return;
        };
        if let Some(cb) = callback.as_mut() {
            if catch_unwind(AssertUnwindSafe(|| cb(&sample))).is_err() {
                tracing::warn!("the system-sample callback panicked; it will not be called again");
                callback = None;
            }
        }
        lock(store).push(sample);
        drop(span);
        // Keep the grid; after a stall (suspend, overloaded host) skip missed ticks.
        next += interval;
        let now = Instant::now();
        if next < now {
            next = now + interval;
        }
    }
}

/// A poisoned lock only means a panic elsewhere; the samples are still valid.
fn lock(samples: &Mutex<Vec<Sample>>) -> MutexGuard<'_, Vec<Sample>> {
    samples.lock().unwrap_or_else(|e| e.into_inner())
}
