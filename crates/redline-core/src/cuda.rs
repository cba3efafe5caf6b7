//! The CUDA side of the core (built with the `cuda` feature): GPU count, the
//! driver's memory pool (stats, caching, trim), loading the kernels, and
//! event timing.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use candle_core::CudaDevice;

use crate::error::{Error, Result};
use crate::memory::MemoryStats;

/// cudarc, as candle builds it (the NCCL backend of redline-dist uses its
/// bindings on candle's streams).
pub use candle_core::cuda_backend::cudarc;

/// The stream candle runs `dev`'s work on (NCCL collectives join it, so
/// they are ordered after the backward that made the gradients).
pub fn stream(dev: &CudaDevice) -> Arc<CudaStream> {
    dev.cuda_stream()
}

fn driver(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Candle(candle_core::Error::Msg(format!("CUDA driver: {what}: {e}")))
}

/// GPUs the driver reports, or why it could not be asked (no driver, no device node).
pub fn device_count() -> std::result::Result<usize, String> {
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| format!("{e:?}"))
}

fn context(dev: &CudaDevice) -> Arc<CudaContext> {
    dev.cuda_stream().context().clone()
}

/// The GPU's name as the driver gives it (`NVIDIA H100 80GB HBM3`) and its
/// compute capability, which key the peak table ([`crate::peak::gpu`]).
pub fn identity(dev: &CudaDevice) -> Result<(String, (u32, u32))> {
    let ctx = context(dev);
    let name = ctx.name().map_err(|e| driver("device name", e))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| driver("compute capability", e))?;
    let cc = (
        u32::try_from(major).unwrap_or(0),
        u32::try_from(minor).unwrap_or(0),
    );
    Ok((name, cc))
}

fn default_pool(dev: &CudaDevice) -> Result<sys::CUmemoryPool> {
    let ctx = context(dev);
    ctx.bind_to_thread()
        .map_err(|e| driver("bind context", e))?;
    // SAFETY: the device handle comes from a live context.
    unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }
        .map_err(|e| driver("default memory pool", e))
}

fn pool_attr(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: these attributes are cuuint64_t, which `v` is.
    unsafe { result::mem_pool::get_attribute(pool, attr, (&mut v as *mut u64).cast()) }
        .map_err(|e| driver("memory pool attribute", e))?;
    Ok(v)
}

/// candle's kernel modules that training uses, each named by one of its
/// functions. Quantized and sort kernels are left to load on first use.
const STEP_MODULES: [(&str, &candle_core::cuda_backend::kernels::Module); 9] = {
    use candle_core::cuda_backend::kernels as k;
    [
        ("affine_f32", &k::AFFINE),
        ("badd_f32", &k::BINARY),
        ("cast_f32_f64", &k::CAST),
        ("conv2d_f32", &k::CONV),
        ("fill_f32", &k::FILL),
        ("is_u32_f32", &k::INDEXING),
        ("fast_sum_f32", &k::REDUCE),
        ("where_u8_f32", &k::TERNARY),
        ("ucopy_f32", &k::UNARY),
    ]
};

/// Loads the modules of [`STEP_MODULES`] into `dev` (candle keeps them per
/// device), before the first training step. The vendored candle-kernels
/// ships them as machine code for the build's GPU architecture
/// (`vendor/candle-kernels/REDLINE.md`); where it has none (another GPU, or
/// `REDLINE_CANDLE_PTX=1`), the driver JIT-compiles their PTX here: 16.6 to
/// 21.8 s on a fresh H100, 16.9 s on an H200, cached by the driver after.
/// Compiling the nine on a thread each (into the driver's JIT cache) did not
/// help: 21.6 s on an H200 (`bench/results/h200-2026-11-26-2/`).
pub fn load_kernels(dev: &CudaDevice) -> Result<()> {
    for (func, module) in STEP_MODULES {
        dev.get_or_load_func(func, module)
            .map_err(|e| driver(&format!("loading kernel module of {func}"), e))?;
    }
    Ok(())
}

/// Keeps freed blocks in the pool instead of returning them to the driver at
/// every synchronisation (the pool's default release threshold is 0), so the
/// steady-state step allocates from cache like PyTorch's caching allocator.
pub fn enable_pool_caching(dev: &CudaDevice) -> Result<()> {
    let pool = default_pool(dev)?;
    let mut keep: u64 = u64::MAX;
    // SAFETY: RELEASE_THRESHOLD is a cuuint64_t.
    unsafe {
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast(),
        )
    }
    .map_err(|e| driver("set pool release threshold", e))
}

/// Allocated, peak, pool size and device free/total.
pub fn memory_stats(dev: &CudaDevice) -> Result<MemoryStats> {
    use sys::CUmemPool_attribute as A;
    let pool = default_pool(dev)?;
    let (free, total) = result::mem_get_info().map_err(|e| driver("memory info", e))?;
    Ok(MemoryStats {
        allocated: pool_attr(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        peak_allocated: pool_attr(pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        reserved: pool_attr(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
        peak_reserved: pool_attr(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        device_free: free as u64,
        device_total: total as u64,
    })
}

/// Sets the pool's high-water mark of allocated bytes to 0, so that it
/// next reports the peak from now on (the driver allows only 0 here).
pub fn reset_peak(dev: &CudaDevice) -> Result<()> {
    let pool = default_pool(dev)?;
    let mut zero: u64 = 0;
    // SAFETY: USED_MEM_HIGH is a cuuint64_t; the pool belongs to a live device.
    unsafe {
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            (&mut zero as *mut u64).cast(),
        )
    }
    .map_err(|e| driver("reset pool peak", e))
}

/// Waits for queued work, then returns every cached free block to the driver.
pub fn trim_pool(dev: &CudaDevice) -> Result<()> {
    dev.cuda_stream()
        .synchronize()
        .map_err(|e| driver("synchronize", e))?;
    let pool = default_pool(dev)?;
    // SAFETY: the pool belongs to a live device.
    unsafe { result::mem_pool::trim_to(pool, 0) }.map_err(|e| driver("trim pool", e))
}

/// Timing events on the device's compute stream: [`EventTimer::mark`] records
/// one at each phase boundary (no host wait); [`EventTimer::drain`] waits for
/// the last and returns the device time between consecutive marks. Events are
/// pooled, so the steady state creates none.
pub struct EventTimer {
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    free: Vec<CudaEvent>,
    marks: Vec<(usize, CudaEvent)>,
}

impl EventTimer {
    /// A timer on `dev`'s compute stream.
    pub fn new(dev: &CudaDevice) -> Self {
        let stream = dev.cuda_stream();
        let ctx = stream.context().clone();
        Self {
            stream,
            ctx,
            free: Vec::new(),
            marks: Vec::new(),
        }
    }

    /// Records a boundary: the work queued from here until the next mark is
    /// charged to `tag`.
    pub fn mark(&mut self, tag: usize) -> Result<()> {
        let ev = match self.free.pop() {
            Some(ev) => ev,
            None => self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
                .map_err(|e| driver("create event", e))?,
        };
        ev.record(&self.stream)
            .map_err(|e| driver("record event", e))?;
        self.marks.push((tag, ev));
        Ok(())
    }

    /// Device milliseconds between consecutive marks, charged to the earlier
    /// mark's tag; keeps the last mark as the start of the next interval. This
    /// waits for the device to reach the last mark: call it at log points only.
    pub fn drain(&mut self) -> Result<Vec<(usize, f64)>> {
        let Some((_, last)) = self.marks.last() else {
            return Ok(Vec::new());
        };
        last.synchronize()
            .map_err(|e| driver("event synchronize", e))?;
        let mut out = Vec::with_capacity(self.marks.len());
        for pair in self.marks.windows(2) {
            let ms = pair[0]
                .1
                .elapsed_ms(&pair[1].1)
                .map_err(|e| driver("event elapsed", e))?;
            out.push((pair[0].0, f64::from(ms)));
        }
        let keep = self.marks.pop();
        self.free.extend(self.marks.drain(..).map(|(_, ev)| ev));
        self.marks.extend(keep);
        Ok(out)
    }
}
