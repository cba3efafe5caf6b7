//! The `--csv FILE` log: one row per sample, appended and flushed as it is taken.
//!
//! Columns: `unix_time, t_s, cpu_percent, memory_used, memory_total,
//! process_cpu_percent`, then for each GPU `i`: `gpu{i}_util, gpu{i}_mem_used,
//! gpu{i}_mem_total, gpu{i}_temp_c, gpu{i}_power_w`. Memory is in bytes; a
//! value the GPU does not report is an empty cell. The header is written when
//! the file is new; an existing file must have the same header, so that rows
//! from a machine with another GPU count never land under the wrong columns.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::sample::Sample;

/// An open CSV log for a fixed number of GPUs.
pub(crate) struct CsvLog {
    path: PathBuf,
    file: File,
    gpus: usize,
}

impl CsvLog {
    /// Opens `path` for appending (creating it), writing the header if it is new.
    pub(crate) fn open(path: &Path, gpus: usize) -> Result<CsvLog> {
        let expected = header(gpus);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| csv_error(path, "open", e))?;
        let len = file
            .metadata()
            .map_err(|e| csv_error(path, "read", e))?
            .len();
        if len == 0 {
            writeln!(file, "{expected}").map_err(|e| csv_error(path, "append to", e))?;
        } else {
            let mut found = String::new();
            File::open(path)
                .map(BufReader::new)
                .and_then(|mut r| r.read_line(&mut found))
                .map_err(|e| csv_error(path, "read", e))?;
            let found = found.trim_end().to_string();
            if found != expected {
                return Err(Error::CsvHeader {
                    path: path.to_path_buf(),
                    found,
                    expected,
                });
            }
        }
        Ok(CsvLog {
            path: path.to_path_buf(),
            file,
            gpus,
        })
    }

    /// Appends one row (a single write, so a crash leaves whole rows).
    pub(crate) fn append(&mut self, sample: &Sample) -> Result<()> {
        let line = row(sample, self.gpus) + "\n";
        self.file
            .write_all(line.as_bytes())
            .map_err(|e| csv_error(&self.path, "append to", e))
    }
}

/// The header line for `gpus` GPUs, without a newline.
pub(crate) fn header(gpus: usize) -> String {
    let mut cols: Vec<String> = [
        "unix_time",
        "t_s",
        "cpu_percent",
        "memory_used",
        "memory_total",
        "process_cpu_percent",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for i in 0..gpus {
        for suffix in ["util", "mem_used", "mem_total", "temp_c", "power_w"] {
            cols.push(format!("gpu{i}_{suffix}"));
        }
    }
    cols.join(",")
}

/// One data line for `gpus` GPUs, without a newline; missing GPUs or values are empty.
pub(crate) fn row(sample: &Sample, gpus: usize) -> String {
    let h = &sample.host;
    let mut cells = vec![
        format!("{:.3}", sample.unix_time),
        format!("{:.3}", sample.t_s),
        format!("{:.2}", h.cpu_percent),
        h.memory_used.to_string(),
        h.memory_total.to_string(),
        format!("{:.2}", h.process_cpu_percent),
    ];
    for i in 0..gpus {
        let gpu = sample.gpus.get(i);
        cells.push(float(gpu.and_then(|g| g.utilization_gpu_percent)));
        cells.push(int(gpu.and_then(|g| g.memory_used)));
        cells.push(int(gpu.and_then(|g| g.memory_total)));
        cells.push(float(gpu.and_then(|g| g.temperature_c)));
        cells.push(float(gpu.and_then(|g| g.power_w)));
    }
    cells.join(",")
}

fn float(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_default()
}

fn int(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

fn csv_error(path: &Path, action: &'static str, error: std::io::Error) -> Error {
    let hint = match error.kind() {
        ErrorKind::NotFound => {
            let folder = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            format!(
                "the folder {} does not exist; create it or pass another --csv FILE",
                folder.display()
            )
        }
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => {
            "no permission to write there; pass a --csv FILE in a folder you can write".into()
        }
        ErrorKind::IsADirectory => format!(
            "that is a folder; pass a file inside it, e.g. --csv {}",
            path.join("monitor.csv").display()
        ),
        _ => "check the path and free disk space, or pass another --csv FILE".into(),
    };
    Error::Csv {
        path: path.to_path_buf(),
        action,
        error,
        hint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuSample;
    use crate::host::HostSample;

    fn sample(gpus: Vec<GpuSample>) -> Sample {
        Sample {
            t_s: 1.0,
            unix_time: 1_795_000_000.25,
            host: HostSample {
                cpu_percent_per_core: vec![50.0, 25.0],
                cpu_percent: 37.5,
                memory_used: 100,
                memory_total: 400,
                process_cpu_percent: 99.0,
                process_rss: 7,
                processes: Vec::new(),
            },
            gpus,
            gpu_note: None,
        }
    }

    fn gpu(index: u32) -> GpuSample {
        GpuSample {
            index,
            name: "fake".into(),
            utilization_gpu_percent: Some(80.0),
            utilization_memory_percent: None,
            memory_used: Some(1024),
            memory_total: Some(4096),
            temperature_c: Some(60.0),
            power_w: None,
            power_limit_w: None,
            sm_clock_mhz: None,
            memory_clock_mhz: None,
            processes: Vec::new(),
        }
    }

    #[test]
    fn header_has_host_columns_then_five_per_gpu() {
        assert_eq!(
            header(0),
            "unix_time,t_s,cpu_percent,memory_used,memory_total,process_cpu_percent"
        );
        let h = header(2);
        assert_eq!(h.split(',').count(), 6 + 10);
        assert!(h.ends_with("gpu1_util,gpu1_mem_used,gpu1_mem_total,gpu1_temp_c,gpu1_power_w"));
    }

    #[test]
    fn rows_match_the_header_and_leave_missing_values_empty() {
        let r = row(&sample(vec![gpu(0)]), 2);
        assert_eq!(r.split(',').count(), header(2).split(',').count());
        assert_eq!(
            r,
            "1795000000.250,1.000,37.50,100,400,99.00,80.00,1024,4096,60.00,,,,,,"
        );
    }

    #[test]
    fn a_file_with_another_header_is_refused_with_both_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.csv");
        CsvLog::open(&path, 1).unwrap();
        CsvLog::open(&path, 1).unwrap();
        let err = CsvLog::open(&path, 0).err().unwrap().to_string();
        assert!(err.contains("found:    unix_time"), "{err}");
        assert!(err.contains("HINT: "), "{err}");
    }
}
