//! A real `redline train` run, checked by the external tools its outputs are
//! for: TensorBoard's own `EventAccumulator` reads the event file, and headless
//! Chromium renders report.html.
//!
//! Tools are found by `redline_testkit::tools`; without one a test is skipped,
//! unless `REDLINE_REQUIRE_TOOLS=1`, where it fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

use redline_testkit::{check_page, event_accumulator, tools};
use serde_json::Value;
use tempfile::TempDir;

/// A 300-step MLP run, logging every 25 steps and sampling the host every
/// 0.1 s, with the simple profiler; returns its temp dir (removed on drop) and
/// the run folder, `<tmp>/run`.
fn real_run() -> (TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .args([
            "train",
            "--max-steps",
            "300",
            "--log-every",
            "25",
            "--monitor-interval",
            "0.1",
            "--profiler",
            "simple",
            "--run-dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "redline train failed\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (tmp, dir)
}

#[test]
fn tensorboard_reads_a_real_run() {
    let Some(python) = tools::need_tensorboard_python() else {
        return;
    };
    let (_tmp, dir) = real_run();

    let scalars = event_accumulator(&python, &dir).unwrap_or_else(|e| panic!("{e}"));
    for tag in [
        "train/loss",
        "train/lr",
        "train/samples_per_s",
        "test/loss",
        "test/accuracy",
        "epoch/train_accuracy",
        "system/cpu_percent",
    ] {
        assert!(
            scalars.iter().any(|s| s.tag == tag),
            "{tag} missing from {:?}",
            {
                let mut tags: Vec<&str> = scalars.iter().map(|s| s.tag.as_str()).collect();
                tags.dedup();
                tags
            }
        );
    }

    let tb_loss: Vec<(i64, f64)> = scalars
        .iter()
        .filter(|s| s.tag == "train/loss")
        .map(|s| (s.step, s.value))
        .collect();
    let steps: Vec<i64> = tb_loss.iter().map(|&(step, _)| step).collect();
    assert_eq!(steps, (1..=12).map(|i| i * 25).collect::<Vec<_>>());

    // The event file stores f32: TensorBoard's value is the logged loss rounded to f32.
    let logged: Vec<(i64, f64)> = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["kind"] == "step")
        .map(|r| {
            let loss = r["loss"].as_f64().unwrap();
            (r["step"].as_i64().unwrap(), f64::from(loss as f32))
        })
        .collect();
    assert_eq!(tb_loss, logged, "train/loss: TensorBoard vs metrics.jsonl");
    eprintln!(
        "EventAccumulator ({}) read {} scalars from a real run; train/loss matches metrics.jsonl",
        python.display(),
        scalars.len()
    );
}

#[test]
fn report_of_a_real_run_renders_in_chromium() {
    let Some(bin) = tools::need_chromium() else {
        return;
    };
    let (tmp, dir) = real_run();

    let keep = std::env::var_os("REDLINE_REPORT_SCREENSHOTS").map(PathBuf::from);
    let shots = keep.as_deref().unwrap_or(tmp.path());
    std::fs::create_dir_all(shots).unwrap();
    let png = shots.join("report-real-run.png");

    let check =
        check_page(&bin, &dir.join("report.html"), Some(&png)).unwrap_or_else(|e| panic!("{e}"));
    let total = check.assert_report_renders(6, 50_000);
    eprintln!(
        "real run ({}): {total} charts laid out, no console output, screenshot {} ({} bytes)",
        bin.display(),
        png.display(),
        check.screenshot_bytes.unwrap_or(0)
    );
}
