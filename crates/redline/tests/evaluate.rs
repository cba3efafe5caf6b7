//! `redline test RUN_DIR` (issue 47): a finished run evaluated again from
//! its folder gives the test loss and accuracy its `summary.json` recorded;
//! bad checkpoints, folders and data are refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Output;

use common::{json, redline, train_in};

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Trains `flags` into a run folder, then tests it: the same numbers.
fn same_as_the_summary(flags: &[&str]) {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let r = run.to_str().unwrap();
    train_in(&run, flags);
    let summary = json(&run.join("summary.json"));
    let out = redline(&["test", r]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    let loss = summary["test_loss"].as_f64().unwrap();
    let acc = summary["test_accuracy"].as_f64().unwrap();
    assert!(
        printed.contains(&format!(
            "test loss {loss:.4} | test accuracy {:.2}%",
            100.0 * acc
        )),
        "{flags:?}: summary {loss} {acc}\n{printed}"
    );
    assert!(!run.join("test").exists() && json(&run.join("summary.json")) == summary);
}

#[test]
fn a_runs_test_accuracy_is_given_again_from_its_folder() {
    same_as_the_summary(&["--max-steps", "30"]);
    same_as_the_summary(&[
        "--model",
        "cnn",
        "--data",
        "data/tables/digits.npz",
        "--epochs",
        "1",
    ]);
}

#[test]
fn bad_checkpoints_folders_and_data_are_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let r = run.to_str().unwrap();
    let wine = ["--data", "data/tables/wine.csv", "--epochs", "1"];
    let out = redline(&[&["train", "--device", "cpu", "--run-dir", r][..], &wine[..]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let refused = |args: &[&str], want: &str| {
        let out = redline(args);
        let e = text(&out);
        assert!(
            !out.status.success() && e.contains(want) && !e.contains("panicked"),
            "{args:?}: {e}"
        );
    };
    refused(
        &["test", r, "--checkpoint", "/no/such"],
        "no such checkpoint folder",
    );
    refused(&["test", t.path().to_str().unwrap()], "not a run folder");
    // Weights of another model: the CNN's on the wine MLP.
    let other = t.path().join("other");
    let o = other.to_str().unwrap();
    let cnn = [
        "--model",
        "cnn",
        "--data",
        "data/tables/digits.npz",
        "--max-steps",
        "1",
    ];
    let saved = t.path().join("cnn.safetensors");
    let s = saved.to_str().unwrap();
    let out = redline(
        &[
            &["train", "--device", "cpu", "--run-dir", o, "--save", s][..],
            &cnn,
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", text(&out));
    refused(&["test", r, "--checkpoint", s], "do not fit the model");
    // Data of another shape than the run's (digits: 64 features, wine: 13).
    refused(
        &["test", r, "--data", "data/tables/digits.npz"],
        "do not fit the model",
    );
}
