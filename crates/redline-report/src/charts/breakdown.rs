//! The time breakdown: a donut of the six categories and the per-step stacked timeline.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{frame, tick, Chart, Swatch, XTicks, CATEGORY_COLORS, FONT, LABEL, WIDE};
use crate::error::{Error, Result};
use crate::records::{Breakdown, Category, TimelineRow};

/// Size of the donut's square.
const PIE: (u32, u32) = (300, 300);

/// The six categories as a donut with the wall time in the hole; the page puts
/// the legend (percent and seconds) beside it. `None` when no time was recorded.
pub(crate) fn pie(b: &Breakdown) -> Result<Option<Chart>> {
    let name = "breakdown";
    let err = Error::chart(name);
    let (mut sizes, mut colors) = (Vec::new(), Vec::new());
    for (cat, color) in Category::ALL.into_iter().zip(CATEGORY_COLORS) {
        let s = b.share(cat).map_or(0.0, |c| c.seconds);
        // Plotters draws every slice; a zero or negative one would be a stray sliver.
        if s.is_finite() && s > 0.0 {
            sizes.push(s);
            colors.push(color);
        }
    }
    if sizes.is_empty() {
        return Ok(None);
    }
    let labels = vec![""; sizes.len()];
    let center = (PIE.0 as i32 / 2, PIE.1 as i32 / 2);
    let radius = 0.45 * PIE.0 as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PIE).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let mut donut = Pie::new(&center, &radius, &sizes, &colors, &labels);
        donut.start_angle(-90.0);
        donut.donut_hole(0.6 * radius);
        root.draw(&donut).map_err(&err)?;
        let mid = Pos::new(HPos::Center, VPos::Center);
        let big = (FONT, 30).into_font().color(&BLACK).pos(mid);
        let small = (FONT, 16).into_font().color(&LABEL).pos(mid);
        let wall = format!("{:.2} s", b.wall_s);
        root.draw(&Text::new(wall, (center.0, center.1 - 8), big))
            .map_err(&err)?;
        root.draw(&Text::new("wall time", (center.0, center.1 + 20), small))
            .map_err(&err)?;
        root.present().map_err(&err)?;
    }
    Ok(Some(Chart {
        name,
        title: "Where the time went".into(),
        svg,
        legend: Vec::new(),
    }))
}

/// Mean milliseconds per step of each timeline bin, stacked by category.
/// `None` without timeline rows.
pub(crate) fn timeline(b: &Breakdown) -> Result<Option<Chart>> {
    let name = "timeline";
    let err = Error::chart(name);
    let rows = &b.timeline.rows;
    if rows.is_empty() {
        return Ok(None);
    }
    // Records are read as written, hostile or not: a bin's edges in order,
    // ms finite and bounded, so every point lies inside the axes.
    let edges = |r: &TimelineRow| {
        let (l, rt) = (r.first_step as f64, r.last_step.saturating_add(1) as f64);
        (l.min(rt), l.max(rt))
    };
    let ms = |r: &TimelineRow, k: usize| {
        let v = r.values_ms()[k];
        if v.is_finite() {
            v.clamp(0.0, 1e300)
        } else {
            0.0
        }
    };
    let x0 = rows
        .iter()
        .map(|r| edges(r).0)
        .fold(f64::INFINITY, f64::min);
    let x1 = rows
        .iter()
        .map(|r| edges(r).1)
        .fold(f64::NEG_INFINITY, f64::max);
    let top = rows
        .iter()
        .map(|r| (0..6).map(|k| ms(r, k)).sum::<f64>())
        .fold(0.0, f64::max);
    let y1 = if top > 0.0 { top * 1.08 } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, WIDE).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let x = x0..x1.max(x0 + 1.0);
        let xt = XTicks {
            grid: false,
            count: 10,
            label: tick,
        };
        let mut chart = frame(&root, name, (x, 0.0..y1), ("step", "ms per step"), xt)?;
        // One step-shaped band per category, stacked: (bin edges) x (cumulative ms).
        // Bands instead of a rectangle per bin keep the SVG small and seamless.
        let mut below: Vec<f64> = vec![0.0; rows.len()];
        for (k, color) in CATEGORY_COLORS[..6].iter().enumerate() {
            let above: Vec<f64> = rows.iter().zip(&below).map(|(r, b)| b + ms(r, k)).collect();
            if above.iter().zip(&below).all(|(a, b)| a <= b) {
                continue;
            }
            let mut band = Vec::with_capacity(4 * rows.len());
            for (r, &y) in rows.iter().zip(&above) {
                let (l, rt) = edges(r);
                band.extend([(l, y), (rt, y)]);
            }
            for (r, &y) in rows.iter().zip(&below).rev() {
                let (l, rt) = edges(r);
                band.extend([(rt, y), (l, y)]);
            }
            chart
                .draw_series(std::iter::once(Polygon::new(band, color.filled())))
                .map_err(&err)?;
            below = above;
        }
        root.present().map_err(&err)?;
    }
    let legend = Category::ALL[..6]
        .iter()
        .zip(CATEGORY_COLORS)
        .map(|(c, color)| (c.key().to_string(), color, Swatch::Fill))
        .collect();
    let bin = b.timeline.bin_steps;
    Ok(Some(Chart {
        name,
        title: format!("Per-step time ({bin} steps per bar; idle is between steps)"),
        svg,
        legend,
    }))
}
