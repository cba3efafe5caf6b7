//! A finished profile: the action table (simple), per-layer spans and per-op
//! counts (detailed), and writing them into a run folder.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use redline_core::trace::Trace;
use serde::{Deserialize, Serialize};

use crate::action::Mode;
use crate::breakdown::Breakdown;
use crate::chrome;
use crate::error::{Error, Result};
use crate::kernels::GpuBusy;
use crate::nullable::nullable;

/// One row of the action table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActionRow {
    /// What the loop did.
    #[serde(deserialize_with = "nullable")]
    pub action: String,
    /// Times it did it.
    #[serde(deserialize_with = "nullable")]
    pub calls: u64,
    /// Mean milliseconds per call.
    #[serde(deserialize_with = "nullable")]
    pub mean_ms: f64,
    /// Total seconds.
    #[serde(deserialize_with = "nullable")]
    pub total_s: f64,
    /// Percent of wall time.
    #[serde(deserialize_with = "nullable")]
    pub percent: f64,
    /// Device-queue seconds of the work queued during this action (GPU event
    /// timing); absent where there is no device clock (the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_s: Option<f64>,
}

/// Inclusive time of one named span (a layer's forward or backward).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpanRow {
    /// Span name, e.g. `fc1.forward`.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Times it ran.
    #[serde(deserialize_with = "nullable")]
    pub calls: u64,
    /// Mean milliseconds.
    #[serde(deserialize_with = "nullable")]
    pub mean_ms: f64,
    /// Total seconds.
    #[serde(deserialize_with = "nullable")]
    pub total_s: f64,
}

/// What [`crate::Profiler::finish`] returns.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The mode it ran in.
    pub mode: Mode,
    /// Wall time covered.
    pub wall_s: f64,
    /// Optimizer steps.
    pub steps: usize,
    /// Exclusive action rows summing to `wall_s`; `other` last.
    pub rows: Vec<ActionRow>,
    /// The category breakdown.
    pub breakdown: Breakdown,
    /// Spans and counts (detailed only).
    pub trace: Option<Trace>,
    /// Device time of the compute actions (forward, loss, backward, optimizer,
    /// metrics) over wall time, from the device clock; `None` without one.
    pub device_compute_percent: Option<f64>,
}

/// `profile.json`: what [`Profile::write`] writes and `redline-report` reads back
/// (tolerantly: a missing or `null` field is its default).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProfileFile {
    /// Wall time the rows sum to.
    #[serde(deserialize_with = "nullable")]
    pub wall_s: f64,
    /// `simple` or `detailed`.
    #[serde(deserialize_with = "nullable")]
    pub mode: String,
    /// Optimizer steps.
    #[serde(deserialize_with = "nullable")]
    pub steps: usize,
    /// The action table; `other` last.
    #[serde(deserialize_with = "nullable")]
    pub rows: Vec<ActionRow>,
    /// See [`Profile::device_compute_percent`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_compute_percent: Option<f64>,
    /// Per-layer spans (detailed only).
    #[serde(deserialize_with = "nullable")]
    pub layers: Vec<SpanRow>,
    /// Kernel calls per step (detailed only).
    #[serde(deserialize_with = "nullable")]
    pub op_counts_per_step: BTreeMap<String, f64>,
}

impl Profile {
    /// Per-layer spans, largest total first (detailed only; empty otherwise).
    pub fn layer_rows(&self) -> Vec<SpanRow> {
        let Some(trace) = &self.trace else {
            return Vec::new();
        };
        let mut by_name: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
        for s in trace
            .spans
            .iter()
            .filter(|s| s.cat == "layer" || s.cat == "backward")
        {
            let e = by_name.entry(&s.name).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += s.dur_us * 1e-6;
        }
        let mut rows: Vec<SpanRow> = by_name
            .into_iter()
            .map(|(name, (calls, total_s))| SpanRow {
                name: name.to_string(),
                calls,
                mean_ms: 1e3 * total_s / calls as f64,
                total_s,
            })
            .collect();
        rows.sort_by(|a, b| b.total_s.total_cmp(&a.total_s));
        rows
    }

    /// Kernel invocations per optimizer step (detailed only).
    pub fn op_counts_per_step(&self) -> BTreeMap<&'static str, f64> {
        let steps = self.steps.max(1) as f64;
        self.trace
            .iter()
            .flat_map(|t| t.counts.iter())
            .map(|(k, v)| (*k, *v as f64 / steps))
            .collect()
    }

    /// The table printed at the end of a profiled run.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Profiler ({}): {:.3} s wall over {} steps. Rows are exclusive and sum to the wall time.",
            self.mode, self.wall_s, self.steps
        );
        let timed = self.rows.iter().any(|r| r.device_s.is_some());
        let _ = write!(
            s,
            "{:<34} {:>9} {:>10} {:>10} {:>7}",
            "Action", "Calls", "Mean ms", "Total s", "% wall"
        );
        let _ = writeln!(s, "{}", if timed { "  Device ms" } else { "" });
        let mut sum = 0.0;
        for r in &self.rows {
            sum += r.total_s;
            let (calls, mean) = if r.calls > 0 {
                (r.calls.to_string(), format!("{:.4}", r.mean_ms))
            } else {
                ("-".into(), "-".into())
            };
            let _ = write!(
                s,
                "{:<34} {:>9} {:>10} {:>10.4} {:>7.1}",
                r.action, calls, mean, r.total_s, r.percent
            );
            match (timed, r.device_s, r.calls) {
                (true, Some(d), c) if c > 0 => {
                    let _ = writeln!(s, "  {:>9.4}", 1e3 * d / c as f64);
                }
                _ => s.push('\n'),
            }
        }
        let pct = if self.wall_s > 0.0 {
            100.0 * sum / self.wall_s
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            "{:<34} {:>9} {:>10} {:>10.4} {:>7.1}",
            "total", "", "", sum, pct
        );
        if let Some(p) = self.device_compute_percent {
            let _ = writeln!(
                s,
                "Device time of compute actions: {p:.1}% of wall (GPU events; Device ms is per call)"
            );
        }
        let layers = self.layer_rows();
        if !layers.is_empty() {
            let _ = writeln!(
                s,
                "\nPer layer (inclusive; inside the forward and backward rows above):"
            );
            let _ = writeln!(
                s,
                "{:<34} {:>9} {:>10} {:>10}",
                "Span", "Calls", "Mean ms", "Total s"
            );
            for r in &layers {
                let _ = writeln!(
                    s,
                    "{:<34} {:>9} {:>10.4} {:>10.4}",
                    r.name, r.calls, r.mean_ms, r.total_s
                );
            }
        }
        let counts = self.op_counts_per_step();
        if !counts.is_empty() {
            let _ = writeln!(s, "\nKernel calls per step (Redline's kernels):");
            for (k, v) in counts {
                let _ = writeln!(s, "{k:<34} {v:>9.2}");
            }
        }
        if let Some(g) = &self.breakdown.gpu {
            gpu_kernels(&mut s, g);
        }
        s
    }

    /// What `profile.json` holds.
    pub fn file(&self) -> ProfileFile {
        ProfileFile {
            wall_s: self.wall_s,
            mode: self.mode.to_string(),
            steps: self.steps,
            rows: self.rows.clone(),
            device_compute_percent: self.device_compute_percent,
            layers: self.layer_rows(),
            op_counts_per_step: self
                .op_counts_per_step()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }
    }

    /// Writes `breakdown.json` always, `profile.txt` and `profile.json` unless
    /// the mode is off, and `trace.json` when detailed. Returns the files written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let mut written = Vec::new();
        written.push(write_file(
            &dir.join("breakdown.json"),
            &to_json("breakdown", &self.breakdown)?,
        )?);
        if self.mode != Mode::Off {
            written.push(write_file(&dir.join("profile.txt"), &self.table())?);
            written.push(write_file(
                &dir.join("profile.json"),
                &to_json("profile", &self.file())?,
            )?);
        }
        if let Some(trace) = &self.trace {
            let path = dir.join("trace.json");
            let text =
                chrome::to_chrome_json(trace, &self.op_counts_per_step()).map_err(|source| {
                    Error::Json {
                        what: "trace",
                        source,
                    }
                })?;
            written.push(write_file(&path, &text)?);
        }
        Ok(written)
    }
}

/// Kernel names longer than this are cut in the table (`profile.json` and
/// `breakdown.json` keep them whole).
const KERNEL_NAME_CHARS: usize = 58;

/// The GPU's busy time and its longest-running kernels.
fn gpu_kernels(s: &mut String, g: &GpuBusy) {
    let _ = writeln!(s, "\n{}", g.line());
    if g.top.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "{:<60} {:>9} {:>10} {:>9} {:>7}",
        "Kernel (longest total first)", "Calls", "Total ms", "Mean µs", "% kern"
    );
    for r in &g.top {
        let name: String = if r.name.chars().count() > KERNEL_NAME_CHARS {
            r.name
                .chars()
                .take(KERNEL_NAME_CHARS - 1)
                .chain(['…'])
                .collect()
        } else {
            r.name.clone()
        };
        let _ = writeln!(
            s,
            "{name:<60} {:>9} {:>10.3} {:>9.2} {:>7.1}",
            r.calls, r.total_ms, r.mean_us, r.percent
        );
    }
}

fn to_json<T: Serialize>(what: &'static str, v: &T) -> Result<String> {
    serde_json::to_string_pretty(v).map_err(|source| Error::Json { what, source })
}

/// Writes whole (a temporary file, `fsync`, a rename; no temporary left on
/// failure), so a reader never sees half a file.
fn write_file(path: &Path, text: &str) -> Result<PathBuf> {
    redline_core::files::write_atomic(path, text.as_bytes()).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KernelSpan, KernelTally, Profiler};

    #[test]
    fn the_table_lists_the_gpu_kernels_when_traced() {
        let mut p = Profiler::new(Mode::Simple, "cuda:0").finish();
        assert!(!p.table().contains("GPU busy"), "no trace, no GPU lines");
        let mut t = KernelTally::new(0);
        let long = "k".repeat(100);
        let (a, b) = (t.name_id("affine_f32"), t.name_id(&long));
        t.add(&mut [
            KernelSpan {
                start_ns: 0,
                end_ns: 1_000,
                name: a,
            },
            KernelSpan {
                start_ns: 2_000,
                end_ns: 5_000,
                name: b,
            },
        ]);
        p.breakdown.gpu = Some(t.finish(10_000, 1, "cupti"));
        let table = p.table();
        assert!(table.contains("GPU busy 40.0% of wall"), "{table}");
        let rows: Vec<&str> = table
            .lines()
            .skip_while(|l| !l.starts_with("Kernel (longest"))
            .skip(1)
            .collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(
            rows[0].starts_with(&format!("{}…", "k".repeat(57))),
            "{table}"
        );
        assert!(rows[1].starts_with("affine_f32"), "{table}");
    }
}
