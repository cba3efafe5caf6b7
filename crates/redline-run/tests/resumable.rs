//! The library's resume (issue 47): `examples/resumable.rs` (a step of its
//! own, a run folder, checkpoints) killed with SIGKILL part way and started
//! again with `--resume` ends with the same weights, byte for byte, as the
//! run never stopped, and its folder says it was resumed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The example's binary, which `cargo test` builds beside the tests.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let debug = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = debug.join("examples/resumable");
    assert!(
        bin.is_file(),
        "{} not built (cargo test builds examples)",
        bin.display()
    );
    bin
}

#[test]
fn a_run_of_the_library_killed_with_sigkill_resumes_bit_for_bit() {
    let t = tempfile::tempdir().unwrap();
    let (whole, killed) = (t.path().join("whole"), t.path().join("killed"));
    let out = Command::new(example())
        .arg(&whole)
        .arg("300")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut child = Command::new(example())
        .arg(&killed)
        .arg("300")
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !killed.join("checkpoints/step-00000100").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never checkpointed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !killed.join("final.safetensors").exists(),
        "killed after the end"
    );
    let out = Command::new(example())
        .arg(&killed)
        .arg("300")
        .arg("--resume")
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(so.contains("resuming at step"), "{so}");
    let (a, b) = (
        std::fs::read(whole.join("final.safetensors")).unwrap(),
        std::fs::read(killed.join("final.safetensors")).unwrap(),
    );
    assert!(a == b, "the resumed run's weights differ");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(killed.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["status"], "finished");
    assert_eq!(summary["steps"], 300);
    assert_eq!(summary["segments"][0]["ended"], "killed", "{summary}");
}
