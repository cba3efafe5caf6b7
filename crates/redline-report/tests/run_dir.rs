//! Reading run directories: a full one, one with files missing, corrupt files.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{write_run, Fixture};
use redline_report::{advice, render_html, write_report, Error, Level, RunData, RunStatus};

#[test]
fn full_run_loads_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    write_run(tmp.path(), &Fixture::default());
    let run = RunData::load(tmp.path()).unwrap();
    let s = run.summary.as_ref().unwrap();
    assert_eq!(s.status, RunStatus::Finished);
    assert_eq!(s.batch_size, Some(64));
    assert_eq!(run.epochs.len(), 10);
    assert_eq!(run.steps.len(), 9380 / 50);
    assert!(run.system.len() > 10);
    let b = run.breakdown.as_ref().unwrap();
    assert_eq!(b.categories.len(), 6);
    assert!(!b.timeline.rows.is_empty() && b.timeline.rows.len() <= 400);
    assert_eq!(
        run.profile.as_ref().unwrap().rows.last().unwrap().action,
        "other"
    );
    assert!(run.config.as_ref().unwrap().contains("batch_size = 64"));
    assert!(run.notes.is_empty());
}

#[test]
fn write_report_replaces_the_page_and_leaves_no_temp_file() {
    let tmp = tempfile::tempdir().unwrap();
    write_run(tmp.path(), &Fixture::default());
    std::fs::write(tmp.path().join("report.html"), "old").unwrap();
    let path = write_report(tmp.path()).unwrap();
    assert_eq!(path, tmp.path().join("report.html"));
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_ne!(
            mode & 0o044,
            0,
            "report.html is readable by others: {mode:o}"
        );
    }
    for chart in [
        "loss",
        "accuracy",
        "throughput",
        "breakdown",
        "timeline",
        "host-cpu",
        "memory",
    ] {
        assert!(html.contains(&format!("data-chart=\"{chart}\"")), "{chart}");
    }
    assert!(
        html.contains("&lt;b&gt;escaped&lt;/b&gt; &amp; kept"),
        "config is escaped"
    );
    // Self-contained: nothing is fetched.
    for needle in ["http://", "https://", "<link", "src="] {
        let hits: Vec<&str> = html.matches(needle).collect();
        let allowed = if needle == "http://" {
            html.matches("http://www.w3.org/2000/svg").count()
        } else {
            0
        };
        assert_eq!(hits.len(), allowed, "{needle}");
    }
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with(".report.html")),
        "{names:?}"
    );
}

#[test]
fn missing_files_are_named_in_their_sections() {
    let tmp = tempfile::tempdir().unwrap();
    let f = Fixture {
        status: "failed",
        epochs: 3,
        breakdown: false,
        system: false,
        profile: false,
        ..Fixture::default()
    };
    write_run(tmp.path(), &f);
    let run = RunData::load(tmp.path()).unwrap();
    assert_eq!(run.summary.as_ref().unwrap().status, RunStatus::Failed);
    assert!(run.breakdown.is_none() && run.profile.is_none() && run.system.is_empty());
    let html = render_html(&run).unwrap();
    assert!(html.contains(r#"<span class="badge failed">failed</span>"#));
    assert!(
        html.contains("loss is NaN at step 2101"),
        "the error is shown"
    );
    assert!(html.contains("breakdown.json is missing"));
    assert!(html.contains("no system samples in metrics.jsonl"));
    assert!(html.contains("profile.json is missing"));
    assert!(html.contains(r#"data-chart="loss""#), "curves still drawn");
    assert!(!html.contains(r#"data-chart="breakdown""#));
    // Only the summary's numbers are left to judge.
    let a = advice(&run);
    assert!(a
        .iter()
        .any(|a| a.level == Level::Good && a.text.contains("host syncs per step")));
    assert!(!a.iter().any(|a| a.text.contains("threads oversubscribed")));
}

#[test]
fn run_with_only_a_config_still_renders() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config.toml"), "model = \"cnn\"\n").unwrap();
    let html = render_html(&RunData::load(tmp.path()).unwrap()).unwrap();
    assert!(html.contains("summary.json is missing"));
    assert!(html.contains("metrics.jsonl is missing"));
    assert!(html.contains("model = &quot;cnn&quot;"));
}

#[test]
fn corrupt_json_names_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    write_run(tmp.path(), &Fixture::default());
    std::fs::write(
        tmp.path().join("breakdown.json"),
        "{\n  \"wall_s\": 3.5,\n  \"categories\": [ {\"name\": \"compute\",, } ]\n}\n",
    )
    .unwrap();
    let err = RunData::load(tmp.path()).unwrap_err();
    assert!(matches!(err, Error::Json { line: 3, .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("breakdown.json:3:"), "{msg}");
    assert!(msg.contains("HINT"), "{msg}");
}

#[test]
fn corrupt_metrics_line_is_skipped_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    write_run(tmp.path(), &Fixture::default());
    let path = tmp.path().join("metrics.jsonl");
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    lines[6] = r#"{"kind":"step","step":"three"}"#.into();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    // Skipped and counted (issue 53): one bad line never costs the report.
    let run = RunData::load(tmp.path()).unwrap();
    let notes = run.notes.join("\n");
    assert!(
        notes.contains("1 line is not a record and was skipped (line 7;"),
        "{notes}"
    );
}

#[test]
fn not_a_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let msg = RunData::load(tmp.path()).unwrap_err().to_string();
    assert!(msg.contains("not a run directory"), "{msg}");
    let msg = RunData::load(&tmp.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("nope"), "{msg}");
}

#[test]
fn a_gpu_run_says_how_its_device_was_chosen_and_whether_it_replayed_a_graph() {
    let tmp = tempfile::tempdir().unwrap();
    write_run(
        tmp.path(),
        &Fixture {
            device: "cuda:0",
            ..Fixture::default()
        },
    );
    let html = render_html(&RunData::load(tmp.path()).unwrap()).unwrap();
    assert!(
        html.contains("device auto: cuda:0, 0.210 ms per step against 0.360 ms on cpu"),
        "no device choice"
    );
    assert!(html.contains("cuda graph: on (the step captured at step 3"));
    assert!(html.contains("matmul precision: highest (fp32 products)"));
    assert!(
        html.contains("convolutions: cuDNN 9.19.0"),
        "no convolution backend"
    );
    // The GPU's kernel time beside NVML's utilization, as a note and a card.
    assert!(
        html.contains("GPU busy 41.5% of wall (")
            && html
                .contains("40.0 kernels per step, 3.1 µs each on average; NVML mean utilization"),
        "no GPU busy note"
    );
    assert!(
        html.contains(r#"<div class="v">41.5%</div><div class="k">GPU busy (kernel time)</div>"#)
    );
    // The breakdown lists the longest kernels.
    assert!(html.contains("<h3>GPU kernels</h3>"));
    assert!(html.contains(r#"<td class="kname" title="gemm_f32">gemm_f32</td>"#));
    // Without its breakdown the figure is missing, and the card says so.
    std::fs::remove_file(tmp.path().join("breakdown.json")).unwrap();
    let html = render_html(&RunData::load(tmp.path()).unwrap()).unwrap();
    assert!(html.contains(r#"<div class="v">—</div><div class="k">GPU busy (kernel time)</div>"#));
    assert!(!html.contains("GPU busy 41.5%"));
    // On the CPU the graph's absence is no news, and there was no choice.
    let cpu = tempfile::tempdir().unwrap();
    write_run(cpu.path(), &Fixture::default());
    let html = render_html(&RunData::load(cpu.path()).unwrap()).unwrap();
    assert!(
        !html.contains("cuda graph:")
            && !html.contains("device auto:")
            && !html.contains("matmul precision")
            && !html.contains("convolutions:")
    );
    assert!(!html.contains("GPU busy") && !html.contains("GPU kernels"));
}
