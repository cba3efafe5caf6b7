//! `redline predict RUN_DIR --data PATH --out FILE.csv|.npy`: a finished
//! run's model applied to data of its input shape, one row per sample (as
//! Lightning's `trainer.predict`): a classifier's class and probabilities,
//! a regression's values, a language model's most likely next id at each
//! position of a window, and the sample's target where the data has one.
//! The file is written whole (a temporary file, then a rename).

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context};

use crate::cli::PredictArgs;
use crate::evaluate::{run_model, RunModel};

/// What a row holds.
struct Rows {
    /// Column names.
    header: Vec<String>,
    /// Values, `header.len()` a row.
    values: Vec<f32>,
}

/// Runs `redline predict`.
pub fn run(args: &PredictArgs) -> anyhow::Result<()> {
    let format = check_out(&args.out)?;
    let mut run = run_model(
        "redline predict",
        &args.run_dir,
        Some(&args.data),
        &args.checkpoint,
        None,
    )?;
    let classes = run.shape.target.classes();
    let positions = match run.shape.target {
        redline_data::TargetKind::Tokens { len, .. } => Some(len),
        _ => None,
    };
    let (loader, n) = run.loader(true)?;
    let RunModel { model, file, .. } = run;
    let mut rows: Option<Rows> = None;
    for batch in loader.epoch(0) {
        let batch = batch?;
        let out = redline_train::step::output(model.as_ref(), &batch, false)?;
        if let Some(t) = positions {
            // A language model: each position's most likely next id, then
            // the window's next ids.
            let next = out
                .argmax(out.rank().saturating_sub(1))?
                .to_dtype(redline_core::DType::F32)?;
            let next = next.reshape((batch.size(), t))?.to_vec2::<f32>()?;
            let targets = batch
                .y
                .reshape((batch.size(), t))?
                .to_dtype(redline_core::DType::F32)?;
            let targets = targets.to_vec2::<f32>()?;
            let r = rows.get_or_insert_with(|| Rows {
                header: (0..t)
                    .map(|i| format!("next{i}"))
                    .chain((0..t).map(|i| format!("target{i}")))
                    .collect(),
                values: Vec::new(),
            });
            for (p, y) in next.iter().zip(&targets) {
                r.values.extend(p);
                r.values.extend(y);
            }
            continue;
        }
        let out = out.reshape((batch.size(), ()))?.to_vec2::<f32>()?;
        let targets: Vec<f32> = match batch.y.dtype() {
            redline_core::DType::U32 => batch
                .y
                .to_vec1::<u32>()?
                .iter()
                .map(|&c| c as f32)
                .collect(),
            _ => batch
                .y
                .reshape((batch.size(), ()))?
                .to_vec2::<f32>()?
                .concat(),
        };
        let width = targets.len() / batch.size().max(1);
        let r = rows.get_or_insert_with(|| Rows {
            header: header(classes, out.first().map_or(0, Vec::len), width),
            values: Vec::new(),
        });
        for (i, row) in out.iter().enumerate() {
            match classes {
                Some(_) => {
                    let (class, probs) = softmax(row);
                    r.values.push(class as f32);
                    r.values.extend(probs);
                }
                None => r.values.extend(row),
            }
            r.values.extend(&targets[i * width..(i + 1) * width]);
        }
    }
    let rows = rows.unwrap_or(Rows {
        header: Vec::new(),
        values: Vec::new(),
    });
    match format {
        "csv" => write_csv(&args.out, &rows)?,
        _ => write_npy(&args.out, &rows, n)?,
    }
    let columns = match rows.header.len() {
        0..=12 => rows.header.join(","),
        k => format!(
            "{},...,{}: {k} columns",
            rows.header[..3].join(","),
            rows.header[k - 1]
        ),
    };
    println!(
        "predicted {n} samples ({columns}) with {} into {}",
        file.display(),
        args.out.display()
    );
    Ok(())
}

/// `--out` must name a new or regular file ending in .csv or .npy.
fn check_out(out: &Path) -> anyhow::Result<&'static str> {
    let format = match out.extension().and_then(|e| e.to_str()) {
        Some("csv") => "csv",
        Some("npy") => "npy",
        _ => bail!(
            "--out {}: give a .csv (a header and one row per sample) or .npy (an (N, columns) \
             float32 array) file",
            out.display()
        ),
    };
    if out.is_dir() {
        bail!("--out {}: is a folder, not a file", out.display());
    }
    redline_core::files::output_target(out).with_context(|| {
        format!(
            "--out {}\nHINT: give a file path in a folder you can write",
            out.display()
        )
    })?;
    Ok(format)
}

/// Column names: `class, p0..` (classes) or `y0..` (values), then the
/// target's `target` (class) or `target0..`.
fn header(classes: Option<usize>, outputs: usize, target_width: usize) -> Vec<String> {
    let mut h: Vec<String> = match classes {
        Some(_) => std::iter::once("class".to_string())
            .chain((0..outputs).map(|i| format!("p{i}")))
            .collect(),
        None => (0..outputs).map(|i| format!("y{i}")).collect(),
    };
    match (classes, target_width) {
        (Some(_), _) | (None, 1) => h.push("target".into()),
        (None, w) => h.extend((0..w).map(|i| format!("target{i}"))),
    }
    h
}

/// The argmax of `logits` and their softmax (in f64, then rounded).
fn softmax(logits: &[f32]) -> (usize, Vec<f32>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logits.iter().map(|&v| f64::from(v - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    let class = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i);
    (class, e.iter().map(|v| (v / sum) as f32).collect())
}

fn write_csv(out: &Path, rows: &Rows) -> anyhow::Result<()> {
    let width = rows.header.len().max(1);
    redline_core::files::write_atomic_with(out, |w| {
        writeln!(w, "{}", rows.header.join(","))?;
        for row in rows.values.chunks(width) {
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(i, v)| match rows.header.get(i).map(String::as_str) {
                    Some(h)
                        if (h == "class" || h.starts_with("target") || h.starts_with("next"))
                            && v.fract() == 0.0 =>
                    {
                        format!("{v}")
                    }
                    _ => format!("{v:e}"),
                })
                .collect();
            writeln!(w, "{}", cells.join(","))?;
        }
        Ok(())
    })
    .with_context(|| format!("--out {}: writing it", out.display()))
}

/// An `(n, columns)` little-endian float32 `.npy` (format 1.0).
fn write_npy(out: &Path, rows: &Rows, n: usize) -> anyhow::Result<()> {
    let dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({n}, {}), }}",
        rows.header.len()
    );
    // Magic (6) + version (2) + length (2) + dict + padding + newline: a
    // multiple of 64 bytes.
    let pad = (64 - (10 + dict.len() + 1) % 64) % 64;
    let header = format!("{dict}{}\n", " ".repeat(pad));
    let len = u16::try_from(header.len()).context("the .npy header is too long")?;
    redline_core::files::write_atomic_with(out, |w| {
        w.write_all(b"\x93NUMPY\x01\x00")?;
        w.write_all(&len.to_le_bytes())?;
        w.write_all(header.as_bytes())?;
        for v in &rows.values {
            w.write_all(&v.to_le_bytes())?;
        }
        Ok(())
    })
    .with_context(|| format!("--out {}: writing it", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_is_a_distribution_and_names_the_argmax() {
        let (c, p) = softmax(&[1.0, 3.0, 2.0]);
        assert_eq!(c, 1);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[1] > p[2] && p[2] > p[0]);
        assert_eq!(header(Some(2), 2, 1), ["class", "p0", "p1", "target"]);
        assert_eq!(header(None, 2, 2), ["y0", "y1", "target0", "target1"]);
    }
}
