//! End-to-end tests of the `redline` binary: the golden run through the CLI,
//! determinism, and the clear errors for bad input.

// Tests may panic on unexpected values: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

mod common;
use common::{fails, json, jsonl, ok, root, train_in};

fn step_losses(rows: &[serde_json::Value]) -> Vec<f64> {
    rows.iter()
        .filter(|r| r["kind"] == "step")
        .map(|r| r["loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn golden_mlp_run_through_the_cli_matches_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let (out, metrics) = (dir.path().join("O.safetensors"), dir.path().join("M.jsonl"));
    let mut args: Vec<String> = vec!["train".into(), "--device".into(), "cpu".into()];
    // PyTorch's trace trained on the whole training split (the job has no validation split).
    args.extend(common::golden_job("mlp", 64, 20));
    args.extend(
        [
            "--optimizer",
            "adam",
            "--lr",
            "1e-3",
            "--save",
            out.to_str().unwrap(),
            "--metrics",
            metrics.to_str().unwrap(),
        ]
        .map(String::from),
    );
    let stdout = ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(stdout.contains("test accuracy"), "{stdout}");

    let rows = jsonl(&metrics);
    let want = common::golden_losses("mlp_trace.json");
    let got = step_losses(&rows);
    assert_eq!(got.len(), 20);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() / w < 1e-5, "ours {g} PyTorch {w}");
    }
    for r in rows.iter().filter(|r| r["kind"] == "step") {
        for key in ["step", "epoch", "loss", "lr", "samples_per_s", "elapsed_s"] {
            assert!(!r[key].is_null(), "{key} missing in {r}");
        }
    }
    let epoch = rows.iter().find(|r| r["kind"] == "epoch").unwrap();
    for key in ["epoch", "train_loss", "train_accuracy", "epoch_s", "eval_s"] {
        assert!(epoch[key].is_number(), "{key} missing in {epoch}");
    }
    // --val-split 0: no validation (the held-out split has its own test, run_dir.rs).
    assert!(epoch["val_loss"].is_null(), "{epoch}");
    // The test pass after fit, on the test split.
    let test = rows.iter().find(|r| r["kind"] == "test").unwrap();
    let acc = test["test_accuracy"].as_f64().unwrap();
    assert!(
        acc > 0.5 && acc <= 1.0,
        "20 steps should beat chance by far: {acc}"
    );
    assert_eq!(test["samples"], 10000);

    let saved = candle_core::safetensors::load(&out, &candle_core::Device::Cpu).unwrap();
    let want = candle_core::safetensors::load(
        root().join("testdata/golden/mlp_final.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let mut names: Vec<_> = saved.keys().cloned().collect();
    names.sort();
    assert_eq!(names, ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]);
    for (name, t) in &saved {
        let d = (t - &want[name])
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(d < 1e-5, "{name}: max abs diff {d}");
    }
}

#[test]
fn same_seed_same_run_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str| {
        let m = dir.path().join(name);
        ok(&[
            "train",
            "--device",
            "cpu",
            "--seed",
            "3",
            "--max-steps",
            "30",
            "--log-every",
            "1",
            "--no-validate",
            "--metrics",
            m.to_str().unwrap(),
        ]);
        step_losses(&jsonl(&m))
    };
    let (a, b) = (run("a.jsonl"), run("b.jsonl"));
    assert_eq!(a.len(), 30);
    assert_eq!(a, b);
    let m = dir.path().join("c.jsonl");
    ok(&[
        "train",
        "--device",
        "cpu",
        "--seed",
        "4",
        "--max-steps",
        "30",
        "--log-every",
        "1",
        "--no-validate",
        "--metrics",
        m.to_str().unwrap(),
    ]);
    assert_ne!(
        a,
        step_losses(&jsonl(&m)),
        "another seed must give another run"
    );
}

#[test]
fn streaming_and_device_resident_feeding_train_identically() {
    let dir = tempfile::tempdir().unwrap();
    let run = |policy: &str, prefetch: &str| {
        let run_dir = dir.path().join(format!("{policy}-{prefetch}"));
        let m = dir.path().join(format!("{policy}-{prefetch}.jsonl"));
        let out = ok(&[
            "train",
            "--device",
            "cpu",
            "--seed",
            "5",
            "--max-steps",
            "25",
            "--log-every",
            "1",
            "--no-validate",
            "--data-on-device",
            policy,
            "--prefetch",
            prefetch,
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--metrics",
            m.to_str().unwrap(),
        ]);
        let summary = json(&run_dir.join("summary.json"));
        (
            step_losses(&jsonl(&m)),
            summary["data_placement"].clone(),
            out,
        )
    };
    let (resident, placed, out) = run("on", "2");
    assert_eq!(placed, "device-resident");
    assert!(out.contains("device-resident"), "{out}");
    assert_eq!(resident.len(), 25);
    for prefetch in ["0", "3"] {
        let (streamed, placed, _) = run("off", prefetch);
        assert_eq!(placed, "streaming");
        assert_eq!(
            resident, streamed,
            "streaming (prefetch {prefetch}) must see the same batches"
        );
    }
    // `auto` on the CPU: the data already lives in the memory the model uses.
    assert_eq!(run("auto", "2").1, "device-resident");
    let err = fails(&["train", "--data-on-device", "sometimes", "--max-steps", "1"]);
    assert!(err.contains("expected `auto`, `on` or `off`"), "{err}");
}

#[test]
fn torch_saved_weights_reproduce_pytorch_logits() {
    // torch_saved_mlp.safetensors was written by safetensors.torch.save_file(model.state_dict()).
    use redline_like::*;
    let logits = mlp_logits(&root().join("testdata/golden/torch_saved_mlp.safetensors"));
    let want = candle_core::safetensors::load(
        root().join("testdata/golden/torch_saved_mlp_logits.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let d = (&logits - &want["logits"])
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(d < 1e-5, "max abs diff {d}");
}

/// The weight-loading path the CLI uses, driven from a test.
mod redline_like {
    use super::*;
    pub fn mlp_logits(weights: &Path) -> candle_core::Tensor {
        let dev = redline_core::Device::cpu();
        let m = redline_models::ModelConfig::by_name("mlp")
            .unwrap()
            .build(&dev, redline_core::Precision::Fp32, 0)
            .unwrap();
        m.params().load_safetensors(weights).unwrap();
        let input = candle_core::safetensors::load(
            root().join("testdata/golden/torch_saved_mlp_logits.safetensors"),
            dev.candle(),
        )
        .unwrap();
        m.forward(&input["input"]).unwrap()
    }
}

#[test]
fn help_has_a_line_per_flag() {
    let help = ok(&["train", "--help"]);
    for flag in [
        "--model",
        "--data",
        "--device",
        "--epochs",
        "--max-steps",
        "--lr-schedule",
        "--early-stop",
        "--checkpoint-every",
        "--keep-last",
        "--val-split",
        "--batch-size",
        "--optimizer",
        "--lr",
        "--seed",
        "--no-shuffle",
        "--prefetch",
        "--data-on-device",
        "--empty-cache",
        "--mean",
        "--std",
        "--log-every",
        "--init",
        "--save",
        "--metrics",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
}

#[test]
fn devices_lists_the_cpu() {
    let out = ok(&["devices"]);
    assert!(out.contains("cpu") && out.contains("GiB"), "{out}");
    // This machine has no NVIDIA driver and CI builds without CUDA: both are said.
    assert!(
        out.contains("GPUs: NVML") || out.contains("NVIDIA driver"),
        "{out}"
    );
    assert!(
        out.contains("CPU build") && out.contains("--features cuda"),
        "{out}"
    );
    let v: serde_json::Value = serde_json::from_str(&ok(&["devices", "--json"])).unwrap();
    assert_eq!(v[0]["id"], "cpu");
    assert_eq!(v[0]["usable"], true);
}

#[test]
fn cuda_graph_flag_is_checked_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train_in(
        &run,
        &["--max-steps", "3", "--no-validate", "--cuda-graph", "off"],
    );
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["cuda_graph"], "off (--cuda-graph off)");
    let err = fails(&[
        "train",
        "--device",
        "cpu",
        "--max-steps",
        "1",
        "--cuda-graph",
        "on",
    ]);
    assert!(
        err.contains("--cuda-graph on: the training step cannot be captured")
            && err.contains("the device is the CPU"),
        "{err}"
    );
    let err = fails(&["train", "--device", "cpu", "--cuda-graph", "sometimes"]);
    assert!(err.contains("choose auto, on or off"), "{err}");
}

#[test]
fn matmul_precision_is_checked_recorded_and_a_no_op_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = train_in(
        &run,
        &[
            "--max-steps",
            "3",
            "--no-validate",
            "--matmul-precision",
            "high",
        ],
    );
    assert!(
        out.contains("--matmul-precision high has no effect on the CPU"),
        "{out}"
    );
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("matmul-precision = \"high\""), "{config}");
    // The CPU's products are fp32 whatever the flag: nothing to record.
    assert!(json(&run.join("summary.json"))
        .get("matmul_precision")
        .is_none());
    let quiet = train_in(
        &dir.path().join("quiet"),
        &["--max-steps", "1", "--no-validate"],
    );
    assert!(!quiet.contains("matmul precision"), "{quiet}");
    let err = fails(&["train", "--device", "cpu", "--matmul-precision", "medium"]);
    assert!(err.contains("medium") && err.contains("highest"), "{err}");
}

#[test]
fn missing_gpu_is_a_clear_error() {
    let err = fails(&["train", "--device", "cuda:3", "--max-steps", "1"]);
    assert!(err.contains("cuda:3") && err.contains("HINT"), "{err}");
    assert!(
        err.contains("built without CUDA") && err.contains("--features cuda"),
        "{err}"
    );
    let err = fails(&["train", "--device", "tpu"]);
    assert!(err.contains("expected `auto`, `cpu` or `cuda:N`"), "{err}");
}

#[test]
fn bad_data_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = fails(&["train", "--data", dir.path().to_str().unwrap()]);
    assert!(
        err.contains("train-images-idx3-ubyte") && err.contains("--data"),
        "{err}"
    );

    // A truncated gzip, then a label file whose count does not match.
    for f in [
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ] {
        std::fs::copy(
            root().join("data/fashion-mnist").join(f),
            dir.path().join(f),
        )
        .unwrap();
    }
    let lbl = dir.path().join("train-labels-idx1-ubyte.gz");
    let bytes = std::fs::read(&lbl).unwrap();
    std::fs::write(&lbl, &bytes[..bytes.len() / 2]).unwrap();
    let err = fails(&[
        "train",
        "--data",
        dir.path().to_str().unwrap(),
        "--max-steps",
        "1",
    ]);
    assert!(
        err.contains("train-labels-idx1-ubyte.gz") && err.contains("gzip"),
        "{err}"
    );

    let mut raw = vec![0u8, 0, 8, 1];
    raw.extend_from_slice(&59_999u32.to_be_bytes());
    raw.extend(std::iter::repeat_n(1u8, 59_999));
    std::fs::remove_file(&lbl).unwrap();
    std::fs::write(dir.path().join("train-labels-idx1-ubyte"), raw).unwrap();
    let err = fails(&[
        "train",
        "--data",
        dir.path().to_str().unwrap(),
        "--max-steps",
        "1",
    ]);
    assert!(err.contains("59999 labels but 60000 images"), "{err}");
}

#[test]
fn mismatched_init_lists_the_offending_names() {
    let init = root().join("testdata/golden/cnn_init.safetensors");
    let err = fails(&[
        "train",
        "--model",
        "mlp",
        "--init",
        init.to_str().unwrap(),
        "--max-steps",
        "1",
    ]);
    assert!(
        err.contains("unexpected conv1.bias")
            && err.contains("fc1.weight: file [128, 3136], model [128, 784]"),
        "{err}"
    );
}

#[test]
fn diverging_loss_stops_with_a_hint_and_leaves_its_run_folder() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("nan");
    let err = fails(&[
        "train",
        "--optimizer",
        "sgd",
        "--lr",
        "1e30",
        "--max-steps",
        "20",
        "--log-every",
        "1",
        "--no-validate",
        "--run-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(
        err.contains("loss became") && err.contains("HINT: lower the learning rate"),
        "{err}"
    );
    // The failed run still says what happened, with its breakdown and report.
    let summary = common::json(&dir.join("summary.json"));
    assert_eq!(summary["status"], "failed");
    assert!(summary["error"].as_str().unwrap().contains("loss became"));
    assert!(dir.join("breakdown.json").exists());
    assert!(dir.join("report.html").exists());
}
