//! `redline runs`: one row per run folder under a root, as a text table.

use std::path::Path;

use redline_core::text::{clip, MAX_SHOWN};

use crate::error::{Error, Result};
use crate::records::Summary;
use crate::records::{Breakdown, Category};
use crate::run::{load_json, read_optional};

/// One run of the listing. Numbers are `None` where the run did not record them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRow {
    /// Folder name.
    pub name: String,
    /// `finished`, `failed`, `interrupted`; `running` or `killed` for a folder
    /// without `summary.json` (by whether the process its `pid` file names is
    /// alive); `unreadable` when `summary.json` does not parse.
    pub status: String,
    /// Model name.
    pub model: String,
    /// Device.
    pub device: String,
    /// Epochs run.
    pub epochs: Option<u64>,
    /// Final test accuracy, percent (the last validation's for runs without
    /// a test pass).
    pub test_accuracy_pct: Option<f64>,
    /// Training throughput.
    pub samples_per_s: Option<f64>,
    /// Wall seconds.
    pub wall_s: Option<f64>,
    /// Compute share of wall time from `breakdown.json`, percent.
    pub compute_pct: Option<f64>,
    /// Model FLOPs utilisation, percent (`summary.json`'s `flops.mfu`).
    pub mfu_pct: Option<f64>,
    /// Start time as Unix seconds (the sort key).
    pub started_unix: Option<f64>,
    /// Start time as written (`YYYY-mm-dd HH:MM:SS`).
    pub started: String,
    /// Why a file of this run could not be read.
    pub problem: Option<String>,
}

fn row(dir: &Path, name: String) -> RunRow {
    let summary = match load_json::<Summary>(&dir.join("summary.json")) {
        Ok(Some(s)) => s,
        Ok(None) => Summary::default(),
        Err(e) => {
            return RunRow {
                name,
                status: "unreadable".into(),
                problem: Some(e.to_string()),
                ..Default::default()
            }
        }
    };
    let (compute_pct, problem) = match load_json::<Breakdown>(&dir.join("breakdown.json")) {
        Ok(b) => (b.and_then(|b| b.listed_percent(Category::Compute)), None),
        Err(e) => (None, Some(e.to_string())),
    };
    RunRow {
        name,
        // A dev run only checked that training works: marked apart.
        status: match summary.fast_dev_run {
            Some(_) => format!("{} (dev run)", summary.status),
            None => summary.status.to_string(),
        },
        model: summary.model,
        device: summary.device,
        epochs: summary.epochs,
        test_accuracy_pct: summary
            .test_accuracy
            .or(summary.val_accuracy)
            .map(|a| 100.0 * a),
        samples_per_s: summary.samples_per_s,
        wall_s: summary.wall_s,
        compute_pct,
        mfu_pct: summary
            .flops
            .as_ref()
            .and_then(|f| f.mfu)
            .map(|m| 100.0 * m),
        started_unix: summary.started_unix,
        started: summary.started,
        problem,
    }
}

/// Whether process `pid` is alive (Linux: it has a `/proc` entry).
fn alive(pid: u32) -> bool {
    cfg!(target_os = "linux") && Path::new(&format!("/proc/{pid}")).exists()
}

/// A run folder without `summary.json`: still running (its `pid` file names a
/// live process), else killed before it could write one.
fn unfinished(dir: &Path, name: String) -> RunRow {
    let pid = read_optional(&dir.join("pid"))
        .ok()
        .flatten()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let running = pid.is_some_and(alive);
    let config = read_optional(&dir.join("config.toml"))
        .ok()
        .flatten()
        .unwrap_or_default();
    let model = config
        .lines()
        .find_map(|l| l.strip_prefix("model = "))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_default();
    // The record files are created when the run starts.
    let started_unix = std::fs::metadata(dir.join("metrics.jsonl"))
        .and_then(|m| m.created().or_else(|_| m.modified()))
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64());
    RunRow {
        name,
        status: if running { "running" } else { "killed" }.into(),
        model,
        started_unix,
        problem: (!running).then(|| {
            "no summary.json: the process ended without writing one (killed with SIGKILL, out \
             of memory, or the machine stopped); metrics.jsonl holds what it logged, and \
             `redline report` renders it"
                .to_string()
        }),
        ..Default::default()
    }
}

/// One row per run folder under `root`, oldest first (by start time, then by
/// name). A run folder is one with `summary.json` or `metrics.jsonl`: `root`
/// itself (`redline runs runs/one`), or a folder up to three levels below
/// it (a `--run-dir` such as `experiments/lr-0.1/one`). A run whose files do
/// not parse is listed as `unreadable` with the reason, and one that ended
/// without a summary as `killed`, so no folder is hidden.
pub fn list_runs(root: &Path) -> Result<Vec<RunRow>> {
    let mut rows = Vec::new();
    if is_run(root) {
        let name = root.file_name().map_or_else(
            || root.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        push_run(root, name, &mut rows);
    } else {
        // Each real folder once: links (a loop, or two names for one run)
        // would list a run many times.
        let mut seen = std::collections::HashSet::new();
        seen.insert(std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf()));
        collect_runs(root, None, 2, &mut rows, &mut seen)?;
    }
    rows.sort_by(|a, b| {
        let key = |r: &RunRow| r.started_unix.unwrap_or(f64::INFINITY);
        key(a)
            .total_cmp(&key(b))
            .then_with(|| a.started.cmp(&b.started))
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(rows)
}

/// Whether `dir` holds a run's records.
fn is_run(dir: &Path) -> bool {
    dir.join("summary.json").is_file() || dir.join("metrics.jsonl").is_file()
}

/// Adds the row of the run folder `dir`.
fn push_run(dir: &Path, name: String, rows: &mut Vec<RunRow>) {
    if dir.join("summary.json").is_file() {
        rows.push(row(dir, name));
    } else {
        rows.push(unfinished(dir, name));
    }
}

/// The runs among the subfolders of `dir` (named `prefix/name`), looking
/// `depth` more levels into folders that are not runs.
fn collect_runs(
    dir: &Path,
    prefix: Option<&str>,
    depth: usize,
    rows: &mut Vec<RunRow>,
    seen: &mut std::collections::HashSet<std::path::PathBuf>,
) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(Error::io(dir))?;
    let mut entries: Vec<std::fs::DirEntry> = entries
        .collect::<std::io::Result<_>>()
        .map_err(Error::io(dir))?;
    // Name order: of two names for one folder, the first is listed.
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let sub = entry.path();
        if !sub.is_dir() {
            continue;
        }
        let Ok(real) = std::fs::canonicalize(&sub) else {
            continue;
        };
        if !seen.insert(real) {
            continue;
        }
        let file = entry.file_name().to_string_lossy().into_owned();
        let name = prefix.map_or_else(|| file.clone(), |p| format!("{p}/{file}"));
        if is_run(&sub) {
            push_run(&sub, name, rows);
        } else if depth > 0 {
            // A folder that cannot be listed is not a run: skipped.
            let _ = collect_runs(&sub, Some(&name), depth - 1, rows, seen);
        }
    }
    Ok(())
}

fn opt(x: Option<f64>, decimals: usize) -> String {
    match x.filter(|v| v.is_finite()) {
        Some(v) => format!("{v:.decimals$}"),
        None => "-".into(),
    }
}

/// The rows as an aligned text table, with any unreadable files listed below it.
pub fn format_runs(rows: &[RunRow]) -> String {
    if rows.is_empty() {
        return "no runs (a run is a folder with summary.json or metrics.jsonl; `redline train` \
                writes one under runs/)\n"
            .into();
    }
    let header = [
        "run",
        "status",
        "model",
        "device",
        "epochs",
        "test acc %",
        "samples/s",
        "wall s",
        "compute %",
        "MFU %",
    ];
    // Text from the run's files, clipped: a column is as wide as its widest
    // cell, and a width past u16::MAX panics in `format!`.
    let text = |t: &str| clip(t, MAX_SHOWN);
    let cells: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            [
                text(&r.name),
                text(&r.status),
                text(&r.model),
                text(&r.device),
                r.epochs.map_or("-".into(), |e| e.to_string()),
                opt(r.test_accuracy_pct, 2),
                opt(r.samples_per_s, 0),
                opt(r.wall_s, 2),
                opt(r.compute_pct, 1),
                opt(r.mfu_pct, 1),
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    // Text columns align left, numbers right.
    let line = |row: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in row.iter().zip(width).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            if i < 4 {
                s.push_str(&format!("{c:<w$}"));
            } else {
                s.push_str(&format!("{c:>w$}"));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(&header.map(String::from));
    for row in &cells {
        out.push_str(&line(row));
    }
    for r in rows {
        if let Some(p) = &r.problem {
            out.push_str(&format!(
                "\n{}: {}\n",
                text(&r.name),
                clip(p, 4 * MAX_SHOWN)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn write_run(root: &Path, name: &str, summary: &str, breakdown: Option<&str>) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("summary.json"), summary).unwrap();
        if let Some(b) = breakdown {
            std::fs::write(dir.join("breakdown.json"), b).unwrap();
        }
    }

    /// A `summary.json` with a 70,000-character model or device is listed,
    /// clipped. Before, the table's width-formatting panicked ("Formatting
    /// argument out of range").
    #[test]
    fn a_run_with_huge_strings_is_listed_clipped() {
        let root = tempfile::tempdir().unwrap();
        let huge = "m".repeat(70_000);
        let summary = format!(
            r#"{{"model":"{huge}","device":"{huge}\nx","status":"{huge}","started_unix":1}}"#
        );
        write_run(root.path(), &"r".repeat(200), &summary, None);
        let text = format_runs(&list_runs(root.path()).unwrap());
        assert!(text.contains('…'), "{text}");
        assert!(
            text.lines().all(|l| l.chars().count() < 10 * MAX_SHOWN),
            "{text}"
        );
    }

    /// Before: a link loop (`a/loop -> ..`) listed one run many times.
    #[test]
    fn links_and_loops_list_each_run_once() {
        let root = tempfile::tempdir().unwrap();
        let summary = r#"{"model":"mlp","device":"cpu","status":"finished","started_unix":1}"#;
        write_run(root.path(), "a/one", summary, None);
        std::os::unix::fs::symlink(root.path(), root.path().join("a/loop")).unwrap();
        std::os::unix::fs::symlink(root.path().join("a/one"), root.path().join("b-alias")).unwrap();
        let names: Vec<String> = list_runs(root.path())
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["a/one"]);
    }

    #[test]
    fn a_run_dir_anywhere_is_listed_from_itself_or_two_levels_up() {
        let root = tempfile::tempdir().unwrap();
        let summary = r#"{"model":"mlp","device":"cpu","status":"finished","started_unix":1}"#;
        write_run(root.path(), "experiments/lr-0.1/one", summary, None);
        write_run(root.path(), "top", summary, None);
        let names = |p: &Path| -> Vec<String> {
            list_runs(p).unwrap().into_iter().map(|r| r.name).collect()
        };
        let mut all = names(root.path());
        all.sort();
        assert_eq!(all, ["experiments/lr-0.1/one", "top"]);
        assert_eq!(names(&root.path().join("experiments/lr-0.1/one")), ["one"]);
        assert_eq!(names(&root.path().join("experiments")), ["lr-0.1/one"]);
    }

    #[test]
    fn lists_runs_oldest_first_with_breakdown_share() {
        let root = tempfile::tempdir().unwrap();
        write_run(
            root.path(),
            "b-late",
            r#"{"model":"cnn","device":"cpu","status":"failed","started_unix":200,"epochs":1}"#,
            None,
        );
        write_run(
            root.path(),
            "a-early",
            r#"{"model":"mlp","device":"cpu","status":"finished","started_unix":100,
                "epochs":5,"test_accuracy":0.8725,"samples_per_s":85000.0,"wall_s":3.9}"#,
            Some(
                r#"{"wall_s":3.9,"categories":[{"name":"compute","seconds":3.2,"percent":82.4}]}"#,
            ),
        );
        std::fs::create_dir_all(root.path().join("not-a-run")).unwrap();
        std::fs::write(root.path().join("stray.txt"), "x").unwrap();

        let rows = list_runs(root.path()).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a-early", "b-late"]);
        assert_eq!(rows[0].compute_pct, Some(82.4));
        assert_eq!(rows[1].compute_pct, None);

        let text = format_runs(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("run "), "{text}");
        assert!(
            lines[1].contains("finished") && lines[1].contains("87.25"),
            "{text}"
        );
        assert!(
            lines[1].contains("85000") && lines[1].contains("82.4"),
            "{text}"
        );
        assert!(lines[2].contains("failed"), "{text}");
    }

    #[test]
    fn corrupt_summary_is_listed_as_unreadable() {
        let root = tempfile::tempdir().unwrap();
        write_run(root.path(), "bad", "{\"model\": ", None);
        let rows = list_runs(root.path()).unwrap();
        assert_eq!(rows[0].status, "unreadable");
        let text = format_runs(&rows);
        assert!(text.contains("summary.json:1:"), "{text}");
    }

    #[test]
    fn a_folder_without_a_summary_is_running_or_killed() {
        let root = tempfile::tempdir().unwrap();
        let folder = |name: &str, pid: Option<u32>| {
            let dir = root.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("metrics.jsonl"), "").unwrap();
            std::fs::write(dir.join("config.toml"), "epochs = 5\nmodel = \"cnn\"\n").unwrap();
            if let Some(p) = pid {
                std::fs::write(dir.join("pid"), p.to_string()).unwrap();
            }
        };
        folder("a-killed", None);
        // This test's own process is alive; pid 0 never has a /proc entry.
        folder("b-live", Some(std::process::id()));
        folder("c-dead", Some(0));
        let mut rows = list_runs(root.path()).unwrap();
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        let status: Vec<&str> = rows.iter().map(|r| r.status.as_str()).collect();
        assert_eq!(status, ["killed", "running", "killed"]);
        assert!(rows
            .iter()
            .all(|r| r.model == "cnn" && r.started_unix.is_some()));
        let text = format_runs(&rows);
        assert!(text.contains("a-killed: no summary.json"), "{text}");
        assert!(!text.contains("b-live: "), "{text}");
    }

    #[test]
    fn missing_root_and_empty_root() {
        let root = tempfile::tempdir().unwrap();
        let e = list_runs(&root.path().join("nope")).unwrap_err();
        assert!(e.to_string().contains("nope"));
        assert!(format_runs(&list_runs(root.path()).unwrap()).starts_with("no runs"));
    }
}
