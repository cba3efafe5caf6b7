//! Detailed tracing: timed spans on named thread tracks, per-op counts and the
//! layer label that lets a kernel's backward say which layer it belongs to.
//!
//! Spans go to a [`Tracer`]: a recorder a thread is *attached* to. Nothing is
//! process-wide: two trainers in one process (or two tests running in
//! parallel) each attach their own thread to their own tracer and never see
//! each other's spans. A thread that starts helpers for the traced work (the
//! loader's prefetch thread, the system monitor) hands them
//! [`current`] and they [`Tracer::attach`] to it.
//!
//! Off by default. Every entry point first reads one relaxed atomic (the number
//! of attached threads in the process) and returns at once when it is zero, so
//! call sites in kernels and models cost a load and a branch (no clock read, no
//! allocation, no lock); when some thread somewhere is traced, an untraced
//! thread pays one thread-local read more.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Threads attached to some tracer, process-wide: the fast "off" check.
static ATTACHED: AtomicUsize = AtomicUsize::new(0);
static NEXT_TID: AtomicU32 = AtomicU32::new(1);

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
    static NAME: RefCell<Option<String>> = const { RefCell::new(None) };
    static CURRENT: RefCell<Option<Arc<Recorder>>> = const { RefCell::new(None) };
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
    /// Start, microseconds since the tracer was made.
    pub start_us: f64,
    /// Duration in microseconds.
    pub dur_us: f64,
}

/// Everything a tracer recorded since it was made or last taken.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Finished spans in the order they ended.
    pub spans: Vec<SpanRecord>,
    /// Track names by id.
    pub threads: BTreeMap<u32, String>,
    /// Kernel invocations by op name.
    pub counts: BTreeMap<&'static str, u64>,
}

#[derive(Debug)]
struct Recorder {
    origin: Instant,
    spans: Mutex<Vec<SpanRecord>>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
    threads: Mutex<BTreeMap<u32, String>>,
}

/// A trace recorder that threads attach to. Cheap to clone (shared); `Send`,
/// so helper threads can be given it.
#[derive(Debug, Clone)]
pub struct Tracer(Arc<Recorder>);

impl Default for Tracer {
    fn default() -> Self {
        Self::new()
    }
}

impl Tracer {
    /// A new, empty recorder; its clock starts now.
    pub fn new() -> Self {
        Self(Arc::new(Recorder {
            origin: Instant::now(),
            spans: Mutex::new(Vec::new()),
            counts: Mutex::new(BTreeMap::new()),
            threads: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Records this thread's spans and counts here until the guard drops
    /// (then the thread goes back to what it was attached to before, if anything).
    pub fn attach(&self) -> Attached {
        let id = tid();
        let name = NAME.with(|n| n.borrow().clone());
        lock(&self.0.threads)
            .entry(id)
            .or_insert_with(|| name.unwrap_or_else(|| default_name(id)));
        let prev = CURRENT.with(|c| c.borrow_mut().replace(Arc::clone(&self.0)));
        if prev.is_none() {
            ATTACHED.fetch_add(1, Ordering::Relaxed);
        }
        Attached { prev: Some(prev) }
    }

    /// Takes everything recorded so far (spans and counts are cleared; track names stay).
    pub fn take(&self) -> Trace {
        Trace {
            spans: std::mem::take(&mut *lock(&self.0.spans)),
            threads: lock(&self.0.threads).clone(),
            counts: std::mem::take(&mut *lock(&self.0.counts)),
        }
    }

    /// Whether `self` and `other` are the same recorder.
    pub fn same(&self, other: &Tracer) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Keeps a thread attached to a [`Tracer`]; see [`Tracer::attach`].
#[must_use = "the thread is attached only while the guard lives"]
#[derive(Debug)]
pub struct Attached {
    prev: Option<Option<Arc<Recorder>>>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(prev) = self.prev.take() {
            if prev.is_none() {
                ATTACHED.fetch_sub(1, Ordering::Relaxed);
            }
            CURRENT.with(|c| *c.borrow_mut() = prev);
        }
    }
}

/// The tracer this thread is attached to, to hand to threads it starts.
pub fn current() -> Option<Tracer> {
    if ATTACHED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    CURRENT.with(|c| c.borrow().clone()).map(Tracer)
}

/// Runs `f` with this thread's recorder, if it is attached to one.
#[inline]
fn with_recorder(f: impl FnOnce(&Recorder)) {
    if ATTACHED.load(Ordering::Relaxed) == 0 {
        return;
    }
    CURRENT.with(|c| {
        if let Some(r) = c.borrow().as_deref() {
            f(r);
        }
    });
}

/// Whether this thread is being traced.
#[inline]
pub fn detailed() -> bool {
    ATTACHED.load(Ordering::Relaxed) != 0 && CURRENT.with(|c| c.borrow().is_some())
}

fn micros(origin: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(origin).as_secs_f64() * 1e6
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep using it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn default_name(id: u32) -> String {
    std::thread::current()
        .name()
        .map_or_else(|| format!("thread {id}"), str::to_string)
}

/// This thread's track id (unique in the process).
fn tid() -> u32 {
    TID.with(|c| {
        if c.get() == 0 {
            c.set(NEXT_TID.fetch_add(1, Ordering::Relaxed));
        }
        c.get()
    })
}

/// Names this thread's track (e.g. `main loop`, `loader/prefetch`). Cheap; call
/// it whether or not tracing is on, so a later attach finds the name.
pub fn name_thread(name: &str) {
    NAME.with(|n| *n.borrow_mut() = Some(name.to_string()));
    with_recorder(|r| {
        lock(&r.threads).insert(tid(), name.to_string());
    });
}

/// Records a span timed by the caller (the profiler's main-loop phases).
pub fn record(cat: &'static str, name: &str, start: Instant, end: Instant) {
    with_recorder(|r| {
        let rec = SpanRecord {
            name: Arc::from(name),
            cat,
            tid: tid(),
            start_us: micros(r.origin, start),
            dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
        };
        lock(&r.spans).push(rec);
    });
}

/// Counts one invocation of kernel `op`.
#[inline]
pub fn count(op: &'static str) {
    with_recorder(|r| *lock(&r.counts).entry(op).or_insert(0) += 1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_on_an_attached_thread() {
        drop(span("layer", "off"));
        count("off-op");
        assert!(!detailed() && current().is_none());

        let tracer = Tracer::new();
        let traced = tracer.clone();
        let other = Tracer::new();
        // Another thread attached to another tracer records there, not here.
        let other_thread = {
            let other = other.clone();
            std::thread::spawn(move || {
                let _a = other.attach();
                count("other-op");
            })
        };
        name_thread("test track");
        {
            let _a = tracer.attach();
            assert!(detailed() && current().is_some_and(|t| t.same(&traced)));
            let _l = layer("fc1");
            assert_eq!(current_layer().as_deref(), Some("fc1"));
            count("linear.forward");
            let _b = backward(current_layer().as_ref(), "linear");
        }
        assert_eq!(current_layer(), None);
        assert!(!detailed(), "the guard detaches the thread");
        count("after-detach");
        other_thread.join().unwrap();
        let t = tracer.take();
        let names: Vec<&str> = t.spans.iter().map(|s| &*s.name).collect();
        assert!(names.contains(&"fc1.forward"), "{names:?}");
        assert!(names.contains(&"fc1.backward (linear)"), "{names:?}");
        assert!(!names.contains(&"off"), "{names:?}");
        assert_eq!(
            t.counts.keys().copied().collect::<Vec<_>>(),
            ["linear.forward"]
        );
        let tid = t.spans[0].tid;
        assert_eq!(t.threads.get(&tid).map(String::as_str), Some("test track"));
        assert_eq!(other.take().counts.get("other-op"), Some(&1));
    }

    #[test]
    fn attaching_nests_and_restores() {
        let (outer, inner) = (Tracer::new(), Tracer::new());
        let _o = outer.attach();
        {
            let _i = inner.attach();
            count("inner-op");
        }
        count("outer-op");
        assert_eq!(inner.take().counts.len(), 1);
        assert_eq!(
            outer.take().counts.keys().copied().collect::<Vec<_>>(),
            ["outer-op"]
        );
    }
}
