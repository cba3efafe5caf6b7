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
