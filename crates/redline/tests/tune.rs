//! `redline tune batch-size|lr` and `train --batch-size auto --lr auto`
//! through the binary: the tables and curve are measured and saved, the
//! choices recorded as numbers, and a resumed tuned run does not search again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{json, ok, train_in};

const DIGITS: &str = "data/tables/digits.npz";

#[test]
fn tune_batch_size_prints_and_saves_the_table_of_what_it_measured() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("bs");
    let so = ok(&[
        "tune",
        "batch-size",
        "--device",
        "cpu",
        "--data",
        DIGITS,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(so.contains("<- chosen") && so.contains("samples/s"), "{so}");
    let c = json(&out.join("batch_size.json"));
    let trials = c["trials"].as_array().unwrap();
    assert!(trials.len() >= 2, "{c}");
    let chosen = c["batch_size"].as_u64().unwrap();
    assert!(trials.iter().any(|t| t["batch_size"] == chosen), "{c}");
    for t in trials {
        assert!(t["samples_per_s"].as_f64().unwrap() > 0.0, "{t}");
        assert!(t["peak_bytes"].as_u64().unwrap() > 0, "{t}");
    }
    // Memory grows with the batch, and the choice is within 5% of the best throughput.
    let mut by_batch: Vec<(u64, u64, f64)> = trials
        .iter()
        .map(|t| {
            (
                t["batch_size"].as_u64().unwrap(),
                t["peak_bytes"].as_u64().unwrap(),
                t["samples_per_s"].as_f64().unwrap(),
            )
        })
        .collect();
    by_batch.sort_by_key(|t| t.0);
    assert!(
        by_batch.windows(2).all(|w| w[1].1 >= w[0].1),
        "peak memory not monotone in the batch: {by_batch:?}"
    );
    let best = by_batch.iter().map(|t| t.2).fold(0.0, f64::max);
    let picked = by_batch.iter().find(|t| t.0 == chosen).unwrap().2;
    assert!(
        picked * 1.05 >= best,
        "chose {chosen} at {picked}/s, best {best}/s"
    );
    // The search stopped for a stated reason: throughput, memory or the data's size.
    let why = c["stopped"].as_str().unwrap();
    assert!(
        why.contains("samples/s rose") || why.contains("memory") || why.contains("largest"),
        "{why}"
    );
    let csv = std::fs::read_to_string(out.join("batch_size.csv")).unwrap();
    assert_eq!(csv.lines().count(), trials.len() + 1);
}

#[test]
fn tune_lr_saves_the_curve_its_suggestion_and_a_chart() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("lr");
    let so = ok(&[
        "tune",
        "lr",
        "--device",
        "cpu",
        "--data",
        DIGITS,
        "--batch-size",
        "16",
        "--max-lr",
        "10",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(so.contains("lr auto:"), "{so}");
    let f = json(&out.join("lr.json"));
    let lr = f["curve"]["lr"].as_array().unwrap();
    let i = f["index"].as_u64().unwrap() as usize;
    assert!((10..lr.len()).contains(&i), "{f}");
    assert_eq!(f["lr"], lr[i]);
    // Rates rise from min_lr by Lightning's exponential rule.
    assert_eq!(lr[0].as_f64(), Some(1e-8));
    assert!(lr.windows(2).all(|w| w[1].as_f64() > w[0].as_f64()));
    let page = std::fs::read_to_string(out.join("lr.html")).unwrap();
    assert!(page.contains("data-chart=\"lr-finder\"") && page.contains("<svg"));
}

#[test]
fn auto_flags_are_measured_recorded_as_numbers_and_not_searched_again_on_resume() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let so = train_in(
        &run,
        &[
            "--data",
            DIGITS,
            "--batch-size",
            "auto",
            "--lr",
            "auto",
            "--epochs",
            "2",
            "--threads",
            "1",
        ],
    );
    assert!(
        so.contains("batch size auto:") && so.contains("lr auto:"),
        "{so}"
    );
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let table: toml::Table = toml::from_str(&config).unwrap();
    let (batch, lr) = (
        table["batch-size"].as_integer().unwrap(),
        table["lr"].as_float().unwrap(),
    );
    let s = json(&run.join("summary.json"));
    assert_eq!(s["batch_size"].as_i64(), Some(batch), "{s}");
    assert!(
        s["batch_size_choice"].as_str().unwrap().contains("auto"),
        "{s}"
    );
    assert!(s["lr_choice"].as_str().unwrap().contains("steepest"), "{s}");
    let found = json(&run.join("tune_lr.json"));
    assert_eq!(found["lr"].as_f64(), Some(lr));
    assert!(run.join("tune_batch_size.json").is_file());
    let page = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(page.contains("data-chart=\"lr-finder\""));
    // A resume reads the numbers: no search, the same identity.
    let again = ok(&["train", "--resume", run.to_str().unwrap(), "--epochs", "3"]);
    assert!(
        !again.contains("batch size auto:") && !again.contains("lr auto:"),
        "{again}"
    );
    assert!(again.contains("resuming"), "{again}");
}

/// Before: `tune lr` ignored the first SIGINT (only a second one, with no
/// message, ended it), and `--steps` had no bound: `--steps 100000000000`
/// ran for more than 10 minutes.
#[test]
fn tune_lr_stops_at_the_first_signal_and_bounds_its_steps() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let t = tempfile::tempdir().unwrap();
    let base = [
        "tune",
        "lr",
        "--device",
        "cpu",
        "--data",
        DIGITS,
        "--batch-size",
        "16",
        "--threads",
        "1",
        "--max-lr",
        "1e-6",
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(base)
        .args(["--steps", "100000", "--out"])
        .arg(t.path().join("lr"))
        .current_dir(common::root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The signal comes once the range test runs.
    assert!(lines.any(|l| l.is_ok_and(|l| l.starts_with("lr range test:"))));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed().as_secs() > 60 {
            let _ = child.kill();
            panic!("tune lr still ran 60 s after SIGINT");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{se}");
    assert!(
        se.contains("interrupted by SIGINT while running the learning-rate range test"),
        "{se}"
    );
    let refused = common::redline(&[&base[..], &["--steps", "100000000000"]].concat());
    let se = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        se.contains("--steps 100000000000: give 2 to 100000"),
        "{se}"
    );
}

#[test]
fn tune_workers_times_the_streamed_pipeline_and_refuses_resident_data() {
    let t = tempfile::tempdir().unwrap();
    common::image_folder(t.path(), 10);
    let data = t.path().to_str().unwrap();
    let out = t.path().join("tw");
    let text = common::ok(&[
        "tune",
        "workers",
        "--device",
        "cpu",
        "--data",
        data,
        "--augment",
        "random-resized-crop=16,hflip",
        "--batch-size",
        "8",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        text.contains("workers  images/s  peak RSS") && text.contains("<- chosen"),
        "{text}"
    );
    let csv = std::fs::read_to_string(out.join("workers.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    // One row per count (1, 2, 4, ... up to the cores), exactly one chosen,
    // every rate positive.
    assert!(!rows.is_empty() && rows[0].starts_with("1,"), "{csv}");
    assert_eq!(
        rows.iter().filter(|r| r.ends_with(",true")).count(),
        1,
        "{csv}"
    );
    for r in &rows {
        let rate: f64 = r.split(',').nth(1).unwrap().parse().unwrap();
        assert!(rate > 0.0, "{csv}");
    }
    let chosen = common::json(&out.join("workers.json"))["workers"]
        .as_u64()
        .unwrap();
    assert!(
        text.contains(&format!("train with --workers {chosen}")),
        "{text}"
    );
    let m = common::fails(&[
        "tune",
        "workers",
        "--device",
        "cpu",
        "--data",
        data,
        "--image-size",
        "16",
        "--stream",
        "off",
    ]);
    assert!(
        m.contains("decoded into memory once (resident)") && m.contains("--stream on"),
        "{m}"
    );
}
