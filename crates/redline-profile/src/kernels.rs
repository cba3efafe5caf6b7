//! How busy the GPU itself was: the intervals in which kernels ran on the
//! device (CUPTI activity records on a CUDA build), merged so that overlapping
//! kernels count once, over the wall time of the fit.
//!
//! [`KernelTally`] folds records in as they arrive, in batches (CUPTI hands
//! them over a buffer at a time), keeping one row per kernel name and the
//! merged busy time, so memory does not grow with the number of steps.
//! [`GpuBusy`] is the result, written into `breakdown.json` and
//! `summary.json`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::nullable::nullable;

/// Rows kept in [`GpuBusy::top`].
pub const TOP_KERNELS: usize = 12;

/// One kernel's run on the device: nanoseconds on the device trace's clock
/// and the kernel's name as an id from [`KernelTally::name_id`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSpan {
    /// Start, ns.
    pub start_ns: u64,
    /// End, ns.
    pub end_ns: u64,
    /// Name id.
    pub name: usize,
}

/// The kernels of one name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KernelRow {
    /// Kernel name as the device reports it (C++ names are mangled).
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Launches.
    #[serde(deserialize_with = "nullable")]
    pub calls: u64,
    /// Summed run time, milliseconds.
    #[serde(deserialize_with = "nullable")]
    pub total_ms: f64,
    /// Mean run time, microseconds.
    #[serde(deserialize_with = "nullable")]
    pub mean_us: f64,
    /// Percent of all kernels' summed run time.
    #[serde(deserialize_with = "nullable")]
    pub percent: f64,
}

/// GPU busy: the time kernels ran on the device over the wall time of the fit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuBusy {
    /// Where the kernel times come from (`cupti`).
    #[serde(deserialize_with = "nullable")]
    pub source: String,
    /// `100 * kernel_s / wall_s`.
    #[serde(deserialize_with = "nullable")]
    pub percent: f64,
    /// Seconds in which at least one kernel ran (overlaps count once).
    #[serde(deserialize_with = "nullable")]
    pub kernel_s: f64,
    /// Wall seconds traced, on the device trace's clock.
    #[serde(deserialize_with = "nullable")]
    pub wall_s: f64,
    /// Kernel launches recorded.
    #[serde(deserialize_with = "nullable")]
    pub kernels: u64,
    /// Optimizer steps in the traced time.
    #[serde(deserialize_with = "nullable")]
    pub steps: u64,
    /// `kernels / steps` (validation's kernels included).
    #[serde(deserialize_with = "nullable")]
    pub kernels_per_step: f64,
    /// Mean run time of one kernel, microseconds.
    #[serde(deserialize_with = "nullable")]
    pub mean_kernel_us: f64,
    /// Records the tracer lost (its buffers were full); 0 when complete.
    #[serde(deserialize_with = "nullable")]
    pub dropped: u64,
    /// The kernels that ran longest in total, longest first.
    #[serde(deserialize_with = "nullable")]
    pub top: Vec<KernelRow>,
    /// How the figure was measured when it was not from kernel records.
    #[serde(
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub note: String,
}

impl GpuBusy {
    /// Percent of wall time the GPU waited with no kernel running.
    pub fn idle_percent(&self) -> f64 {
        (100.0 - self.percent).max(0.0)
    }

    /// From CUDA events around each replay of a captured step, where no
    /// kernel records could be had: `replay_s` of device time over `replays`
    /// replays in `wall_s`. It counts the gaps between a graph's nodes as busy
    /// and the eagerly run steps (warm-up, the last batch, validation) as idle.
    pub fn from_replays(replay_s: f64, replays: u64, wall_s: f64, steps: usize, why: &str) -> Self {
        let kernel_s = replay_s.min(wall_s).max(0.0);
        GpuBusy {
            source: "graph replay events".into(),
            percent: ratio(kernel_s, wall_s),
            kernel_s,
            wall_s,
            steps: steps as u64,
            note: format!(
                "{why}; timed {replays} graph replays with CUDA events instead (gaps between \
                 a graph's nodes count as busy, eager steps as idle)"
            ),
            ..Self::default()
        }
    }

    /// One line for the end of a run.
    pub fn line(&self) -> String {
        if self.kernels == 0 && !self.note.is_empty() {
            return format!(
                "GPU busy {:.1}% of wall ({:.3} s of {} in {:.3} s): {}",
                self.percent, self.kernel_s, self.source, self.wall_s, self.note
            );
        }
        let lost = if self.dropped > 0 {
            format!(" ({} records lost: a lower bound)", self.dropped)
        } else {
            String::new()
        };
        format!(
            "GPU busy {:.1}% of wall ({:.3} s of kernels in {:.3} s, {}){lost}: \
             {:.1} kernels per step, {:.1} µs each on average",
            self.percent,
            self.kernel_s,
            self.wall_s,
            self.source,
            self.kernels_per_step,
            self.mean_kernel_us
        )
    }
}

/// Running totals over the kernel records of one trace.
#[derive(Debug, Clone, Default)]
pub struct KernelTally {
    names: Vec<String>,
    index: HashMap<String, usize>,
    calls: Vec<u64>,
    total_ns: Vec<u64>,
    /// Trace start: time before it is not counted.
    since_ns: u64,
    /// The merged interval still open to extension.
    open: Option<(u64, u64)>,
    /// Busy time of the intervals already closed.
    busy_ns: u64,
    kernels: u64,
    dropped: u64,
}

impl KernelTally {
    /// A tally of a trace that started at `since_ns`.
    pub fn new(since_ns: u64) -> Self {
        Self {
            since_ns,
            ..Self::default()
        }
    }

    /// The id of kernel `name`, added on first sight.
    pub fn name_id(&mut self, name: &str) -> usize {
        if let Some(&id) = self.index.get(name) {
            return id;
        }
        let id = self.names.len();
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), id);
        self.calls.push(0);
        self.total_ns.push(0);
        id
    }

    /// Counts records the tracer reports lost.
    pub fn add_dropped(&mut self, n: u64) {
        self.dropped += n;
    }

    /// Folds in one batch of spans (any order within the batch). Spans are
    /// clipped to the trace's start; a span with an unknown name id or that
    /// ends before it starts is ignored. Batches are expected in time order,
    /// as a tracer delivers them; a span that starts before the open merged
    /// interval and does not touch it is counted on its own.
    pub fn add(&mut self, batch: &mut [KernelSpan]) {
        batch.sort_unstable_by_key(|s| s.start_ns);
        for s in batch.iter() {
            let start = s.start_ns.max(self.since_ns);
            if s.end_ns < s.start_ns || s.name >= self.names.len() {
                continue;
            }
            self.kernels += 1;
            self.calls[s.name] += 1;
            self.total_ns[s.name] += s.end_ns - s.start_ns;
            if s.end_ns <= start {
                continue;
            }
            self.open = Some(match self.open {
                None => (start, s.end_ns),
                Some((a, b)) if start > b => {
                    self.busy_ns += b - a;
                    (start, s.end_ns)
                }
                Some((a, b)) if s.end_ns < a => {
                    self.busy_ns += s.end_ns - start;
                    (a, b)
                }
                Some((a, b)) => (a.min(start), b.max(s.end_ns)),
            });
        }
    }

    /// The result for a trace that ended at `until_ns`, covering `steps`
    /// optimizer steps; kernel time after `until_ns` is not counted.
    pub fn finish(mut self, until_ns: u64, steps: usize, source: &str) -> GpuBusy {
        if let Some((a, b)) = self.open.take() {
            self.busy_ns += b.min(until_ns).saturating_sub(a);
        }
        let wall_ns = until_ns.saturating_sub(self.since_ns);
        let busy_ns = self.busy_ns.min(wall_ns);
        let summed: u64 = self.total_ns.iter().sum();
        let mut rows: Vec<KernelRow> = self
            .names
            .into_iter()
            .zip(self.calls.iter().zip(&self.total_ns))
            .filter(|(_, (&calls, _))| calls > 0)
            .map(|(name, (&calls, &ns))| KernelRow {
                name,
                calls,
                total_ms: ns as f64 / 1e6,
                mean_us: ns as f64 / 1e3 / calls as f64,
                percent: ratio(ns as f64, summed as f64),
            })
            .collect();
        rows.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.name.cmp(&b.name)));
        rows.truncate(TOP_KERNELS);
        GpuBusy {
            source: source.to_string(),
            percent: ratio(busy_ns as f64, wall_ns as f64),
            kernel_s: busy_ns as f64 / 1e9,
            wall_s: wall_ns as f64 / 1e9,
            kernels: self.kernels,
            steps: steps as u64,
            kernels_per_step: if steps > 0 {
                self.kernels as f64 / steps as f64
            } else {
                0.0
            },
            mean_kernel_us: if self.kernels > 0 {
                summed as f64 / 1e3 / self.kernels as f64
            } else {
                0.0
            },
            dropped: self.dropped,
            top: rows,
            note: String::new(),
        }
    }
}

/// `100 * a / b`, 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        100.0 * a / b
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start_ns: u64, end_ns: u64, name: usize) -> KernelSpan {
        KernelSpan {
            start_ns,
            end_ns,
            name,
        }
    }

    #[test]
    fn back_to_back_kernels_with_gaps() {
        // Ten steps of three 2 µs kernels each launched 10 µs apart: the GPU
        // runs 6 µs of every 30 µs.
        let mut t = KernelTally::new(0);
        let names = [t.name_id("gemm"), t.name_id("relu"), t.name_id("adam")];
        for step in 0..10u64 {
            let mut batch: Vec<KernelSpan> = (0..3u64)
                .map(|k| {
                    let s = step * 30_000 + k * 10_000;
                    span(s, s + 2_000, names[k as usize])
                })
                .collect();
            t.add(&mut batch);
        }
        let b = t.finish(300_000, 10, "cupti");
        assert!((b.percent - 20.0).abs() < 1e-9, "{}", b.percent);
        assert!((b.kernel_s - 60e-6).abs() < 1e-15);
        assert_eq!(b.kernels, 30);
        assert!((b.kernels_per_step - 3.0).abs() < 1e-12);
        assert!((b.mean_kernel_us - 2.0).abs() < 1e-12);
        assert!((b.idle_percent() - 80.0).abs() < 1e-9);
        assert_eq!(b.top.len(), 3);
        assert!(b
            .top
            .iter()
            .all(|r| r.calls == 10 && (r.mean_us - 2.0).abs() < 1e-12));
        let line = b.line();
        assert!(line.contains("GPU busy 20.0% of wall"), "{line}");
        assert!(line.contains("3.0 kernels per step, 2.0 µs each"), "{line}");
    }

    #[test]
    fn overlapping_kernels_count_once() {
        // Two streams: [0,10) and [5,15) overlap; [20,30) is alone.
        let mut t = KernelTally::new(0);
        let a = t.name_id("a");
        let b = t.name_id("b");
        t.add(&mut [span(5, 15, b), span(0, 10, a)]);
        t.add(&mut [span(20, 30, a)]);
        let g = t.finish(40, 1, "cupti");
        assert!((g.percent - 62.5).abs() < 1e-9, "{}", g.percent);
        assert_eq!(g.kernels, 3);
        // Summed time is 30 ns: a ran 20 of it.
        assert_eq!(g.top[0].name, "a");
        assert!((g.top[0].percent - 100.0 * 20.0 / 30.0).abs() < 1e-9);
    }

    #[test]
    fn late_batch_before_the_open_interval_is_counted_on_its_own() {
        let mut t = KernelTally::new(0);
        let a = t.name_id("a");
        t.add(&mut [span(100, 110, a)]);
        t.add(&mut [span(10, 20, a)]);
        let g = t.finish(200, 2, "cupti");
        assert!((g.kernel_s - 20e-9).abs() < 1e-18, "{}", g.kernel_s);
    }

    #[test]
    fn clipped_to_the_trace_and_robust_to_bad_records() {
        let mut t = KernelTally::new(100);
        let a = t.name_id("a");
        assert_eq!(t.name_id("a"), a, "names are interned");
        t.add(&mut [
            span(50, 150, a),   // half before the trace
            span(300, 250, a),  // ends before it starts: ignored
            span(400, 410, 99), // unknown name: ignored
            span(180, 260, a),  // runs past the end
        ]);
        t.add_dropped(3);
        let g = t.finish(200, 0, "cupti");
        // Busy: 100..150 and 180..200 = 70 of 100 ns.
        assert!((g.percent - 70.0).abs() < 1e-9, "{}", g.percent);
        assert_eq!(g.kernels, 2);
        assert_eq!(g.kernels_per_step, 0.0);
        assert_eq!(g.dropped, 3);
        assert!(g.line().contains("3 records lost"));
    }

    #[test]
    fn an_empty_trace_is_zero_not_nan() {
        let g = KernelTally::new(5).finish(5, 0, "cupti");
        assert_eq!(g.percent, 0.0);
        assert_eq!(g.mean_kernel_us, 0.0);
        assert!(g.top.is_empty());
    }

    #[test]
    fn keeps_the_longest_kernels() {
        let mut t = KernelTally::new(0);
        let mut batch = Vec::new();
        for k in 0..(TOP_KERNELS as u64 + 5) {
            let id = t.name_id(&format!("k{k}"));
            batch.push(span(k * 1000, k * 1000 + k + 1, id));
        }
        t.add(&mut batch);
        let g = t.finish(1_000_000, 1, "cupti");
        assert_eq!(g.top.len(), TOP_KERNELS);
        assert_eq!(g.top[0].name, format!("k{}", TOP_KERNELS + 4));
        assert!(g.top.windows(2).all(|w| w[0].total_ms >= w[1].total_ms));
    }

    #[test]
    fn replay_events_stand_in_for_kernel_records() {
        let g = GpuBusy::from_replays(0.156, 935, 0.2, 938, "libcupti was not found");
        assert!((g.percent - 78.0).abs() < 1e-9, "{}", g.percent);
        assert_eq!(g.kernels, 0);
        let line = g.line();
        assert!(
            line.starts_with("GPU busy 78.0% of wall (0.156 s of graph replay events"),
            "{line}"
        );
        assert!(
            line.contains("libcupti was not found; timed 935 graph replays"),
            "{line}"
        );
        // Never more busy than the wall.
        assert_eq!(GpuBusy::from_replays(3.0, 1, 2.0, 1, "x").percent, 100.0);
        let json = serde_json::to_string(&g).unwrap_or_default();
        let back: GpuBusy = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, g);
        assert!(
            !serde_json::to_string(&KernelTally::new(0).finish(1, 1, "cupti"))
                .unwrap_or_default()
                .contains("note")
        );
    }

    #[test]
    fn reads_back_tolerantly() {
        let g: GpuBusy =
            serde_json::from_str(r#"{"percent":31.5,"top":null,"kernels":null,"x":1}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.percent, 31.5);
        assert!(g.top.is_empty());
        assert_eq!(g.kernels, 0);
    }
}
