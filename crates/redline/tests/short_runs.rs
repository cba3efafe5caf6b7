//! Short runs through the binary, as Lightning's: `--fast-dev-run`,
//! `--limit-{train,val,test}-batches` and `--overfit-batches`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{fails, json, jsonl, ok, train_in};

const DIGITS: &str = "data/tables/digits.npz";

#[test]
fn a_fast_dev_run_runs_one_batch_of_each_and_keeps_nothing_but_a_marked_folder() {
    let t = tempfile::tempdir().unwrap();
    let (run, save) = (t.path().join("run"), t.path().join("w.safetensors"));
    let out = train_in(
        &run,
        &[
            "--fast-dev-run",
            "--epochs",
            "5",
            "--eval-batch-size",
            "100",
            "--save",
            save.to_str().unwrap(),
        ],
    );
    assert!(out.contains("fast dev run: 1 batch"), "{out}");
    assert!(!save.exists(), "--save is not written by a dev run");
    assert!(!run.join("checkpoints").exists(), "no checkpoints");
    let s = json(&run.join("summary.json"));
    assert_eq!(
        (s["steps"].as_u64(), s["epochs"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(s["fast_dev_run"], 1, "{s}");
    let recs = jsonl(&run.join("metrics.jsonl"));
    let test = recs.iter().find(|r| r["kind"] == "test").unwrap();
    assert_eq!(test["samples"], 100, "one test batch: {test}");
    let listing = ok(&["runs", t.path().to_str().unwrap()]);
    assert!(listing.contains("finished (dev run)"), "{listing}");
    // N batches of each.
    let run3 = t.path().join("run3");
    train_in(&run3, &["--fast-dev-run", "3", "--data", DIGITS]);
    assert_eq!(json(&run3.join("summary.json"))["steps"], 3);
}

#[test]
fn limits_cut_each_epoch_and_zero_skips_a_pass() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    train_in(
        &run,
        &[
            "--data",
            DIGITS,
            "--epochs",
            "2",
            "--batch-size",
            "32",
            "--limit-train-batches",
            "5",
            "--eval-batch-size",
            "10",
            "--limit-val-batches",
            "0.5",
            "--limit-test-batches",
            "0",
        ],
    );
    let s = json(&run.join("summary.json"));
    assert_eq!(s["steps"], 10, "{s}");
    assert_eq!(s["samples"], 320, "{s}");
    assert!(s["test_loss"].is_null(), "no test pass: {s}");
    let recs = jsonl(&run.join("metrics.jsonl"));
    // 150 validation samples in batches of 10: half of the 15 batches.
    let epochs: Vec<_> = recs.iter().filter(|r| r["kind"] == "epoch").collect();
    assert_eq!(epochs.len(), 2);
    assert!(
        epochs.iter().all(|e| e["val_loss"].is_number()),
        "{epochs:?}"
    );
    assert!(recs.iter().all(|r| r["kind"] != "test"));
}

#[test]
fn overfitting_two_batches_drives_their_loss_down() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    train_in(
        &run,
        &[
            "--data",
            DIGITS,
            "--epochs",
            "40",
            "--batch-size",
            "16",
            "--lr",
            "0.01",
            "--overfit-batches",
            "2",
            "--no-checkpoint",
        ],
    );
    let recs = jsonl(&run.join("metrics.jsonl"));
    let losses: Vec<f64> = recs
        .iter()
        .filter(|r| r["kind"] == "epoch")
        .map(|r| r["train_loss"].as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 40);
    assert_eq!(json(&run.join("summary.json"))["steps"], 80);
    // The same 32 samples every epoch: a working model memorises them.
    assert!(losses[39] < 0.05 * losses[0], "{losses:?}");
}

#[test]
fn conflicting_or_bad_limits_are_refused_before_any_data_is_read() {
    for (args, want) in [
        (
            vec!["--fast-dev-run", "--limit-train-batches", "3"],
            "cannot be given with it",
        ),
        (vec!["--limit-train-batches", "1.5"], "at most 1"),
        (
            vec!["--limit-val-batches", "lots"],
            "not a number of batches",
        ),
        (vec!["--limit-train-batches", "0"], "no training at all"),
        (
            vec!["--overfit-batches", "2", "--limit-val-batches", "1"],
            "sets the training and validation limits itself",
        ),
        (vec!["--fast-dev-run", "0"], "at least 1"),
        (
            vec!["--data", DIGITS, "--limit-train-batches", "0.001"],
            "keeps none",
        ),
    ] {
        let mut a = vec!["train", "--device", "cpu"];
        a.extend(&args);
        let e = fails(&a);
        assert!(e.contains(want), "{args:?}: {e}");
    }
}
