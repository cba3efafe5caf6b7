//! Opens a page in headless Chromium: reads the counts the page's on-load
//! script leaves on `<body>` (`data-charts`, `data-charts-ok`), collects
//! console output from Chromium's stderr log, and optionally takes a screenshot.

use std::path::Path;
use std::process::Command;

/// What one page did in Chromium.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCheck {
    /// `<body data-charts="N">` after load: how many charts the page has;
    /// `None` when the on-load script did not set it.
    pub charts: Option<usize>,
    /// `<body data-charts-ok="N">` after load: how many charts laid out with a
    /// size; `None` when the on-load script did not set it.
    pub charts_ok: Option<usize>,
    /// Console output while loading the page (see [`console_lines`]); a page
    /// that logs nothing leaves this empty.
    pub console_lines: Vec<String>,
    /// Size of the screenshot, when one was asked for.
    pub screenshot_bytes: Option<u64>,
}

impl PageCheck {
    /// Asserts what every Redline report must do in the browser: log nothing
    /// to the console, have at least `min_charts` charts, all laid out with a
    /// size, and (when a screenshot was taken) render to more than
    /// `min_screenshot_bytes`, which a blank page does not reach. Returns
    /// the number of charts.
    ///
    /// # Panics
    /// When any of that does not hold; the panic names the caller's line.
    #[track_caller]
    pub fn assert_report_renders(&self, min_charts: usize, min_screenshot_bytes: u64) -> usize {
        assert!(
            self.console_lines.is_empty(),
            "console output from the report:\n{}",
            self.console_lines.join("\n")
        );
        let (Some(total), Some(ok)) = (self.charts, self.charts_ok) else {
            panic!("the on-load script did not set data-charts and data-charts-ok: {self:?}");
        };
        assert!(total >= min_charts, "only {total} charts");
        assert_eq!(ok, total, "{ok} of {total} charts have a size");
        if let Some(size) = self.screenshot_bytes {
            assert!(
                size > min_screenshot_bytes,
                "screenshot is {size} bytes, want > {min_screenshot_bytes}"
            );
        }
        total
    }
}

/// Loads `page` (an HTML file) in headless Chromium `bin` and reports what it
/// did; with `screenshot_png`, loads it again at 1280x4000 and saves a
/// screenshot there (an old file at that path is removed first).
///
/// Console lines come from the first (`--dump-dom`) load only. `Err` when
/// Chromium cannot start, exits with an error, or writes no screenshot.
pub fn check_page(
    bin: &Path,
    page: &Path,
    screenshot_png: Option<&Path>,
) -> Result<PageCheck, String> {
    let (dom, stderr) = run(bin, page, &["--dump-dom".to_owned()])?;
    let mut check = PageCheck {
        charts: body_attr(&dom, "data-charts"),
        charts_ok: body_attr(&dom, "data-charts-ok"),
        console_lines: console_lines(&stderr)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        screenshot_bytes: None,
    };
    if let Some(png) = screenshot_png {
        let _ = std::fs::remove_file(png);
        let (_, stderr) = run(
            bin,
            page,
            &[
                format!("--screenshot={}", png.display()),
                "--window-size=1280,4000".to_owned(),
            ],
        )?;
        let size = std::fs::metadata(png)
            .map_err(|e| format!("no screenshot at {}: {e}\n{stderr}", png.display()))?
            .len();
        check.screenshot_bytes = Some(size);
    }
    Ok(check)
}

/// Runs Chromium headless on `page` with `extra` flags, in a throwaway
/// profile; returns (stdout, stderr).
fn run(bin: &Path, page: &Path, extra: &[String]) -> Result<(String, String), String> {
    // A fresh profile per run: a shared one would be locked by a parallel test.
    let profile = tempfile::tempdir().map_err(|e| format!("profile dir: {e}"))?;
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=2000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("chromium failed ({}): {stderr}", out.status));
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), stderr))
}

/// Console output in Chromium's stderr log. Chromium 156 writes every console
/// message, whatever its level, as
/// `[pid:tid:date:INFO:CONSOLE:12] "Uncaught ReferenceError: ...", source: file:///... (12)`
/// (older versions: `INFO:CONSOLE(12)`), so `console.error` cannot be told from
/// `console.log` by the prefix. The report logs nothing, so every console line
/// is a failure: an uncaught exception, a `console.error`, or a resource that
/// failed to load. The rest of stderr (D-Bus, GPU process) is browser noise.
pub fn console_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE:") || l.contains(":CONSOLE("))
        .collect()
}

/// `NAME="VALUE"` of the `<body>` tag in a dumped DOM, as a number.
fn body_attr(dom: &str, name: &str) -> Option<usize> {
    let body = &dom[dom.find("<body")?..];
    let tag = &body[..body.find('>')?];
    let key = format!("{name}=\"");
    let rest = &tag[tag.find(&key)? + key.len()..];
    rest[..rest.find('"')?].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_are_picked_out_of_browser_noise() {
        let stderr = "\
[1:2:1122/031000.1:ERROR:bus.cc(407)] Failed to connect to the bus
[1:2:1122/031000.2:INFO:CONSOLE:3] \"Uncaught ReferenceError: x is not defined\", source: file:///r.html (3)
[1:2:1122/031000.3:INFO:CONSOLE(7)] \"deliberate\", source: file:///r.html (7)
[1:9:1122/031000.4:WARNING:gpu_init.cc(1)] GPU disabled
";
        let lines = console_lines(stderr);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("Uncaught ReferenceError"));
        assert!(lines[1].contains("deliberate"));
        assert!(console_lines("[1:2:x:ERROR:bus.cc(407)] no bus\n").is_empty());
    }

    #[test]
    fn body_attributes_are_read_from_the_body_tag_only() {
        let dom = r#"<html><head><meta data-charts="99"></head>
<body class="x" data-charts="8" data-charts-ok="7"><div data-charts="1"></div></body></html>"#;
        assert_eq!(body_attr(dom, "data-charts"), Some(8));
        assert_eq!(body_attr(dom, "data-charts-ok"), Some(7));
        assert_eq!(body_attr(dom, "data-missing"), None);
        // Set on a child only, or not a number: not reported.
        assert_eq!(
            body_attr(r#"<body><div data-charts="1"></div></body>"#, "data-charts"),
            None
        );
        assert_eq!(
            body_attr(r#"<body data-charts="many">"#, "data-charts"),
            None
        );
        assert_eq!(body_attr("<html></html>", "data-charts"), None);
    }
}
