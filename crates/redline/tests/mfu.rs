//! FLOPs and MFU in every run: counted from the model, against the CPU's
//! measured peak (or `--peak-flops`), in `summary.json`, the summary line,
//! each log point's TensorBoard scalar and `metrics.jsonl` record, the
//! report, and `redline runs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

fn summary(run: &Path) -> serde_json::Value {
    common::json(&run.join("summary.json"))
}

fn events(run: &Path) -> Vec<(String, i64, f64)> {
    let file = std::fs::read_dir(run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .expect("an event file");
    redline_tensorboard::read_scalars(&file).unwrap()
}

#[test]
fn the_main_job_reports_its_flops_and_an_mfu_between_0_and_1() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let out = common::train_in(
        &run,
        &["--epochs", "1", "--max-steps", "60", "--log-every", "20"],
    );
    // The MLP 784-128-10: forward 2*784*128 + 2*128*10, backward the same
    // less the first layer's input gradient (the data needs none).
    let per_sample = 2 * (2 * 784 * 128) + 3 * (2 * 128 * 10);
    let s = summary(&run);
    let f = &s["flops"];
    assert_eq!(f["train_per_sample"], per_sample, "{s}");
    let mfu = f["mfu"].as_f64().expect("an MFU on the CPU");
    assert!(mfu > 0.0 && mfu < 1.0, "MFU {mfu}");
    let (achieved, peak) = (
        f["achieved_per_s"].as_f64().unwrap(),
        f["peak_per_s"].as_f64().unwrap(),
    );
    assert!((achieved / peak - mfu).abs() < 1e-9 * mfu);
    // 60 steps of 64 samples: the step's FLOPs are the batch's.
    assert_eq!(f["per_step"].as_f64(), Some(64.0 * per_sample as f64));
    let source = f["peak_source"].as_str().unwrap();
    assert!(source.starts_with("measured: the fp32 GEMM on"), "{source}");
    // Printed: at start the peak, at the end the line and the summary's MFU.
    assert!(out.contains("MFU against a peak of"), "{out}");
    assert!(
        out.contains(&format!("| MFU {:.1}% |", 100.0 * mfu)),
        "{out}"
    );
    assert!(out.contains("flops: 409 kFLOP per sample"), "{out}");
    // Every log point has it, in TensorBoard and metrics.jsonl.
    let scalars = events(&run);
    let mfus: Vec<f64> = scalars
        .iter()
        .filter(|(t, _, _)| t == "train/mfu")
        .map(|(_, _, v)| *v)
        .collect();
    assert_eq!(mfus.len(), 3, "one per log point: {scalars:?}");
    assert!(mfus.iter().all(|m| *m > 0.0 && *m < 1.0), "{mfus:?}");
    assert!(scalars.iter().any(|(t, _, _)| t == "train/tflops"));
    let steps: Vec<serde_json::Value> = common::jsonl(&run.join("metrics.jsonl"))
        .into_iter()
        .filter(|r| r["kind"] == "step")
        .collect();
    assert!(
        steps.iter().all(|r| r["mfu"].as_f64().is_some()),
        "{steps:?}"
    );
    // The report's card and breakdown line, and `redline runs`' column.
    let page = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(page.contains("MFU (model FLOPs / peak)"));
    assert!(
        page.contains("math efficiency: MFU"),
        "the breakdown's line"
    );
    let listing = common::ok(&["runs", t.path().to_str().unwrap()]);
    let head = listing.lines().next().unwrap();
    assert!(head.ends_with("MFU %"), "{listing}");
    let row = listing.lines().nth(1).unwrap();
    assert!(row.ends_with(&format!("{:.1}", 100.0 * mfu)), "{listing}");
}

#[test]
fn peak_flops_overrides_the_measured_peak() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    common::train_in(
        &run,
        &[
            "--epochs",
            "1",
            "--max-steps",
            "5",
            "--peak-flops",
            "2.5 TFLOPS",
        ],
    );
    let f = &summary(&run)["flops"];
    assert_eq!(f["peak_per_s"].as_f64(), Some(2.5e12));
    assert_eq!(f["peak_source"], "--peak-flops");
    let (a, m) = (
        f["achieved_per_s"].as_f64().unwrap(),
        f["mfu"].as_f64().unwrap(),
    );
    assert!((a / 2.5e12 - m).abs() <= 1e-9 * m);
}

#[test]
fn a_bad_peak_is_refused_before_anything_is_read() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    for (bad, says) in [
        ("fast", "is not a number of FLOP/s"),
        ("989", "HINT: give FLOP/s, not TFLOP/s"),
        ("-1T", "positive, finite"),
        ("NaN", "positive, finite"),
        ("1e400", "positive, finite"),
    ] {
        let flag = format!("--peak-flops={bad}");
        let err = common::fails(&[
            "train",
            "--device",
            "cpu",
            "--run-dir",
            run.to_str().unwrap(),
            &flag,
        ]);
        assert!(
            err.contains("--peak-flops") && err.contains(says),
            "{bad}: {err}"
        );
        assert!(!err.contains("loading"), "{err}");
        assert!(!run.exists(), "--peak-flops {bad} left a run folder");
    }
}

#[test]
fn the_cnn_and_a_model_file_count_as_the_reference_does() {
    // The golden counts (FlopCounterMode) for the zoo CNN and small-cnn.toml
    // are checked in redline-models; here, that a run reports them.
    let golden = common::json(&common::golden("flops.json"));
    let want = |name: &str| {
        let c = &golden["cases"][name];
        c["forward"].as_u64().unwrap() + c["backward"].as_u64().unwrap()
    };
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("cnn");
    common::train_in(
        &run,
        &["--model", "cnn", "--epochs", "1", "--max-steps", "2"],
    );
    assert_eq!(summary(&run)["flops"]["train_per_sample"], want("cnn"));
}
