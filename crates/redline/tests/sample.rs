//! `redline sample` and `redline export --hf` (issue 50): text from a GPT
//! trained on a text file, greedy ids from a transformers-written GPT-2
//! folder equal to transformers' `generate`, a run exported as such a
//! folder and sampled back to the same ids, `--init` from a GPT-2 folder,
//! and every bad setting refused with its fix.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

fn hf() -> PathBuf {
    common::golden("hf-gpt2-tiny")
}

fn expect() -> serde_json::Value {
    common::json(&common::golden("hf_gpt2_tiny.json"))
}

fn ids_of(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap().to_string())
        .collect()
}

/// A tiny GPT trained for a few steps on a text of repeated words.
fn trained(t: &Path) -> PathBuf {
    let text = t.join("input.txt");
    std::fs::write(&text, "the cat sat on the mat. ".repeat(200)).unwrap();
    let run = t.join("run");
    let model = common::root().join("examples/models/tiny-gpt.toml");
    common::train_in(
        &run,
        &[
            "--data",
            text.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--max-steps",
            "60",
            "--batch-size",
            "16",
            "--lr",
            "3e-3",
        ],
    );
    run
}

fn sample(src: &Path, extra: &[&str]) -> String {
    let mut args = vec!["sample", src.to_str().unwrap(), "--device", "cpu"];
    args.extend_from_slice(extra);
    common::ok(&args)
}

#[test]
fn a_gpt2_folder_samples_transformers_greedy_ids_and_text() {
    let e = expect();
    let prompt = e["prompt"].as_str().unwrap();
    let base = ["--prompt", prompt, "--tokens", "16", "--temperature", "0"];
    let ids = sample(&hf(), &[&base[..], &["--ids"]].concat());
    assert_eq!(
        ids.trim().split(' ').collect::<Vec<_>>(),
        ids_of(&e["greedy_ids"])
    );
    let text = sample(&hf(), &base);
    let want = format!("{prompt}{}\n", e["greedy_text"].as_str().unwrap());
    assert_eq!(text, want);
}

#[test]
fn a_run_on_text_samples_bytes_and_exports_a_folder_that_samples_the_same() {
    let t = tempfile::tempdir().unwrap();
    let run = trained(t.path());
    // Greedy: the learned text continues the prompt; stdout holds only it.
    let out = sample(
        &run,
        &[
            "--prompt",
            "the cat",
            "--tokens",
            "24",
            "--temperature",
            "0",
        ],
    );
    assert!(
        out.starts_with("the cat") && !out.contains("loading"),
        "{out:?}"
    );
    assert!(out.contains("mat"), "{out:?}");
    // Seeded draws repeat with the seed and differ across seeds.
    let draw = |seed: &str| {
        sample(
            &run,
            &[
                "--prompt",
                "the",
                "--tokens",
                "40",
                "--temperature",
                "1.5",
                "--seed",
                seed,
                "--ids",
            ],
        )
    };
    assert_eq!(draw("1"), draw("1"));
    assert_ne!(draw("1"), draw("2"));
    let ids: Vec<u32> = draw("3")
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 40);
    assert!(ids.iter().all(|&i| i < 256));
    // `redline predict`: each window's most likely next ids, then its
    // targets; the trained model gets most of them right.
    let csv = t.path().join("next.csv");
    let text = t.path().join("input.txt");
    let out = common::ok(&[
        "predict",
        run.to_str().unwrap(),
        "--data",
        text.to_str().unwrap(),
        "--out",
        csv.to_str().unwrap(),
    ]);
    assert!(
        out.contains("next0,next1,next2,...,target31: 64 columns"),
        "{out}"
    );
    let body = std::fs::read_to_string(&csv).unwrap();
    let (mut right, mut all) = (0, 0);
    for line in body.lines().skip(1) {
        let v: Vec<u32> = line.split(',').map(|x| x.parse().unwrap()).collect();
        assert_eq!(v.len(), 64);
        right += (0..32).filter(|&i| v[i] == v[32 + i]).count();
        all += 32;
    }
    assert!(right * 10 > all * 6, "{right} of {all} next ids right");
    // Exported as a GPT-2 folder, it draws the same greedy ids from the
    // same prompt ids.
    let dir = t.path().join("hf");
    let out = common::ok(&[
        "export",
        run.to_str().unwrap(),
        "--hf",
        dir.to_str().unwrap(),
    ]);
    assert!(out.contains("UTF-8 bytes"), "{out}");
    let greedy = [
        "--prompt-ids",
        "116 104 101",
        "--tokens",
        "30",
        "--temperature",
        "0",
        "--ids",
    ];
    assert_eq!(sample(&run, &greedy), sample(&dir, &greedy));
    // Never over an export.
    let e = common::fails(&[
        "export",
        run.to_str().unwrap(),
        "--hf",
        dir.to_str().unwrap(),
    ]);
    assert!(e.contains("already exists"), "{e}");
    // A long prompt is cropped to block_size (32), and said so.
    let long = "the cat sat on the mat. ".repeat(4);
    let out = common::redline(&[
        "sample",
        run.to_str().unwrap(),
        "--prompt",
        &long,
        "--tokens",
        "3",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("cropped to its last 32"),
        "{err}"
    );
}

#[test]
fn bad_sampling_settings_are_refused_with_their_fix() {
    let h = hf();
    let src = h.to_str().unwrap();
    for (flags, says) in [
        (&["--tokens", "0"][..], "--tokens 0"),
        (&["--temperature", "nan"], "--temperature NaN"),
        (&["--temperature", "-1"], "--temperature -1"),
        (&["--top-k", "0"], "--top-k 0"),
        (&["--prompt", ""], "the prompt is empty"),
        (&["--prompt-ids", "3 x"], "\"x\" is not a token id"),
        (
            &["--prompt-ids", "320"],
            "token id 320 is outside the model's vocabulary of 320",
        ),
    ] {
        let mut args = vec!["sample", src];
        args.extend_from_slice(flags);
        let e = common::fails(&args);
        assert!(e.contains(says), "{flags:?}: {e}");
    }
    // A tokenizer.json that does not parse; a folder of another architecture.
    let t = tempfile::tempdir().unwrap();
    let tok = t.path().join("tokenizer.json");
    std::fs::write(&tok, "{\"version\": 1, \"model\": []}").unwrap();
    let e = common::fails(&["sample", src, "--tokenizer", tok.to_str().unwrap()]);
    assert!(e.contains("not a Hugging Face tokenizer.json"), "{e}");
    let other = t.path().join("llama");
    std::fs::create_dir(&other).unwrap();
    let config = std::fs::read_to_string(h.join("config.json")).unwrap();
    std::fs::write(
        other.join("config.json"),
        config.replace("\"gpt2\"", "\"llama\""),
    )
    .unwrap();
    std::fs::copy(h.join("model.safetensors"), other.join("model.safetensors")).unwrap();
    let e = common::fails(&["sample", other.to_str().unwrap()]);
    assert!(e.contains("model_type \"llama\""), "{e}");
    // A folder whose weights were cut short.
    let cut = t.path().join("cut");
    std::fs::create_dir(&cut).unwrap();
    std::fs::copy(h.join("config.json"), cut.join("config.json")).unwrap();
    let weights = std::fs::read(h.join("model.safetensors")).unwrap();
    std::fs::write(cut.join("model.safetensors"), &weights[..weights.len() / 2]).unwrap();
    let e = common::fails(&["sample", cut.to_str().unwrap()]);
    assert!(
        e.contains("model.safetensors") && e.contains("not a readable safetensors file"),
        "{e}"
    );
}

fn write_bin(path: &Path, ids: &[u32]) {
    let bytes: Vec<u8> = ids.iter().flat_map(|&v| (v as u16).to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

/// `--init` a GPT-2 folder: training starts from its weights (the loss of
/// the text it was trained on starts low), the position table is cropped
/// to a shorter block, a longer block is refused, and the run samples with
/// the folder's tokenizer.
#[test]
fn init_from_a_gpt2_folder_starts_from_its_weights() {
    let t = tempfile::tempdir().unwrap();
    let e = expect();
    let mut ids: Vec<u32> = Vec::new();
    let seq: Vec<u32> = [&e["prompt_ids"], &e["greedy_ids"]]
        .iter()
        .flat_map(|v| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
        })
        .collect();
    while ids.len() < 4000 {
        ids.extend(&seq);
    }
    let data = t.path().join("data");
    std::fs::create_dir(&data).unwrap();
    write_bin(&data.join("train.bin"), &ids);
    let model = |block: usize| {
        let p = t.path().join(format!("gpt{block}.toml"));
        std::fs::write(
            &p,
            format!("[model]\nkind = \"gpt\"\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = {block}\n"),
        )
        .unwrap();
        p
    };
    let run_with = |name: &str, init: bool| {
        let run = t.path().join(name);
        let m = model(16);
        let mut args = vec![
            "--data",
            data.to_str().unwrap(),
            "--model",
            m.to_str().unwrap(),
            "--classes",
            "320",
            "--max-steps",
            "3",
            "--log-every",
            "1",
            "--lr",
            "1e-9",
        ];
        let h = hf();
        if init {
            args.extend(["--init", h.to_str().unwrap()]);
        }
        common::train_in(&run, &args);
        (run, common::step_losses(&t.path().join(name)))
    };
    let (run, from_hf) = run_with("init", true);
    let (_, scratch) = run_with("scratch", false);
    // ln 320 = 5.77 from scratch; the folder's model knows this text.
    assert!(scratch[0] > 5.0, "{scratch:?}");
    assert!(from_hf[0] < 0.6 * scratch[0], "{from_hf:?} vs {scratch:?}");
    // The run samples text through the folder's tokenizer.
    let out = sample(
        &run,
        &["--prompt", e["prompt"].as_str().unwrap(), "--tokens", "4"],
    );
    assert!(out.starts_with(e["prompt"].as_str().unwrap()), "{out}");
    // Its export carries the folder's tokenizer.
    let out_dir = t.path().join("export");
    common::ok(&[
        "export",
        run.to_str().unwrap(),
        "--hf",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(out_dir.join("tokenizer.json")).unwrap(),
        std::fs::read(hf().join("tokenizer.json")).unwrap()
    );
    // A block longer than the folder's 32 positions.
    let m = model(64);
    let err = common::fails(&[
        "train",
        "--device",
        "cpu",
        "--data",
        data.to_str().unwrap(),
        "--model",
        m.to_str().unwrap(),
        "--classes",
        "320",
        "--init",
        hf().to_str().unwrap(),
        "--max-steps",
        "1",
    ]);
    assert!(
        err.contains("block_size 64 is above the folder's position table"),
        "{err}"
    );
    // Token files without a tokenizer: a text prompt cannot be encoded.
    let (bare, _) = run_with("bare", false);
    let err = common::fails(&["sample", bare.to_str().unwrap(), "--prompt", "hi"]);
    assert!(
        err.contains("--tokenizer") && err.contains("--prompt-ids"),
        "{err}"
    );
    let out = sample(&bare, &["--prompt-ids", "5 6", "--tokens", "3", "--ids"]);
    assert_eq!(out.split_whitespace().count(), 3, "{out}");
}

/// `--tokenizer`: a text is tokenised (cached) and trained on as its
/// tokens; the run samples through the same tokenizer; bad uses are named.
#[test]
fn a_text_trains_through_a_tokenizer_and_samples_through_it() {
    let t = tempfile::tempdir().unwrap();
    let text = t.path().join("code.txt");
    let code = "def forward(self, x):\n    return self.net(x)\n\n".repeat(300);
    std::fs::write(&text, &code).unwrap();
    let model = t.path().join("gpt.toml");
    std::fs::write(
        &model,
        "[model]\nkind = \"gpt\"\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 16\n",
    )
    .unwrap();
    let tok = hf().join("tokenizer.json");
    let run = t.path().join("run");
    let flags = [
        "--data",
        text.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        tok.to_str().unwrap(),
        "--max-steps",
        "80",
        "--batch-size",
        "16",
        "--lr",
        "3e-3",
    ];
    // Run as a user runs it: no cache override, so the tokens go to the
    // default cache under a home of the test's own.
    let home = t.path().join("home");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redline"))
        .args([
            "train",
            "--device",
            "cpu",
            "--monitor-interval",
            "0",
            "--run-dir",
        ])
        .arg(&run)
        .args(flags)
        .current_dir(common::root())
        .env("HOME", &home)
        .env_remove("XDG_CACHE_HOME")
        .env_remove("REDLINE_CACHE_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let cached: Vec<_> = std::fs::read_dir(home.join(".cache/redline/tokens"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        cached.len() == 1 && cached[0].starts_with("code-") && cached[0].ends_with(".bin"),
        "{cached:?}"
    );
    assert!(
        out.contains("text, tokenised by") && out.contains("vocabulary 320"),
        "{out}"
    );
    let s = common::json(&run.join("summary.json"));
    assert!(s["val_loss"].as_f64().unwrap() < 1.0, "{out}");
    let out = sample(
        &run,
        &["--prompt", "def", "--tokens", "30", "--temperature", "0"],
    );
    assert!(out.starts_with("def forward(self, x):"), "{out:?}");
    // Not for a model that is not a language model.
    let e = common::fails(&[
        "train",
        "--device",
        "cpu",
        "--data",
        text.to_str().unwrap(),
        "--tokenizer",
        tok.to_str().unwrap(),
    ]);
    assert!(e.contains("--tokenizer") && e.contains("not one"), "{e}");
    // Bytes that are not UTF-8, named where they are.
    let bad = t.path().join("bad.txt");
    let mut bytes = code.into_bytes();
    bytes[500] = 0xC3;
    bytes[501] = b'(';
    std::fs::write(&bad, bytes).unwrap();
    let mut f = vec!["train", "--device", "cpu", "--data", bad.to_str().unwrap()];
    f.extend_from_slice(&flags[2..]);
    let e = common::fails(&f);
    assert!(e.contains("not UTF-8 at byte 500"), "{e}");
}

/// A run of another model kind, and paths that are neither runs nor
/// folders, are refused by name.
#[test]
fn sample_and_export_refuse_what_is_not_a_gpt() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("mlp");
    common::train_in(
        &run,
        &["--data", "data/tables/digits.npz", "--max-steps", "2"],
    );
    let e = common::fails(&["sample", run.to_str().unwrap(), "--prompt", "hi"]);
    assert!(
        e.contains("trained a mlp model") && e.contains("GPT"),
        "{e}"
    );
    let out = t.path().join("hf");
    let e = common::fails(&[
        "export",
        run.to_str().unwrap(),
        "--hf",
        out.to_str().unwrap(),
    ]);
    assert!(
        e.contains("writes GPT-2 folders") && e.contains("mlp"),
        "{e}"
    );
    assert!(!out.exists(), "nothing written");
    let missing = t.path().join("nowhere");
    let e = common::fails(&["sample", missing.to_str().unwrap()]);
    assert!(e.contains("nowhere"), "{e}");
}
