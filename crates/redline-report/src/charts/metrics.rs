//! Line charts from `metrics.jsonl`: loss, accuracy, throughput and device stats.

use plotters::style::RGBColor;

use super::{line_chart, Axes, Chart, Mark, Series, Swatch, CYCLE, HALF, TEST, TRAIN, WIDE};
use crate::error::Result;
use crate::records::SystemRecord;
use crate::run::RunData;

/// Train loss per log window: a lighter shade of [`TRAIN`].
const TRAIN_STEPS: RGBColor = RGBColor(0x93, 0xc5, 0xfd);
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Drops series without points; `None` when none are left.
fn chart(
    name: &'static str,
    title: impl Into<String>,
    axes: Axes<'_>,
    series: Vec<Series>,
) -> Result<Option<Chart>> {
    let series: Vec<Series> = series
        .into_iter()
        .filter(|s| !s.points.is_empty())
        .collect();
    if series.is_empty() {
        return Ok(None);
    }
    let svg = line_chart(name, axes, &series)?;
    Ok(Some(Chart {
        name,
        title: title.into(),
        svg,
        legend: series
            .into_iter()
            .map(|s| {
                let swatch = if s.mark == Mark::Dashed {
                    Swatch::Dashed
                } else {
                    Swatch::Line
                };
                (s.label, s.color, swatch)
            })
            .collect(),
    }))
}

fn f(x: Option<f64>) -> f64 {
    x.unwrap_or(f64::NAN)
}

/// Train loss per log window and per epoch, test loss per epoch, against the
/// step (or against the epoch when there are no step records).
pub(crate) fn loss(run: &RunData) -> Result<Option<Chart>> {
    let by_step = !run.steps.is_empty();
    let ends = run.epoch_end_steps();
    let x = |i: usize| -> f64 {
        if by_step {
            ends[i].map_or(f64::NAN, |s| s as f64)
        } else {
            run.epochs[i].epoch as f64
        }
    };
    let epochs = || run.epochs.iter().enumerate();
    let series = vec![
        Series::new("train loss (log window)", TRAIN_STEPS, Mark::Line)
            .points(run.steps.iter().map(|s| (s.step as f64, f(s.loss)))),
        Series::new("train loss (epoch mean)", TRAIN, Mark::LineDots)
            .points(epochs().map(|(i, e)| (x(i), f(e.train_loss)))),
        Series::new("validation loss", TEST, Mark::LineDots)
            .points(epochs().map(|(i, e)| (x(i), f(e.val_loss)))),
    ];
    let axes = Axes {
        x: if by_step { "step" } else { "epoch" },
        x_whole: !by_step,
        y: "loss",
        y_from_zero: false,
        y_max: None,
        size: WIDE,
    };
    chart("loss", "Loss", axes, series)
}

/// The step's headline metric per epoch, train and validation: accuracy in
/// percent where the step reports it, else the first metric by name (`mae`).
pub(crate) fn metric(run: &RunData) -> Result<Option<Chart>> {
    let mut names: Vec<String> = run.epochs.iter().flat_map(|e| e.metric_names()).collect();
    names.sort();
    names.dedup();
    let Some(name) = names
        .iter()
        .find(|n| *n == "accuracy")
        .or_else(|| names.first())
    else {
        return Ok(None);
    };
    let accuracy = name == "accuracy";
    let scale = if accuracy { 100.0 } else { 1.0 };
    let points = |split: &'static str| {
        run.epochs
            .iter()
            .map(move |e| (e.epoch as f64, scale * f(e.metric(split, name))))
    };
    let series = vec![
        Series::new(format!("train {name}"), TRAIN, Mark::LineDots).points(points("train")),
        Series::new(format!("validation {name}"), TEST, Mark::LineDots).points(points("val")),
    ];
    let y = if accuracy {
        "accuracy (%)".to_string()
    } else {
        name.clone()
    };
    let axes = Axes {
        x: "epoch",
        x_whole: true,
        y: &y,
        y_from_zero: false,
        y_max: accuracy.then_some(100.0),
        size: HALF,
    };
    if accuracy {
        chart("accuracy", "Accuracy", axes, series)
    } else {
        chart("metric", name.clone(), axes, series)
    }
}

/// The learning rate at each log point against the step; `None` when it
/// never changed (a constant rate says nothing a chart would show).
pub(crate) fn lr(run: &RunData) -> Result<Option<Chart>> {
    let pts: Vec<(f64, f64)> = run
        .steps
        .iter()
        .filter_map(|s| Some((s.step as f64, s.lr?)))
        .filter(|p| p.1.is_finite())
        .collect();
    if pts.windows(2).all(|w| w[0].1 == w[1].1) {
        return Ok(None);
    }
    let axes = Axes {
        x: "step",
        x_whole: true,
        y: "learning rate",
        y_from_zero: true,
        y_max: None,
        size: HALF,
    };
    let series = vec![Series::new("lr (--lr-schedule)", CYCLE[1], Mark::Line).points(pts)];
    chart("lr", "Learning rate", axes, series)
}

/// The learning-rate range test: smoothed loss against log10 of the rate,
/// with the suggested point marked.
pub(crate) fn lr_finder(
    lr: &[f64],
    smoothed: &[Option<f64>],
    pick: Option<usize>,
) -> Result<Option<Chart>> {
    let pts: Vec<(f64, f64)> = lr
        .iter()
        .zip(smoothed)
        .filter_map(|(l, s)| Some((l.log10(), (*s)?)))
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    let marked: Vec<(f64, f64)> = pick
        .and_then(|i| Some((lr.get(i)?.log10(), (*smoothed.get(i)?)?)))
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .into_iter()
        .collect();
    let axes = Axes {
        x: "log10 learning rate",
        x_whole: false,
        y: "smoothed loss",
        y_from_zero: false,
        y_max: None,
        size: WIDE,
    };
    let series = vec![
        Series::new("smoothed loss", CYCLE[1], Mark::Line).points(pts),
        Series::new("suggested rate (steepest fall)", TEST, Mark::LineDots).points(marked),
    ];
    chart("lr-finder", "Learning-rate range test", axes, series)
}

/// Samples per second of each log window against seconds since training started.
pub(crate) fn throughput(run: &RunData) -> Result<Option<Chart>> {
    let series = vec![
        Series::new("samples/s (log window)", CYCLE[0], Mark::Line).points(
            run.steps
                .iter()
                .map(|s| (f(s.elapsed_s), f(s.samples_per_s))),
        ),
    ];
    let axes = Axes {
        x: "seconds since training started",
        x_whole: false,
        y: "samples/s",
        y_from_zero: true,
        y_max: None,
        size: HALF,
    };
    chart("throughput", "Throughput", axes, series)
}

/// (t_s, value) of every system record that has both.
fn over_time(
    system: &[SystemRecord],
    value: impl Fn(&SystemRecord) -> Option<f64>,
) -> Vec<(f64, f64)> {
    system
        .iter()
        .filter_map(|r| Some((r.t_s?, value(r)?)))
        .collect()
}

/// Host CPU and memory charts, then GPU utilization and memory when sampled.
pub(crate) fn device_charts(run: &RunData) -> Result<Vec<Chart>> {
    let sys = &run.system;
    let cores = sys
        .iter()
        .filter_map(|r| r.host.as_ref())
        .map(|h| h.cpu_percent_per_core.len())
        .max()
        .unwrap_or(0);
    let host_label = if cores > 0 {
        format!("host CPU, mean of {cores} cores (%)")
    } else {
        "host CPU (%)".into()
    };
    let secs = "seconds since the monitor started";
    let pct_axes = |size| Axes {
        x: secs,
        x_whole: false,
        y: "percent",
        y_from_zero: true,
        y_max: Some(100.0),
        size,
    };
    let gib_axes = |size| Axes {
        x: secs,
        x_whole: false,
        y: "GiB",
        y_from_zero: true,
        y_max: None,
        size,
    };
    let host = |v: fn(&crate::records::HostSample) -> Option<f64>| {
        over_time(sys, move |r| r.host.as_ref().and_then(v))
    };
    let gib = |v: Option<f64>| v.map(|b| b / GIB);
    let mut out = Vec::new();
    out.extend(chart(
        "host-cpu",
        "CPU",
        pct_axes(HALF),
        vec![
            Series::new(host_label, CYCLE[0], Mark::Line).points(host(|h| h.cpu_percent)),
            Series::new("redline process (% of one core)", CYCLE[1], Mark::Line)
                .points(host(|h| h.process_cpu_percent)),
        ],
    )?);
    out.extend(chart(
        "memory",
        "Host memory",
        gib_axes(HALF),
        vec![
            Series::new("host used", CYCLE[3], Mark::Line).points(
                host(|h| h.memory_used)
                    .into_iter()
                    .map(|(t, b)| (t, b / GIB)),
            ),
            Series::new("host total", AXIS_GREY, Mark::Dashed).points(
                host(|h| h.memory_total)
                    .into_iter()
                    .map(|(t, b)| (t, b / GIB)),
            ),
            Series::new("redline process (RSS)", CYCLE[1], Mark::Line).points(
                host(|h| h.process_rss)
                    .into_iter()
                    .map(|(t, b)| (t, b / GIB)),
            ),
        ],
    )?);

    let mut indices: Vec<u64> = sys
        .iter()
        .flat_map(|r| r.gpus.iter().map(|g| g.index))
        .collect();
    indices.sort_unstable();
    indices.dedup();
    let mut util = Vec::new();
    let mut mem = Vec::new();
    for (k, &i) in indices.iter().enumerate() {
        let color = CYCLE[k % CYCLE.len()];
        let gpu = |v: &dyn Fn(&crate::records::GpuSample) -> Option<f64>| {
            over_time(sys, |r| r.gpus.iter().find(|g| g.index == i).and_then(v))
        };
        util.push(
            Series::new(format!("GPU {i} busy"), color, Mark::Line)
                .points(gpu(&|g| g.utilization_gpu_percent)),
        );
        util.push(
            Series::new(format!("GPU {i} memory busy"), color, Mark::Dashed)
                .points(gpu(&|g| g.utilization_memory_percent)),
        );
        mem.push(
            Series::new(format!("GPU {i} used"), color, Mark::Line)
                .points(gpu(&|g| gib(g.memory_used))),
        );
        mem.push(
            Series::new(format!("GPU {i} total"), color, Mark::Dashed)
                .points(gpu(&|g| gib(g.memory_total))),
        );
    }
    out.extend(chart("gpu-util", "GPU utilization", pct_axes(HALF), util)?);
    out.extend(chart("gpu-memory", "GPU memory", gib_axes(HALF), mem)?);
    Ok(out)
}

/// Limits (total memory) are drawn dashed in a neutral grey.
const AXIS_GREY: RGBColor = RGBColor(0x94, 0xa3, 0xb8);
