//! The `nvidia-smi`-like text view of a [`Sample`]: a pure function, no I/O.
//!
//! Layout: a header (time, driver and CUDA versions or the reason there are
//! none), one block per GPU with its processes, then the host: per-core CPU
//! bars, memory, and the redline processes. `n/a` marks a query the GPU does
//! not support.

use std::fmt::Write;

use crate::gpu::GpuSample;
use crate::host::HostSample;
use crate::sample::Sample;

const WIDTH: usize = 80;
const BAR: usize = 10;
const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * MIB;

/// Renders one sample as text. `driver` is the versions line for the header
/// (e.g. [`crate::Monitor::driver_summary`]); without it the header shows the
/// sample's `gpu_note`.
pub fn render(sample: &Sample, driver: Option<&str>) -> String {
    let mut out = String::new();
    let mut header = format!(
        "redline monitor   {}   t {:.1} s",
        utc_time(sample.unix_time),
        sample.t_s
    );
    if let Some(line) = driver.or(sample.gpu_note.as_deref()) {
        header.push_str("   ");
        header.push_str(line);
    }
    line(&mut out, &header);
    line(&mut out, &"=".repeat(WIDTH));
    for gpu in &sample.gpus {
        render_gpu(&mut out, gpu);
        line(&mut out, &"-".repeat(WIDTH));
    }
    render_host(&mut out, &sample.host);
    out
}

fn render_gpu(out: &mut String, gpu: &GpuSample) {
    line(out, &format!("GPU {}  {}", gpu.index, gpu.name));
    let memory = match (gpu.memory_used, gpu.memory_total) {
        (Some(used), Some(total)) => {
            format!("{:.0} / {:.0} MiB", used as f64 / MIB, total as f64 / MIB)
        }
        (Some(used), None) => format!("{:.0} MiB", used as f64 / MIB),
        _ => "n/a".into(),
    };
    line(
        out,
        &format!(
            "  util {}   mem util {}   memory {}   temp {}",
            percent(gpu.utilization_gpu_percent),
            percent(gpu.utilization_memory_percent),
            memory,
            unit(gpu.temperature_c, "C"),
        ),
    );
    let power = match (gpu.power_w, gpu.power_limit_w) {
        (Some(w), Some(limit)) => format!("{w:.0} / {limit:.0} W"),
        (w, _) => unit(w, "W"),
    };
    line(
        out,
        &format!(
            "  power {}   clocks sm {}   mem {}",
            power,
            unit(gpu.sm_clock_mhz.map(f64::from), "MHz"),
            unit(gpu.memory_clock_mhz.map(f64::from), "MHz"),
        ),
    );
    if gpu.processes.is_empty() {
        line(out, "  no processes");
        return;
    }
    line(
        out,
        &format!("  {:>8}  {:<16} {:>12}", "pid", "process", "GPU memory"),
    );
    for p in &gpu.processes {
        let name = if p.name.is_empty() { "?" } else { &p.name };
        let memory = p
            .memory_used
            .map_or("n/a".into(), |b| format!("{:.0} MiB", b as f64 / MIB));
        line(out, &format!("  {:>8}  {:<16} {:>12}", p.pid, name, memory));
    }
}

fn render_host(out: &mut String, host: &HostSample) {
    line(
        out,
        &format!(
            "host   cpu {:.0}%   memory {:.1} / {:.1} GiB   this process {:.0}% cpu, {:.0} MiB RSS",
            host.cpu_percent,
            host.memory_used as f64 / GIB,
            host.memory_total as f64 / GIB,
            host.process_cpu_percent,
            host.process_rss as f64 / MIB,
        ),
    );
    let cores = &host.cpu_percent_per_core;
    let columns = match cores.len() {
        0..=8 => 1,
        9..=32 => 2,
        _ => 3,
    };
    let label_width = format!("cpu{}", cores.len().saturating_sub(1)).len();
    for row in cores.chunks(columns).enumerate() {
        let (r, chunk) = row;
        let cells: Vec<String> = chunk
            .iter()
            .enumerate()
            .map(|(c, &pct)| {
                let label = format!("cpu{}", r * columns + c);
                format!("{label:<label_width$} [{}] {:>3.0}%", bar(pct), pct)
            })
            .collect();
        line(out, &format!("  {}", cells.join("   ")));
    }
    if host.processes.is_empty() {
        return;
    }
    line(
        out,
        &format!(
            "  {:>8} {:>7} {:>10}  {}",
            "pid", "cpu%", "RSS", "redline process"
        ),
    );
    for p in &host.processes {
        line(
            out,
            &format!(
                "  {:>8} {:>7.1} {:>6.0} MiB  {}",
                p.pid,
                p.cpu_percent,
                p.rss as f64 / MIB,
                p.name
            ),
        );
    }
}

/// `|||||     ` for 50%; clamped to the bar.
fn bar(pct: f64) -> String {
    let filled = ((pct / 100.0) * BAR as f64).round().clamp(0.0, BAR as f64) as usize;
    format!("{}{}", "|".repeat(filled), " ".repeat(BAR - filled))
}

fn percent(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0}%"))
}

fn unit(v: Option<f64>, unit: &str) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0} {unit}"))
}

fn line(out: &mut String, text: &str) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "{}", text.trim_end());
}

/// `YYYY-mm-dd HH:MM:SS UTC` from Unix seconds.
fn utc_time(unix: f64) -> String {
    redline_core::time::Utc::from_unix(unix).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuProcess;
    use crate::host::HostProcess;

    fn fake_sample() -> Sample {
        Sample {
            t_s: 12.04,
            unix_time: 1_795_000_000.5,
            host: HostSample {
                cpu_percent_per_core: vec![52.0, 20.0],
                cpu_percent: 36.0,
                memory_used: 3 * 1024 * 1024 * 1024,
                memory_total: 16 * 1024 * 1024 * 1024,
                process_cpu_percent: 95.0,
                process_rss: 512 * 1024 * 1024,
                processes: vec![HostProcess {
                    pid: 4321,
                    name: "redline".into(),
                    cpu_percent: 95.0,
                    rss: 512 * 1024 * 1024,
                }],
            },
            gpus: vec![GpuSample {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                utilization_gpu_percent: Some(87.0),
                utilization_memory_percent: Some(40.0),
                memory_used: Some(40_960 * 1024 * 1024),
                memory_total: Some(81_559 * 1024 * 1024),
                temperature_c: Some(54.0),
                power_w: Some(312.4),
                power_limit_w: None,
                sm_clock_mhz: Some(1980),
                memory_clock_mhz: Some(2619),
                processes: vec![GpuProcess {
                    pid: 4321,
                    name: "redline".into(),
                    memory_used: Some(40_000 * 1024 * 1024),
                }],
            }],
            gpu_note: None,
        }
    }

    #[test]
    fn renders_gpu_block_host_bars_and_processes() {
        let text = render(&fake_sample(), Some("driver 550.54.15, CUDA 12.4"));
        let first = text.lines().next().unwrap_or_default();
        assert!(first.contains("2026-11-18 11:06:40 UTC"), "{first}");
        assert!(first.contains("t 12.0 s"), "{first}");
        assert!(first.contains("driver 550.54.15, CUDA 12.4"), "{first}");
        assert!(text.contains("GPU 0  NVIDIA H100 80GB HBM3"), "{text}");
        assert!(text.contains("util 87%   mem util 40%   memory 40960 / 81559 MiB   temp 54 C"));
        // No power limit: the draw alone.
        assert!(
            text.contains("power 312 W   clocks sm 1980 MHz   mem 2619 MHz"),
            "{text}"
        );
        assert!(
            text.contains("4321  redline             40000 MiB"),
            "{text}"
        );
        assert!(text.contains("cpu0 [|||||     ]  52%"), "{text}");
        assert!(text.contains("cpu1 [||        ]  20%"), "{text}");
        assert!(text.contains("memory 3.0 / 16.0 GiB"), "{text}");
        assert!(text.contains("4321    95.0    512 MiB  redline"), "{text}");
        assert!(text.lines().all(|l| l == l.trim_end()));
    }

    #[test]
    fn without_gpus_the_header_carries_the_note() {
        let mut sample = fake_sample();
        sample.gpus.clear();
        sample.gpu_note = Some("NVML unavailable (no NVIDIA driver); GPU stats off".into());
        let text = render(&sample, None);
        let first = text.lines().next().unwrap_or_default();
        assert!(first.ends_with("NVML unavailable (no NVIDIA driver); GPU stats off"));
        assert!(!text.contains("GPU 0"));
        assert!(text.contains("host   cpu 36%"));
    }

    #[test]
    fn unsupported_gpu_queries_read_n_a() {
        let mut sample = fake_sample();
        let gpu = &mut sample.gpus[0];
        gpu.power_w = None;
        gpu.temperature_c = None;
        gpu.processes.clear();
        let text = render(&sample, None);
        assert!(text.contains("temp n/a"), "{text}");
        assert!(text.contains("power n/a"), "{text}");
        assert!(text.contains("no processes"), "{text}");
    }

    #[test]
    fn bars_clamp_and_cores_wrap_into_columns() {
        assert_eq!(bar(-5.0), " ".repeat(BAR));
        assert_eq!(bar(130.0), "|".repeat(BAR));
        let mut sample = fake_sample();
        sample.host.cpu_percent_per_core = vec![10.0; 16];
        let text = render(&sample, None);
        let rows = text
            .lines()
            .filter(|l| l.contains("cpu") && l.contains('['))
            .count();
        assert_eq!(rows, 8);
        assert!(
            text.contains("cpu0  [|         ]  10%   cpu1  [|"),
            "{text}"
        );
    }

    #[test]
    fn utc_time_matches_known_dates() {
        assert_eq!(utc_time(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_time(951_782_400.0), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_time(1_700_000_000.0), "2023-11-14 22:13:20 UTC");
    }
}
