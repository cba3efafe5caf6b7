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

/// `redline predict` on Fashion-MNIST's test split: 10,000 rows whose
/// argmax accuracy is the run's test accuracy; `.npy` holds the same rows;
/// an `--out` that is a folder, a device or of another kind is refused.
#[test]
fn predictions_are_one_row_a_sample_and_agree_with_test() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let r = run.to_str().unwrap();
    train_in(&run, &["--max-steps", "30"]);
    let acc = json(&run.join("summary.json"))["test_accuracy"]
        .as_f64()
        .unwrap();
    let csv = t.path().join("p.csv");
    let predict =
        |out: &str| redline(&["predict", r, "--data", "data/fashion-mnist", "--out", out]);
    let out = predict(csv.to_str().unwrap());
    assert!(out.status.success(), "{}", text(&out));
    let body = std::fs::read_to_string(&csv).unwrap();
    let mut lines = body.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header.len(), 12, "{header:?}");
    assert_eq!(
        (header[0], header[1], header[11]),
        ("class", "p0", "target")
    );
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|c| c.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 10_000);
    let right = rows.iter().filter(|r| r[0] == r[11]).count();
    assert_eq!(right as f64 / 10_000.0, (acc * 10_000.0).round() / 10_000.0);
    let p_sum: f64 = rows[0][1..11].iter().sum();
    assert!((p_sum - 1.0).abs() < 1e-4, "{p_sum}");
    let npy = t.path().join("p.npy");
    let out = predict(npy.to_str().unwrap());
    assert!(out.status.success(), "{}", text(&out));
    let bytes = std::fs::read(&npy).unwrap();
    let head = String::from_utf8_lossy(&bytes[10..128]);
    assert!(head.contains("'shape': (10000, 12)"), "{head}");
    let header_len = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!(bytes.len(), header_len + 10_000 * 12 * 4);
    let fifo = t.path().join("fifo.csv");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for (bad, want) in [
        (t.path().to_str().unwrap(), "give a .csv"),
        (fifo.to_str().unwrap(), "FIFO"),
        (&*format!("{}/x.txt", t.path().display()), "give a .csv"),
    ] {
        let out = predict(bad);
        let e = text(&out);
        assert!(!out.status.success() && e.contains(want), "{bad}: {e}");
    }
    let dir_csv = t.path().join("d.csv");
    std::fs::create_dir(&dir_csv).unwrap();
    let out = predict(dir_csv.to_str().unwrap());
    assert!(text(&out).contains("is a folder"), "{}", text(&out));
}
