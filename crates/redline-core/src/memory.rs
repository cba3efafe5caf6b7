//! Device memory: what the run allocated, the pool's size, a pool trim (this
//! system's `empty_cache`), and out-of-memory recognition.
//!
//! On the CPU there is no device pool: [`stats`] returns `None` and
//! [`empty_cache`] unmaps the large blocks the host allocator keeps for
//! reuse ([`crate::host_alloc`]). On a GPU the numbers come from the CUDA
//! driver's stream-ordered memory pool, which candle allocates from.

use serde_json::{json, Value};

use crate::error::Result;
use crate::Device;

/// Memory of one GPU, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in live allocations now.
    pub allocated: u64,
    /// Most bytes in live allocations at once since the pool was last reset.
    pub peak_allocated: u64,
    /// Bytes the pool holds from the driver (allocated plus cached free blocks).
    pub reserved: u64,
    /// Most bytes the pool held at once.
    pub peak_reserved: u64,
    /// Free memory on the device, as the driver reports it.
    pub device_free: u64,
    /// Total memory on the device.
    pub device_total: u64,
}

impl MemoryStats {
    /// The stats as a JSON object (bytes), for `summary.json`.
    pub fn to_json(&self) -> Value {
        json!({
            "allocated_bytes": self.allocated,
            "peak_allocated_bytes": self.peak_allocated,
            "reserved_bytes": self.reserved,
            "peak_reserved_bytes": self.peak_reserved,
            "device_free_bytes": self.device_free,
            "device_total_bytes": self.device_total,
        })
    }
}

/// The device's memory now; `None` on the CPU.
pub fn stats(device: &Device) -> Result<Option<MemoryStats>> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = device.candle() {
        return crate::cuda::memory_stats(d).map(Some);
    }
    let _ = device;
    Ok(None)
}

/// Returns the pool's cached free blocks to the driver (after the queued work
/// finishes), like PyTorch's `torch.cuda.empty_cache()`; on the CPU, the
/// host allocator's kept blocks to the kernel ([`crate::host_alloc`]).
pub fn empty_cache(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = device.candle() {
        return crate::cuda::trim_pool(d);
    }
    let _ = device;
    crate::host_alloc::release_cached();
    Ok(())
}

/// Starts a new peak: on a GPU the pool's high-water mark of allocated
/// bytes is set to what is allocated now; on the CPU (Linux) the process's
/// peak resident set (`VmHWM`) is reset to its current size through
/// `/proc/self/clear_refs`. `false` where it cannot be reset.
pub fn reset_peak(device: &Device) -> bool {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = device.candle() {
        return crate::cuda::reset_peak(d).is_ok();
    }
    let _ = device;
    // Blocks kept for reuse (`host_alloc`) are not the next job's memory.
    crate::host_alloc::release_cached();
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The peak since [`reset_peak`]: on a GPU the pool's most allocated bytes,
/// on the CPU the process's peak resident set (Linux); `None` elsewhere.
pub fn peak(device: &Device) -> Option<u64> {
    if let Ok(Some(s)) = stats(device) {
        return Some(s.peak_allocated);
    }
    host_status_bytes("VmHWM")
}

/// A `kB` line of `/proc/self/status` in bytes.
fn host_status_bytes(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line
        .trim_start_matches(key)
        .trim_start_matches(':')
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Whether a tensor error is the device running out of memory.
pub fn is_out_of_memory(err: &candle_core::Error) -> bool {
    is_out_of_memory_text(&err.to_string())
}

/// Whether an error's text is the device running out of memory (through
/// any crate's error that carries the driver's).
pub fn is_out_of_memory_text(msg: &str) -> bool {
    msg.contains("CUDA_ERROR_OUT_OF_MEMORY")
        || msg.contains("cudaErrorMemoryAllocation")
        || msg.to_ascii_lowercase().contains("out of memory")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_has_no_pool_and_trim_is_a_no_op() -> Result<()> {
        let cpu = Device::cpu();
        assert_eq!(stats(&cpu)?, None);
        empty_cache(&cpu)?;
        Ok(())
    }

    #[test]
    fn the_host_peak_is_measured_and_reset() {
        let cpu = Device::cpu();
        if !reset_peak(&cpu) {
            return; // not Linux, or no clear_refs: nothing to measure
        }
        let before = peak(&cpu).unwrap_or_default();
        // black_box: an optimised build would elide an allocation never read.
        let big = std::hint::black_box(vec![1u8; 64 << 20]);
        let grown = peak(&cpu).unwrap_or_default();
        assert!(grown >= before + (60 << 20), "{before} -> {grown}");
        drop(big);
        assert!(reset_peak(&cpu));
        let after = peak(&cpu).unwrap_or_default();
        assert!(
            after + (60 << 20) <= grown,
            "{grown} -> {after} after the reset"
        );
    }

    #[test]
    fn recognises_driver_out_of_memory_errors() {
        // The text cudarc's DriverError gives inside a candle error.
        let oom = candle_core::Error::Msg(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
        );
        assert!(is_out_of_memory(&oom));
        let other = candle_core::Error::Msg("shape mismatch in matmul".into());
        assert!(!is_out_of_memory(&other));
    }

    #[test]
    fn stats_serialise_in_bytes() {
        let s = MemoryStats {
            allocated: 1,
            peak_allocated: 2,
            reserved: 3,
            peak_reserved: 4,
            device_free: 5,
            device_total: 6,
        };
        let v = s.to_json();
        assert_eq!(v["peak_allocated_bytes"], 2);
        assert_eq!(v["device_total_bytes"], 6);
    }
}
