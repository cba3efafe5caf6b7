//! `--strategy` and `--devices` launches that need no second rank, so they
//! run in every build: a world of one, DataParallel's explanation, a launcher
//! environment this process cannot join, and `--devices` without `mpirun`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;

use common::{fails, json, root, train_in};

#[test]
fn ddp_with_a_world_of_one_runs_as_one_process_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = train_in(
        &run,
        &["--strategy", "ddp", "--max-steps", "3", "--no-validate"],
    );
    assert!(out.contains("strategy: ddp with a world of one"), "{out}");
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["world_size"], 1, "{summary}");
    assert_eq!(summary["strategy"], "single", "{summary}");
    assert_eq!(summary["steps"], 3, "{summary}");
}

#[test]
fn dp_is_not_built_and_says_what_to_use() {
    let err = fails(&["train", "--strategy", "dp", "--max-steps", "1"]);
    assert!(
        err.contains("DataParallel") && err.contains("--strategy ddp") && err.contains("mpirun"),
        "{err}"
    );
    let err = fails(&["train", "--strategy", "fsdp"]);
    assert!(err.contains("give auto, single or ddp"), "{err}");
}

/// A torchrun-style environment of 2 ranks with nobody to join: refused
/// before any data is read (no MPI build: it says how to build one; an MPI
/// build: MPI sees a world of one, and it says how to launch).
#[test]
fn a_launch_this_process_cannot_join_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(["train", "--device", "cpu", "--max-steps", "1"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("HINT:") && err.contains('2'), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("loading"));
    // --strategy single under a launcher of 2 is refused by name too.
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(["train", "--strategy", "single", "--max-steps", "1"])
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--strategy single, but torchrun-style environment started 2 ranks"),
        "{err}"
    );
}

#[test]
fn devices_without_mpirun_on_path_is_a_clear_error() {
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(["train", "--devices", "2", "--max-steps", "1"])
        .env("PATH", empty.path())
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--devices 2 starts the ranks with `mpirun`, which is not on PATH")
            && err.contains("apt-get install openmpi-bin"),
        "{err}"
    );
    let err = fails(&["train", "--devices", "0"]);
    assert!(err.contains("--devices 0"), "{err}");
}

#[test]
fn bad_dist_timeouts_are_refused_before_anything_runs() {
    for bad in ["0", "-1", "nan", "inf", "1e300"] {
        let flag = format!("--dist-timeout={bad}");
        let err = fails(&["train", &flag, "--max-steps", "1"]);
        assert!(err.contains("--dist-timeout"), "{bad}: {err}");
    }
}
