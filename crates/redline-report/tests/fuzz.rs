//! Fuzzing the readers of a run folder (`redline report`, `redline runs`;
//! `redline_testkit::fuzz`, corpus in `testdata/fuzz/`): one file of an
//! otherwise valid folder is mutated at a time (`metrics.jsonl`,
//! `summary.json`, `breakdown.json`, `profile.json`). Loading gives the run
//! or an error, rendering never panics, and the listing always has the row
//! and prints.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use redline_report::{format_runs, list_runs, render_html, RunData};
use redline_testkit::fuzz::{corpus, fuzz};

/// A run folder of the corpus' first seed of each file, with `file` fuzzed.
fn fuzz_file(target: &str, file: &str) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("run");
    std::fs::create_dir_all(&dir).unwrap();
    for (t, f) in [
        ("metrics", "metrics.jsonl"),
        ("summary", "summary.json"),
        ("breakdown", "breakdown.json"),
        ("profile", "profile.json"),
    ] {
        std::fs::write(dir.join(f), &corpus(t)[0]).unwrap();
    }
    fuzz(target, |bytes| {
        std::fs::write(dir.join(file), bytes).unwrap();
        if let Ok(run) = RunData::load(&dir) {
            let page = render_html(&run);
            assert!(page.is_err() || page.is_ok_and(|p| p.contains("</html>")));
        }
        let rows = list_runs(root.path()).unwrap();
        assert_eq!(rows.len(), 1, "the folder is listed, readable or not");
        // And printed: what was read reaches a width-formatted table.
        assert!(format_runs(&rows).contains("run "));
    });
}

#[test]
fn fuzz_metrics_jsonl() {
    fuzz_file("metrics", "metrics.jsonl");
}

#[test]
fn fuzz_summary_json() {
    fuzz_file("summary", "summary.json");
}

#[test]
fn fuzz_breakdown_json() {
    fuzz_file("breakdown", "breakdown.json");
}

#[test]
fn fuzz_profile_json() {
    fuzz_file("profile", "profile.json");
}

/// `tune_lr.json` (`--lr auto`'s curve), drawn by the report: a damaged one
/// is a note on the page, never a failed report.
#[test]
fn fuzz_tune_lr_json() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("run");
    std::fs::create_dir_all(&dir).unwrap();
    for (t, f) in [("metrics", "metrics.jsonl"), ("summary", "summary.json")] {
        std::fs::write(dir.join(f), &corpus(t)[0]).unwrap();
    }
    fuzz("tune_lr", |bytes| {
        std::fs::write(dir.join("tune_lr.json"), bytes).unwrap();
        let run = RunData::load(&dir).expect("the finder's file never fails the report");
        let page = render_html(&run).unwrap();
        assert!(page.contains("</html>"));
    });
}

/// `config.toml`, read by the listing (for a run without a summary) and shown
/// verbatim in the report: any bytes, in a finished and an unfinished run.
#[test]
fn fuzz_config_toml() {
    let root = tempfile::tempdir().unwrap();
    let (done, killed) = (root.path().join("done"), root.path().join("killed"));
    for dir in [&done, &killed] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("metrics.jsonl"), &corpus("metrics")[0]).unwrap();
    }
    std::fs::write(done.join("summary.json"), &corpus("summary")[0]).unwrap();
    fuzz("config", |bytes| {
        for dir in [&done, &killed] {
            std::fs::write(dir.join("config.toml"), bytes).unwrap();
            if let Ok(run) = RunData::load(dir) {
                let page = render_html(&run);
                assert!(page.is_err() || page.is_ok_and(|p| p.contains("</html>")));
            }
        }
        let rows = list_runs(root.path()).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(format_runs(&rows).contains("run "));
    });
}

/// Any file of a run folder that is not a regular file (a FIFO, a link to
/// `/dev/zero`, ...) gives an error or a row, within seconds.
#[test]
fn special_files_in_a_run_folder_are_refused_not_read_forever() {
    use redline_testkit::fuzz::{special_files, within};
    let limit = std::time::Duration::from_secs(30);
    for file in [
        "metrics.jsonl",
        "summary.json",
        "config.toml",
        "breakdown.json",
        "tune_lr.json",
        "pid",
    ] {
        let root = tempfile::tempdir().unwrap();
        for p in special_files(root.path(), file) {
            let dir = p.parent().unwrap().to_path_buf();
            // The other record files, so the folder is a run.
            for (t, f) in [("metrics", "metrics.jsonl"), ("summary", "summary.json")] {
                if f != file {
                    std::fs::write(dir.join(f), &corpus(t)[0]).unwrap();
                }
            }
            let what = format!("{}", p.display());
            within(limit, &what, move || {
                let _ = RunData::load(&dir);
                let _ = redline_report::write_report(&dir);
            });
        }
        let what = format!("redline runs with a special {file}");
        let root_path = root.path().to_path_buf();
        within(limit, &what, move || {
            list_runs(&root_path).map(|r| r.len()).ok()
        });
    }
}
