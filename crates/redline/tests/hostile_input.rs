//! Issue 26, the hostile-input second pass: one test per class of input that
//! lost users' files, hung, or was silently misread. Each fails without its
//! fix (the comment above it says what happened before).

// Tests may panic on unexpected values: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The flags every run here starts with: the CPU, no system sampling.
const TRAIN: [&str; 5] = ["train", "--device", "cpu", "--monitor-interval", "0"];

/// `redline train` on the CPU without system sampling, with `extra`, in `cwd`.
fn command(cwd: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_redline"));
    cmd.args(TRAIN).args(extra).current_dir(cwd);
    cmd
}

/// Waits for `child`, killing it (and failing) after `limit`: an input that
/// makes the program read forever or block fails here instead of hanging CI.
fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{what}: still running after {limit:?} (reading forever or blocked)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `redline train` on the CPU with `extra` in `cwd`; expected to fail within
/// a minute without a panic; returns stderr.
fn refused_in(cwd: &Path, extra: &[&str]) -> String {
    let child = command(cwd, extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_within(child, Duration::from_secs(60), &format!("{extra:?}"));
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{extra:?} should have been refused");
    assert!(!se.contains("panicked"), "{se}");
    se
}

fn wine() -> String {
    common::root()
        .join("data/tables/wine.csv")
        .display()
        .to_string()
}

fn mkfifo(p: &Path) {
    assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Before: `name = "../../.."` in a model file wrote `config.toml` and
/// `metrics.csv` into the folder above the run's, over the user's files.
#[test]
fn a_name_from_a_model_file_never_leaves_the_runs_folder() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path().join("work/project");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(
        cwd.join("m.toml"),
        "[model]\nname = \"../../..\"\nlayers = [{ type = \"linear\" }]\n",
    )
    .unwrap();
    let out = command(
        &cwd,
        &["--max-steps", "2", "--data", &wine(), "--model", "m.toml"],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Only the model file and runs/ here, and one run inside runs/; nothing above.
    let mut here: Vec<String> = std::fs::read_dir(&cwd)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    here.sort();
    assert_eq!(here, ["m.toml", "runs"]);
    assert_eq!(std::fs::read_dir(cwd.join("runs")).unwrap().count(), 1);
    for above in [t.path().join("work"), t.path().to_path_buf()] {
        assert!(!above.join("config.toml").exists(), "{above:?}");
        assert!(!above.join("metrics.csv").exists(), "{above:?}");
    }
}

/// Before: `--config /dev/zero` grew to 23.8 GB until the kernel killed it; a
/// FIFO blocked forever; `--data` of `/dev/urandom` as a table read forever.
#[test]
fn special_files_as_inputs_are_refused_by_what_they_are() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    mkfifo(&d.join("pipe.toml"));
    mkfifo(&d.join("pipe.csv"));
    mkfifo(&d.join("pipe.safetensors"));
    for (name, target) in [
        ("zero.toml", "/dev/zero"),
        ("zero.csv", "/dev/zero"),
        ("random.csv", "/dev/urandom"),
        ("zero.npz", "/dev/zero"),
        ("zero.safetensors", "/dev/zero"),
    ] {
        std::os::unix::fs::symlink(target, d.join(name)).unwrap();
    }
    std::fs::create_dir(d.join("npy")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.join("npy/x.npy")).unwrap();
    std::fs::write(d.join("npy/y.npy"), b"").unwrap();
    let p = |n: &str| d.join(n).display().to_string();
    let wine = wine();
    let cases: Vec<Vec<String>> = vec![
        vec!["--config".into(), "/dev/zero".into()],
        vec!["--config".into(), p("pipe.toml")],
        vec![
            "--model".into(),
            p("zero.toml"),
            "--data".into(),
            wine.clone(),
        ],
        vec![
            "--model".into(),
            p("pipe.toml"),
            "--data".into(),
            wine.clone(),
        ],
        vec!["--data".into(), p("zero.csv")],
        vec!["--data".into(), p("random.csv")],
        vec!["--data".into(), p("pipe.csv")],
        vec!["--data".into(), p("zero.npz")],
        vec!["--data".into(), p("zero.safetensors")],
        vec!["--data".into(), p("pipe.safetensors")],
        vec!["--data".into(), p("npy")],
        vec![
            "--init".into(),
            p("pipe.safetensors"),
            "--data".into(),
            wine.clone(),
        ],
        vec![
            "--init".into(),
            "/dev/zero".into(),
            "--data".into(),
            wine.clone(),
        ],
    ];
    for case in &cases {
        let args: Vec<&str> = case.iter().map(String::as_str).collect();
        let m = refused_in(d, &args);
        assert!(m.contains("not a regular file"), "{case:?}: {m}");
    }
}

/// Before: `--save` onto a device node replaced the device with a regular
/// file (and so `/dev/null` when run as root).
#[test]
fn special_files_as_outputs_are_refused_and_left_as_they_were() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    mkfifo(&d.join("pipe"));
    std::os::unix::fs::symlink("/dev/null", d.join("null-link")).unwrap();
    let mut targets = vec![d.join("pipe"), d.join("null-link")];
    // A copy of /dev/full, as the issue made it (root only).
    let full = d.join("full");
    if is_root()
        && Command::new("mknod")
            .args([full.to_str().unwrap(), "c", "1", "7"])
            .status()
            .is_ok_and(|s| s.success())
    {
        targets.push(full.clone());
    } else {
        eprintln!("note: not root, the mknod copy of /dev/full is not tried");
    }
    for target in &targets {
        for flag in ["--save", "--metrics"] {
            let m = refused_in(d, &["--data", &wine(), flag, target.to_str().unwrap()]);
            assert!(m.contains(flag) && m.contains("not a regular file"), "{m}");
        }
    }
    use std::os::unix::fs::FileTypeExt;
    let kind = |p: &Path| std::fs::symlink_metadata(p).unwrap().file_type();
    assert!(kind(&d.join("pipe")).is_fifo());
    assert!(kind(&d.join("null-link")).is_symlink());
    if targets.contains(&full) {
        assert!(kind(&full).is_char_device());
    }
    // A file the run folder writes itself, and --save on --metrics.
    let run = d.join("run");
    let summary = run.join("summary.json");
    let m = refused_in(
        d,
        &[
            "--data",
            &wine(),
            "--run-dir",
            run.to_str().unwrap(),
            "--save",
            summary.to_str().unwrap(),
        ],
    );
    assert!(m.contains("the run folder writes this file itself"), "{m}");
    let same = d.join("out.bin");
    let same = same.to_str().unwrap();
    let m = refused_in(d, &["--data", &wine(), "--save", same, "--metrics", same]);
    assert!(m.contains("one would overwrite the other"), "{m}");
}

/// A table of `rows` rows of ten columns.
fn big_table(path: &Path, rows: usize) {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(w, "a,b,c,d,e,f,g,h,i,y").unwrap();
    for r in 0..rows {
        writeln!(w, "{r},1.5,2.25,3,4,5,6,7,8,{}", r % 3).unwrap();
    }
}

/// Before: Ctrl-C while a large table loaded was ignored, twice, and the run
/// finished with exit 0 and status `finished`.
#[test]
fn a_signal_while_the_data_loads_stops_the_run() {
    let t = tempfile::tempdir().unwrap();
    let table = t.path().join("big.csv");
    big_table(&table, 1_500_000);
    let run = t.path().join("run");
    let mut child = command(
        t.path(),
        &[
            "--data",
            table.to_str().unwrap(),
            "--run-dir",
            run.to_str().unwrap(),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The line printed as loading starts, then SIGINT.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("loading ") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "no `loading` line"
        );
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = wait_within(child, Duration::from_secs(120), "SIGINT while loading");
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{se}");
    assert!(
        se.contains("interrupted by SIGINT while reading the data"),
        "{se}"
    );
    assert!(
        !run.exists(),
        "a run stopped before training leaves no run folder"
    );
}

/// `redline train` on the CPU, 2 steps, in a temporary folder; returns
/// (success, stdout, stderr).
fn train(extra: &[&str]) -> (bool, String, String) {
    let t = tempfile::tempdir().unwrap();
    let mut args = vec!["--max-steps", "2", "--run-dir"];
    let run = t.path().join("run");
    args.push(run.to_str().unwrap());
    args.extend_from_slice(extra);
    let out = command(&common::root(), &args).output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!se.contains("panicked"), "{se}");
    (out.status.success(), so, se)
}

/// Writes `text` to `dir/name` and returns the path as a string.
fn file(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// An `.npy` file of little-endian values with `descr` and `shape`.
fn npy(path: &Path, descr: &str, shape: &str, data: &[u8]) {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Before: a numeric header was a data row, negative or huge integer targets
/// turned the task to regression without a word, an empty or nested class
/// folder was dropped or ignored, `x_test` without `y_test` was ignored, and
/// duplicate column names were accepted.
#[test]
fn data_that_was_silently_misread_is_read_as_documented_or_refused() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let rows: String = (0..40)
        .map(|i| format!("{},{},{}\n", i % 7, i % 5, i % 2))
        .collect();
    let csv = file(d, "indices.csv", &format!("0,1,2\n{rows}"));
    let (ok, so, se) = train(&["--data", &csv]);
    assert!(ok, "{se}");
    assert!(
        so.contains("header: the first row (auto: its numbers are the column indices"),
        "{so}"
    );
    assert!(
        so.contains("40 train") || so.contains("36 train"),
        "the header is not a sample: {so}"
    );
    // Negative labels: regression, said loudly with the reason.
    let neg: String = (0..40)
        .map(|i| format!("{},{}\n", i, (i % 2) * 2 - 1))
        .collect();
    let csv = file(d, "neg.csv", &format!("x,label\n{neg}"));
    let (ok, so, se) = train(&["--data", &csv]);
    assert!(ok, "{se}");
    assert!(
        so.contains("warning: task: regression (auto: target `label` holds the negative value -1"),
        "{so}"
    );
    let (ok, _, se) = train(&["--data", &csv, "--task", "classification"]);
    assert!(!ok && se.contains("the negative value -1"), "{se}");
    // Duplicate names.
    let csv = file(d, "dup.csv", &format!("x,x,y\n{rows}"));
    let (ok, _, se) = train(&["--data", &csv]);
    assert!(
        !ok && se.contains("columns 0 and 1 are both named `x`"),
        "{se}"
    );
    // Image folders: a nested image counts; an empty class folder is named.
    let img = d.join("images");
    for (class, sub) in [("cat", ""), ("dog", "2024/")] {
        for i in 0..3 {
            let p = img.join(format!("{class}/{sub}{i}.png"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            image::RgbImage::from_pixel(4, 4, image::Rgb([i * 40, 0, 0]))
                .save(&p)
                .unwrap();
        }
    }
    let (ok, so, se) = train(&["--data", img.to_str().unwrap(), "--val-split", "0"]);
    assert!(ok, "{se}");
    assert!(so.contains("6 train"), "nested images are samples: {so}");
    std::fs::create_dir(img.join("emu")).unwrap();
    let (ok, _, se) = train(&["--data", img.to_str().unwrap()]);
    assert!(
        !ok && se.contains("class folder `emu` holds no PNG or JPEG images"),
        "{se}"
    );
    // Half a test split.
    let arrays = d.join("arrays");
    std::fs::create_dir(&arrays).unwrap();
    npy(
        &arrays.join("x_train.npy"),
        "<f4",
        "(4, 2)",
        &f32s(&[0.0; 8]),
    );
    npy(
        &arrays.join("y_train.npy"),
        "<f4",
        "(4,)",
        &f32s(&[0.0, 1.0, 0.5, 2.0]),
    );
    npy(
        &arrays.join("x_test.npy"),
        "<f4",
        "(2, 2)",
        &f32s(&[0.0; 4]),
    );
    let (ok, _, se) = train(&["--data", arrays.to_str().unwrap()]);
    assert!(!ok && se.contains("holds `x_test` but no `y_test`"), "{se}");
}

/// Before: values of 1e308, NaN targets, `--std 1e-40` or a negative `--std`
/// ended in "loss became NaN: lower --lr", or trained to 9e28 with exit 0.
#[test]
fn non_finite_and_enormous_inputs_are_named_where_they_are_read() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let csv = file(d, "big.csv", "a,b,y\n1,2,0.5\n1e308,3,0.25\n4,5,1\n");
    let (ok, _, se) = train(&["--data", &csv]);
    assert!(
        !ok && se.contains("line 3, column `a`: 1e308 is beyond fp32's range"),
        "{se}"
    );
    let csv = file(d, "huge-y.csv", "a,y\n1,2e30\n2,1e30\n3,5\n");
    let (ok, _, se) = train(&["--data", &csv]);
    assert!(
        !ok && se.contains("target `y` reaches") && se.contains("rescale"),
        "{se}"
    );
    let nan = d.join("nan");
    std::fs::create_dir(&nan).unwrap();
    npy(&nan.join("x.npy"), "<f4", "(3, 1)", &f32s(&[1.0, 2.0, 3.0]));
    npy(
        &nan.join("y.npy"),
        "<f4",
        "(3,)",
        &f32s(&[1.0, f32::NAN, 3.0]),
    );
    let (ok, _, se) = train(&["--data", nan.to_str().unwrap()]);
    assert!(!ok && se.contains("`y` holds NaN at flat index 1"), "{se}");
    for std in ["1e-40", "-0.5", "0"] {
        let (ok, _, se) = train(&["--std", std]);
        assert!(
            !ok && se.contains(&format!("--std {}", std.parse::<f32>().unwrap())),
            "{se}"
        );
    }
    // A large but finite target trains, with a warning on the startup line.
    let csv = file(d, "large-y.csv", "a,y\n1,2e6\n2,1e6\n3,5e5\n4,1e6\n");
    let (ok, so, se) = train(&["--data", &csv, "--val-split", "0"]);
    assert!(ok, "{se}");
    assert!(so.contains("warning: target `y` reaches 2e6"), "{so}");
}

/// Before: a linear layer of zero outputs panicked; a head narrower than the
/// data's classes failed in the loss, mid-step.
#[test]
fn every_size_in_a_model_file_is_checked_before_training() {
    let t = tempfile::tempdir().unwrap();
    for (name, layers, error) in [
        (
            "zero.toml",
            "{ type = \"linear\", out = 0 }, { type = \"linear\" }",
            "out = 0: a linear layer needs at least one output",
        ),
        (
            "head.toml",
            "{ type = \"linear\", out = 2 }",
            "the model ends in [2] per sample but the data needs 3 outputs",
        ),
        (
            "huge.toml",
            "{ type = \"linear\", out = 4294967296 }, { type = \"linear\" }",
            "out = 4294967296: sizes in a model file are at most 16777216",
        ),
    ] {
        let model = file(t.path(), name, &format!("[model]\nlayers = [{layers}]\n"));
        let (ok, _, se) = train(&["--data", &wine(), "--model", &model]);
        assert!(!ok && se.contains(error), "{name}: {se}");
    }
}

/// The table of 50 million columns in the issue peaked at 5.9 GB before the
/// model-size refusal; the model it implies is now refused from the first row.
#[test]
fn a_table_too_wide_for_any_model_is_refused_from_its_first_row() {
    use std::io::Write;
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("wide.csv");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
    // 20 million columns of 0: 40 MB, a first layer of 2.56e9 weights (40 GB to train).
    for _ in 0..2 {
        for _ in 0..20_000_000 - 1 {
            w.write_all(b"0,").unwrap();
        }
        w.write_all(b"1\n").unwrap();
    }
    drop(w);
    let (ok, _, se) = train(&["--data", p.to_str().unwrap(), "--hidden", "128"]);
    assert!(!ok, "{se}");
    assert!(
        se.contains("19999999 features imply a model too large") && se.contains("needs"),
        "{se}"
    );
}

fn mount_tmpfs(dir: &Path, size: &str) -> bool {
    is_root()
        && Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success())
}

/// Unmounts on drop, so a failing test leaves no mount behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Before: a full disk mid-run left `.tmp` files and half-written rows, and
/// the folder read as `killed`; `--metrics` on a full disk was a warning and
/// exit 0.
#[test]
fn a_disk_that_fills_mid_run_leaves_a_failed_run_that_says_why() {
    let t = tempfile::tempdir().unwrap();
    let disk = t.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    if !mount_tmpfs(&disk, "768k") {
        // A user cannot mount a small disk; CI and the development machines run as root.
        eprintln!("note: not root (or no tmpfs): the full-disk run is not tried");
        return;
    }
    let _mounted = Mounted(disk.clone());
    for metrics_on_disk in [false, true] {
        let run = disk.join(format!("run-{metrics_on_disk}"));
        let metrics = if metrics_on_disk {
            disk.join("m.jsonl")
        } else {
            t.path().join("m.jsonl")
        };
        let out = command(
            &common::root(),
            &[
                "--data",
                &wine(),
                "--epochs",
                "100000",
                "--log-every",
                "1",
                "--batch-size",
                "4",
                "--run-dir",
                run.to_str().unwrap(),
                "--metrics",
                metrics.to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
        let se = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{se}");
        assert!(se.contains("No space left on device"), "{se}");
        let summary = common::json(&run.join("summary.json"));
        assert_eq!(summary["status"], "failed", "{summary}");
        let error = summary["error"].as_str().unwrap_or_default();
        assert!(error.contains("No space left on device"), "{error}");
        // Every record whole, and no temporary file anywhere.
        for f in [run.join("metrics.jsonl"), metrics.clone()] {
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(
                text.is_empty() || text.ends_with('\n'),
                "{f:?} ends in half a row"
            );
            for line in text.lines() {
                serde_json::from_str::<serde_json::Value>(line)
                    .unwrap_or_else(|e| panic!("{f:?}: {e}: {line}"));
            }
        }
        let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
        let width = csv.lines().next().unwrap().split(',').count();
        assert!(
            csv.lines().all(|l| l.split(',').count() == width),
            "half a CSV row"
        );
        for entry in std::fs::read_dir(&run).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                !name.contains(".tmp") && name != "pid",
                "{name} left behind"
            );
        }
        let listing = common::ok(&["runs", disk.to_str().unwrap()]);
        assert!(!listing.contains("killed"), "{listing}");
        std::fs::remove_dir_all(&run).unwrap();
        let _ = std::fs::remove_file(&metrics);
    }
}

/// A checkpoint that does not fit on the disk fails alone: the previous one
/// stays the newest, whole, no temporary folder is left, the run goes on and
/// its summary says which checkpoints failed and why.
#[test]
fn a_disk_too_full_for_a_checkpoint_keeps_the_previous_one() {
    let t = tempfile::tempdir().unwrap();
    let disk = t.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    // The MLP's checkpoint is 1.2 MB (weights and Adam's moments): one fits
    // beside the run's records, a second does not.
    if !mount_tmpfs(&disk, "2200k") {
        eprintln!("note: not root (or no tmpfs): the full-disk checkpoint is not tried");
        return;
    }
    let _mounted = Mounted(disk.clone());
    let run = disk.join("run");
    let out = command(
        &common::root(),
        &[
            "--threads",
            "1",
            "--max-steps",
            "300",
            "--checkpoint-every",
            "100",
            "--run-dir",
            run.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{so}\n{se}");
    assert!(
        so.contains("checkpoint failed") && so.contains("No space left on device"),
        "{so}"
    );
    let summary = common::json(&run.join("summary.json"));
    assert_eq!(summary["status"], "finished", "{summary}");
    let failed = summary["checkpoints"]["failed"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!failed.is_empty(), "{summary}");
    let names: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["step-00000100"],
        "only the checkpoint that fitted, whole"
    );
    // The newest is whole: a copy on a roomy disk resumes from it, refusing nothing.
    let copy = t.path().join("copy");
    assert!(Command::new("cp")
        .args(["-r", run.to_str().unwrap(), copy.to_str().unwrap()])
        .status()
        .unwrap()
        .success());
    let out = Command::new(env!("CARGO_BIN_EXE_redline"))
        .current_dir(common::root())
        .args(["train", "--resume", copy.to_str().unwrap()])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{so}");
    assert!(so.contains("(step 100,") && !so.contains("refused"), "{so}");
}
