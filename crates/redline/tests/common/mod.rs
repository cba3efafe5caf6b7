//! Helpers shared by the binary's integration tests: run `redline` from the
//! repository root and read what it wrote.

#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn root() -> PathBuf {
    // A test binary carried to another machine (bench/gpu.sh) is told where the repository is.
    std::env::var_os("REDLINE_REPO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Runs the binary from the repository root. A `train` without `--run-dir`
/// (or `--resume`) gets a temporary run folder, so tests leave nothing in `runs/`.
pub fn redline(args: &[&str]) -> Output {
    let runs = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_redline"));
    cmd.args(args).current_dir(root());
    // Tokenised text is cached in the command's own folder, not the home's.
    if std::env::var_os("REDLINE_CACHE_DIR").is_none() {
        cmd.env("REDLINE_CACHE_DIR", runs.path().join("cache"));
    }
    if args.first() == Some(&"train") && !args.contains(&"--run-dir") && !args.contains(&"--resume")
    {
        cmd.arg("--run-dir").arg(runs.path().join("run"));
    }
    cmd.output().unwrap()
}

/// Runs it and returns stdout; fails the test on a non-zero exit.
pub fn ok(args: &[&str]) -> String {
    let out = redline(args);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "redline {args:?} failed\nstdout:\n{so}\nstderr:\n{se}"
    );
    so.into_owned()
}

/// `redline train` on the CPU, without system sampling, into the run folder
/// `run`, with `extra` flags; returns stdout and fails the test on an error.
pub fn train_in(run: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "train",
        "--device",
        "cpu",
        "--monitor-interval",
        "0",
        "--run-dir",
        run.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok(&args)
}

/// Runs it and returns stderr; fails the test on success or a panic.
pub fn fails(args: &[&str]) -> String {
    let out = redline(args);
    assert!(!out.status.success(), "redline {args:?} should have failed");
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!se.contains("panicked"), "{se}");
    se
}

/// Parses a JSON-lines file.
pub fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Parses a JSON file.
pub fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A file of `testdata/golden`.
pub fn golden(name: &str) -> PathBuf {
    root().join("testdata/golden").join(name)
}

/// The `losses` of a golden trace (`testdata/golden/<file>`).
pub fn golden_losses(file: &str) -> Vec<f64> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden(file)).unwrap()).unwrap();
    v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The golden job's flags: `model` from its golden init, file order, no
/// validation split, `steps` steps of `batch`, every step logged.
pub fn golden_job(model: &str, batch: usize, steps: usize) -> Vec<String> {
    let init = golden(&format!("{model}_init.safetensors"));
    [
        "--model",
        model,
        "--init",
        init.to_str().unwrap(),
        "--no-shuffle",
        "--val-split",
        "0",
        "--max-steps",
        &steps.to_string(),
        "--batch-size",
        &batch.to_string(),
        "--log-every",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The per-step losses of a run folder's `metrics.jsonl`.
pub fn step_losses(run: &Path) -> Vec<f64> {
    jsonl(&run.join("metrics.jsonl"))
        .iter()
        .filter(|r| r["kind"] == "step")
        .map(|r| r["loss"].as_f64().unwrap())
        .collect()
}

/// A safetensors file's tensors, on the CPU.
pub fn weights(path: &Path) -> std::collections::HashMap<String, candle_core::Tensor> {
    candle_core::safetensors::load(path, &candle_core::Device::Cpu).unwrap()
}

/// `|a - b| / |b|` (L2 norms).
pub fn rel_l2(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap();
    let n = b.sqr().unwrap().sum_all().unwrap();
    (d.to_scalar::<f32>().unwrap() / n.to_scalar::<f32>().unwrap().max(1e-30)).sqrt()
}

/// A safetensors file's tensors, bit for bit: its header without the
/// `__metadata__` entry (which `--save` fills with the run folder), and its
/// data bytes.
pub fn tensor_bits(path: &Path) -> (serde_json::Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header.as_object_mut().unwrap().remove("__metadata__");
    (header, bytes[8 + n..].to_vec())
}

/// Whether two safetensors files hold the same tensors, bit for bit.
pub fn same_tensors(a: &Path, b: &Path) -> bool {
    tensor_bits(a) == tensor_bits(b)
}

/// A class folder tree of `per_class` gradient images per class, of varied
/// sizes (PNG and JPEG), under `dir/train` and `dir/val`.
pub fn image_folder(dir: &Path, per_class: u32) {
    for (split, n) in [("train", per_class), ("val", 2)] {
        for c in 0..3u32 {
            let d = dir.join(split).join(format!("class{c}"));
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..n {
                let (w, h) = (24 + (i * 5) % 17, 20 + (i * 3) % 13);
                let img = image::RgbImage::from_fn(w, h, |x, y| {
                    image::Rgb([
                        (x * 9 + c * 70) as u8,
                        (y * 11 + i * 13) as u8,
                        ((x + y) * 5 + c * 40) as u8,
                    ])
                });
                let ext = if i % 3 == 0 { "jpg" } else { "png" };
                img.save(d.join(format!("{i}.{ext}"))).unwrap();
            }
        }
    }
}

/// Packs `folder/train` into WebDataset shards with the system's `tar`:
/// members `KEY.png|jpg` and `KEY.cls`, `per_shard` samples a shard.
pub fn shards(folder: &Path, out: &Path, per_shard: usize) -> Vec<std::path::PathBuf> {
    let mut samples = Vec::new();
    let mut classes: Vec<_> = std::fs::read_dir(folder.join("train"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    classes.sort();
    for (c, dir) in classes.iter().enumerate() {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        samples.extend(files.into_iter().map(|f| (f, c)));
    }
    std::fs::create_dir_all(out).unwrap();
    let mut made = Vec::new();
    for (s, chunk) in samples.chunks(per_shard).enumerate() {
        let stage = out.join(format!("stage{s}"));
        std::fs::create_dir_all(&stage).unwrap();
        let mut names = Vec::new();
        for (k, (f, c)) in chunk.iter().enumerate() {
            let ext = f.extension().unwrap().to_string_lossy().into_owned();
            let key = format!("s{s}k{k:03}");
            std::fs::copy(f, stage.join(format!("{key}.{ext}"))).unwrap();
            std::fs::write(stage.join(format!("{key}.cls")), c.to_string()).unwrap();
            names.push(format!("{key}.{ext}"));
            names.push(format!("{key}.cls"));
        }
        let tar = out.join(format!("train-{s:04}.tar"));
        let st = std::process::Command::new("tar")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&stage)
            .args(&names)
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::remove_dir_all(&stage).unwrap();
        made.push(tar);
    }
    made
}
