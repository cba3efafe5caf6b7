//! CUPTI's activity API, loaded with `libloading`: kernel records
//! (`CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`) handed over a buffer at a time
//! and folded into a [`KernelTally`]. CUPTI's activity API is process-wide,
//! so one trace runs at a time.
//!
//! cudarc's `cupti` feature would link libcupti into every CUDA build (candle
//! links cudarc's libraries at build time), and a machine without it could
//! not start the binary; loading it here keeps it optional.

use std::alloc::{alloc, dealloc, Layout};
use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use redline_profile::{GpuBusy, KernelSpan, KernelTally};

/// Environment variable naming libcupti's path.
const ENV: &str = "REDLINE_CUPTI";
/// CUPTI's buffers: 8 MiB, 8-byte aligned (as NVIDIA's samples).
const BUFFER_BYTES: usize = 8 << 20;
const BUFFER_ALIGN: usize = 8;
/// `CUPTI_ACTIVITY_KIND_KERNEL` and `CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`.
const KIND_KERNEL: u32 = 3;
const KIND_CONCURRENT_KERNEL: u32 = 10;
/// `CUPTI_SUCCESS`. Walking a buffer ends on any other result
/// (`CUPTI_ERROR_MAX_LIMIT_REACHED` after its last record).
const SUCCESS: i32 = 0;
/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`.
const FLUSH_FORCED: u32 = 1;

/// The head of every kernel record (`CUpti_ActivityKernel4` to `13` share it;
/// later versions only append fields).
#[repr(C)]
struct KernelRecord {
    kind: u32,
    cache_config: u8,
    shared_memory_config: u8,
    registers_per_thread: u16,
    partitioned_global_cache_requested: u32,
    partitioned_global_cache_executed: u32,
    start: u64,
    end: u64,
    completed: u64,
    device_id: u32,
    context_id: u32,
    stream_id: u32,
    grid: [i32; 3],
    block: [i32; 3],
    static_shared_memory: i32,
    dynamic_shared_memory: i32,
    local_memory_per_thread: u32,
    local_memory_total: u32,
    correlation_id: u32,
    grid_id: i64,
    name: *const c_char,
}

// The offsets of CUPTI's header (cupti_activity.h), as cudarc's bindings have them.
const _: () = assert!(std::mem::offset_of!(KernelRecord, start) == 16);
const _: () = assert!(std::mem::offset_of!(KernelRecord, end) == 24);
const _: () = assert!(std::mem::offset_of!(KernelRecord, grid_id) == 96);
const _: () = assert!(std::mem::offset_of!(KernelRecord, name) == 104);

type Requested = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
type Completed = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);

/// The CUPTI functions the trace calls.
struct Api {
    register: unsafe extern "C" fn(Requested, Completed) -> i32,
    enable: unsafe extern "C" fn(u32) -> i32,
    disable: unsafe extern "C" fn(u32) -> i32,
    flush_all: unsafe extern "C" fn(u32) -> i32,
    next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut KernelRecord) -> i32,
    dropped: unsafe extern "C" fn(*mut c_void, u32, *mut usize) -> i32,
    timestamp: unsafe extern "C" fn(*mut u64) -> i32,
    error_string: unsafe extern "C" fn(i32, *mut *const c_char) -> i32,
    /// Kept loaded for the process's life: CUPTI calls back into it.
    _lib: libloading::Library,
}

impl Api {
    fn load() -> Result<Self, String> {
        let mut tried = Vec::new();
        for path in candidates() {
            // SAFETY: loading libcupti runs its initialisers, which only
            // register with the CUDA driver.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => return Self::bind(lib, &path),
                Err(_) => tried.push(path.display().to_string()),
            }
        }
        Err(format!(
            "libcupti was not found (tried {}); install CUDA's CUPTI (pip install \
             nvidia-cuda-cupti, or the toolkit's extras/CUPTI) and set {ENV}=/path/to/libcupti.so",
            tried.join(", ")
        ))
    }

    fn bind(lib: libloading::Library, path: &std::path::Path) -> Result<Self, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the signature is CUPTI's for this symbol (cupti_activity.h).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{}: no symbol {}: {e}", path.display(), $name))?
            };
        }
        Ok(Self {
            register: sym!("cuptiActivityRegisterCallbacks"),
            enable: sym!("cuptiActivityEnable"),
            disable: sym!("cuptiActivityDisable"),
            flush_all: sym!("cuptiActivityFlushAll"),
            next_record: sym!("cuptiActivityGetNextRecord"),
            dropped: sym!("cuptiActivityGetNumDroppedRecords"),
            timestamp: sym!("cuptiGetTimestamp"),
            error_string: sym!("cuptiGetResultString"),
            _lib: lib,
        })
    }

    /// `Ok` for `CUPTI_SUCCESS`, else CUPTI's message for `code`.
    fn check(&self, what: &str, code: i32) -> Result<(), String> {
        if code == SUCCESS {
            return Ok(());
        }
        let mut msg: *const c_char = std::ptr::null();
        // SAFETY: CUPTI writes a pointer to a static string.
        let text = if unsafe { (self.error_string)(code, &mut msg) } == SUCCESS && !msg.is_null() {
            // SAFETY: a NUL-terminated static string.
            unsafe { CStr::from_ptr(msg) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("error {code}")
        };
        Err(format!("CUPTI {what}: {text}"))
    }

    fn now(&self) -> Result<u64, String> {
        let mut t = 0u64;
        // SAFETY: writes one u64.
        self.check("timestamp", unsafe { (self.timestamp)(&mut t) })?;
        Ok(t)
    }
}

/// Where libcupti may be: `$REDLINE_CUPTI`, the loader's search path, the
/// CUDA toolkit, and the `nvidia` wheels of Python installs.
fn candidates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::env::var_os(ENV)
        .map(PathBuf::from)
        .into_iter()
        .collect();
    let names = ["libcupti.so", "libcupti.so.13", "libcupti.so.12"];
    out.extend(names.iter().map(PathBuf::from));
    let mut dirs: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .chain([PathBuf::from("/usr/local/cuda")])
        .flat_map(|root| {
            ["lib", "lib64", "extras/CUPTI/lib64"]
                .iter()
                .map(move |sub| root.join(sub))
                .collect::<Vec<_>>()
        })
        .collect();
    dirs.extend(python_nvidia_libs());
    for dir in dirs {
        out.extend(names.iter().map(|n| dir.join(n)).filter(|p| p.exists()));
    }
    out
}

/// `…/site-packages/nvidia/*/lib` of the system's Python installs.
fn python_nvidia_libs() -> Vec<PathBuf> {
    let roots = ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"];
    let mut out = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for py in entries.flatten().filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("python3"))
        }) {
            for pkgs in ["site-packages", "dist-packages"] {
                let nvidia = py.path().join(pkgs).join("nvidia");
                let Ok(libs) = std::fs::read_dir(&nvidia) else {
                    continue;
                };
                out.extend(libs.flatten().map(|e| e.path().join("lib")));
            }
        }
    }
    out
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();
/// The running trace's tally; `None` when no trace runs.
static TALLY: Mutex<Option<KernelTally>> = Mutex::new(None);
/// Whether CUPTI has the buffer callbacks (registered under `TALLY`'s lock).
static REGISTERED: AtomicBool = AtomicBool::new(false);

fn api() -> Result<&'static Api, String> {
    API.get_or_init(Api::load).as_ref().map_err(Clone::clone)
}

unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let ptr = match Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN) {
        // SAFETY: a non-zero size.
        Ok(layout) => unsafe { alloc(layout) },
        Err(_) => std::ptr::null_mut(),
    };
    // SAFETY: CUPTI passes valid out-pointers; a null buffer makes it drop records.
    unsafe {
        *buffer = ptr;
        *size = if ptr.is_null() { 0 } else { BUFFER_BYTES };
        *max = 0;
    }
}

unsafe extern "C" fn buffer_completed(
    ctx: *mut c_void,
    stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    if let Ok(api) = api() {
        // SAFETY: `buffer` holds `valid` bytes of records from CUPTI.
        unsafe { fold(api, ctx, stream, buffer, valid) };
    }
    if let Ok(layout) = Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN) {
        // SAFETY: allocated in `buffer_requested` with this layout.
        unsafe { dealloc(buffer, layout) };
    }
}

/// Reads one completed buffer's kernel records into the running tally.
unsafe fn fold(api: &Api, ctx: *mut c_void, stream: u32, buffer: *mut u8, valid: usize) {
    let mut guard = TALLY.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(tally) = guard.as_mut() else {
        return;
    };
    let mut spans = Vec::new();
    let mut record: *mut KernelRecord = std::ptr::null_mut();
    // SAFETY: CUPTI walks its own buffer; each record it returns is valid
    // until the buffer is freed, and kernel records start with `KernelRecord`.
    while unsafe { (api.next_record)(buffer, valid, &mut record) } == SUCCESS && !record.is_null() {
        let r = unsafe { &*record };
        if r.kind != KIND_CONCURRENT_KERNEL && r.kind != KIND_KERNEL {
            continue;
        }
        let name = if r.name.is_null() {
            "(unnamed kernel)".into()
        } else {
            // SAFETY: CUPTI's NUL-terminated kernel name.
            unsafe { CStr::from_ptr(r.name) }.to_string_lossy()
        };
        spans.push(KernelSpan {
            start_ns: r.start,
            end_ns: r.end,
            name: tally.name_id(&name),
        });
    }
    tally.add(&mut spans);
    let mut dropped = 0usize;
    // SAFETY: writes one usize.
    if unsafe { (api.dropped)(ctx, stream, &mut dropped) } == SUCCESS {
        tally.add_dropped(dropped as u64);
    }
}

/// A running kernel trace (at most one per process).
pub(crate) struct Trace {
    api: &'static Api,
}

impl Trace {
    /// Loads CUPTI if needed and starts recording kernels.
    pub(crate) fn start() -> Result<Self, String> {
        let api = api()?;
        let mut guard = TALLY.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.is_some() {
            return Err("another fit in this process is tracing kernels".into());
        }
        // Once per process: the callbacks stay registered between traces.
        if !REGISTERED.load(Ordering::Acquire) {
            // SAFETY: two `extern "C"` functions with CUPTI's callback signatures.
            api.check("register callbacks", unsafe {
                (api.register)(buffer_requested, buffer_completed)
            })?;
            REGISTERED.store(true, Ordering::Release);
        }
        *guard = Some(KernelTally::new(api.now()?));
        drop(guard);
        // SAFETY: a plain call with an activity kind.
        if let Err(e) = api.check("enable kernel records", unsafe {
            (api.enable)(KIND_CONCURRENT_KERNEL)
        }) {
            *TALLY.lock().unwrap_or_else(PoisonError::into_inner) = None;
            return Err(e);
        }
        Ok(Self { api })
    }

    /// Stops recording (the device must be idle) and returns the figure.
    pub(crate) fn finish(self, steps: usize) -> Result<GpuBusy, String> {
        let api = self.api;
        let until = api.now();
        // SAFETY: a plain call; flushing delivers the last buffers through
        // `buffer_completed` before it returns.
        let flushed = api.check("flush", unsafe { (api.flush_all)(FLUSH_FORCED) });
        let tally = TALLY
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or("the kernel trace's records were lost")?;
        flushed?;
        Ok(tally.finish(until?, steps, "cupti"))
    }
}

impl Drop for Trace {
    /// Stops recording, on `finish` and on a fit that failed alike, so that
    /// the next fit can trace.
    fn drop(&mut self) {
        // SAFETY: a plain call with an activity kind.
        let _ = unsafe { (self.api.disable)(KIND_CONCURRENT_KERNEL) };
        TALLY.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}
