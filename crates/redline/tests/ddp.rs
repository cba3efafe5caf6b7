//! `--strategy ddp` through the binary under real `mpirun -n 2` jobs:
//! the same losses and weights as one process with the same global batch
//! and as PyTorch's DistributedDataParallel (gloo; `tools/reference/
//! make_golden_ddp.py`), rank 0 alone writing the run folder; a rank killed
//! mid-epoch ends the job quickly with a message naming it; ranks started
//! with different flags are refused by name.
//!
//! Tolerances: the ranks' gradients are averaged by an fp32 all-reduce
//! (each rank's mean over its half of the batch, halved, then summed),
//! where one process takes the mean over the whole batch: the same sum in
//! another order, about 1e-7 relative per step. Losses are compared to
//! 1e-5 relative, weights by the relative L2 of their update (Adam divides
//! by sqrt(v), which amplifies rounding in tiny gradients) to 1e-4, as the
//! one-process goldens are.

#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{golden, golden_job, golden_losses, json, jsonl, rel_l2, root, step_losses, weights};
use redline_testkit::tools::mpirun;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_redline")
}

/// `train --strategy ddp` on the CPU with one thread a rank and no system
/// sampling, then `extra`.
fn ddp_args(extra: &[&str]) -> Vec<String> {
    [
        "train",
        "--strategy",
        "ddp",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--monitor-interval",
        "0",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The golden job (`common::golden_job`) on the CPU with one thread,
/// saving its weights into `dir`; test pass on the test split.
fn golden_args(model: &str, batch: usize, steps: usize, dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--monitor-interval",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(golden_job(model, batch, steps));
    for (flag, path) in [("--run-dir", "run"), ("--save", "w.safetensors")] {
        args.push(flag.into());
        args.push(dir.join(path).to_str().unwrap().into());
    }
    args
}

fn test_record(run: &Path) -> serde_json::Value {
    jsonl(&run.join("metrics.jsonl"))
        .into_iter()
        .find(|r| r["kind"] == "test")
        .unwrap()
}

/// The weight updates (final - init) of `ours` and `theirs` agree to `tol`.
fn same_updates(model: &str, ours: &Path, theirs: &Path, tol: f32) {
    let init = weights(&golden(&format!("{model}_init.safetensors")));
    let (a, b) = (weights(ours), weights(theirs));
    assert_eq!(a.len(), b.len());
    for (name, t) in &a {
        let r = rel_l2(
            &(t - &init[name]).unwrap(),
            &(&b[name] - &init[name]).unwrap(),
        );
        assert!(r < tol, "{model} {name}: update rel L2 {r:e}");
    }
}

fn same_losses(ours: &[f64], theirs: &[f64], tol: f64) {
    assert_eq!(ours.len(), theirs.len(), "{ours:?} vs {theirs:?}");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!((a - b).abs() / b < tol, "step {}: {a} vs {b}", i + 1);
    }
}

/// 2 ranks of `batch` vs one process of `2 x batch` vs PyTorch DDP.
fn two_ranks_match_one_process_and_pytorch(model: &str, batch: usize, steps: usize) {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let single = Command::new(bin())
        .args(golden_args(model, 2 * batch, steps, one.path()))
        .current_dir(root())
        .output()
        .unwrap();
    assert!(single.status.success(), "{}", text(&single));
    let ddp = mpirun(2)
        .arg(bin())
        .args(golden_args(model, batch, steps, two.path()))
        .args(["--strategy", "ddp"])
        .current_dir(root())
        .output()
        .unwrap();
    let t = text(&ddp);
    assert!(ddp.status.success(), "{t}");
    assert!(
        t.contains("strategy: ddp, 2 ranks started by mpirun"),
        "{t}"
    );
    // Rank 0 alone prints (one summary) and writes the folder.
    assert_eq!(t.matches("test accuracy").count(), 1, "{t}");
    let (run1, run2) = (one.path().join("run"), two.path().join("run"));
    let summary = json(&run2.join("summary.json"));
    assert_eq!(summary["world_size"], 2, "{summary}");
    assert_eq!(summary["strategy"], "ddp", "{summary}");
    assert_eq!(
        summary["ranks"].as_array().map(Vec::len),
        Some(2),
        "{summary}"
    );
    let report = std::fs::read_to_string(run2.join("report.html")).unwrap();
    assert!(
        report.contains("<h3>Ranks</h3>")
            && report.contains("The slowest rank is rank")
            && report.contains("data-parallel (ddp): 2 ranks started by mpirun"),
        "the report's per-rank table"
    );

    let ours = step_losses(&run2);
    same_losses(&ours, &step_losses(&run1), 1e-5);
    same_losses(
        &ours,
        &golden_losses(&format!("ddp_{model}_trace.json")),
        1e-5,
    );
    let w = two.path().join("w.safetensors");
    same_updates(model, &w, &one.path().join("w.safetensors"), 1e-4);
    same_updates(
        model,
        &w,
        &golden(&format!("ddp_{model}_final.safetensors")),
        1e-4,
    );
    // The test split is sharded and its sums reduced: every sample once,
    // the same accuracy as one process.
    let (t1, t2) = (test_record(&run1), test_record(&run2));
    assert_eq!(t2["samples"], 10000, "{t2}");
    let (a1, a2) = (
        t1["test_accuracy"].as_f64().unwrap(),
        t2["test_accuracy"].as_f64().unwrap(),
    );
    assert!((a1 - a2).abs() <= 2e-4, "one process {a1}, two ranks {a2}");
}

/// A GPT on a text's random windows: 2 ranks of 8 windows take the same
/// steps as one process of 16 (each rank draws its shard of the same seeded
/// windows): losses to 1e-5, weights to 1e-3 relative L2 (Adam over 20
/// steps amplifies the all-reduce's other summation order), the same
/// validation loss.
#[test]
fn ddp_gpt_on_token_windows_matches_one_process() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("input.txt");
    let words = ["the ", "cat ", "sat ", "on ", "a ", "mat; ", "dog ", "lay "];
    let body: String = (0..3000u64)
        .map(|i| words[((i * 2_654_435_761) >> 7) as usize % words.len()])
        .collect();
    std::fs::write(&data, body).unwrap();
    let model = root().join("examples/models/tiny-gpt.toml");
    let run = |dir: &Path, batch: &str| -> Vec<String> {
        [
            "--data",
            data.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--max-steps",
            "20",
            "--batch-size",
            batch,
            "--log-every",
            "1",
            "--no-checkpoint",
            "--run-dir",
            dir.join("run").to_str().unwrap(),
            "--save",
            dir.join("w.safetensors").to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let (one, two) = (t.path().join("one"), t.path().join("two"));
    let mut single_args = ddp_args(&[]);
    single_args.retain(|a| a != "--strategy" && a != "ddp");
    let single = Command::new(bin())
        .args(single_args)
        .args(run(&one, "16"))
        .current_dir(root())
        .output()
        .unwrap();
    assert!(single.status.success(), "{}", text(&single));
    let ddp = mpirun(2)
        .arg(bin())
        .args(ddp_args(&[]))
        .args(run(&two, "8"))
        .current_dir(root())
        .output()
        .unwrap();
    let out = text(&ddp);
    assert!(ddp.status.success(), "{out}");
    let (r1, r2) = (one.join("run"), two.join("run"));
    same_losses(&step_losses(&r2), &step_losses(&r1), 1e-5);
    let (a, b) = (
        weights(&two.join("w.safetensors")),
        weights(&one.join("w.safetensors")),
    );
    for (name, w) in &a {
        let r = rel_l2(w, &b[name]);
        assert!(r < 1e-3, "{name}: rel L2 {r:e}");
    }
    let v = |r: &Path| json(&r.join("summary.json"))["val_loss"].as_f64().unwrap();
    assert!(
        (v(&r1) - v(&r2)).abs() < 1e-4 * v(&r1),
        "{} vs {}",
        v(&r1),
        v(&r2)
    );
}

#[test]
fn ddp_mlp_matches_one_process_and_pytorch_ddp() {
    two_ranks_match_one_process_and_pytorch("mlp", 32, 20);
}

#[test]
fn ddp_cnn_matches_one_process_and_pytorch_ddp() {
    two_ranks_match_one_process_and_pytorch("cnn", 32, 8);
}

/// The pid of the `redline` process that is rank `rank` of the job whose
/// command line holds `run_dir` (tests run jobs side by side).
fn rank_pid(rank: usize, run_dir: &Path) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        if !cmd.starts_with(bin()) || !cmd.contains(run_dir.to_str()?) {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let want = format!("OMPI_COMM_WORLD_RANK={rank}");
        if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn a_rank_killed_mid_epoch_ends_the_job_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let child = mpirun(2)
        // mpirun's SIGKILL follows its SIGTERM after 1 s by default; a
        // loaded test machine may need longer to write rank 0's folder.
        .env("OMPI_MCA_odls_base_sigkill_timeout", "10")
        .arg(bin())
        .args(ddp_args(&[
            "--epochs",
            "50",
            "--log-every",
            "5",
            "--dist-timeout",
            "10",
            "--run-dir",
            run.to_str().unwrap(),
        ]))
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Training has started once rank 0 logged a step.
    let start = Instant::now();
    let metrics = run.join("metrics.jsonl");
    while !std::fs::read_to_string(&metrics).is_ok_and(|m| m.contains("\"step\"")) {
        assert!(start.elapsed() < Duration::from_secs(120), "no step logged");
        std::thread::sleep(Duration::from_millis(50));
    }
    let victim = rank_pid(1, &run).expect("rank 1 is running");
    let killed = Instant::now();
    Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let took = killed.elapsed();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(took < Duration::from_secs(30), "took {took:?}: {t}");
    assert!(
        t.contains("rank 1") && (t.contains("signal 9") || t.contains("Killed")),
        "the dead rank is named: {t}"
    );
    // Rank 0's run folder ends as failed, naming the rank that is gone.
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["status"], "failed", "{summary}");
    let error = summary["error"].as_str().unwrap();
    assert!(
        error.contains("rank 1 did not answer") && error.contains("gradient all-reduce of step"),
        "{error}"
    );
}

#[test]
fn ranks_started_with_different_flags_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let common = |lr: &str| -> Vec<String> {
        let mut v = vec![bin().to_string()];
        v.extend(ddp_args(&[
            "--max-steps",
            "2",
            "--run-dir",
            run.to_str().unwrap(),
            "--lr",
            lr,
        ]));
        v
    };
    // MPMD: rank 0 and rank 1 run different command lines.
    let mut cmd = mpirun(1);
    cmd.args(common("0.001"))
        .arg(":")
        .args(["-n", "1"])
        .args(common("0.002"))
        .current_dir(root());
    let out = cmd.output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("the ranks were started with different configurations")
            && t.contains("lr: 0.001")
            && t.contains("lr: 0.002"),
        "{t}"
    );
}

/// `--devices 3` as a user would type it on a fresh machine: no Open MPI
/// settings in the environment, and (in CI and containers) as root, with
/// more ranks than this 2-core machine has cores. Before: Open MPI's refusal
/// to run as root, then "the 2 ranks ended with exit status: 1".
#[test]
fn devices_starts_the_ranks_through_mpirun_as_root_too() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut cmd = Command::new(bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OMPI_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args([
            "train",
            "--devices",
            "3",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--monitor-interval",
            "0",
            "--max-steps",
            "4",
            "--no-validate",
            "--run-dir",
            run.to_str().unwrap(),
        ])
        .current_dir(root())
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("starting 3 ranks"), "{t}");
    // SAFETY: geteuid has no preconditions.
    let root_user = unsafe { libc::geteuid() } == 0;
    assert_eq!(
        t.contains("running as root: OMPI_ALLOW_RUN_AS_ROOT=1"),
        root_user,
        "{t}"
    );
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["world_size"], 3, "{summary}");
    assert_eq!(summary["samples"], 4 * 64 * 3, "{summary}");
}

/// SIGTERM to every rank (as `scancel` does) mid-run: all stop after the
/// same step, rank 0 checkpoints; `--resume` with the same ranks ends with
/// weights bit-identical to a run never stopped; other ranks are refused.
#[test]
fn a_stopped_ddp_run_resumes_bit_for_bit_and_only_with_its_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let args = |name: &str| -> Vec<String> {
        ddp_args(&[
            "--max-steps",
            "4000",
            "--epochs",
            "0",
            "--checkpoint-every",
            "300",
            "--log-every",
            "10",
            "--no-validate",
            "--run-dir",
            dir.path().join(name).to_str().unwrap(),
            "--save",
            dir.path()
                .join(format!("{name}.safetensors"))
                .to_str()
                .unwrap(),
        ])
    };
    let whole = mpirun(2)
        .arg(bin())
        .args(args("whole"))
        .current_dir(root())
        .output()
        .unwrap();
    assert!(whole.status.success(), "{}", text(&whole));

    let stopped = dir.path().join("stopped");
    let child = mpirun(2)
        .arg(bin())
        .args(args("stopped"))
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    // Both ranks are training once the first checkpoint (step 300) is there.
    while !stopped.join("checkpoints/step-00000300").exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    for rank in 0..2 {
        let pid = rank_pid(rank, &stopped).expect("the rank runs");
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    // Rank 0's code for SIGTERM; rank 1 ended quietly instead of failing
    // (which has mpirun kill rank 0 while it writes).
    assert_eq!(out.status.code(), Some(143), "{t}");
    assert!(!t.contains("error:"), "{t}");
    let summary = json(&stopped.join("summary.json"));
    assert_eq!(summary["status"], "interrupted", "{summary}\n{t}");
    assert!(t.contains("continue with `redline train --resume"), "{t}");

    // Another number of ranks is refused by name.
    let one = Command::new(bin())
        .args(["train", "--resume", stopped.to_str().unwrap()])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(!one.status.success());
    assert!(
        text(&one).contains("ranks: 2 in the checkpoint, (unset) now"),
        "{}",
        text(&one)
    );

    let resumed = mpirun(2)
        .arg(bin())
        .args([
            "train",
            "--resume",
            stopped.to_str().unwrap(),
            "--save",
            dir.path().join("stopped.safetensors").to_str().unwrap(),
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert!(
        common::same_tensors(
            &dir.path().join("whole.safetensors"),
            &dir.path().join("stopped.safetensors")
        ),
        "the resumed run's weights differ from the uninterrupted run's"
    );
}

#[test]
fn streamed_images_under_ddp_each_rank_decodes_its_own_shard() {
    // 3 classes x 8 training images streamed from disk: two ranks at batch
    // 4 take the same steps as one process at batch 8, and each rank
    // decodes only its own samples (rank 0's workers made about half of
    // what the one process's did).
    let t = tempfile::tempdir().unwrap();
    common::image_folder(t.path(), 8);
    let data = t.path().display().to_string();
    let flags = |batch: &str, run: &Path| -> Vec<String> {
        let mut a = ddp_args(&[
            "--data",
            &data,
            "--stream",
            "on",
            "--workers",
            "1",
            "--image-size",
            "16",
            "--model",
            "cnn",
            "--hidden",
            "8",
            "--epochs",
            "2",
            "--log-every",
            "1",
            "--no-checkpoint",
            "--batch-size",
            batch,
        ]);
        a.extend(["--run-dir".into(), run.display().to_string()]);
        a
    };
    let (one, two) = (t.path().join("one"), t.path().join("two"));
    let mut single = flags("8", &one);
    // One process: the same flags without the strategy.
    single.drain(1..3);
    let out = Command::new(bin())
        .args(&single)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let ddp = mpirun(2)
        .arg(bin())
        .args(flags("4", &two))
        .current_dir(root())
        .output()
        .unwrap();
    assert!(ddp.status.success(), "{}", text(&ddp));
    same_losses(&step_losses(&two), &step_losses(&one), 1e-5);
    let images = |run: &Path| {
        json(&run.join("summary.json"))["data_pipeline"]["images"]
            .as_u64()
            .unwrap()
    };
    let (all, rank0) = (images(&one), images(&two));
    assert!(
        rank0 * 10 <= all * 6 && rank0 * 10 >= all * 4,
        "rank 0 decoded {rank0} images, one process {all}"
    );
}
