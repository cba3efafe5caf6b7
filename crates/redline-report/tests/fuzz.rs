//! Fuzzing the readers of a run folder (`redline report`, `redline runs`;
//! `redline_testkit::fuzz`, corpus in `testdata/fuzz/`): one file of an
//! otherwise valid folder is mutated at a time (`metrics.jsonl`,
//! `summary.json`, `breakdown.json`, `profile.json`). Loading gives the run
//! or an error, rendering never panics, and the listing always has the row.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use redline_report::{list_runs, render_html, RunData};
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
