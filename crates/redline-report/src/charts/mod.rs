//! Charts as inline SVG strings, drawn with plotters' SVG backend.
//!
//! Text is emitted as SVG `<text>` (no font files are read: the browser lays
//! text out), so the build needs no system font libraries. Legends are HTML,
//! drawn by the page next to each chart, so their text never overlaps a curve.

mod breakdown;
mod metrics;

pub(crate) use breakdown::{pie, timeline};
pub(crate) use metrics::{device_charts, loss, lr, lr_finder, metric, throughput};

use std::ops::Range;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::records::Category;

/// A drawn chart plus what the page shows around it.
#[derive(Debug, Clone)]
pub(crate) struct Chart {
    /// `data-chart` attribute: a stable name tests and CSS can find.
    pub name: &'static str,
    /// Heading above the chart.
    pub title: String,
    /// The `<svg>` element.
    pub svg: String,
    /// Legend entries: label, colour and how the swatch looks.
    pub legend: Vec<(String, RGBColor, Swatch)>,
}

/// How a legend entry's swatch looks, matching how its series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Swatch {
    /// A filled square (areas, slices).
    Fill,
    /// A short solid line.
    Line,
    /// A short dashed line.
    Dashed,
}

/// Colour of each time-breakdown category, in [`Category::ALL`] order.
pub(crate) const CATEGORY_COLORS: [RGBColor; 7] = [
    RGBColor(0x25, 0x63, 0xeb), // compute: blue
    RGBColor(0xf5, 0x9e, 0x0b), // data_wait: amber
    RGBColor(0x8b, 0x5c, 0xf6), // transfer: violet
    RGBColor(0xdc, 0x26, 0x26), // host_sync: red
    RGBColor(0x10, 0xb9, 0x81), // communication: green
    RGBColor(0x64, 0x74, 0x8b), // overhead: slate
    RGBColor(0xcb, 0xd5, 0xe1), // idle: light grey
];

/// Colour of a breakdown category.
pub(crate) fn category_color(cat: Category) -> RGBColor {
    CATEGORY_COLORS[cat.index()]
}

/// Training series.
pub(crate) const TRAIN: RGBColor = RGBColor(0x25, 0x63, 0xeb);
/// Test/evaluation series.
pub(crate) const TEST: RGBColor = RGBColor(0xea, 0x58, 0x0c);
/// Series without a train/test meaning, cycled in order.
pub(crate) const CYCLE: [RGBColor; 6] = [
    RGBColor(0x0d, 0x94, 0x88), // teal
    RGBColor(0x7c, 0x3a, 0xed), // violet
    RGBColor(0xdb, 0x27, 0x77), // pink
    RGBColor(0x65, 0xa3, 0x0d), // lime
    RGBColor(0x0e, 0xa5, 0xe9), // sky
    RGBColor(0xb4, 0x53, 0x09), // brown
];

const AXIS: RGBColor = RGBColor(0x94, 0xa3, 0xb8);
const GRID: RGBColor = RGBColor(0xe5, 0xe7, 0xeb);
const LABEL: RGBColor = RGBColor(0x47, 0x55, 0x69);
const FONT: &str = "sans-serif";

/// Full content width of the page, in SVG pixels.
pub(crate) const WIDE: (u32, u32) = (1100, 330);
/// Half width, for two charts side by side.
pub(crate) const HALF: (u32, u32) = (540, 310);

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// A line through the points.
    Line,
    /// A line with a dot on each point (few points, e.g. per epoch).
    LineDots,
    /// A dashed line (a limit, e.g. total memory).
    Dashed,
}

/// One curve of a line chart.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    /// Legend text.
    pub label: String,
    /// Line colour.
    pub color: RGBColor,
    /// (x, y); non-finite points are dropped.
    pub points: Vec<(f64, f64)>,
    /// How it is drawn.
    pub mark: Mark,
}

impl Series {
    pub(crate) fn new(label: impl Into<String>, color: RGBColor, mark: Mark) -> Self {
        Self {
            label: label.into(),
            color,
            points: Vec::new(),
            mark,
        }
    }

    /// Sets the points, dropping the non-finite ones.
    pub(crate) fn points(mut self, pts: impl IntoIterator<Item = (f64, f64)>) -> Self {
        self.points = pts
            .into_iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        self
    }
}

/// Axis titles, the y range policy and the size of a line chart.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Axes<'a> {
    pub x: &'a str,
    pub y: &'a str,
    /// Start the y axis at zero (throughput, percentages) instead of the data.
    pub y_from_zero: bool,
    /// Fixed top of the y axis (100 for percentages).
    pub y_max: Option<f64>,
    /// The x axis counts whole things (epochs): no ticks between them.
    pub x_whole: bool,
    pub size: (u32, u32),
}

/// `lo..hi` padded so that a single value or a flat line still has height.
fn padded(lo: f64, hi: f64, from_zero: bool, max: Option<f64>) -> (f64, f64) {
    let lo = if from_zero { lo.min(0.0) } else { lo };
    let span = (hi - lo).abs().max(hi.abs() * 0.1).max(1e-9);
    let lo = if from_zero { lo } else { lo - 0.05 * span };
    let hi = match max {
        Some(m) if hi <= m => m,
        _ => hi + 0.06 * span,
    };
    (lo, hi)
}

/// Tick label: `85k`, `1.2M`, `0.35`, `12`.
pub(crate) fn tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}").trim_end_matches(".0").to_string()
    } else if a >= 0.01 {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.1e}")
    }
}

/// A plotters chart on an SVG string with f64 axes.
pub(crate) type Frame<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// How a chart's x axis is ticked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XTicks {
    /// Draw vertical grid lines (off for bars, which carry their own x).
    pub grid: bool,
    /// About how many tick labels.
    pub count: usize,
    /// Tick label text.
    pub label: fn(f64) -> String,
}

impl XTicks {
    /// Ticks for a continuous axis (steps, seconds).
    pub(crate) const PLAIN: XTicks = XTicks {
        grid: true,
        count: 8,
        label: tick,
    };

    /// Ticks on whole numbers only, for an axis spanning `span` (epochs).
    pub(crate) fn whole(span: f64) -> XTicks {
        XTicks {
            grid: true,
            count: (span.round().max(1.0) as usize + 1).min(11),
            label: whole_tick,
        }
    }
}

/// The axes, grid and tick labels every chart shares.
pub(crate) fn frame<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    name: &'static str,
    (x, y): (Range<f64>, Range<f64>),
    (x_desc, y_desc): (&str, &str),
    xt: XTicks,
) -> Result<Frame<'a, 'b>> {
    let err = Error::chart(name);
    let mut chart = ChartBuilder::on(root)
        .margin_top(16)
        .margin_right(28)
        .margin_left(6)
        .margin_bottom(4)
        .x_label_area_size(52)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
        .map_err(&err)?;
    let (x_fmt, y_fmt) = (|v: &f64| (xt.label)(*v), |v: &f64| tick(*v));
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc)
        .y_desc(y_desc)
        .axis_desc_style((FONT, 16).into_font().color(&LABEL))
        .label_style((FONT, 15).into_font().color(&LABEL))
        .bold_line_style(GRID.stroke_width(1))
        .light_line_style(WHITE.stroke_width(0))
        .axis_style(AXIS.stroke_width(1))
        .x_labels(xt.count)
        .y_labels(6)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt);
    if !xt.grid {
        mesh.disable_x_mesh();
    }
    mesh.draw().map_err(&err)?;
    Ok(chart)
}

/// Tick label for an axis of whole numbers: none between them.
pub(crate) fn whole_tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-6 {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

/// Plots `series` as lines on shared axes. Every series must have a point
/// (callers drop empty ones and say so on the page instead).
pub(crate) fn line_chart(name: &'static str, axes: Axes<'_>, series: &[Series]) -> Result<String> {
    let err = Error::chart(name);
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        return Err(Error::Chart {
            chart: name,
            message: "no finite points to plot".into(),
        });
    }
    let (x0, x1) = if x1 > x0 {
        (x0, x1)
    } else {
        (x0 - 1.0, x1 + 1.0)
    };
    let (y0, y1) = padded(y0, y1, axes.y_from_zero, axes.y_max);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, axes.size).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let xt = if axes.x_whole {
            XTicks::whole(x1 - x0)
        } else {
            XTicks::PLAIN
        };
        let mut chart = frame(&root, name, (x0..x1, y0..y1), (axes.x, axes.y), xt)?;
        for s in series {
            let pts = s.points.iter().copied();
            match s.mark {
                Mark::Line | Mark::LineDots => {
                    chart
                        .draw_series(LineSeries::new(pts.clone(), s.color.stroke_width(2)))
                        .map_err(&err)?;
                }
                Mark::Dashed => {
                    chart
                        .draw_series(DashedLineSeries::new(
                            pts.clone(),
                            6,
                            4,
                            s.color.stroke_width(2),
                        ))
                        .map_err(&err)?;
                }
            }
            if s.mark == Mark::LineDots {
                chart
                    .draw_series(pts.map(|p| Circle::new(p, 4, s.color.filled())))
                    .map_err(&err)?;
            }
        }
        root.present().map_err(&err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(85_000.0), "85k");
        assert_eq!(tick(1_250_000.0), "1.2M");
        assert_eq!(tick(250.0), "250");
        assert_eq!(tick(12.0), "12");
        assert_eq!(tick(0.5), "0.5");
        assert_eq!(tick(0.0), "0");
        assert_eq!(whole_tick(3.0), "3");
        assert_eq!(whole_tick(2.5), "");
    }

    #[test]
    fn line_chart_is_svg_with_text_and_survives_one_point() {
        let axes = Axes {
            x: "step",
            y: "loss",
            y_from_zero: false,
            y_max: None,
            x_whole: false,
            size: HALF,
        };
        let s = Series::new("train", TRAIN, Mark::LineDots).points([(1.0, 0.5)]);
        let svg = line_chart("t", axes, &[s]).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<text") && svg.contains(">\nstep\n<"));
        let empty = Series::new("x", TRAIN, Mark::Line).points([(f64::NAN, 1.0)]);
        assert!(line_chart("t", axes, &[empty]).is_err());
    }
}
