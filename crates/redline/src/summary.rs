//! The end-of-run summary printed to stdout.

use std::io::Write;

use redline_train::{EvalResult, FitSummary};

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.2}%", 100.0 * x)
    } else {
        "-".into()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A metric for people: `accuracy` in percent, anything else as a number.
pub fn show(name: &str, v: f64) -> String {
    if name == "accuracy" {
        pct(v)
    } else if v.is_finite() {
        format!("{v:.4}")
    } else {
        "-".into()
    }
}

/// Prints the per-epoch table (a column per metric the step returned) and
/// the headline numbers, the test pass's first.
pub fn print(s: &FitSummary, test: Option<&EvalResult>, batch_size: usize) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let first = s.epochs_log.first();
    let train_names: Vec<&str> = first.map_or(vec![], |e| e.train.iter().map(|m| m.0).collect());
    let val_names: Vec<&str> = first
        .and_then(|e| e.val.as_ref())
        .map_or(vec![], |v| v.metrics.iter().map(|m| m.0).collect());
    let mut head = vec!["epoch".to_string(), "train_loss".into()];
    head.extend(train_names.iter().map(|n| format!("train_{n}")));
    if first.is_some_and(|e| e.val.is_some()) {
        head.push("val_loss".into());
        head.extend(val_names.iter().map(|n| format!("val_{n}")));
    }
    head.extend(["train_s", "eval_s", "samples/s"].map(String::from));
    // A step's metric names size the columns; a width past u16::MAX panics.
    let head: Vec<String> = head
        .iter()
        .map(|h| redline_core::text::clip(h, redline_core::text::MAX_SHOWN))
        .collect();
    let widths: Vec<usize> = head.iter().map(|h| h.len().max(9)).collect();
    let row = |cells: &[String]| -> String {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    writeln!(out, "{}", row(&head))?;
    for e in &s.epochs_log {
        let mut cells = vec![e.epoch.to_string(), format!("{:.4}", e.train_loss)];
        cells.extend(
            train_names
                .iter()
                .map(|n| show(n, e.train.get(n).unwrap_or(f64::NAN))),
        );
        if let Some(v) = &e.val {
            cells.push(format!("{:.4}", v.loss));
            cells.extend(
                val_names
                    .iter()
                    .map(|n| show(n, v.metrics.get(n).unwrap_or(f64::NAN))),
            );
        }
        cells.extend([
            format!("{:.3}", e.epoch_s),
            format!("{:.3}", e.eval_s),
            format!("{:.0}", e.samples as f64 / e.epoch_s.max(1e-9)),
        ]);
        writeln!(out, "{}", row(&cells))?;
    }
    let full: Vec<f64> = s.epochs_log.iter().map(|e| e.epoch_s).collect();
    // The test pass when there was one, else the last validation.
    let last = test
        .map(|t| ("test", t))
        .or(s.val.as_ref().map(|v| ("val", v)));
    let headline = match last {
        Some((split, t)) => {
            let mut parts = vec![format!("{split} loss {:.4}", t.loss)];
            parts.extend(
                t.metrics
                    .iter()
                    .map(|(n, v)| format!("{split} {n} {}", show(n, v))),
            );
            parts.join(" | ") + " | "
        }
        None => String::new(),
    };
    if let Some(best) = &s.best {
        writeln!(out, "best epoch: {} ({:.6})", best.best_epoch, best.best)?;
    }
    if let Some(why) = &s.stopped_early {
        writeln!(out, "stopped after epoch {}: {}", why.epoch, why.message)?;
    }
    let mfu = match &s.flops {
        Some(Ok(f)) => f
            .mfu
            .map_or(String::new(), |m| format!(" | MFU {:.1}%", 100.0 * m)),
        _ => String::new(),
    };
    writeln!(
        out,
        "{headline}train {:.3} s/epoch (median) | {:.0} samples/s | batch {} | {} steps | \
         host syncs/step {:.3}{mfu} | wall {:.2} s",
        median(full),
        s.samples_per_s,
        batch_size,
        s.steps,
        s.host_syncs_per_step,
        s.wall_s
    )
}

/// A language model's line: the held-out (or test) perplexity and bits per
/// token (per byte on byte-level data) from its mean loss, and the training
/// tokens per second; `None` for other targets.
pub fn language_model(
    s: &FitSummary,
    test: Option<&EvalResult>,
    target: redline_data::TargetKind,
) -> Option<String> {
    let redline_data::TargetKind::Tokens { vocab, len } = target else {
        return None;
    };
    let tokens_s = s.samples_per_s * len as f64;
    let last = test
        .map(|t| ("test", t.loss))
        .or(s.val.as_ref().map(|v| ("val", v.loss)));
    let unit = if vocab == 256 { "byte" } else { "token" };
    Some(match last {
        Some((split, loss)) => format!(
            "language model: {split} perplexity {:.3} | {:.4} bits per {unit} | {:.0} tokens/s \
             (training)",
            redline_train::lm_step::perplexity(loss),
            redline_train::lm_step::bits_per_token(loss),
            tokens_s
        ),
        None => format!("language model: {tokens_s:.0} tokens/s (training)"),
    })
}
