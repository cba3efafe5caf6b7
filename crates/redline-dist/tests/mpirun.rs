//! Real `mpirun` jobs of the `collectives` example: every collective gives
//! the right values on 2 and 3 ranks; a rank that hangs is named by the
//! others' timeout within its bound; a rank that dies ends the job.

#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use redline_testkit::tools::mpirun;

/// The example binary `cargo test` built beside this test.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let p = dir.join("examples/collectives");
    assert!(p.exists(), "{} not built", p.display());
    p
}

fn run(ranks: usize, timeout_s: f64, extra: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = mpirun(ranks)
        .env("TIMEOUT_S", timeout_s.to_string())
        .arg(example())
        .args(extra)
        .output()
        .unwrap();
    (out, start.elapsed())
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn every_collective_is_right_on_two_and_three_ranks() {
    for n in [2, 3] {
        let (out, _) = run(n, 30.0, &[]);
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        for r in 0..n {
            assert!(t.contains(&format!("rank {r}/{n} ok (mpi)")), "{t}");
        }
    }
}

#[test]
fn a_hung_rank_is_named_by_the_others_within_the_timeout() {
    let (out, took) = run(3, 3.0, &["hang", "1"]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    for r in [0, 2] {
        assert!(
            t.contains(&format!(
                "rank {r}: the last all-reduce (step 7) did not complete within 3 s: \
                 rank 1 did not answer"
            )),
            "{t}"
        );
    }
    assert!(
        t.contains("the last operation every rank completed was barrier"),
        "{t}"
    );
    // The timeout, the roll call's wait and mpirun's teardown.
    assert!(took < Duration::from_secs(30), "took {took:?}: {t}");
}

#[test]
fn a_rank_that_dies_ends_the_job() {
    let (out, took) = run(2, 60.0, &["die", "1"]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(!t.contains("rank 0/2 ok"), "{t}");
    assert!(took < Duration::from_secs(30), "took {took:?}: {t}");
}
