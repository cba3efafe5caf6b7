//! `redline train` with gradient accumulation, clipping and the gradient
//! norm: what the records say, and bad values refused before any work.

// Tests may panic on unexpected values: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{fails, json, jsonl, ok};

#[test]
fn accumulation_halves_the_steps_and_clipping_logs_the_norm() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let stdout = ok(&[
        "train",
        "--data",
        "data/tables/wine.csv",
        "--device",
        "cpu",
        "--monitor-interval",
        "0",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--accumulate",
        "2",
        "--clip-grad-norm",
        "1.5",
        "--log-every",
        "1",
        "--run-dir",
        run.to_str().unwrap(),
    ]);
    assert!(stdout.contains("effective batch 32"), "{stdout}");
    let records = jsonl(&run.join("metrics.jsonl"));
    let steps: Vec<&serde_json::Value> = records.iter().filter(|r| r["kind"] == "step").collect();
    let epochs: Vec<&serde_json::Value> = records.iter().filter(|r| r["kind"] == "epoch").collect();
    // 160 training rows (a tenth of 178 held out) in 10 batches of 16: 5
    // optimizer steps an epoch, each logged with its gradient norm.
    assert_eq!(steps.len(), 10, "{records:?}");
    assert_eq!(steps.last().unwrap()["step"], 10);
    for s in &steps {
        let g = s["grad_norm"].as_f64().unwrap();
        assert!(g.is_finite() && g > 0.0, "{s}");
    }
    assert_eq!(epochs.len(), 2);
    assert!(
        epochs[0]["train_grad_norm"].as_f64().is_some(),
        "{:?}",
        epochs[0]
    );
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["steps"], 10, "{summary}");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        config.contains("accumulate = 2") && config.contains("clip-grad-norm = 1.5"),
        "{config}"
    );
}

#[test]
fn bad_clipping_and_accumulation_are_refused_before_the_run_folder() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let base = [
        "train",
        "--data",
        "data/tables/wine.csv",
        "--device",
        "cpu",
        "--run-dir",
        run.to_str().unwrap(),
    ];
    let with = |extra: &[&str]| -> String {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        fails(&args)
    };
    let m = with(&["--clip-grad-norm", "0"]);
    assert!(
        m.contains("--clip-grad-norm 0: must be a finite number > 0"),
        "{m}"
    );
    let m = with(&["--clip-grad-value", "nan"]);
    assert!(m.contains("--clip-grad-value NaN"), "{m}");
    let m = with(&["--accumulate", "0"]);
    assert!(m.contains("--accumulate 0"), "{m}");
    let m = with(&["--clip-grad-norm", "1", "--clip-grad-value", "1"]);
    assert!(m.contains("cannot be used with"), "{m}");
    assert!(!run.exists(), "a refused run leaves no folder");
}

#[test]
fn a_diverging_run_stops_fails_and_leaves_the_save_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let save = dir.path().join("w.safetensors");
    std::fs::write(&save, "the weights of an earlier run").unwrap();
    let args = [
        "train",
        "--lr",
        "1e6",
        "--max-steps",
        "100",
        "--log-every",
        "10",
        "--device",
        "cpu",
        "--monitor-interval",
        "0",
        "--save",
        save.to_str().unwrap(),
        "--run-dir",
        run.to_str().unwrap(),
    ];
    let m = fails(&args);
    assert!(
        m.contains("training diverged at step 10") && m.contains("lower the learning rate"),
        "{m}"
    );
    let kept = std::fs::read_to_string(&save).unwrap();
    assert_eq!(kept, "the weights of an earlier run");
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["status"], "failed", "{summary}");
    // Turned off, the same run goes on to the end (and is saved).
    let mut off = args.to_vec();
    let run2 = dir.path().join("run2");
    let n = off.len();
    off[n - 1] = run2.to_str().unwrap();
    off.extend_from_slice(&["--divergence-threshold", "0", "--max-steps", "20"]);
    ok(&off);
    assert_ne!(std::fs::read(&save).unwrap(), kept.as_bytes());
}
