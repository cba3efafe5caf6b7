//! `redline train --resume` through the binary: a run killed with SIGKILL
//! at a random step and resumed ends with the same weights, bit for bit,
//! and the same logged losses as the run never stopped; damaged, foreign
//! and live runs are refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{json, jsonl, root};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_redline"));
    c.current_dir(root());
    c
}

/// The flags of every run of a case, into the run folder `dir`, saving the
/// final weights to `save`.
fn args(dir: &Path, save: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "train",
        "--device",
        "cpu",
        "--monitor-interval",
        "0",
        "--log-every",
        "1",
        "--run-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(dir.display().to_string());
    a.push("--save".into());
    a.push(save.display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{cmd:?} failed\n{so}\n{se}");
    so
}

/// The largest step logged so far in `dir/metrics.jsonl`.
fn logged_step(dir: &Path) -> usize {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["step"].as_u64())
        .unwrap_or(0) as usize
}

fn has_checkpoint(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("checkpoints"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("step-"))
}

/// Kills `child` with SIGKILL once it has logged step `at` and written a
/// checkpoint; the step it had reached.
fn kill_at(mut child: Child, dir: &Path, at: usize) -> usize {
    let start = Instant::now();
    loop {
        let step = logged_step(dir);
        if step >= at && has_checkpoint(dir) {
            child.kill().unwrap();
            child.wait().unwrap();
            return step;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before step {at}");
        }
        assert!(start.elapsed() < Duration::from_secs(120), "no step {at}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `(step, loss bits, lr bits, loss scale bits)` of the step records and
/// `(epoch, train loss, val loss)` of the epoch records.
type Logged = (Vec<(u64, u64, u64, u64)>, Vec<(u64, String, String)>);

fn logged(dir: &Path) -> Logged {
    let recs = jsonl(&dir.join("metrics.jsonl"));
    let bits = |v: &serde_json::Value| v.as_f64().map_or(0, f64::to_bits);
    let steps = recs
        .iter()
        .filter(|r| r["kind"] == "step")
        .map(|r| {
            (
                r["step"].as_u64().unwrap(),
                bits(&r["loss"]),
                bits(&r["lr"]),
                bits(&r["loss_scale"]),
            )
        })
        .collect();
    let epochs = recs
        .iter()
        .filter(|r| r["kind"] == "epoch")
        .map(|r| {
            (
                r["epoch"].as_u64().unwrap(),
                r["train_loss"].to_string(),
                r["val_loss"].to_string(),
            )
        })
        .collect();
    (steps, epochs)
}

/// A tiny deterministic stream for the kill points (printed on failure).
fn draw(seed: u64, lo: usize, hi: usize) -> usize {
    let x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    lo + ((x >> 33) as usize) % (hi - lo)
}

/// Runs the case whole, then killed at a random step and resumed; both
/// must end with the same weights and the same records.
fn killed_and_resumed(extra: &[&str], seed: u64, steps: (usize, usize)) {
    let t = tempfile::tempdir().unwrap();
    let seed_s = seed.to_string();
    let mut flags = extra.to_vec();
    flags.extend(["--seed", &seed_s]);
    let (whole, cut) = (t.path().join("whole"), t.path().join("cut"));
    let (whole_st, cut_st) = (t.path().join("whole.st"), t.path().join("cut.st"));
    run_ok(bin().args(args(&whole, &whole_st, &flags)));
    let at = draw(seed, steps.0, steps.1);
    let child = bin()
        .args(args(&cut, &cut_st, &flags))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let reached = kill_at(child, &cut, at);
    assert!(!cut.join("summary.json").exists(), "SIGKILL writes nothing");
    let out = run_ok(bin().args(["train", "--resume", cut.to_str().unwrap()]));
    let case = format!("{extra:?} seed {seed}: killed at step {reached} (drawn {at})\n{out}");
    assert!(out.contains("resuming"), "{case}");
    assert!(
        common::same_tensors(&whole_st, &cut_st),
        "final weights differ: {case}"
    );
    let (w, c) = (logged(&whole), logged(&cut));
    assert_eq!(w.0, c.0, "step records: {case}");
    assert_eq!(w.1, c.1, "epoch records: {case}");
    let s = json(&cut.join("summary.json"));
    assert_eq!(s["status"], "finished", "{case}");
    assert_eq!(s["resumed"].as_array().map(Vec::len), Some(1), "{s}");
    assert_eq!(
        s["test_loss"],
        json(&whole.join("summary.json"))["test_loss"],
        "{case}"
    );
    let csv = std::fs::read_to_string(cut.join("metrics.csv")).unwrap();
    let csv_whole = std::fs::read_to_string(whole.join("metrics.csv")).unwrap();
    assert_eq!(
        csv.lines().count(),
        csv_whole.lines().count(),
        "metrics.csv rows: {case}"
    );
}

#[test]
fn an_mlp_killed_at_random_steps_resumes_bit_for_bit() {
    // Fashion-MNIST, 2 epochs of 844 steps; checkpoints every 100 steps and
    // at the epoch end, so kills land mid-epoch and after an epoch's end.
    for seed in [1, 2, 3] {
        killed_and_resumed(
            &[
                "--threads",
                "1",
                "--epochs",
                "2",
                "--checkpoint-every",
                "100",
            ],
            seed,
            (120, 1650),
        );
    }
}

#[test]
fn a_16_mixed_run_resumes_with_its_loss_scale() {
    // Made to overflow (2^24 backs off to about 2^19, then grows every 3
    // clean steps and overflows again): the scale, its run of clean steps
    // and the skipped count change all along, so a resume that lost them
    // would skip other steps and log other scales.
    for seed in [1, 2] {
        killed_and_resumed(
            &[
                "--threads",
                "1",
                "--max-steps",
                "300",
                "--checkpoint-every",
                "40",
                "--precision",
                "16-mixed",
                "--loss-scale",
                "dynamic:init=16777216:interval=3",
            ],
            seed,
            (50, 280),
        );
    }
}

#[test]
fn a_bf16_true_run_resumes_bit_for_bit() {
    // bf16 weights and bf16 Adam moments: the checkpoint widens them to
    // f32 and the resume narrows them back, exactly; a lossy round trip
    // or a state restored in another dtype would change the weights.
    killed_and_resumed(
        &[
            "--threads",
            "1",
            "--max-steps",
            "200",
            "--checkpoint-every",
            "30",
            "--precision",
            "bf16-true",
        ],
        3,
        (40, 190),
    );
}

#[test]
fn a_cnn_killed_at_random_steps_resumes_bit_for_bit() {
    // The zoo's CNN on the 8x8 digits: 43 steps an epoch, 4 epochs.
    for seed in [4, 5] {
        killed_and_resumed(
            &[
                "--model",
                "cnn",
                "--data",
                "data/tables/digits.npz",
                "--hidden",
                "32",
                "--batch-size",
                "32",
                "--threads",
                "2",
                "--epochs",
                "4",
                "--checkpoint-every",
                "7",
                "--augment",
                "flip",
            ],
            seed,
            (10, 160),
        );
    }
}

#[test]
fn shards_through_a_shuffle_buffer_resume_bit_for_bit() {
    // WebDataset's order (shards shuffled, a buffer of 5) over 4 shards,
    // decoded on 2 workers: 3 epochs of 5 steps, a checkpoint every 2.
    let t = tempfile::tempdir().unwrap();
    common::image_folder(t.path(), 12);
    let out = t.path().join("shards");
    common::shards(t.path(), &out, 9);
    let data = out.to_str().unwrap();
    killed_and_resumed(
        &[
            "--model",
            "cnn",
            "--data",
            data,
            "--hidden",
            "16",
            "--image-size",
            "16",
            "--batch-size",
            "7",
            "--threads",
            "1",
            "--workers",
            "2",
            "--stream",
            "on",
            "--shuffle-buffer",
            "5",
            "--epochs",
            "3",
            "--checkpoint-every",
            "2",
        ],
        8,
        (3, 14),
    );
}

#[test]
fn a_streamed_image_folder_with_random_crops_resumes_bit_for_bit() {
    // Random-resized crops decoded on 2 workers every epoch: 3 epochs of 5
    // steps, a checkpoint every 2 steps; the crops after the resume must be
    // the ones the whole run drew.
    let t = tempfile::tempdir().unwrap();
    common::image_folder(t.path(), 12);
    let data = t.path().to_str().unwrap();
    for seed in [6, 7] {
        killed_and_resumed(
            &[
                "--model",
                "cnn",
                "--data",
                data,
                "--hidden",
                "16",
                "--batch-size",
                "7",
                "--threads",
                "1",
                "--workers",
                "2",
                "--epochs",
                "3",
                "--checkpoint-every",
                "2",
                "--augment",
                "random-resized-crop=16,hflip",
            ],
            seed,
            (3, 13),
        );
    }
}

#[test]
fn a_gpt_on_a_texts_random_windows_resumes_bit_for_bit() {
    // Token windows at seeded random offsets: 3 epochs of 6 steps of a
    // 2-layer GPT on a text's bytes, a checkpoint every 2 steps; the windows
    // after the resume must be the ones the whole run drew.
    let t = tempfile::tempdir().unwrap();
    let text = t.path().join("input.txt");
    let words = ["the ", "cat ", "sat ", "on ", "a ", "mat; ", "dog ", "lay "];
    let body: String = (0..900u64)
        .map(|i| words[((i * 2_654_435_761) >> 7) as usize % words.len()])
        .collect();
    std::fs::write(&text, body).unwrap();
    // The second with dropout (its mask streams are checkpointed) and no
    // biases.
    let dropped = t.path().join("dropout-gpt.toml");
    std::fs::write(
        &dropped,
        "[model]\nkind = \"gpt\"\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 32\n\
         dropout = 0.2\nbias = false\n",
    )
    .unwrap();
    let tiny = root().join("examples/models/tiny-gpt.toml");
    for (seed, model) in [(4, tiny), (5, dropped)] {
        killed_and_resumed(
            &[
                "--model",
                model.to_str().unwrap(),
                "--data",
                text.to_str().unwrap(),
                "--batch-size",
                "16",
                "--threads",
                "1",
                "--epochs",
                "3",
                "--checkpoint-every",
                "2",
            ],
            seed,
            (3, 16),
        );
    }
}

/// A stopped (SIGTERM) run folder of the MLP on the digits, and its flags.
fn stopped_run(t: &Path) -> (PathBuf, Vec<String>) {
    let dir = t.join("run");
    let flags = args(
        &dir,
        &t.join("w.st"),
        &[
            "--data",
            "data/tables/digits.npz",
            "--threads",
            "1",
            "--epochs",
            "3",
            "--checkpoint-every",
            "5",
            "--max-steps",
            "40",
        ],
    );
    run_ok(bin().args(&flags));
    (dir, flags)
}

#[test]
fn a_damaged_newest_checkpoint_is_refused_by_name_and_set_aside() {
    let t = tempfile::tempdir().unwrap();
    let (dir, _) = stopped_run(t.path());
    let newest = dir.join("checkpoints/step-00000040");
    let weights = newest.join("weights.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    // More steps than the run had: it goes on from the older checkpoint.
    let out = run_ok(bin().args([
        "train",
        "--resume",
        dir.to_str().unwrap(),
        "--max-steps",
        "50",
    ]));
    assert!(
        out.contains("checkpoint refused")
            && out.contains("step-00000040/weights.safetensors")
            && out.contains("truncated"),
        "{out}"
    );
    assert!(out.contains("step 35"), "{out}");
    assert!(
        dir.join("checkpoints/refused-step-00000040").is_dir(),
        "the damaged checkpoint is kept aside"
    );
    let s = json(&dir.join("summary.json"));
    assert_eq!(s["steps"], 50, "{s}");
    // The config now says 50 steps: resuming again has nothing left to do
    // but the test pass, and says where it resumed.
    let again = run_ok(bin().args(["train", "--resume", dir.to_str().unwrap()]));
    assert!(again.contains("step 50"), "{again}");
}

#[test]
fn a_changed_flag_or_a_missing_run_is_refused_with_what_differs() {
    let t = tempfile::tempdir().unwrap();
    let (dir, _) = stopped_run(t.path());
    let d = dir.to_str().unwrap();
    let out = bin()
        .args(["train", "--resume", d, "--lr", "0.01"])
        .output()
        .unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        se.contains("written by a different run")
            && se.contains("lr: 0.001 in the checkpoint, 0.01 now"),
        "{se}"
    );
    for (args, want) in [
        (vec!["--resume", "/no/such/run"], "no such run folder"),
        (vec!["--resume", d, "--run-dir", "x"], "cannot be used with"),
    ] {
        let mut a = vec!["train"];
        a.extend(args);
        let out = bin().args(&a).output().unwrap();
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && se.contains(want), "{a:?}: {se}");
    }
    // A run whose process is alive is not taken over.
    std::fs::write(dir.join("pid"), "1").unwrap();
    let out = bin().args(["train", "--resume", d]).output().unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(se.contains("still running (pid 1)"), "{se}");
}

#[test]
fn sigterm_names_the_resume_command_and_last_finds_the_run() {
    let t = tempfile::tempdir().unwrap();
    // From a folder of its own, so `runs/` and `last` are this test's.
    let child = Command::new(env!("CARGO_BIN_EXE_redline"))
        .current_dir(t.path())
        .args([
            "train",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--monitor-interval",
            "0",
            "--epochs",
            "2",
            "--checkpoint-every",
            "100",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let runs = t.path().join("runs");
    let start = Instant::now();
    let dir = loop {
        let d = std::fs::read_dir(&runs)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .next();
        if let Some(d) = d.filter(|d| logged_step(d) >= 150) {
            break d;
        }
        assert!(start.elapsed() < Duration::from_secs(120));
        std::thread::sleep(Duration::from_millis(5));
    };
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{se}");
    assert!(se.contains("continue with `redline train --resume"), "{se}");
    let s = json(&dir.join("summary.json"));
    assert_eq!(s["status"], "interrupted", "{s}");
    let stopped_at = s["steps"].as_u64().unwrap_or_default();
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .current_dir(t.path())
        .args(["train", "--resume", "last", "--max-steps", "300"])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(so.contains("resuming"), "{so}");
    let s = json(&dir.join("summary.json"));
    assert_eq!(s["status"], "finished", "{s}");
    assert_eq!(s["steps"], 300, "{s}");
    assert!(stopped_at < 300, "{stopped_at}");
}
