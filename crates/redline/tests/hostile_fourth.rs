//! Issues 51 and 53, the hostile-input third and fourth passes, through the
//! binary: user files that a run would overwrite, a resume that cannot
//! train, and an fp16 run that never took a step. Each test fails without
//! its fix (the comment above it says what happened before).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::root;

/// `bin train` on the CPU without system sampling.
fn cpu_train(bin: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args(["train", "--device", "cpu", "--monitor-interval", "0"]);
    c
}

/// `redline train` on the CPU on the wine table, 1 thread, with `extra`
/// (a later `--data` replaces the table).
fn train(extra: &[&str]) -> Output {
    let wine = root().join("data/tables/wine.csv");
    cpu_train(Path::new(env!("CARGO_BIN_EXE_redline")))
        .args(["--threads", "1", "--batch-size", "16", "--data"])
        .arg(wine)
        .args(extra)
        .current_dir(root())
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(extra: &[&str]) -> String {
    let out = train(extra);
    let (so, se) = text(&out);
    assert!(out.status.success(), "{extra:?} failed\n{so}\n{se}");
    so
}

fn refused(extra: &[&str]) -> String {
    let out = train(extra);
    let (so, se) = text(&out);
    assert!(!out.status.success(), "{extra:?} should be refused\n{so}");
    assert!(!se.contains("panicked"), "{se}");
    se
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A run into `run` of `steps` steps, checkpointing every `every`.
fn first_segment(run: &Path, steps: &str, every: &str) {
    ok(&[
        "--max-steps",
        steps,
        "--checkpoint-every",
        every,
        "--run-dir",
        s(run),
    ]);
}

/// Before: `--run-dir` on a folder of the user's own files wrote the run's
/// `config.toml`, `metrics.csv` and `report.html` over theirs.
#[test]
fn a_run_dir_holding_user_files_is_refused_and_left_as_it_was() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("mine");
    std::fs::create_dir(&dir).unwrap();
    for f in ["config.toml", "report.html", "metrics.csv"] {
        std::fs::write(dir.join(f), "my own").unwrap();
    }
    let se = refused(&["--epochs", "1", "--run-dir", s(&dir)]);
    assert!(
        se.contains("not empty") && se.contains("config.toml, metrics.csv, report.html"),
        "{se}"
    );
    for f in ["config.toml", "report.html", "metrics.csv"] {
        assert_eq!(std::fs::read_to_string(dir.join(f)).unwrap(), "my own");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 3, "nothing added");
}

/// Before: `--metrics FILE` truncated a file already there.
#[test]
fn an_existing_metrics_file_is_appended_to() {
    let t = tempfile::tempdir().unwrap();
    let m = t.path().join("m.jsonl");
    std::fs::write(&m, "{\"mine\":1}\n").unwrap();
    let run = t.path().join("run");
    let so = ok(&["--max-steps", "2", "--run-dir", s(&run), "--metrics", s(&m)]);
    assert!(so.contains("appended"), "{so}");
    let text = std::fs::read_to_string(&m).unwrap();
    assert!(text.starts_with("{\"mine\":1}\n{"), "{text}");
    assert!(text.lines().count() > 2, "{text}");
}

/// Before: `--resume RUN --max-steps N` below the checkpoint's step
/// "finished" at once with 0 samples/s and wrote N into `config.toml`.
#[test]
fn a_resume_with_max_steps_below_its_checkpoint_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    first_segment(&run, "6", "3");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    for low in ["2", "5"] {
        let se = refused(&["--resume", s(&run), "--max-steps", low]);
        assert!(
            se.contains(&format!("--max-steps {low} is below step 6")),
            "{se}"
        );
        let now = std::fs::read_to_string(run.join("config.toml")).unwrap();
        assert_eq!(now, config, "config.toml unchanged");
    }
    ok(&["--resume", s(&run), "--max-steps", "8"]);
}

/// Before: `init=1e40` (inf in fp32) skipped every step, wrote untrained
/// weights to `--save`, then failed writing `summary.json` ("invalid type:
/// null, expected f64"), leaving a run that `redline runs` called killed.
/// A finite init that overflows every step (3e38) still trains nothing:
/// `--save` is not written and the summary is.
#[test]
fn an_fp16_run_that_skips_every_step_saves_nothing_and_still_ends() {
    let t = tempfile::tempdir().unwrap();
    let save = t.path().join("w.safetensors");
    // Three 16-mixed steps from the loss scale `init`.
    let fp16 = |init: &'static str| {
        let scale = [
            "--precision",
            "16-mixed",
            "--loss-scale",
            init,
            "--max-steps",
            "3",
        ];
        scale.to_vec()
    };
    let se = refused(&fp16("dynamic:init=1e40"));
    assert!(se.contains("--loss-scale") && se.contains("init"), "{se}");
    let run = t.path().join("run");
    let mut args = fp16("dynamic:init=3e38");
    args.extend(["--save", s(&save), "--run-dir", s(&run)]);
    let so = ok(&args);
    assert!(
        so.contains("not written: all 3 optimizer steps were skipped"),
        "{so}"
    );
    assert!(!save.exists(), "untrained weights were saved");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["status"], "finished", "{summary}");
    assert_eq!(summary["loss_scale"]["skipped_steps"], 3, "{summary}");
    assert!(!run.join("pid").exists());
}

/// Before: data rewritten between a kill and `--resume` with the same size
/// (so the same number of batches) continued silently.
#[test]
fn a_resume_onto_changed_data_is_refused_by_file() {
    let t = tempfile::tempdir().unwrap();
    let csv = t.path().join("wine.csv");
    let original = std::fs::read_to_string(root().join("data/tables/wine.csv")).unwrap();
    std::fs::write(&csv, &original).unwrap();
    let run = t.path().join("run");
    let first = train(&[
        "--max-steps",
        "3",
        "--checkpoint-every",
        "3",
        "--data",
        s(&csv),
        "--run-dir",
        s(&run),
    ]);
    assert!(first.status.success(), "{}", text(&first).1);
    assert!(run.join("inputs.json").is_file());
    // The same size: a digit of the last row changed.
    let mut edited = original.clone().into_bytes();
    let at = edited.iter().rposition(u8::is_ascii_digit).unwrap();
    edited[at] = if edited[at] == b'1' { b'2' } else { b'1' };
    std::fs::write(&csv, &edited).unwrap();
    let resume = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_redline"))
            .args(["train", "--resume", s(&run), "--max-steps", "5"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = resume(&[]);
    let (so, se) = text(&out);
    assert!(!out.status.success(), "{so}");
    assert!(
        se.contains("input changed") && se.contains("wine.csv has the same size but other"),
        "{se}"
    );
    assert!(
        se.contains("put the original back, or pass --accept-changed-data"),
        "{se}"
    );
    let out = resume(&["--accept-changed-data"]);
    let (so, se) = text(&out);
    assert!(out.status.success(), "{so}\n{se}");
    assert!(so.contains("resuming onto changed input"), "{so}");
}

/// Before: a binary copied elsewhere looked for the default data in the
/// folder it was built in, and said nothing of where it looked.
#[test]
fn a_copied_binary_finds_the_data_beside_itself_and_says_so() {
    let t = tempfile::tempdir().unwrap();
    let bin = t.path().join("bin");
    std::fs::create_dir_all(bin.join("data")).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_redline"), bin.join("redline")).unwrap();
    std::os::unix::fs::symlink(
        root().join("data/fashion-mnist"),
        bin.join("data/fashion-mnist"),
    )
    .unwrap();
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let out = cpu_train(&bin.join("redline"))
        .arg("--fast-dev-run")
        .arg("--run-dir")
        .arg(t.path().join("run"))
        .current_dir(&elsewhere)
        .output()
        .unwrap();
    let (so, se) = text(&out);
    assert!(out.status.success(), "{so}\n{se}");
    assert!(
        so.contains("Fashion-MNIST found beside the executable"),
        "{so}"
    );
}

/// Before: a run resumed near its end reported that segment alone: `wall_s`
/// of the last process ("157 epochs in 0.04 s"), with no word of the
/// segments before it.
#[test]
fn a_resumed_run_reports_its_totals_and_segments() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    first_segment(&run, "5", "5");
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
    };
    let first_wall = read()["wall_s"].as_f64().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(["train", "--resume", s(&run), "--max-steps", "10"])
        .output()
        .unwrap();
    let (so, se) = text(&out);
    assert!(out.status.success(), "{so}\n{se}");
    assert!(so.contains("resumed run: 2 segments"), "{so}");
    let summary = read();
    let segs = summary["segments"].as_array().unwrap();
    assert_eq!(segs.len(), 2, "{summary}");
    assert_eq!(segs[0]["ended"], "finished");
    assert_eq!(segs[0]["to_step"], 5);
    assert_eq!(segs[1]["from_step"], 5);
    assert_eq!(segs[1]["to_step"], 10);
    let (wall, this) = (
        summary["wall_s"].as_f64().unwrap(),
        summary["segment_wall_s"].as_f64().unwrap(),
    );
    assert!(wall >= first_wall && wall > this, "{summary}");
    let runs = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(["runs", s(&run)])
        .output()
        .unwrap();
    let listed = text(&runs).0;
    assert!(listed.contains(&format!("{wall:.2}")), "{listed}");
}
