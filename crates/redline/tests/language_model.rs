//! A GPT trains on token data through the CLI (issue 50): a text file's
//! bytes and a folder of nanoGPT's uint16 `train.bin` / `val.bin`, cut into
//! windows of the model file's `block_size + 1`; the next-token loss falls,
//! and the run reports perplexity, bits per byte and tokens/s. Bad token
//! data is refused with its fix.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

/// `n` words of a small vocabulary, seeded: text a GPT learns quickly.
fn words(n: usize) -> String {
    let vocab = [
        "the", "cat", "sat", "on", "mat", "and", "dog", "lay", "log", "a", "bird", "sang",
    ];
    let mut state = 7u64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            vocab[((state >> 33) % vocab.len() as u64) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `redline train` of the tiny GPT file on `data` into `run` (CPU), with
/// `extra` flags; returns stdout.
fn train_gpt(run: &Path, data: &Path, extra: &[&str]) -> String {
    let m = model();
    let mut args = vec!["--data", data.to_str().unwrap(), "--model", &m];
    args.extend_from_slice(extra);
    common::train_in(run, &args)
}

/// `redline train` of the tiny GPT file on `data` that must fail; returns
/// stderr.
fn gpt_fails(t: &Path, data: &Path, extra: &[&str]) -> String {
    let m = model();
    let run = t.join(format!(
        "run-{}",
        data.file_name().unwrap().to_string_lossy()
    ));
    let mut args = vec![
        "train",
        "--device",
        "cpu",
        "--data",
        data.to_str().unwrap(),
        "--model",
        &m,
        "--run-dir",
        run.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    common::fails(&args)
}

fn model() -> String {
    common::root()
        .join("examples/models/tiny-gpt.toml")
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_gpt_learns_a_text_files_bytes() {
    let t = tempfile::tempdir().unwrap();
    let text = t.path().join("input.txt");
    std::fs::write(&text, words(3000)).unwrap();
    let run = t.path().join("run");
    let out = train_gpt(
        &run,
        &text,
        &[
            "--max-steps",
            "120",
            "--batch-size",
            "16",
            "--lr",
            "3e-3",
            "--log-every",
            "10",
        ],
    );
    assert!(
        out.contains("text (UTF-8 bytes)")
            && out.contains("windows of 33 ids")
            && out.contains("next-token cross-entropy"),
        "{out}"
    );
    let s = common::json(&run.join("summary.json"));
    let val = s["val_loss"].as_f64().unwrap();
    // From about ln 256 = 5.5 nats a byte.
    assert!(val < 1.5, "val loss {val}\n{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("language model: val perplexity"))
        .unwrap_or_else(|| panic!("no language model line\n{out}"));
    assert!(
        line.contains("bits per byte") && line.contains("tokens/s"),
        "{line}"
    );
    let losses = common::step_losses(&run);
    assert!(losses.last().unwrap() < &(0.5 * losses[0]), "{losses:?}");
    // `redline test` reads the text with the run's model: its windows.
    let out = common::ok(&[
        "test",
        run.to_str().unwrap(),
        "--data",
        text.to_str().unwrap(),
    ]);
    assert!(
        out.contains("test loss") && out.contains("test token_accuracy"),
        "{out}"
    );
}

/// Under bf16-mixed (16-bit products, the residual stream and the loss in
/// fp32) the GPT learns the text too; its precision probe times a few
/// windows gathered into memory (which a token split had refused).
#[test]
fn a_gpt_trains_under_bf16_mixed() {
    let t = tempfile::tempdir().unwrap();
    let text = t.path().join("input.txt");
    std::fs::write(&text, words(3000)).unwrap();
    let run = t.path().join("run");
    let out = train_gpt(
        &run,
        &text,
        &[
            "--max-steps",
            "100",
            "--batch-size",
            "16",
            "--lr",
            "3e-3",
            "--precision",
            "bf16-mixed",
        ],
    );
    let s = common::json(&run.join("summary.json"));
    let val = s["val_loss"].as_f64().unwrap();
    assert!(val < 2.0, "bf16-mixed val loss {val}\n{out}");
}

fn write_bin(path: &Path, ids: &[u16]) {
    let bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn nanogpt_bin_files_train_and_val_bin_is_the_test_split() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    // Ids above 255 (uint16): a repeating sequence of 300 ids.
    let ids: Vec<u16> = (0..6000).map(|i| ((i * 7) % 300) as u16).collect();
    write_bin(&dir.join("train.bin"), &ids[..5400]);
    write_bin(&dir.join("val.bin"), &ids[5400..]);
    let run = t.path().join("run");
    let out = train_gpt(
        &run,
        &dir,
        &["--max-steps", "60", "--batch-size", "16", "--lr", "3e-3"],
    );
    assert!(
        out.contains("nanoGPT token files") && out.contains("vocabulary 300"),
        "{out}"
    );
    let line = out
        .lines()
        .find(|l| l.starts_with("language model: test perplexity"))
        .unwrap_or_else(|| panic!("no test perplexity\n{out}"));
    assert!(line.contains("bits per token"), "{line}");
    let s = common::json(&run.join("summary.json"));
    assert!(s["test_loss"].as_f64().unwrap() < 300f64.ln(), "{s}");
}

#[test]
fn bad_token_data_is_refused_with_the_fix() {
    let t = tempfile::tempdir().unwrap();
    let short = t.path().join("short.txt");
    std::fs::write(&short, "too short").unwrap();
    let e = gpt_fails(t.path(), &short, &[]);
    assert!(
        e.contains("short.txt") && e.contains("block_size + 1 = 33"),
        "{e}"
    );
    // A text with a model that is not a language model.
    let text = t.path().join("input.txt");
    std::fs::write(&text, words(500)).unwrap();
    let e = common::fails(&[
        "train",
        "--device",
        "cpu",
        "--data",
        text.to_str().unwrap(),
        "--model",
        "mlp",
        "--run-dir",
        t.path().join("run2").to_str().unwrap(),
    ]);
    assert!(e.contains("block_size") && e.contains("gpt-char"), "{e}");
    // Ids beyond a vocabulary given with --classes: the first, by offset.
    let dir = t.path().join("big");
    std::fs::create_dir(&dir).unwrap();
    let ids: Vec<u16> = (0..400).map(|i| (i % 120) as u16).collect();
    write_bin(&dir.join("train.bin"), &ids);
    let e = gpt_fails(t.path(), &dir, &["--classes", "100"]);
    assert!(
        e.contains("train.bin") && e.contains("token id 100 at id offset 100 (byte 200)"),
        "{e}"
    );
    // A .bin of odd length.
    let dir = t.path().join("odd");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("train.bin"), [1u8, 0, 2]).unwrap();
    let e = gpt_fails(t.path(), &dir, &[]);
    assert!(e.contains("train.bin") && e.contains("odd length"), "{e}");
}
