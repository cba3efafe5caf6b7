//! `redline train --model FILE.toml`: models described as layers, trained
//! from the CLI with no Rust, recorded in the run folder and re-run from it.

// Tests may panic on unexpected values: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{fails, json, root};

fn train(extra: &[&str], run: &std::path::Path) -> String {
    common::train_in(run, extra)
}

#[test]
fn a_residual_mlp_file_trains_a_regression_and_reruns_from_its_run_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (run, rerun) = (dir.path().join("run"), dir.path().join("rerun"));
    let model = root().join("examples/models/residual-mlp.toml");
    let save = dir.path().join("w.safetensors");
    let flags = [
        "--data",
        "data/tables/diabetes.csv",
        "--model",
        model.to_str().unwrap(),
        "--lr",
        "0.01",
        "--epochs",
        "30",
        "--batch-size",
        "16",
        "--save",
        save.to_str().unwrap(),
    ];
    let stdout = train(&flags, &run);
    assert!(stdout.contains("residual-mlp"), "{stdout}");
    // Predicting the mean gives an MAE of about 64 on this target.
    let mae = json(&run.join("summary.json"))["val_mae"].as_f64().unwrap();
    assert!(mae < 60.0, "val_mae {mae}\n{stdout}");
    // nn.Sequential names, the residual body under `<i>.body.<j>`.
    let saved = candle_core::safetensors::load(&save, &candle_core::Device::Cpu).unwrap();
    assert!(saved.contains_key("0.weight") && saved.contains_key("2.body.1.weight"));
    // The file is copied into the run folder and the config names the copy.
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let copy = run.join("model.toml");
    assert!(copy.is_file() && config.contains("model.toml"), "{config}");
    let config_path = run.join("config.toml");
    train(&["--config", config_path.to_str().unwrap()], &rerun);
    let again = json(&rerun.join("summary.json"))["val_mae"]
        .as_f64()
        .unwrap();
    assert_eq!(
        again, mae,
        "the same flags, seed and model file give the same run"
    );
}

#[test]
fn model_file_mistakes_are_refused_with_the_layer_and_a_fix() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[model]\nlayers = [{ type = \"linear\", out = 8 }]\n").unwrap();
    let m = fails(&["train", "--model", bad.to_str().unwrap(), "--device", "cpu"]);
    assert!(
        m.contains("layer 0 (linear)") && m.contains("flatten"),
        "{m}"
    );
    let model = root().join("examples/models/small-cnn.toml");
    let m = fails(&[
        "train",
        "--model",
        model.to_str().unwrap(),
        "--hidden",
        "32",
        "--device",
        "cpu",
    ]);
    assert!(m.contains("model file"), "{m}");
    let m = fails(&[
        "train",
        "--model",
        model.to_str().unwrap(),
        "--data",
        "data/tables/wine.csv",
        "--device",
        "cpu",
    ]);
    assert!(m.contains("conv2d takes images"), "{m}");
}

/// `--model resnet18` from the zoo trains from the command line on any
/// image size (the digits' 1 x 8 x 8; torchvision's stem and strides bring
/// it down to 1 x 1), and its run folder records it.
#[test]
fn the_zoo_resnet18_trains_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = train(
        &[
            "--model",
            "resnet18",
            "--data",
            "data/tables/digits.npz",
            "--max-steps",
            "1",
            "--batch-size",
            "16",
        ],
        &run,
    );
    assert!(out.contains("redline: resnet18 ("), "{out}");
    let summary = common::json(&run.join("summary.json"));
    assert_eq!(summary["model"], "resnet18", "{summary}");
    assert_eq!(summary["steps"], 1, "{summary}");
    assert!(
        summary["test_loss"].as_f64().is_some_and(f64::is_finite),
        "{summary}"
    );
}
