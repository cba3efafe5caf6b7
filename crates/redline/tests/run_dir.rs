//! End-to-end tests of what a run leaves behind: the run folder (config,
//! metrics, TensorBoard events, breakdown, profile, trace, summary, report),
//! `--config` re-runs, `redline runs`, `redline report` and `redline monitor`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use serde_json::Value;

mod common;
use common::{json, jsonl, ok, redline};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A short MLP run into `dir` with the given extra flags.
fn short_run(dir: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "train",
        "--max-steps",
        "120",
        "--log-every",
        "20",
        "--eval-batch-size",
        "2000",
        "--run-dir",
        s(dir),
    ];
    args.extend_from_slice(extra);
    ok(&args)
}

#[test]
fn a_run_leaves_a_complete_run_folder() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("run");
    let out = short_run(&dir, &["--profiler", "simple", "--monitor-interval", "0.2"]);

    // The one-line breakdown and the simple profiler table are printed.
    assert!(out.contains("time: compute"), "{out}");
    assert!(
        out.contains("Rows are exclusive and sum to the wall time"),
        "{out}"
    );
    assert!(out.contains("report.html"), "{out}");

    let summary = json(&dir.join("summary.json"));
    assert_eq!(summary["status"], "finished");
    assert_eq!(summary["steps"], 120);
    assert_eq!(summary["model"], "mlp");
    assert!(summary["test_accuracy"].as_f64().unwrap() > 0.5);
    // Validation is held out of the training split, not the test split.
    assert!(summary["val_accuracy"].as_f64().unwrap() > 0.5);
    assert!(
        summary["validation"]
            .as_str()
            .unwrap()
            .contains("held out of the training split"),
        "{summary}"
    );
    // The epoch end wrote a checkpoint with PyTorch-named weights.
    assert_eq!(summary["checkpoints"]["written"], 1);
    let ckpt = dir.join("checkpoints/step-00000120");
    for f in ["weights.safetensors", "optimizer.safetensors", "state.json"] {
        assert!(ckpt.join(f).is_file(), "{f} missing in {}", ckpt.display());
    }
    assert!(summary["val_loss"].as_f64().unwrap() > 0.0);

    let rows = jsonl(&dir.join("metrics.jsonl"));
    let steps: Vec<_> = rows.iter().filter(|r| r["kind"] == "step").collect();
    assert_eq!(steps.len(), 6, "a log point every 20 of 120 steps");
    assert_eq!(rows.iter().filter(|r| r["kind"] == "epoch").count(), 1);
    let csv = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    assert!(csv.starts_with("kind,step,epoch,loss"));
    assert_eq!(csv.lines().filter(|l| l.starts_with("step,")).count(), 6);

    // Breakdown: seven categories (communication 0 in one process),
    // exclusive, summing to the wall time.
    let b = json(&dir.join("breakdown.json"));
    let cats = b["categories"].as_array().unwrap();
    let names: Vec<&str> = cats.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "compute",
            "data_wait",
            "transfer",
            "host_sync",
            "communication",
            "overhead",
            "idle"
        ]
    );
    let sum: f64 = cats.iter().map(|c| c["seconds"].as_f64().unwrap()).sum();
    let wall = b["wall_s"].as_f64().unwrap();
    assert!((sum - wall).abs() < 1e-6 * wall.max(1.0), "{sum} vs {wall}");
    assert!(cats[0]["seconds"].as_f64().unwrap() > 0.0);
    let timeline = b["timeline"]["rows"].as_array().unwrap();
    assert_eq!(timeline.last().unwrap()["last_step"], 120);

    // The profile table: exclusive rows that sum to the wall time.
    let p = json(&dir.join("profile.json"));
    let rows = p["rows"].as_array().unwrap();
    let total: f64 = rows.iter().map(|r| r["total_s"].as_f64().unwrap()).sum();
    let pwall = p["wall_s"].as_f64().unwrap();
    assert!((total - pwall).abs() < 1e-6 * pwall.max(1.0));
    let actions: Vec<&str> = rows.iter().map(|r| r["action"].as_str().unwrap()).collect();
    for a in [
        "waiting for data",
        "training_step",
        "backward",
        "optimizer step",
        "validation",
    ] {
        assert!(actions.contains(&a), "{a} missing from {actions:?}");
    }
    let fwd = rows
        .iter()
        .find(|r| r["action"] == "training_step")
        .unwrap();
    assert_eq!(fwd["calls"], 120);
    assert!(std::fs::read_to_string(dir.join("profile.txt"))
        .unwrap()
        .contains("% wall"));
    assert!(!dir.join("trace.json").exists(), "trace only when detailed");

    // TensorBoard scalars, read back (the format itself is checked against
    // TensorBoard's EventAccumulator in redline-tensorboard's tests).
    let events = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .expect("an event file");
    let scalars = redline_tensorboard::read_scalars(&events).unwrap();
    let has = |tag: &str| scalars.iter().any(|(t, _, _)| t == tag);
    for tag in [
        "train/loss",
        "train/lr",
        "train/samples_per_s",
        "test/accuracy",
        "test/loss",
        "val/accuracy",
        "val/loss",
        "epoch/train_accuracy",
    ] {
        assert!(has(tag), "{tag} missing");
    }

    // config.toml is valid TOML naming the flags.
    let cfg: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("config.toml")).unwrap()).unwrap();
    assert_eq!(cfg["max-steps"].as_integer(), Some(120));
    assert_eq!(cfg["profiler"].as_str(), Some("simple"));

    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(page.contains("<svg"), "the report has charts");
}

#[test]
fn system_samples_are_recorded_during_training() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("run");
    // Long enough for several samples at 0.1 s.
    short_run(
        &dir,
        &[
            "--monitor-interval",
            "0.1",
            "--max-steps",
            "600",
            "--no-validate",
        ],
    );
    let rows = jsonl(&dir.join("metrics.jsonl"));
    let system: Vec<_> = rows.iter().filter(|r| r["kind"] == "system").collect();
    assert!(!system.is_empty(), "no system samples");
    let host = &system[0]["host"];
    assert!(host["memory_total"].as_u64().unwrap() > 0);
    assert!(!host["cpu_percent_per_core"].as_array().unwrap().is_empty());
    // No NVIDIA driver here: the GPU part says why instead of failing.
    assert!(system[0]["gpu_note"].is_string() || !system[0]["gpus"].as_array().unwrap().is_empty());
    assert_eq!(
        json(&dir.join("summary.json"))["system_samples"],
        system.len()
    );
}

#[test]
fn detailed_profiler_writes_a_chrome_trace_with_layers_and_tracks() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("run");
    let out = short_run(
        &dir,
        &[
            "--profiler",
            "detailed",
            "--monitor-interval",
            "0.1",
            "--max-steps",
            "400",
        ],
    );
    assert!(out.contains("fc1.backward (linear)"), "{out}");
    assert!(out.contains("Kernel calls per step"), "{out}");

    let trace = json(&dir.join("trace.json"));
    let events = trace["traceEvents"].as_array().unwrap();
    let track = |name: &str| {
        events
            .iter()
            .find(|e| e["ph"] == "M" && e["args"]["name"] == name)
            .map(|e| e["tid"].as_u64().unwrap())
    };
    let main = track("main loop").expect("main loop track");
    let loader = track("loader/prefetch").expect("loader track");
    let on = |tid: u64, name: &str| {
        events
            .iter()
            .any(|e| e["ph"] == "X" && e["tid"] == tid && e["name"] == name)
    };
    assert!(on(main, "training_step") && on(main, "backward") && on(main, "fc1.forward"));
    assert!(on(main, "fc1.backward (linear)") && on(main, "fc2.backward (linear)"));
    assert!(on(loader, "assemble batch"));
    let monitor = track("monitor").expect("monitor track");
    assert!(on(monitor, "sample"));
    let counts = &trace["otherData"]["op_counts_per_step"];
    assert!(counts["linear.backward"].as_f64().unwrap() >= 2.0);
    assert!(counts["optimizer.update"].as_f64().unwrap() >= 4.0);
}

#[test]
fn config_toml_reruns_the_same_run_and_flags_override_it() {
    let t = tempfile::tempdir().unwrap();
    let (a, b, c) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
    short_run(&a, &["--seed", "7", "--no-validate", "--lr", "0.002"]);
    let cfg = a.join("config.toml");
    ok(&["train", "--config", s(&cfg), "--run-dir", s(&b)]);
    let losses = |d: &Path| -> Vec<f64> {
        jsonl(&d.join("metrics.jsonl"))
            .iter()
            .filter(|r| r["kind"] == "step")
            .map(|r| r["loss"].as_f64().unwrap())
            .collect()
    };
    assert_eq!(losses(&a), losses(&b), "same config, same run");
    // A flag given on the command line wins over the file.
    ok(&[
        "train",
        "--config",
        s(&cfg),
        "--max-steps",
        "40",
        "--run-dir",
        s(&c),
    ]);
    assert_eq!(json(&c.join("summary.json"))["steps"], 40);

    let bad = t.path().join("bad.toml");
    std::fs::write(&bad, "epochs = [1, 2]\n").unwrap();
    let out = redline(&["train", "--config", s(&bad)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("epochs"), "{err}");
}

#[test]
fn runs_lists_runs_and_report_rebuilds_the_page() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("first");
    short_run(&a, &["--no-validate", "--max-steps", "30"]);
    let listing = ok(&["runs", s(t.path())]);
    assert!(
        listing.contains("first") && listing.contains("mlp"),
        "{listing}"
    );

    std::fs::remove_file(a.join("report.html")).unwrap();
    let out = ok(&["report", s(&a)]);
    assert!(out.contains("report.html"));
    assert!(a.join("report.html").exists());

    let again = redline(&["train", "--max-steps", "5", "--run-dir", s(&a)]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("already holds a run"),
        "{err}"
    );
}

#[test]
fn monitor_once_and_json_work_without_a_gpu_driver() {
    let out = ok(&["monitor", "--once"]);
    assert!(out.to_lowercase().contains("cpu"), "{out}");
    let out = ok(&["monitor", "--json", "--count", "2", "--interval", "0.3"]);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[1]["t_s"].as_f64().unwrap() > lines[0]["t_s"].as_f64().unwrap());
    let err =
        String::from_utf8_lossy(&redline(&["monitor", "--interval", "0"]).stderr).into_owned();
    assert!(err.contains("--interval"), "{err}");
}
