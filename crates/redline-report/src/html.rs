//! `report.html`: one self-contained page (inline CSS and SVG, no network).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::style::RGBColor;

use crate::charts::{Chart, Swatch};
use crate::error::{Error, Result};
use crate::records::RunStatus;
use crate::run::RunData;
use crate::sections;

const CSS: &str = include_str!("report.css");

/// Counts the drawn charts once the page has laid out; the browser test reads
/// `data-charts` (all chart SVGs) and `data-charts-ok` (those with a size).
const SCRIPT: &str = r#"<script>
window.addEventListener("load", function () {
  var svgs = Array.prototype.slice.call(document.querySelectorAll(".chart svg"));
  var ok = svgs.filter(function (s) { var r = s.getBoundingClientRect(); return r.width > 0 && r.height > 0; });
  document.body.dataset.charts = String(svgs.length);
  document.body.dataset.chartsOk = String(ok.length);
});
</script>"#;

/// Escapes text for HTML element content and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// `#rrggbb`.
pub(crate) fn hex(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// A colour swatch for a legend.
pub(crate) fn swatch(c: RGBColor) -> String {
    format!(r#"<span class="sw" style="background:{}"></span>"#, hex(c))
}

/// A chart as `<figure class="chart" data-chart=...>` with its caption and legend.
pub(crate) fn figure(c: &Chart) -> String {
    let mut s = format!(
        r#"<figure class="chart" data-chart="{}"><figcaption>{}</figcaption>{}"#,
        c.name,
        esc(&c.title),
        c.svg
    );
    if !c.legend.is_empty() {
        s.push_str(r#"<ul class="legend">"#);
        for (label, color, kind) in &c.legend {
            let sw = match kind {
                Swatch::Fill => swatch(*color),
                Swatch::Line => format!(
                    r#"<span class="sw line" style="background:{}"></span>"#,
                    hex(*color)
                ),
                Swatch::Dashed => format!(
                    r#"<span class="sw dash" style="color:{}"></span>"#,
                    hex(*color)
                ),
            };
            let _ = write!(s, "<li>{sw}{}</li>", esc(label));
        }
        s.push_str("</ul>");
    }
    s.push_str("</figure>");
    s
}

/// A paragraph saying why a section is empty.
pub(crate) fn missing(text: &str) -> String {
    format!(r#"<p class="missing">{}</p>"#, esc(text))
}

/// `84500.4` -> `84,500`.
fn grouped(v: f64) -> String {
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < -0.5 {
        out.insert(0, '-');
    }
    out
}

fn num(x: Option<f64>, fmt: impl Fn(f64) -> String) -> String {
    x.filter(|v| v.is_finite()).map_or("—".into(), fmt)
}

fn header(run: &RunData) -> String {
    let dir_name = run.dir.file_name().map_or_else(
        || run.dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let Some(s) = &run.summary else {
        return format!(
            r#"<header class="top"><h1>{}</h1>{}</header>"#,
            esc(&dir_name),
            missing(
                "summary.json is missing: the run was stopped before it could write one; \
                 the sections below show what it logged"
            )
        );
    };
    let badge = match s.status {
        RunStatus::Finished => "finished",
        RunStatus::Failed => "failed",
        _ => "other",
    };
    let mut meta = vec![
        format!(
            r#"<span class="badge {badge}">{}</span>"#,
            esc(&s.status.to_string())
        ),
        format!("<span>started {}</span>", esc(&s.started)),
    ];
    let mut push = |label: &str, v: Option<String>| {
        if let Some(v) = v {
            meta.push(format!("<span>{label} {}</span>", esc(&v)));
        }
    };
    push("epochs", s.epochs.map(|v| v.to_string()));
    push("batch", s.batch_size.map(|v| v.to_string()));
    push("steps", s.steps.map(|v| v.to_string()));
    push("threads", s.threads.map(|v| v.to_string()));
    push("prefetch", s.prefetch.map(|v| v.to_string()));
    push("run", Some(dir_name));
    let mut h = format!(
        r#"<header class="top"><h1>{} on {}</h1><div class="meta">{}</div>"#,
        esc(&s.model),
        esc(run.device()),
        meta.concat()
    );
    if let Some(e) = s.error.as_deref().filter(|e| !e.is_empty()) {
        let _ = write!(h, r#"<div class="error">{}</div>"#, esc(e));
    }
    let mut cards = vec![
        match s.headline() {
            Some((k, v)) if k.ends_with("accuracy") => (k, format!("{:.2}%", 100.0 * v)),
            Some((k, v)) => (k, format!("{v:.4}")),
            None => ("test accuracy".into(), num(None, |v: f64| v.to_string())),
        },
        ("samples / s".into(), num(s.samples_per_s, grouped)),
        ("wall time".into(), num(s.wall_s, |v| format!("{v:.2} s"))),
        (
            "host syncs / step".into(),
            num(s.host_syncs_per_step, |v| format!("{v:.3}")),
        ),
    ];
    cards.push((
        "MFU (model FLOPs / peak)".into(),
        num(s.flops.as_ref().and_then(|f| f.mfu), |v| {
            format!("{:.1}%", 100.0 * v)
        }),
    ));
    if !run.is_cpu() {
        cards.push((
            "GPU busy (kernel time)".into(),
            num(run.gpu_busy().map(|g| g.percent), |v| format!("{v:.1}%")),
        ));
    }
    h.push_str(r#"<div class="cards">"#);
    for (k, v) in cards {
        let _ = write!(
            h,
            r#"<div class="card"><div class="v">{v}</div><div class="k">{}</div></div>"#,
            esc(&k)
        );
    }
    h.push_str("</div>");
    // How the device was chosen and whether the step ran as a CUDA graph
    // (the latter only on a GPU, where it is a question).
    let device_notes = [
        s.validation.as_ref().map(|v| format!("validation: {v}")),
        s.lr_schedule.as_ref().map(|v| format!("lr schedule: {v}")),
        s.stopped_early.clone(),
        s.short_run.clone(),
        resumed_note(s),
        s.device_choice.clone(),
        precision_note(s),
        memory_note(s),
        ranks_note(s),
        gpu_busy_note(run),
        s.cuda_graph
            .as_ref()
            .filter(|_| !run.is_cpu())
            .map(|g| format!("cuda graph: {g}")),
        s.matmul_precision
            .as_ref()
            .filter(|_| !run.is_cpu())
            .map(|p| format!("matmul precision: {p}")),
        s.gpu_conv
            .as_ref()
            .filter(|_| !run.is_cpu())
            .map(|c| format!("convolutions: {c}")),
    ];
    for n in device_notes.iter().flatten().chain(&run.notes) {
        let _ = write!(h, r#"<p class="note">{}</p>"#, esc(n));
    }
    h.push_str("</header>");
    h
}

/// `precision: bf16-mixed (how its products ran)` for a run not in fp32,
/// from `summary.json` `precision` and `precision_path`.
fn precision_note(s: &crate::records::Summary) -> Option<String> {
    let p = s.other.get("precision")?.as_str()?;
    if p == "32-true" {
        return None;
    }
    let path = s.other.get("precision_path").and_then(|v| v.as_str());
    let timing = s
        .other
        .get("precision_timing")
        .and_then(|v| v.as_str())
        .map_or(String::new(), |t| format!(". Measured at start: {t}"));
    Some(match path {
        Some(how) => format!("precision: {how}{timing}"),
        None => format!("precision: {p}{timing}"),
    })
}

/// `memory: parameters .., gradients .., optimizer state .., activations ..`
/// from `summary.json` `memory` (measured at the fit's first step).
fn memory_note(s: &crate::records::Summary) -> Option<String> {
    let m = s.other.get("memory")?;
    let part = |k: &str| m.get(k).and_then(|v| v.as_f64()).map(|b| b / 1048576.0);
    let (p, g, o, a) = (
        part("parameters")?,
        part("gradients")?,
        part("optimizer")?,
        part("activations")?,
    );
    let batch = m.get("batch").and_then(|v| v.as_u64()).unwrap_or(0);
    let by = m.get("measured_by").and_then(|v| v.as_str()).unwrap_or("?");
    Some(format!(
        "memory: parameters {p:.2} MiB, gradients {g:.2} MiB, optimizer state {o:.2} MiB, \
         activations {a:.2} MiB (batch {batch}, by {by}); {:.2} MiB in all",
        p + g + o + a
    ))
}

/// `data-parallel: N ranks (launcher)` for a run of several ranks, from
/// `summary.json` `world_size` and `launcher`.
fn ranks_note(s: &crate::records::Summary) -> Option<String> {
    let n = s.other.get("world_size")?.as_u64().filter(|&n| n > 1)?;
    let launcher = s
        .other
        .get("launcher")
        .and_then(|v| v.as_str())
        .unwrap_or("a launcher");
    Some(format!(
        "data-parallel (ddp): {n} ranks started by {launcher}; the numbers are rank 0's \
         times over every rank's samples, and the breakdown has a table per rank"
    ))
}

/// `resumed from step N (checkpoint ...)` for each `--resume` of the run,
/// from `summary.json` `resumed` (an edited entry shows as it is).
fn resumed_note(s: &crate::records::Summary) -> Option<String> {
    // Segments (newer runs): each with its start, steps, end and time.
    let segments: Option<Vec<redline_run::segments::Segment>> = s
        .other
        .get("segments")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .filter(|v: &Vec<_>| v.len() > 1);
    if let Some(segs) = segments {
        let parts: Vec<String> = segs
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let (_, at) = redline_run::folder::utc_stamp(g.started_unix);
                format!(
                    "{}) {at} from step {}{}, {} at step {} after {}",
                    i + 1,
                    g.from_step,
                    g.checkpoint.as_deref().map_or(String::new(), |c| format!(
                        " ({})",
                        redline_core::text::clip(c, 80)
                    )),
                    g.ended.as_deref().unwrap_or("running"),
                    g.to_step.map_or("?".to_string(), |t| t.to_string()),
                    g.wall_s().map_or("?".to_string(), |w| format!("{w:.2} s"))
                )
            })
            .collect();
        return Some(format!(
            "resumed: {} segments, {:.2} s of wall time in all: {}",
            segs.len(),
            redline_run::segments::total_wall_s(&segs),
            parts.join("; ")
        ));
    }
    let list = s.other.get("resumed")?.as_array()?;
    let parts: Vec<String> = list
        .iter()
        .map(
            |r| match (r.get("step").and_then(|v| v.as_u64()), r.get("at")) {
                (Some(step), Some(at)) => {
                    format!("from step {step} at {}", at.as_str().unwrap_or("?"))
                }
                _ => r.to_string(),
            },
        )
        .collect();
    (!parts.is_empty()).then(|| format!("resumed {}", parts.join("; ")))
}

/// On a GPU run: the kernel trace's busy figure beside NVML's mean
/// utilization, or why it was not measured.
fn gpu_busy_note(run: &RunData) -> Option<String> {
    if run.is_cpu() {
        return None;
    }
    let nvml = run.nvml_utilization().map_or_else(
        || "NVML utilization not sampled".to_string(),
        |(u, n)| format!("NVML mean utilization {u:.0}% over {n} samples"),
    );
    match (
        run.gpu_busy(),
        run.summary.as_ref()?.gpu_busy_note.as_deref(),
    ) {
        (Some(g), _) => Some(format!("{}; {nvml}", g.line())),
        (None, Some(why)) => Some(format!("GPU busy: {why}; {nvml}")),
        (None, None) => None,
    }
}

/// The whole report page for `run`.
pub fn render_html(run: &RunData) -> Result<String> {
    let title = match &run.summary {
        Some(s) => format!("{} on {} — {}", s.model, run.device(), s.started),
        None => run.dir.display().to_string(),
    };
    let mut page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Redline report: {}</title><style>{CSS}</style></head><body><main>",
        esc(&title)
    );
    page.push_str(&header(run));
    page.push_str(&sections::advice(run));
    page.push_str(&sections::training(run)?);
    page.push_str(&sections::breakdown(run)?);
    page.push_str(&sections::device(run)?);
    page.push_str(&sections::profile(run));
    page.push_str(&sections::config(run));
    let _ = writeln!(
        page,
        "<footer>redline report · {}</footer></main>{SCRIPT}</body></html>",
        esc(&run.dir.display().to_string())
    );
    Ok(page)
}

/// A page of its own for `redline tune lr`: the range test's curve, the
/// suggested point marked.
pub fn lr_finder_page(lr: &[f64], smoothed: &[f64], pick: Option<usize>) -> Result<String> {
    let smoothed: Vec<Option<f64>> = smoothed.iter().map(|v| Some(*v)).collect();
    let chart = match crate::charts::lr_finder(lr, &smoothed, pick)? {
        Some(c) => figure(&c),
        None => "<p class=\"note\">no finite point to draw</p>".into(),
    };
    let said = pick
        .and_then(|i| lr.get(i))
        .map_or("no suggestion".to_string(), |l| {
            format!("suggested learning rate {l:.3e}")
        });
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Redline: learning-rate range test</title><style>{CSS}</style></head><body><main>\
         <header><h1>Learning-rate range test</h1><p class=\"note\">{}: the steepest fall \
         of the smoothed loss ({} steps)</p></header>{chart}</main></body></html>",
        esc(&said),
        lr.len()
    ))
}

/// Reads the run in `dir` and writes `dir/report.html` whole (a temporary
/// file in the same folder, `fsync`, a rename; none left behind on failure),
/// so a reader never sees half a page. The page gets the mode any file the
/// user writes gets (0666 less the umask).
pub fn write_report(dir: &Path) -> Result<PathBuf> {
    let run = RunData::load(dir)?;
    let html = render_html(&run)?;
    let path = dir.join("report.html");
    redline_core::files::write_atomic(&path, html.as_bytes()).map_err(Error::io(path.clone()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn groups_thousands() {
        assert_eq!(grouped(84_500.4), "84,500");
        assert_eq!(grouped(1_234_567.0), "1,234,567");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(-1500.0), "-1,500");
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn empty_run_renders_with_every_section_saying_why() {
        let html = render_html(&RunData::default()).unwrap();
        for needle in [
            "summary.json is missing",
            "breakdown.json is missing",
            "config.toml is missing",
        ] {
            assert!(html.contains(needle), "{needle}");
        }
        assert!(!html.contains("<svg"));
    }
}
