//! Values nobody bounded and outputs that cannot be written: refused before
//! any training and before the run folder exists, with the flag named.

// Tests may panic on unexpected values: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::fails;

/// `redline train` with `extra`, expected to fail; the run folder must not exist.
fn refused(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut args = vec![
        "train",
        "--device",
        "cpu",
        "--run-dir",
        run.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let m = fails(&args);
    assert!(!run.exists(), "{extra:?} left a run folder");
    m
}

#[test]
fn unbounded_numbers_are_refused_not_panicked_on() {
    let m = refused(&["--prefetch", "1000000000"]);
    assert!(m.contains("--prefetch 1000000000: at most 64"), "{m}");
    let m = refused(&["--monitor-interval", "1e300"]);
    assert!(m.contains("--monitor-interval 1e300"), "{m}");
    let m = fails(&["monitor", "--interval", "1e300", "--count", "2"]);
    assert!(m.contains("--interval 1e300: give seconds"), "{m}");
    assert!(!m.contains("panicked"), "{m}");
}

#[test]
fn a_save_target_that_cannot_be_written_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("a-folder");
    std::fs::create_dir(&folder).unwrap();
    let m = refused(&["--save", folder.to_str().unwrap()]);
    assert!(m.contains("--save") && m.contains("is a folder"), "{m}");
    // A read-only folder (root ignores permissions, so only check as a user).
    let ro = dir.path().join("read-only");
    std::fs::create_dir(&ro).unwrap();
    let mut perm = std::fs::metadata(&ro).unwrap().permissions();
    perm.set_readonly(true);
    std::fs::set_permissions(&ro, perm).unwrap();
    if std::fs::write(ro.join("x"), b"").is_err() {
        let target = ro.join("w.safetensors");
        let m = refused(&["--metrics", target.to_str().unwrap()]);
        assert!(
            m.contains("--metrics") && m.contains("cannot write there"),
            "{m}"
        );
    }
    let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(entries.len(), 2, "no probe files left behind");
}

#[test]
fn a_config_with_negative_values_reruns_from_another_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (run, rerun) = (dir.path().join("run"), dir.path().join("rerun"));
    common::train_in(
        &run,
        &[
            "--data",
            "data/tables/wine.csv",
            "--mean",
            "-0.5",
            "--epochs",
            "2",
        ],
    );
    let config = run.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("mean = -0.5"), "{text}");
    // Re-run from a folder that is not the repository: the data path is absolute.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(["train", "--config", config.to_str().unwrap(), "--run-dir"])
        .arg(&rerun)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = common::json(&run.join("summary.json"));
    let b = common::json(&rerun.join("summary.json"));
    assert_eq!(a["val_loss"], b["val_loss"], "the same run again");
}

#[test]
fn a_bad_value_in_a_config_file_names_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(&config, "epochs = 1\nlr = \"fast\"\n").unwrap();
    let m = fails(&["train", "--config", config.to_str().unwrap()]);
    assert!(
        m.contains("--config") && m.contains("c.toml") && m.contains("the key `lr`"),
        "{m}"
    );
    std::fs::write(&config, "epochs = 1\nlearning-rate = 0.1\n").unwrap();
    let m = fails(&["train", "--config", config.to_str().unwrap()]);
    assert!(m.contains("`learning-rate` is not a setting"), "{m}");
}

#[test]
fn optimizer_flags_that_cannot_work_are_refused_before_the_run_folder() {
    for (flags, says) in [
        (
            &["--weight-decay", "-0.1"][..],
            "--weight-decay -0.1: must be",
        ),
        (&["--lr=-0.01"][..], "--lr -0.01: must be"),
        (
            &["--momentum", "0.9"][..],
            "--momentum applies to --optimizer sgd only",
        ),
        (&["--beta1", "1"][..], "must be in [0, 1)"),
        (
            &["--optimizer", "sgd", "--nesterov"][..],
            "--nesterov needs --momentum > 0",
        ),
    ] {
        let m = refused(flags);
        assert!(m.contains(says), "{flags:?}: {m}");
    }
}

#[test]
fn sigterm_finishes_the_step_writes_everything_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("runs/one");
    let save = dir.path().join("w.safetensors");
    std::fs::write(&save, "earlier").unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_redline"))
        .args([
            "train",
            "--epochs",
            "50",
            "--device",
            "cpu",
            "--monitor-interval",
            "0",
        ])
        .arg("--save")
        .arg(&save)
        .arg("--run-dir")
        .arg(&run)
        .current_dir(common::root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until training has logged a step, then ask it to stop.
    let metrics = run.join("metrics.jsonl");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&metrics).is_ok_and(|t| t.contains("\"kind\":\"step\"")) {
        assert!(started.elapsed().as_secs() < 120, "no step logged");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let pid = child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("interrupted by SIGTERM"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&save).unwrap(), "earlier");
    let summary = common::json(&run.join("summary.json"));
    assert_eq!(summary["status"], "interrupted", "{summary}");
    assert!(run.join("report.html").is_file());
    let listing = common::ok(&["runs", dir.path().join("runs").to_str().unwrap()]);
    assert!(listing.contains("interrupted"), "{listing}");
}

#[test]
fn sizes_beyond_the_data_or_the_machine_are_clamped_or_refused_with_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let wine = common::root().join("data/tables/wine.csv");
    let run = dir.path().join("run");
    // A batch larger than the data is the whole data, and says so.
    let out = common::train_in(
        &run,
        &[
            "--data",
            wine.to_str().unwrap(),
            "--epochs",
            "1",
            "--batch-size",
            "100000",
        ],
    );
    assert!(
        out.contains("--batch-size 100000 is more than the 160 training samples"),
        "{out}"
    );
    let summary = common::json(&run.join("summary.json"));
    assert_eq!(summary["batch_size"], 160, "{summary}");
    // A width that would not fit any memory is refused before allocating.
    let m = refused(&["--data", wine.to_str().unwrap(), "--hidden", "100000000000"]);
    assert!(m.contains("GiB to train") && m.contains("--hidden"), "{m}");
    assert!(!m.contains("panicked"), "{m}");
    let m = refused(&["--threads", "100000000"]);
    assert!(m.contains("--threads 100000000: at most 1024"), "{m}");
}
