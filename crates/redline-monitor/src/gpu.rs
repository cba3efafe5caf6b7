//! NVIDIA GPU sampling through NVML, loaded at run time.
//!
//! `nvml-wrapper` opens `libnvidia-ml.so.1` with `libloading` when [`Gpus::open`] is
//! called, so this crate builds and runs on machines without a driver: there
//! `open` returns a one-line note instead of failing. Once open, every query is
//! independent: one the GPU does not support (power on some boards, clocks under
//! MIG) becomes `None` in its field, never an error for the whole sample.

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};
use serde::{Deserialize, Serialize};

/// One reading of one GPU. Memory is in bytes; `None` means the query is not
/// supported on this GPU or failed this time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    /// NVML index (the order of `nvidia-smi`, not necessarily of `CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Percent of the last sample period in which a kernel was running.
    pub utilization_gpu_percent: Option<f64>,
    /// Percent of the last sample period in which device memory was read or written.
    pub utilization_memory_percent: Option<f64>,
    /// Device memory allocated, bytes.
    pub memory_used: Option<u64>,
    /// Device memory installed, bytes.
    pub memory_total: Option<u64>,
    /// GPU die temperature, degrees Celsius.
    pub temperature_c: Option<f64>,
    /// Board power draw, watts.
    pub power_w: Option<f64>,
    /// Enforced power limit, watts.
    pub power_limit_w: Option<f64>,
    /// Streaming-multiprocessor clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Memory clock, MHz.
    pub memory_clock_mhz: Option<u32>,
    /// Compute and graphics processes on this GPU, by pid.
    pub processes: Vec<GpuProcess>,
}

/// A process holding a context on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// Process id (in the driver's pid namespace).
    pub pid: u32,
    /// Command name from `/proc/PID/comm`; empty where that is not readable
    /// (another pid namespace, a process that just exited).
    pub name: String,
    /// Device memory the process uses, bytes, where the driver reports it.
    pub memory_used: Option<u64>,
}

/// Static facts of one GPU, for `redline devices`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuInfo {
    /// NVML index (the N of `cuda:N` when no `CUDA_VISIBLE_DEVICES` reorders them).
    pub index: u32,
    /// Product name.
    pub name: String,
    /// Total memory in bytes.
    pub memory_total: Option<u64>,
    /// Free memory in bytes.
    pub memory_free: Option<u64>,
    /// Compute capability, e.g. `9.0`.
    pub compute_capability: Option<String>,
}

/// An open NVML session and the GPUs it sees.
pub struct Gpus {
    nvml: Nvml,
    count: u32,
    driver_version: Option<String>,
    cuda_driver_version: Option<String>,
}

impl std::fmt::Debug for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpus")
            .field("count", &self.count)
            .field("driver_version", &self.driver_version)
            .field("cuda_driver_version", &self.cuda_driver_version)
            .finish_non_exhaustive()
    }
}

impl Gpus {
    /// Loads NVML and counts the GPUs. The `Err` is a one-line note for the user
    /// (`NVML unavailable (...); GPU stats off`), never a reason to stop a run.
    pub fn open() -> std::result::Result<Gpus, String> {
        let nvml = Nvml::init().map_err(|e| unavailable_note(&e))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML unavailable (cannot count GPUs: {e}); GPU stats off"))?;
        if count == 0 {
            return Err("NVML found no GPUs (driver loaded, 0 devices); GPU stats off".into());
        }
        let driver_version = nvml.sys_driver_version().ok();
        let cuda_driver_version = nvml.sys_cuda_driver_version().ok().map(format_cuda_version);
        Ok(Gpus {
            nvml,
            count,
            driver_version,
            cuda_driver_version,
        })
    }

    /// Number of GPUs NVML sees.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Kernel driver version, e.g. `550.54.15`.
    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }

    /// Highest CUDA version the driver supports, e.g. `12.4`.
    pub fn cuda_driver_version(&self) -> Option<&str> {
        self.cuda_driver_version.as_deref()
    }

    /// What `redline devices` lists for every GPU: name, memory, compute capability.
    pub fn inventory(&self) -> Vec<GpuInfo> {
        (0..self.count)
            .map(|index| {
                let device = self.nvml.device_by_index(index);
                let memory = device.as_ref().ok().and_then(|d| d.memory_info().ok());
                GpuInfo {
                    index,
                    name: match &device {
                        Ok(d) => d.name().unwrap_or_else(|_| format!("GPU {index}")),
                        Err(e) => format!("unavailable: {e}"),
                    },
                    memory_total: memory.as_ref().map(|m| m.total),
                    memory_free: memory.as_ref().map(|m| m.free),
                    compute_capability: device
                        .as_ref()
                        .ok()
                        .and_then(|d| d.cuda_compute_capability().ok())
                        .map(|c| format!("{}.{}", c.major, c.minor)),
                }
            })
            .collect()
    }

    /// One reading of every GPU, in index order. A GPU that cannot be opened
    /// (fallen off the bus) still gets an entry, with every field `None`.
    pub fn sample(&self) -> Vec<GpuSample> {
        (0..self.count)
            .map(|index| match self.nvml.device_by_index(index) {
                Ok(device) => sample_device(index, &device),
                Err(e) => GpuSample {
                    name: format!("unavailable: {e}"),
                    ..empty_sample(index)
                },
            })
            .collect()
    }
}

/// Reads one device; each query on its own.
fn sample_device(index: u32, device: &Device<'_>) -> GpuSample {
    let utilization = device.utilization_rates().ok();
    let memory = device.memory_info().ok();
    let mut processes = Vec::new();
    if let Ok(list) = device.running_compute_processes() {
        merge_processes(&mut processes, &list);
    }
    if let Ok(list) = device.running_graphics_processes() {
        merge_processes(&mut processes, &list);
    }
    processes.sort_by_key(|p| p.pid);
    GpuSample {
        index,
        name: device.name().unwrap_or_else(|_| format!("GPU {index}")),
        utilization_gpu_percent: utilization.as_ref().map(|u| f64::from(u.gpu)),
        utilization_memory_percent: utilization.as_ref().map(|u| f64::from(u.memory)),
        memory_used: memory.as_ref().map(|m| m.used),
        memory_total: memory.as_ref().map(|m| m.total),
        temperature_c: device
            .temperature(TemperatureSensor::Gpu)
            .ok()
            .map(f64::from),
        power_w: device.power_usage().ok().map(milliwatts_to_watts),
        power_limit_w: device.enforced_power_limit().ok().map(milliwatts_to_watts),
        sm_clock_mhz: device.clock_info(Clock::SM).ok(),
        memory_clock_mhz: device.clock_info(Clock::Memory).ok(),
        processes,
    }
}

fn empty_sample(index: u32) -> GpuSample {
    GpuSample {
        index,
        name: String::new(),
        utilization_gpu_percent: None,
        utilization_memory_percent: None,
        memory_used: None,
        memory_total: None,
        temperature_c: None,
        power_w: None,
        power_limit_w: None,
        sm_clock_mhz: None,
        memory_clock_mhz: None,
        processes: Vec::new(),
    }
}

/// Adds NVML's process list to `out`. A process with both a compute and a
/// graphics context (`C+G` in nvidia-smi) is listed once.
fn merge_processes(out: &mut Vec<GpuProcess>, list: &[ProcessInfo]) {
    for info in list {
        let memory_used = match info.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        };
        if let Some(known) = out.iter_mut().find(|p| p.pid == info.pid) {
            known.memory_used = known.memory_used.or(memory_used);
        } else {
            out.push(GpuProcess {
                pid: info.pid,
                name: process_name(info.pid),
                memory_used,
            });
        }
    }
}

/// `/proc/PID/comm` without its newline, or empty where unreadable.
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

fn milliwatts_to_watts(mw: u32) -> f64 {
    f64::from(mw) / 1000.0
}

/// NVML encodes CUDA versions as `1000 * major + 10 * minor` (12040 -> `12.4`).
fn format_cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The user-facing note for a failed `nvmlInit`.
fn unavailable_note(e: &NvmlError) -> String {
    let why = match e {
        NvmlError::LibloadingError(_) => {
            "no NVIDIA driver: libnvidia-ml.so.1 not found".to_string()
        }
        NvmlError::FailedToLoadSymbol(_) => {
            "libnvidia-ml.so.1 is too old for nvml-wrapper (missing symbols)".to_string()
        }
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        other => other.to_string(),
    };
    format!("NVML unavailable ({why}); GPU stats off")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, used: UsedGpuMemory) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn cuda_version_is_major_dot_minor() {
        assert_eq!(format_cuda_version(12040), "12.4");
        assert_eq!(format_cuda_version(11080), "11.8");
        assert_eq!(format_cuda_version(13000), "13.0");
    }

    #[test]
    fn notes_are_one_line_and_name_nvml() {
        for e in [
            NvmlError::DriverNotLoaded,
            NvmlError::NoPermission,
            NvmlError::FailedToLoadSymbol("nvmlInit_v2".into()),
            NvmlError::Unknown,
        ] {
            let note = unavailable_note(&e);
            assert!(note.starts_with("NVML unavailable ("), "{note}");
            assert!(note.ends_with("; GPU stats off"), "{note}");
            assert!(!note.contains('\n'), "{note}");
        }
    }

    #[test]
    fn a_process_with_compute_and_graphics_contexts_is_listed_once() {
        let mut out = Vec::new();
        merge_processes(
            &mut out,
            &[
                info(7, UsedGpuMemory::Unavailable),
                info(9, UsedGpuMemory::Used(5)),
            ],
        );
        merge_processes(&mut out, &[info(7, UsedGpuMemory::Used(3))]);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].pid, 7);
        assert_eq!(out[0].memory_used, Some(3));
        assert_eq!(out[1].memory_used, Some(5));
    }

    #[test]
    fn own_process_name_comes_from_proc() {
        let name = process_name(std::process::id());
        if std::path::Path::new("/proc/self/comm").exists() {
            assert!(!name.is_empty());
        }
        assert_eq!(process_name(u32::MAX), "");
    }
}
