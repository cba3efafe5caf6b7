//! Fuzzing `Run::reopen` (`redline train --resume`), which reads a stopped
//! run's `metrics.jsonl` and `summary.json` that anyone may have edited,
//! copied half or truncated (`redline_testkit::fuzz`, the run-folder corpus
//! in `testdata/fuzz/`): it reopens the folder or errs, never panics, and
//! what it leaves reads back whole in `redline report` (where the folder
//! did before) and `redline runs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use redline_report::{list_runs, RunData};
use redline_run::{ResumePoint, Run};
use redline_testkit::fuzz::{corpus, fuzz};

fn reopen_with(file: &str, target: &str) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("run");
    std::fs::create_dir_all(&dir).unwrap();
    let at = ResumePoint {
        step: 5,
        epochs: 1,
        written_unix_s: 1.8e9,
        checkpoint: "checkpoints/step-00000005".into(),
    };
    fuzz(target, |bytes| {
        for (t, f) in [("metrics", "metrics.jsonl"), ("summary", "summary.json")] {
            std::fs::write(dir.join(f), &corpus(t)[0]).unwrap();
        }
        std::fs::write(dir.join(file), bytes).unwrap();
        // A record the report cannot read (a `pid` of -1, say) is the user's
        // and stays: the report names its line. Reopening must never turn a
        // folder the report could read into one it cannot.
        let readable_before = RunData::load(&dir).is_ok();
        let Ok((run, _)) = Run::reopen(&dir, "mlp", &at) else {
            return;
        };
        // Dropped unfinished: it says so in summary.json, as a crash would.
        drop(run);
        let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
        for line in text.lines() {
            assert!(
                serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.is_object()),
                "a line that is not a record was kept: {line}"
            );
        }
        assert!(
            !readable_before || RunData::load(&dir).is_ok(),
            "a folder the report read before reopening reads back after it"
        );
        assert_eq!(list_runs(root.path()).unwrap().len(), 1);
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            if e.file_name().to_string_lossy().starts_with("events.out") {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
    });
}

#[test]
fn fuzz_reopen_metrics_jsonl() {
    reopen_with("metrics.jsonl", "metrics");
}

#[test]
fn fuzz_reopen_summary_json() {
    reopen_with("summary.json", "summary");
}

/// `segments.json` (a resumed run's segments), edited or damaged: the
/// reopen goes on or errs, and the summary the run then writes reads back.
#[test]
fn fuzz_reopen_segments_json() {
    reopen_with("segments.json", "segments");
}

/// `inputs.json` (the fingerprints `--resume` checks the data against),
/// edited or damaged: read back or ignored, and compared with the inputs
/// now without a panic; it never reports a change for an input it lacks.
#[test]
fn fuzz_inputs_json() {
    use redline_run::inputs::{changes, fingerprint, recorded, INPUTS};
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("a.csv");
    std::fs::write(&data, "x,y\n1,2\n").unwrap();
    let now = vec![fingerprint("--data", &data).unwrap()];
    fuzz("inputs", |bytes| {
        std::fs::write(root.path().join(INPUTS), bytes).unwrap();
        if let Some(was) = recorded(root.path()) {
            let found = changes(&was, &now);
            assert!(found.len() <= was.len(), "{found:?}");
        }
    });
}
