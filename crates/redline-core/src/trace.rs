//! Detailed tracing: timed spans on named thread tracks, per-op counts and the
//! layer label that lets a kernel's backward say which layer it belongs to.
//!
//! Off by default. Every entry point first reads one relaxed atomic flag and
//! returns at once when tracing is off, so call sites in kernels and models cost
//! a load and a branch (no clock read, no allocation, no lock). When on
//! (`--profiler detailed`), spans go into one process-wide list that the
//! profiler drains at the end and writes as a Chrome trace.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

static DETAILED: AtomicBool = AtomicBool::new(false);
static NEXT_TID: AtomicU32 = AtomicU32::new(1);
static ORIGIN: OnceLock<Instant> = OnceLock::new();
static SPANS: Mutex<Vec<SpanRecord>> = Mutex::new(Vec::new());
static COUNTS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());
static THREADS: Mutex<BTreeMap<u32, String>> = Mutex::new(BTreeMap::new());

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
    static LAYER: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    /// What ran, e.g. `fc1.forward` or `forward`.
    pub name: Arc<str>,
    /// Kind of span: `step` (main-loop phase), `layer`, `backward`, `loader`, `monitor`.
    pub cat: &'static str,
    /// Track (thread) id, see [`Trace::threads`].
    pub tid: u32,
    /// Start, microseconds since the trace origin.
    pub start_us: f64,
    /// Duration in microseconds.
    pub dur_us: f64,
}

/// Everything recorded since tracing was switched on.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Finished spans in the order they ended.
    pub spans: Vec<SpanRecord>,
    /// Track names by id.
    pub threads: BTreeMap<u32, String>,
    /// Kernel invocations by op name.
    pub counts: BTreeMap<&'static str, u64>,
}

/// Switches detailed tracing on or off for the whole process.
pub fn set_detailed(on: bool) {
    if on {
        ORIGIN.get_or_init(Instant::now);
    }
    DETAILED.store(on, Ordering::Relaxed);
}

/// Whether detailed tracing is on.
#[inline]
pub fn detailed() -> bool {
    DETAILED.load(Ordering::Relaxed)
}

fn micros(t: Instant) -> f64 {
    let origin = *ORIGIN.get_or_init(Instant::now);
    t.saturating_duration_since(origin).as_secs_f64() * 1e6
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep using it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// This thread's track id, registering the thread on first use.
fn tid() -> u32 {
    TID.with(|c| {
        if c.get() == 0 {
            let id = NEXT_TID.fetch_add(1, Ordering::Relaxed);
            c.set(id);
            let name = std::thread::current()
                .name()
                .map_or_else(|| format!("thread {id}"), str::to_string);
            lock(&THREADS).entry(id).or_insert(name);
        }
        c.get()
    })
}

/// Names this thread's track (e.g. `main loop`, `loader/prefetch`). Cheap; call
/// it whether or not tracing is on, so a later switch-on finds the name.
pub fn name_thread(name: &str) {
    let id = tid();
    lock(&THREADS).insert(id, name.to_string());
}

/// Records a span timed by the caller (the profiler's main-loop phases).
pub fn record(cat: &'static str, name: &str, start: Instant, end: Instant) {
    if !detailed() {
        return;
    }
    let rec = SpanRecord {
        name: Arc::from(name),
        cat,
        tid: tid(),
        start_us: micros(start),
        dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
    };
    lock(&SPANS).push(rec);
}

/// Counts one invocation of kernel `op`.
#[inline]
pub fn count(op: &'static str) {
    if detailed() {
        *lock(&COUNTS).entry(op).or_insert(0) += 1;
    }
}

/// A span that records itself when dropped; inert when tracing is off.
#[must_use = "a span measures until it is dropped"]
pub struct Span {
    open: Option<(Arc<str>, &'static str, Instant)>,
    restore_layer: Option<Option<Arc<str>>>,
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(prev) = self.restore_layer.take() {
            LAYER.with(|l| *l.borrow_mut() = prev);
        }
        if let Some((name, cat, start)) = self.open.take() {
            record(cat, &name, start, Instant::now());
        }
    }
}

/// Opens a span named `name` of kind `cat`.
#[inline]
pub fn span(cat: &'static str, name: &str) -> Span {
    if !detailed() {
        return Span {
            open: None,
            restore_layer: None,
        };
    }
    Span {
        open: Some((Arc::from(name), cat, Instant::now())),
        restore_layer: None,
    }
}

/// Opens the forward span of layer `layer` and makes it the current layer, so
/// kernels built inside it label their backward spans with it.
#[inline]
pub fn layer(layer: &str) -> Span {
    if !detailed() {
        return span("layer", layer);
    }
    let name: Arc<str> = Arc::from(layer);
    let prev = LAYER.with(|l| l.borrow_mut().replace(name));
    Span {
        open: Some((
            Arc::from(format!("{layer}.forward")),
            "layer",
            Instant::now(),
        )),
        restore_layer: Some(prev),
    }
}

/// The layer whose forward is running on this thread (only while tracing).
pub fn current_layer() -> Option<Arc<str>> {
    if !detailed() {
        return None;
    }
    LAYER.with(|l| l.borrow().clone())
}

/// Opens the backward span of a kernel: `<layer>.backward (<op>)` when the
/// kernel was built inside a layer (a block may hold several kernels, e.g. a
/// conv and its pooling), else `<op>.backward`.
pub fn backward(layer: Option<&Arc<str>>, op: &'static str) -> Span {
    if !detailed() {
        return span("backward", op);
    }
    let name = match layer {
        Some(l) => format!("{l}.backward ({op})"),
        None => format!("{op}.backward"),
    };
    span("backward", &name)
}

/// Takes everything recorded so far (spans and counts are cleared; track names stay).
pub fn take() -> Trace {
    Trace {
        spans: std::mem::take(&mut *lock(&SPANS)),
        threads: lock(&THREADS).clone(),
        counts: std::mem::take(&mut *lock(&COUNTS)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test touches the global switch so parallel tests do not race on it.
    #[test]
    fn records_only_when_detailed() {
        set_detailed(false);
        drop(span("layer", "off"));
        count("off-op");
        assert!(!take().spans.iter().any(|s| &*s.name == "off"));

        set_detailed(true);
        name_thread("test track");
        {
            let _l = layer("fc1");
            assert_eq!(current_layer().as_deref(), Some("fc1"));
            count("linear.forward");
            let _b = backward(current_layer().as_ref(), "linear");
        }
        assert_eq!(current_layer(), None);
        set_detailed(false);
        let t = take();
        let names: Vec<&str> = t.spans.iter().map(|s| &*s.name).collect();
        assert!(names.contains(&"fc1.forward"), "{names:?}");
        assert!(names.contains(&"fc1.backward (linear)"), "{names:?}");
        assert_eq!(t.counts.get("linear.forward"), Some(&1));
        let tid = t.spans[0].tid;
        assert_eq!(t.threads.get(&tid).map(String::as_str), Some("test track"));
    }
}
