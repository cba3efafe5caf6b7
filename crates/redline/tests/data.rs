//! `redline train --data` on the other shipped formats: a regression table, a
//! classification table and an array file, end to end through the binary.

// Tests may panic on unexpected values: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{fails, json};

/// Trains on `data` with `extra` flags into a temporary run folder; returns
/// stdout and the summary.
fn train(data: &str, extra: &[&str]) -> (String, serde_json::Value, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut args = vec!["--data", data];
    args.extend_from_slice(extra);
    let stdout = common::train_in(&run, &args);
    let summary = json(&run.join("summary.json"));
    (stdout, summary, dir)
}

#[test]
fn diabetes_regression_learns_far_past_the_mean_predictor() {
    let (stdout, s, dir) = train(
        "data/tables/diabetes.csv",
        &[
            "--hidden",
            "32",
            "--lr",
            "0.01",
            "--epochs",
            "40",
            "--batch-size",
            "16",
        ],
    );
    assert!(stdout.contains("loss mse"), "{stdout}");
    assert!(stdout.contains("task: regression"), "{stdout}");
    // Predicting the mean gives an MAE of about 64 on this target; a working
    // fit of the standardised features gets well under 50.
    let mae = s["val_mae"].as_f64().unwrap();
    assert!(mae < 50.0, "val_mae {mae}\n{stdout}");
    assert!(s.get("val_accuracy").is_none());
    let csv = std::fs::read_to_string(dir.path().join("run/metrics.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    assert!(
        header.contains("train_mae") && header.contains("val_mae"),
        "{header}"
    );
    // The run's config holds the data flags and re-runs it.
    let config = std::fs::read_to_string(dir.path().join("run/config.toml")).unwrap();
    assert!(config.contains("hidden = \"32\""), "{config}");
}

#[test]
fn wine_classification_with_l1_refused_and_cross_entropy_accurate() {
    let (stdout, s, _dir) = train(
        "data/tables/wine.csv",
        &["--epochs", "30", "--batch-size", "16", "--lr", "0.01"],
    );
    assert!(stdout.contains("3 classes"), "{stdout}");
    let acc = s["val_accuracy"].as_f64().unwrap();
    assert!(acc >= 0.9, "val_accuracy {acc}\n{stdout}");
    let m = fails(&["train", "--data", "data/tables/wine.csv", "--loss", "l1"]);
    assert!(m.contains("the targets are class ids"), "{m}");
}

#[test]
fn digits_npz_trains_the_cnn_sized_from_the_data_and_tests_after_fit() {
    let (stdout, s, _dir) = train(
        "data/tables/digits.npz",
        &[
            "--model",
            "cnn",
            "--epochs",
            "2",
            "--batch-size",
            "32",
            "--hidden",
            "32",
        ],
    );
    assert!(stdout.contains("inputs [1, 8, 8], 10 classes"), "{stdout}");
    assert!(s["test_accuracy"].as_f64().unwrap() > 0.5, "{s}");
}

#[test]
fn data_and_model_mismatches_are_clear_errors() {
    let m = fails(&[
        "train",
        "--data",
        "data/tables/diabetes.csv",
        "--model",
        "cnn",
    ]);
    assert!(m.contains("--model cnn takes images (C, H, W)"), "{m}");
    let m = fails(&[
        "train",
        "--data",
        "data/tables/diabetes.csv",
        "--loss",
        "ce",
    ]);
    assert!(m.contains("--loss ce needs class targets"), "{m}");
    let m = fails(&["train", "--data", "data/tables/wine.csv", "--hidden", "8,0"]);
    assert!(m.contains("--hidden \"8,0\""), "{m}");
    let m = fails(&[
        "train",
        "--data",
        "data/tables/wine.csv",
        "--target",
        "colour",
    ]);
    assert!(
        m.contains("--target colour: no such column; the table's 14 columns are"),
        "{m}"
    );
    let m = fails(&["train", "--data", "Cargo.toml"]);
    assert!(m.contains("unknown data file type"), "{m}");
}

#[test]
fn augmentation_streams_the_training_images_and_still_learns() {
    let (stdout, s, _dir) = train(
        "data/tables/digits.npz",
        &[
            "--augment",
            "flip,crop=1",
            "--epochs",
            "3",
            "--batch-size",
            "32",
        ],
    );
    assert!(stdout.contains("streaming"), "{stdout}");
    assert!(s["test_accuracy"].as_f64().unwrap() > 0.5, "{s}");
    assert_eq!(s["data_placement"], "streaming");
    let m = fails(&[
        "train",
        "--data",
        "data/tables/wine.csv",
        "--augment",
        "flip",
    ]);
    assert!(m.contains("augmentation needs images (C, H, W)"), "{m}");
    let m = fails(&[
        "train",
        "--data",
        "data/tables/digits.npz",
        "--augment",
        "rotate",
    ]);
    assert!(m.contains("expected flip, crop or crop=N"), "{m}");
}
