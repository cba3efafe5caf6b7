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
    // Data of another shape than the run's (digits: 8 x 8 images, wine: 13),
    // with both shapes named.
    refused(
        &["test", r, "--data", "data/tables/digits.npz"],
        "its samples are [1, 8, 8], but the run's model takes [13]",
    );
}

/// The wine table with `keep` rows (by label) and `shift` added to each
/// label, written to `dir/name`.
fn wine_with(dir: &std::path::Path, name: &str, keep: &[u32], shift: u32) -> String {
    let text = std::fs::read_to_string(common::root().join("data/tables/wine.csv")).unwrap();
    let mut lines = text.lines().map(|l| l.trim_end_matches('\r'));
    let mut out = vec![lines.next().unwrap().to_string()];
    for l in lines {
        let (x, y) = l.rsplit_once(',').unwrap();
        let y: u32 = y.trim().parse().unwrap();
        if keep.contains(&y) {
            out.push(format!("{x},{}", y + shift));
        }
    }
    let at = dir.join(name);
    std::fs::write(&at, out.join("\n") + "\n").unwrap();
    at.to_str().unwrap().to_string()
}

/// Before: data with fewer classes than the run's head was refused ("do not
/// fit the model": a head built for the data's 2 classes), and more classes
/// named neither number.
#[test]
fn fewer_classes_than_the_head_are_evaluated_and_more_refused_by_number() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let r = run.to_str().unwrap();
    train_in(&run, &["--data", "data/tables/wine.csv", "--epochs", "2"]);
    let two = wine_with(t.path(), "two.csv", &[0, 1], 0);
    let out = redline(&["test", r, "--data", &two]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("| 130 samples |"), "{printed}");
    // Predictions have the head's 3 probabilities.
    let csv = t.path().join("p.csv");
    let out = redline(&["predict", r, "--data", &two, "--out", csv.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let body = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(body.lines().next(), Some("class,p0,p1,p2,target"));
    assert_eq!(body.lines().count(), 131);
    let eight = wine_with(t.path(), "eight.csv", &[0, 1, 2], 5);
    let out = redline(&["test", r, "--data", &eight]);
    let e = text(&out);
    assert!(!out.status.success(), "{e}");
    assert!(
        e.contains("its labels need 8 classes, but the run's head has 3"),
        "{e}"
    );
}

/// `redline test WEIGHTS`: a checkpoint's weights file finds its run
/// folder, and `--save`'s names its run; `--record` appends a line to the
/// run's tests.jsonl (and nothing is written without it); a weights file
/// that names no run, or a gone one, is refused with the fix.
#[test]
fn a_weights_file_finds_its_run_and_record_appends_the_result() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let saved = t.path().join("digits.safetensors");
    let s = saved.to_str().unwrap();
    let flags = [
        "--data",
        "data/tables/digits.npz",
        "--epochs",
        "1",
        "--save",
        s,
    ];
    train_in(&run, &flags);
    let acc = json(&run.join("summary.json"))["test_accuracy"]
        .as_f64()
        .unwrap();
    let want = format!("test accuracy {:.2}%", 100.0 * acc);
    let last = redline_train::checkpoint::list(&run.join("checkpoints"))
        .pop()
        .unwrap()
        .1
        .join("weights.safetensors");
    for weights in [s, last.to_str().unwrap()] {
        let out = redline(&["test", weights]);
        let printed = text(&out);
        assert!(out.status.success() && printed.contains(&want), "{printed}");
        assert!(printed.contains(&format!("weights {weights}")), "{printed}");
    }
    assert!(!run.join("tests.jsonl").exists());
    for _ in 0..2 {
        let out = redline(&["test", s, "--record"]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let lines = common::jsonl(&run.join("tests.jsonl"));
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["test_accuracy"].as_f64(), Some(acc));
    assert_eq!(lines[1]["weights"].as_str(), Some(s));
    let refused = |args: &[&str], want: &str| {
        let out = redline(args);
        let e = text(&out);
        assert!(!out.status.success() && e.contains(want), "{args:?}: {e}");
    };
    refused(
        &["test", s, "--checkpoint", "best"],
        "is a weights file already",
    );
    // A checkpoint's weights copied out of its run name no run.
    let loose = t.path().join("loose.safetensors");
    std::fs::copy(&last, &loose).unwrap();
    refused(&["test", loose.to_str().unwrap()], "does not name its run");
    let summary = run.join("summary.json");
    refused(
        &["test", summary.to_str().unwrap()],
        "neither a run folder nor",
    );
    std::fs::remove_file(run.join("config.toml")).unwrap();
    refused(&["test", s], "which is no longer a run folder");
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
