//! Opens a generated report in headless Chromium: every chart must lay out with
//! a size, the page must log nothing to the console, and a screenshot is taken.
//!
//! Chromium is found by `redline_testkit::tools::chromium`. Without it the
//! test is skipped, unless `REDLINE_REQUIRE_TOOLS=1`, where it fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use common::{write_run, Fixture};
use redline_testkit::{check_page, tools};

#[test]
fn console_detector_catches_a_deliberate_error() {
    let Some(bin) = tools::need_chromium() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let page = tmp.path().join("broken.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><body><script>console.error('deliberate'); \
         window.addEventListener('load', function () { notDefined(); });</script></body></html>",
    )
    .unwrap();
    let lines = check_page(&bin, &page, None)
        .unwrap_or_else(|e| panic!("{e}"))
        .console_lines;
    assert!(
        lines.iter().any(|l| l.contains("Uncaught ReferenceError")),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l.contains("deliberate")), "{lines:?}");
}

/// Renders `fixture`, checks the charts and the console, screenshots it to `png`.
fn check_report(bin: &Path, fixture: &Fixture, png: &Path) -> usize {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("20261122-031000-mlp");
    write_run(&dir, fixture);
    let page = redline_report::write_report(&dir).unwrap();

    let check = check_page(bin, &page, Some(png)).unwrap_or_else(|e| panic!("{e}"));
    let total = check.assert_report_renders(6, 50_000);
    std::fs::copy(&page, png.with_extension("html")).unwrap();
    eprintln!(
        "{} ({}): {total} charts laid out, no console output, screenshot {} ({} bytes)",
        fixture.device,
        bin.display(),
        png.display(),
        check.screenshot_bytes.unwrap_or(0)
    );
    total
}

#[test]
fn report_renders_every_chart_without_console_errors() {
    let Some(bin) = tools::need_chromium() else {
        return;
    };
    let shots = tempfile::tempdir().unwrap();
    let keep = std::env::var_os("REDLINE_REPORT_SCREENSHOTS").map(PathBuf::from);
    let dir = keep.as_deref().unwrap_or(shots.path());
    std::fs::create_dir_all(dir).unwrap();

    let cpu = check_report(&bin, &Fixture::default(), &dir.join("report-cpu.png"));
    let gpu = Fixture {
        device: "cuda:0",
        ..Fixture::default()
    };
    let with_gpu = check_report(&bin, &gpu, &dir.join("report-gpu.png"));
    assert_eq!(with_gpu, cpu + 2, "GPU utilization and memory charts");
}
