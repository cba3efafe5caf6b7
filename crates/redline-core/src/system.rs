//! Discovery of the devices on this machine, for `redline devices`.

use sysinfo::System;

/// One device on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// The name to pass to `--device` (`cpu`, `cuda:0`).
    pub id: String,
    /// Marketing name (CPU brand or GPU model).
    pub name: String,
    /// Cores (CPU) or streaming multiprocessors (GPU); logical cores for CPUs.
    pub cores: usize,
    /// Cores this process may use (cgroup / affinity aware).
    pub usable_cores: usize,
    /// Total memory in bytes.
    pub memory_total: u64,
    /// Memory available now in bytes.
    pub memory_free: u64,
}

/// Lists the devices this machine and build can use, CPU first. Where the
/// system cannot be queried, counts fall back to what the process can see and
/// memory reads 0 (unknown).
pub fn devices() -> Vec<DeviceInfo> {
    let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut cpu = DeviceInfo {
        id: "cpu".into(),
        name: std::env::consts::ARCH.to_string(),
        cores: usable,
        usable_cores: usable,
        memory_total: 0,
        memory_free: 0,
    };
    if let Ok(mut sys) = System::new() {
        sys.refresh_memory();
        sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
        if let Some(brand) = sys
            .cpus()
            .first()
            .map(|c| c.brand().trim())
            .filter(|b| !b.is_empty())
        {
            cpu.name = brand.to_string();
        }
        cpu.cores = sys.cpus().len().max(usable);
        cpu.memory_total = sys.total_memory();
        cpu.memory_free = sys.available_memory();
    }
    vec![cpu]
}

/// Host memory available now, in bytes (`None` where it cannot be read).
pub fn host_memory_free() -> Option<u64> {
    let mut sys = System::new().ok()?;
    sys.refresh_memory();
    Some(sys.available_memory()).filter(|&m| m > 0)
}

/// Host memory installed, in bytes (`None` where it cannot be read).
pub fn host_memory_total() -> Option<u64> {
    let mut sys = System::new().ok()?;
    sys.refresh_memory();
    Some(sys.total_memory()).filter(|&m| m > 0)
}

/// Whether this build can drive NVIDIA GPUs.
pub fn cuda_compiled() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_cpu_with_real_numbers() {
        let d = devices();
        assert_eq!(d[0].id, "cpu");
        assert!(d[0].cores >= 1 && d[0].usable_cores >= 1);
        assert!(d[0].memory_total > 0 && d[0].memory_free <= d[0].memory_total);
    }
}
