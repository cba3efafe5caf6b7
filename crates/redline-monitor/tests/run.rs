#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `run` end to end: once, JSON, and a real CSV file.

use std::time::Duration;

use redline_monitor::{run, run_to, Gpus, MonitorOptions, Sample};

fn gpu_count() -> usize {
    Gpus::open().map_or(0, |g| g.count() as usize)
}

#[test]
fn once_with_csv_writes_the_header_and_one_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("monitor.csv");
    let opts = MonitorOptions {
        once: true,
        csv: Some(path.clone()),
        ..MonitorOptions::default()
    };
    let mut out = Vec::new();
    run_to(&opts, &mut out).unwrap();
    let table = String::from_utf8(out).unwrap();
    assert!(table.starts_with("redline monitor   "), "{table}");
    assert!(table.contains("\nhost   cpu "), "{table}");
    assert!(table.contains("cpu0 ["), "{table}");
    assert!(!table.contains('\x1b'), "no screen clearing for --once");

    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    let header: Vec<&str> = lines[0].split(',').collect();
    assert_eq!(
        header[..6],
        [
            "unix_time",
            "t_s",
            "cpu_percent",
            "memory_used",
            "memory_total",
            "process_cpu_percent"
        ]
    );
    assert_eq!(header.len(), 6 + 5 * gpu_count());
    let row: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(row.len(), header.len());
    let unix_time: f64 = row[0].parse().unwrap();
    let cpu: f64 = row[2].parse().unwrap();
    let memory_total: u64 = row[4].parse().unwrap();
    assert!(unix_time > 1.0e9);
    assert!((0.0..=100.5).contains(&cpu));
    assert!(memory_total > 0);

    // A second run appends a row under the same header.
    run_to(&opts, &mut Vec::new()).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 3);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("unix_time")).count(),
        1
    );
}

#[test]
fn json_with_count_writes_one_row_per_sample() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.csv");
    let opts = MonitorOptions {
        interval: Duration::from_millis(50),
        json: true,
        count: Some(2),
        csv: Some(path.clone()),
        ..MonitorOptions::default()
    };
    let mut out = Vec::new();
    run_to(&opts, &mut out).unwrap();
    let samples: Vec<Sample> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(samples.len(), 2);
    assert!(samples[0].t_s < samples[1].t_s);
    assert!(samples.iter().all(|s| s.host.memory_total > 0));
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 1 + 2);
}

/// Set in the child process of [`run_prints_one_json_line_to_stdout`].
const CHILD: &str = "REDLINE_MONITOR_STDOUT_CHILD";

#[test]
fn run_prints_to_real_stdout_child() {
    // Does the printing in a child process of the test below; on its own a no-op.
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let opts = MonitorOptions {
        once: true,
        json: true,
        ..MonitorOptions::default()
    };
    run(&opts).unwrap();
}

#[test]
fn run_prints_one_json_line_to_stdout() {
    // `run` writes to the process's real stdout, which the harness does not
    // capture: this test binary runs the test above in a child and reads it.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "run_prints_to_real_stdout_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let samples: Vec<Sample> = text
        .lines()
        // The harness's "test ... " may share the line: the record starts at `{`.
        .filter_map(|l| l.find('{').map(|i| &l[i..]))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(samples.len(), 1, "{text}");
    assert!(samples[0].host.memory_total > 0);
}

#[test]
fn a_csv_in_a_missing_folder_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/folder/m.csv");
    let opts = MonitorOptions {
        once: true,
        csv: Some(path.clone()),
        ..MonitorOptions::default()
    };
    let err = run_to(&opts, &mut Vec::new()).unwrap_err().to_string();
    assert!(err.starts_with(&path.display().to_string()), "{err}");
    assert!(err.contains("cannot open the CSV file"), "{err}");
    assert!(err.contains("HINT: the folder"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn a_folder_given_as_csv_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let opts = MonitorOptions {
        once: true,
        csv: Some(dir.path().to_path_buf()),
        ..MonitorOptions::default()
    };
    let err = run_to(&opts, &mut Vec::new()).unwrap_err().to_string();
    assert!(err.contains("HINT: "), "{err}");
    assert!(err.contains("monitor.csv"), "{err}");
}
