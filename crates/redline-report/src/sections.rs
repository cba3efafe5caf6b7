//! The report's sections below the header, each saying why when its file is missing.

use std::fmt::Write as _;

use crate::advice::advice as run_advice;
use crate::charts::{self, category_color};
use crate::error::Result;
use crate::html::{esc, figure, missing, swatch};
use crate::records::{Category, GpuBusy};
use crate::run::RunData;

fn section(id: &str, title: &str, body: &str) -> String {
    format!(r#"<section id="{id}"><h2>{title}</h2>{body}</section>"#)
}

/// Why there are no training curves.
fn no_metrics(run: &RunData, what: &str) -> String {
    if run.has_metrics {
        missing(&format!("metrics.jsonl has no {what}"))
    } else {
        missing("metrics.jsonl is missing: the run logged nothing")
    }
}

/// Advice as a coloured list, warnings first.
pub(crate) fn advice(run: &RunData) -> String {
    let items = run_advice(run);
    if items.is_empty() {
        return section(
            "advice",
            "Advice",
            &missing("no advice: the rules need summary.json, breakdown.json or system samples"),
        );
    }
    let mut body = String::from(r#"<ul class="advice">"#);
    for a in items {
        let lvl = a.level.as_str();
        let _ = write!(
            body,
            r#"<li class="{lvl}"><b>{lvl}</b> {}</li>"#,
            esc(&a.text)
        );
    }
    body.push_str("</ul>");
    section("advice", "Advice", &body)
}

/// Loss, the step's headline metric (accuracy for classification) and throughput.
pub(crate) fn training(run: &RunData) -> Result<String> {
    let mut out = String::new();
    let loss = match charts::loss(run)? {
        Some(c) => figure(&c),
        None => no_metrics(run, "loss values"),
    };
    out.push_str(&section("loss", "Loss curves", &loss));
    if let Some(c) = charts::lr(run)? {
        out.push_str(&section("lr", "Learning rate", &figure(&c)));
    }
    if let Some(f) = &run.lr_finder {
        if let Some(c) = charts::lr_finder(&f.curve.lr, &f.curve.smoothed, f.index)? {
            out.push_str(&section(
                "lr-finder",
                "Learning-rate finder (--lr auto)",
                &figure(&c),
            ));
        }
    }
    let acc = match charts::metric(run)? {
        Some(c) => figure(&c),
        None => no_metrics(run, "epoch records with a metric"),
    };
    let thr = match charts::throughput(run)? {
        Some(c) => figure(&c),
        None => no_metrics(run, "step records with throughput"),
    };
    out.push_str(&section(
        "accuracy",
        "Metrics and throughput",
        &format!(r#"<div class="grid2"><div>{acc}</div><div>{thr}</div></div>"#),
    ));
    Ok(out)
}

/// The donut with its legend table, then the per-step timeline.
pub(crate) fn breakdown(run: &RunData) -> Result<String> {
    let Some(b) = &run.breakdown else {
        return Ok(section(
            "breakdown",
            "Time breakdown",
            &missing(
                "breakdown.json is missing: it is written when a run ends, so a run that was \
                 stopped early has none",
            ),
        ));
    };
    let mut body = String::new();
    let mut legend = String::from(
        r#"<table class="legend-table"><tr><th>category</th><th class="n">% of wall</th><th class="n">seconds</th></tr>"#,
    );
    for cat in Category::ALL {
        let (p, s) = b
            .share(cat)
            .map_or((f64::NAN, f64::NAN), |c| (c.percent, c.seconds));
        let _ = write!(
            legend,
            r#"<tr><td>{}{}</td><td class="n">{p:.1}%</td><td class="n">{s:.3}</td></tr>"#,
            swatch(category_color(cat)),
            cat.key()
        );
    }
    let _ = write!(
        legend,
        r#"<tr><td><b>wall</b></td><td class="n">100%</td><td class="n"><b>{:.3}</b></td></tr></table>"#,
        b.wall_s
    );
    if !b.rule.is_empty() {
        let _ = write!(legend, r#"<p class="note">{}</p>"#, esc(&b.rule));
    }
    if let Some(line) = crate::advice::efficiency_line(run) {
        let _ = write!(legend, r#"<p class="note">{}</p>"#, esc(&line));
    }
    match charts::pie(b)? {
        Some(c) => {
            let _ = write!(
                body,
                r#"<div class="pie">{}<div>{legend}</div></div>"#,
                figure(&c)
            );
        }
        None => {
            body.push_str(&missing("breakdown.json records no time"));
            body.push_str(&legend);
        }
    }
    match charts::timeline(b)? {
        Some(c) => body.push_str(&figure(&c)),
        None => body.push_str(&missing("breakdown.json has no per-step timeline")),
    }
    if let Some(g) = &b.gpu {
        body.push_str(&gpu_kernels(g));
    }
    if let Some(table) = rank_table(run) {
        body.push_str(&table);
    }
    Ok(section("breakdown", "Time breakdown", &body))
}

/// One rank of a data-parallel run as `summary.json`'s `ranks` holds it.
#[derive(serde::Deserialize)]
struct RankRow {
    rank: usize,
    train_s: f64,
    seconds: Vec<(String, f64)>,
}

/// Data-parallel runs: each rank's seconds per category, and which rank
/// the others waited for (the one that spent least time in the all-reduce:
/// the others waited there for it) and in what it spent the difference.
/// `None` for one process or a `ranks` field that does not parse.
fn rank_table(run: &RunData) -> Option<String> {
    let value = run.summary.as_ref()?.other.get("ranks")?;
    let rows: Vec<RankRow> = serde_json::from_value(value.clone()).ok()?;
    if rows.len() < 2 {
        return None;
    }
    let get = |r: &RankRow, key: &str| {
        r.seconds
            .iter()
            .find(|(k, _)| k == key)
            .map_or(0.0, |(_, s)| *s)
    };
    let mut h = String::from(
        r#"<h3>Ranks</h3><table class="legend-table"><tr><th>rank</th><th class="n">train s</th>"#,
    );
    for cat in Category::ALL {
        let _ = write!(h, r#"<th class="n">{}</th>"#, cat.key());
    }
    h.push_str("</tr>");
    for r in &rows {
        let _ = write!(
            h,
            r#"<tr><td>{}</td><td class="n">{:.3}</td>"#,
            r.rank, r.train_s
        );
        for cat in Category::ALL {
            let _ = write!(h, r#"<td class="n">{:.3}</td>"#, get(r, cat.key()));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    let comm = Category::Communication.key();
    let slowest = rows
        .iter()
        .filter(|r| get(r, comm).is_finite())
        .min_by(|a, b| get(a, comm).total_cmp(&get(b, comm)))?;
    let waited = rows
        .iter()
        .map(|r| get(r, comm))
        .filter(|s| s.is_finite())
        .fold(f64::NEG_INFINITY, f64::max);
    // Where the slowest rank spent the time the others waited: the category
    // it spent most more in than the rank that waited longest.
    let fastest = rows
        .iter()
        .find(|r| get(r, comm) == waited)
        .unwrap_or(slowest);
    let why = Category::ALL
        .iter()
        .filter(|c| **c != Category::Communication && **c != Category::Idle)
        .map(|c| (c.key(), get(slowest, c.key()) - get(fastest, c.key())))
        .filter(|(_, d)| d.is_finite())
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let _ = write!(
        h,
        "<p class=\"note\">The slowest rank is rank {}: the others waited for it in the \
         gradient all-reduce (up to {:.3} s more than it did){}.</p>",
        slowest.rank,
        (waited - get(slowest, comm)).max(0.0),
        match why {
            Some((key, d)) if d > 0.0 => format!("; it spent {d:.3} s more in {key}"),
            _ => String::new(),
        }
    );
    Some(h)
}

/// The GPU's kernel time and its longest-running kernels (`breakdown.json` `gpu`).
fn gpu_kernels(g: &GpuBusy) -> String {
    let mut h = format!(
        r#"<h3>GPU kernels</h3><p class="note">{}</p>"#,
        esc(&g.line())
    );
    if g.top.is_empty() {
        return h;
    }
    h.push_str(
        r#"<table class="kernels"><tr><th>kernel (longest total first)</th><th class="n">calls</th><th class="n">total ms</th><th class="n">mean µs</th><th class="n">% of kernel time</th></tr>"#,
    );
    for r in &g.top {
        let _ = write!(
            h,
            r#"<tr><td class="kname" title="{name}">{name}</td><td class="n">{}</td><td class="n">{:.3}</td><td class="n">{:.2}</td><td class="n">{:.1}</td></tr>"#,
            r.calls,
            r.total_ms,
            r.mean_us,
            r.percent,
            name = esc(&r.name),
        );
    }
    h.push_str("</table>");
    h
}

/// Host CPU and memory, GPU utilization and memory.
pub(crate) fn device(run: &RunData) -> Result<String> {
    if run.system.is_empty() {
        let why = if run.has_metrics {
            "no system samples in metrics.jsonl: the monitor was off or the run ended before \
             its first sample"
        } else {
            "metrics.jsonl is missing: no system samples"
        };
        return Ok(section("device", "Device stats", &missing(why)));
    }
    let charts = charts::device_charts(run)?;
    let mut body = String::from(r#"<div class="grid2">"#);
    for c in &charts {
        let _ = write!(body, "<div>{}</div>", figure(c));
    }
    body.push_str("</div>");
    if !charts.iter().any(|c| c.name.starts_with("gpu")) {
        let note = run
            .system
            .iter()
            .rev()
            .find_map(|r| r.gpu_note.clone())
            .unwrap_or_else(|| "no GPU samples".into());
        let _ = write!(body, r#"<p class="note">GPU: {}</p>"#, esc(&note));
    }
    Ok(section("device", "Device stats", &body))
}

/// The profiler table with a bar per row.
pub(crate) fn profile(run: &RunData) -> String {
    let Some(p) = &run.profile else {
        return section(
            "profile",
            "Profiler",
            &missing("profile.json is missing: run with --profiler simple or --profiler detailed"),
        );
    };
    let max = p
        .rows
        .iter()
        .map(|r| r.percent)
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let fmt = |x: f64, d: usize| {
        if x.is_finite() {
            format!("{x:.d$}")
        } else {
            "—".into()
        }
    };
    let mut body = format!(
        r#"<p class="note">mode {} · wall {} s</p><table><tr><th>action</th><th class="n">calls</th><th class="n">mean ms</th><th class="n">total s</th><th class="n">%</th><th></th></tr>"#,
        esc(&p.mode),
        fmt(p.wall_s, 3)
    );
    for r in &p.rows {
        let w = if r.percent.is_finite() {
            r.percent.clamp(0.0, max) / max * 100.0
        } else {
            0.0
        };
        let _ = write!(
            body,
            r#"<tr><td>{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td><td class="barcell"><div class="bar" style="width:{w:.1}%"></div></td></tr>"#,
            esc(&r.action),
            r.calls,
            fmt(r.mean_ms, 3),
            fmt(r.total_s, 3),
            fmt(r.percent, 1),
        );
    }
    body.push_str("</table>");
    section("profile", "Profiler", &body)
}

/// `config.toml` verbatim.
pub(crate) fn config(run: &RunData) -> String {
    let body = match &run.config {
        Some(c) => format!(r#"<pre class="config">{}</pre>"#, esc(c)),
        None => missing("config.toml is missing"),
    };
    section("config", "Config", &body)
}
