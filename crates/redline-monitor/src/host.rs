//! Host sampling: CPU per core, memory, and the redline processes (sysinfo).
//!
//! CPU percentages are differences between two reads of `/proc/stat` (and of
//! `/proc/PID/stat` for processes), so a reading needs an earlier one. The
//! sampler primes itself at construction; the first [`HostSampler::sample`] is
//! meaningful once [`CPU_WINDOW`] has passed since then. sysinfo ignores CPU
//! refreshes closer together than that window (and would then divide a short
//! process delta by a stale system one), so a sample sooner than the window
//! after the last CPU reading repeats the CPU and process figures; system
//! memory is always fresh.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// The shortest interval over which CPU percentages are measured (sysinfo's
/// `MINIMUM_CPU_UPDATE_INTERVAL`, 200 ms on Linux).
pub const CPU_WINDOW: std::time::Duration = sysinfo::MINIMUM_CPU_UPDATE_INTERVAL;

/// One reading of the host. Memory is in bytes; CPU percentages are over the
/// time since the previous reading.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostSample {
    /// Busy percent of each logical core, 0..=100, in core order.
    pub cpu_percent_per_core: Vec<f64>,
    /// Mean busy percent over all cores, 0..=100.
    pub cpu_percent: f64,
    /// RAM in use (total minus available), bytes.
    pub memory_used: u64,
    /// RAM installed (`MemTotal`; not a container's cgroup limit), bytes.
    pub memory_total: u64,
    /// CPU used by this process, percent of one core (200 = two cores busy).
    pub process_cpu_percent: f64,
    /// Resident memory of this process, bytes.
    pub process_rss: u64,
    /// Processes whose name contains `redline`, and this process, by pid.
    pub processes: Vec<HostProcess>,
}

/// A redline process on this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostProcess {
    /// Process id.
    pub pid: u32,
    /// Command name (Linux truncates it to 15 bytes).
    pub name: String,
    /// CPU used, percent of one core.
    pub cpu_percent: f64,
    /// Resident memory, bytes.
    pub rss: u64,
}

/// Keeps the previous CPU reading so that each sample is a difference.
pub struct HostSampler {
    system: Option<System>,
    pid: Pid,
    note: Option<String>,
    /// When CPU and processes were last read.
    last_cpu: Instant,
}

impl std::fmt::Debug for HostSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSampler")
            .field("pid", &self.pid)
            .field("note", &self.note)
            .finish_non_exhaustive()
    }
}

impl Default for HostSampler {
    fn default() -> Self {
        Self::new()
    }
}

impl HostSampler {
    /// A sampler primed with a first CPU reading. Where the platform has no
    /// host statistics, samples are zeros and [`HostSampler::note`] says why.
    pub fn new() -> Self {
        let pid = Pid::from_u32(std::process::id());
        match System::new() {
            Ok(system) => {
                let mut sampler = Self {
                    system: Some(system),
                    pid,
                    note: None,
                    last_cpu: Instant::now(),
                };
                sampler.refresh();
                sampler
            }
            Err(e) => Self {
                system: None,
                pid,
                note: Some(format!("host statistics unavailable ({e}); host stats off")),
                last_cpu: Instant::now(),
            },
        }
    }

    /// Why host statistics are off, where they are.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Reads the host now. CPU figures cover the time since the previous CPU
    /// reading; within [`CPU_WINDOW`] of it they are repeated (see the module docs).
    pub fn sample(&mut self) -> HostSample {
        if self.last_cpu.elapsed() >= CPU_WINDOW {
            self.refresh();
        } else if let Some(system) = &mut self.system {
            system.refresh_memory();
        }
        let Some(system) = &self.system else {
            return HostSample::default();
        };
        let cpu_percent_per_core: Vec<f64> =
            system.cpus().iter().map(|c| f64::from(c.usage())).collect();
        let cpu_percent = if cpu_percent_per_core.is_empty() {
            0.0
        } else {
            cpu_percent_per_core.iter().sum::<f64>() / cpu_percent_per_core.len() as f64
        };
        let me = system.process(self.pid);
        let mut processes: Vec<HostProcess> = system
            .processes()
            .values()
            // Threads are listed only with `with_tasks()`; skip them should that change.
            .filter(|p| p.thread_kind().is_none())
            .filter(|p| p.pid() == self.pid || is_redline(&p.name().to_string_lossy()))
            .map(|p| HostProcess {
                pid: p.pid().as_u32(),
                name: p.name().to_string_lossy().into_owned(),
                cpu_percent: f64::from(p.cpu_usage()),
                rss: p.memory(),
            })
            .collect();
        processes.sort_by_key(|p| p.pid);
        HostSample {
            cpu_percent_per_core,
            cpu_percent,
            memory_used: system.used_memory(),
            memory_total: system.total_memory(),
            process_cpu_percent: me.map_or(0.0, |p| f64::from(p.cpu_usage())),
            process_rss: me.map_or(0, |p| p.memory()),
            processes,
        }
    }

    /// Reads CPU, memory and processes; the CPU window starts here.
    fn refresh(&mut self) {
        if let Some(system) = &mut self.system {
            system.refresh_cpu_usage();
            system.refresh_memory();
            // Every process, to find the redline ones by name; CPU and RSS only.
            system.refresh_processes_specifics(
                ProcessesToUpdate::All,
                true,
                ProcessRefreshKind::nothing().with_cpu().with_memory(),
            );
        }
        // After the reads, so that sysinfo's own window has surely passed too.
        self.last_cpu = Instant::now();
    }
}

fn is_redline(name: &str) -> bool {
    name.to_ascii_lowercase().contains("redline")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redline_names_match_case_insensitively() {
        assert!(is_redline("redline"));
        assert!(is_redline("Redline-train"));
        assert!(is_redline("redline_monitor"));
        assert!(!is_redline("python3"));
    }
}
