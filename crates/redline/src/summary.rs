//! The end-of-run summary printed to stdout.

use std::io::Write;

use redline_train::FitSummary;

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

/// Prints the per-epoch table and the headline numbers.
pub fn print(s: &FitSummary, batch_size: usize) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:>5} {:>10} {:>9} {:>10} {:>9} {:>8} {:>7} {:>10}",
        "epoch",
        "train_loss",
        "train_acc",
        "test_loss",
        "test_acc",
        "train_s",
        "eval_s",
        "samples/s"
    )?;
    for e in &s.epochs_log {
        writeln!(
            out,
            "{:>5} {:>10.4} {:>9} {:>10.4} {:>9} {:>8.3} {:>7.3} {:>10.0}",
            e.epoch,
            e.train_loss,
            pct(e.train_accuracy),
            e.test_loss,
            pct(e.test_accuracy),
            e.epoch_s,
            e.eval_s,
            e.samples as f64 / e.epoch_s.max(1e-9)
        )?;
    }
    let full: Vec<f64> = s.epochs_log.iter().map(|e| e.epoch_s).collect();
    writeln!(
        out,
        "test accuracy {} | train {:.3} s/epoch (median) | {:.0} samples/s | batch {} | {} steps | \
         host syncs/step {:.3} | wall {:.2} s",
        pct(s.test_accuracy),
        median(full),
        s.samples_per_s,
        batch_size,
        s.steps,
        s.host_syncs_per_step,
        s.wall_s
    )
}
