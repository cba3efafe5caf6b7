//! `summary.json`, the records of `metrics.jsonl`, and (from `redline-profile`)
//! `breakdown.json` and `profile.json`, as typed structs
//! (docs/run-dir.md): what the writer ([`crate::Run`], [`crate::RunLog`])
//! writes and what `redline-report` reads.
//!
//! Every struct is tolerant: unknown fields are ignored, and a missing or `null`
//! field reads as `None` (or an empty string/list), because a failed run, an
//! older writer or a machine without NVML leaves gaps.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, Serializer};

pub use redline_profile::nullable;
/// `breakdown.json` and `profile.json`, as the profiler writes them and the report reads them.
pub use redline_profile::{
    ActionRow, Breakdown, Category, CategoryShare, GpuBusy, KernelRow, ProfileFile, SpanRow,
    Timeline, TimelineRow,
};

/// How the run ended (`summary.json` `status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "String")]
pub enum RunStatus {
    /// The run completed every epoch.
    Finished,
    /// The run stopped on an error (`Summary::error` holds it).
    Failed,
    /// The run was stopped by a signal after a whole step (`Summary::error` says which).
    Interrupted,
    /// A status this version does not know, kept verbatim.
    Other(String),
    /// No status was written.
    #[default]
    Unknown,
}

impl From<String> for RunStatus {
    fn from(s: String) -> Self {
        match s.as_str() {
            "finished" => Self::Finished,
            "failed" => Self::Failed,
            "interrupted" => Self::Interrupted,
            "" => Self::Unknown,
            _ => Self::Other(s),
        }
    }
}

impl Serialize for RunStatus {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Finished => "finished",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
            Self::Other(s) => s,
            Self::Unknown => "unknown",
        })
    }
}

/// `summary.json`: the run's headline numbers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    /// Model name (`mlp`, `cnn`, ...).
    #[serde(deserialize_with = "nullable")]
    pub model: String,
    /// Device the run used (`cpu`, `cuda:0`).
    #[serde(deserialize_with = "nullable")]
    pub device: String,
    /// Local start time, `YYYY-mm-dd HH:MM:SS`.
    #[serde(deserialize_with = "nullable")]
    pub started: String,
    /// Start time as Unix seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_unix: Option<f64>,
    /// Finished or failed.
    pub status: RunStatus,
    /// The error message of a failed run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Epochs run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epochs: Option<u64>,
    /// Optimizer steps run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// Training samples seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Samples per step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u64>,
    /// Seconds from start to end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<f64>,
    /// Seconds in training epochs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_s: Option<f64>,
    /// Seconds in evaluation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_s: Option<f64>,
    /// Training throughput.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples_per_s: Option<f64>,
    /// Loss of the test pass after training (older runs: the last validation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_loss: Option<f64>,
    /// Accuracy of the test pass, 0..1 (classification only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
    /// Loss of the last validation pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Accuracy of the last validation pass, 0..1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_accuracy: Option<f64>,
    /// Device-to-host reads per optimizer step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_syncs_per_step: Option<f64>,
    /// How `--device auto` chose between the CPU and a GPU, with the step
    /// times it measured (absent when there was no choice to make).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_choice: Option<String>,
    /// Where validation came from (held out of the training split, and how).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation: Option<String>,
    /// The learning-rate schedule (`--lr-schedule`), when not constant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_schedule: Option<String>,
    /// A short run's limits (`--fast-dev-run`, `--limit-*-batches`, `--overfit-batches`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_run: Option<String>,
    /// `--fast-dev-run N`: the run only checked that training works.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast_dev_run: Option<u64>,
    /// Why the fit ended before its planned epochs (`--early-stop`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<String>,
    /// Whether the step ran as a replayed CUDA graph, or why not (`--cuda-graph`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_graph: Option<String>,
    /// `16-mixed`: the loss scaler's standing at the end (scale, clean
    /// steps in a row, steps skipped on overflow).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<LossScaleRecord>,
    /// On a GPU: how its fp32 matrix products were computed
    /// (`--matmul-precision`: fp32 or TF32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matmul_precision: Option<String>,
    /// On a GPU: what ran the fused path's convolutions (`--gpu-conv`: cuDNN
    /// and its version, or Redline's implicit-GEMM kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_conv: Option<String>,
    /// On a GPU: the time kernels ran over the fit's wall time (CUPTI's
    /// kernel records), with the kernels per step and the longest kernels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_busy: Option<GpuBusy>,
    /// On a GPU without [`Summary::gpu_busy`]: why it was not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_busy_note: Option<String>,
    /// The training FLOPs counted from the model and the MFU against the
    /// device's peak: `train_per_sample`, `per_step`, `achieved_per_s`,
    /// `peak_per_s`, `peak_source`, `mfu`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops: Option<redline_train::mfu::FlopsSummary>,
    /// Without [`Summary::flops`]: why the FLOPs are not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops_note: Option<String>,
    /// On a GPU: seconds the device's opening spent loading (on a machine's
    /// first run, compiling) candle's kernels, before training.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_kernels_load_s: Option<f64>,
    /// Compute threads the run used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u64>,
    /// Cores that were free when the run started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_cores: Option<f64>,
    /// Logical cores of the machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logical_cores: Option<u64>,
    /// Batches prefetched ahead of the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<u64>,
    /// Profiler mode (`off`, `simple`, `detailed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profiler: Option<String>,
    /// Every other key: the step's other metrics (`test_mae`, `val_mae`, ...)
    /// and fields this reader does not type.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// `summary.json`'s `loss_scale` (redline-train's `ScalerState`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScaleRecord {
    /// The scale at the end; `inf` or `NaN` written as the string `"inf"`
    /// or `"NaN"` (JSON has no such number, and `null` would fail the read).
    #[serde(with = "any_f64")]
    pub scale: f64,
    /// Clean steps since the last growth or overflow.
    pub growth_tracker: u64,
    /// Optimizer steps skipped because their gradients overflowed.
    pub skipped_steps: u64,
}

impl Summary {
    /// The run's headline result: test accuracy, else the first other test
    /// metric, else the last validation's accuracy; `(name, value)`.
    pub fn headline(&self) -> Option<(String, f64)> {
        if let Some(a) = self.test_accuracy {
            return Some(("test accuracy".into(), a));
        }
        let test = self.other.iter().find_map(|(k, v)| {
            let name = k.strip_prefix("test_")?;
            Some((format!("test {name}"), v.as_f64()?))
        });
        test.or_else(|| self.val_accuracy.map(|a| ("val accuracy".into(), a)))
    }
}

/// A `{"kind":"step"}` record of `metrics.jsonl`, written at each log point.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StepRecord {
    /// Optimizer step (1-based, counted across epochs).
    pub step: u64,
    /// Epoch (1-based).
    pub epoch: u64,
    /// Mean training loss over the log window.
    pub loss: Option<f64>,
    /// Learning rate.
    pub lr: Option<f64>,
    /// Throughput over the log window.
    pub samples_per_s: Option<f64>,
    /// Seconds since training started.
    pub elapsed_s: Option<f64>,
    /// Gradient norm before clipping (with `--log-grad-norm` or norm clipping).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    /// The loss scale after the step (`16-mixed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// Training FLOPs per second over the log window (the model counts its FLOPs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops_per_s: Option<f64>,
    /// Model FLOPs utilisation over the log window (the device's peak is known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
}

/// A `{"kind":"epoch"}` record of `metrics.jsonl`, written at each epoch end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct EpochRecord {
    /// Epoch (1-based).
    pub epoch: u64,
    /// Mean training loss of the epoch.
    pub train_loss: Option<f64>,
    /// Training accuracy, 0..1 (classification).
    pub train_accuracy: Option<f64>,
    /// Validation loss after the epoch (`test_loss` in older runs).
    #[serde(alias = "test_loss")]
    pub val_loss: Option<f64>,
    /// Validation accuracy after the epoch, 0..1 (`test_accuracy` in older runs).
    #[serde(alias = "test_accuracy")]
    pub val_accuracy: Option<f64>,
    /// Seconds of training in the epoch.
    pub epoch_s: Option<f64>,
    /// Seconds of evaluation after it.
    pub eval_s: Option<f64>,
    /// Optimizer steps in the epoch.
    pub steps: Option<u64>,
    /// Training samples in the epoch.
    pub samples: Option<u64>,
    /// The step's other metrics: `train_<name>` and `val_<name>` keys.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl EpochRecord {
    /// `train_<name>` (`split` = `train`) or `val_<name>` of this epoch.
    pub fn metric(&self, split: &str, name: &str) -> Option<f64> {
        match (split, name) {
            ("train", "accuracy") => self.train_accuracy,
            ("val", "accuracy") => self.val_accuracy,
            _ => self.other.get(&format!("{split}_{name}"))?.as_f64(),
        }
    }

    /// Names of the metrics this record holds (besides the loss), sorted.
    pub fn metric_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .other
            .keys()
            .filter_map(|k| k.strip_prefix("train_").or_else(|| k.strip_prefix("val_")))
            .map(str::to_string)
            .collect();
        if self.train_accuracy.is_some() || self.val_accuracy.is_some() {
            names.push("accuracy".into());
        }
        names.sort();
        names.dedup();
        names
    }
}

/// Host numbers of a system record.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HostSample {
    /// Busy percent of each logical core.
    #[serde(deserialize_with = "nullable")]
    pub cpu_percent_per_core: Vec<Option<f64>>,
    /// Mean busy percent over the cores, 0..100.
    pub cpu_percent: Option<f64>,
    /// Used host memory, bytes.
    pub memory_used: Option<f64>,
    /// Total host memory, bytes.
    pub memory_total: Option<f64>,
    /// CPU of the redline process; 100 = one core busy.
    pub process_cpu_percent: Option<f64>,
    /// Resident memory of the redline process, bytes.
    pub process_rss: Option<f64>,
    /// Redline processes on the host.
    #[serde(deserialize_with = "nullable")]
    pub processes: Vec<HostProcess>,
}

/// A redline process of a host sample.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HostProcess {
    /// Process id.
    pub pid: u64,
    /// Command name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// CPU used; 100 = one core busy.
    pub cpu_percent: Option<f64>,
    /// Resident memory, bytes.
    pub rss: Option<f64>,
}

/// One GPU of a system record.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuSample {
    /// NVML index.
    pub index: u64,
    /// Product name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Percent of time a kernel ran, 0..100.
    pub utilization_gpu_percent: Option<f64>,
    /// Percent of time memory was read or written, 0..100.
    pub utilization_memory_percent: Option<f64>,
    /// Used device memory, bytes.
    pub memory_used: Option<f64>,
    /// Total device memory, bytes.
    pub memory_total: Option<f64>,
    /// Temperature, °C.
    pub temperature_c: Option<f64>,
    /// Power draw, W.
    pub power_w: Option<f64>,
    /// Power limit, W.
    pub power_limit_w: Option<f64>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<f64>,
    /// Memory clock, MHz.
    pub memory_clock_mhz: Option<f64>,
    /// Processes holding a context on the GPU.
    #[serde(deserialize_with = "nullable")]
    pub processes: Vec<GpuProcess>,
}

/// A process of a GPU sample.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuProcess {
    /// Process id (in the driver's pid namespace).
    pub pid: u64,
    /// Command name; empty where it could not be read.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Device memory it uses, bytes.
    pub memory_used: Option<f64>,
}

/// A `{"kind":"system"}` record of `metrics.jsonl`: one monitor sample.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SystemRecord {
    /// Seconds since the sampler started.
    pub t_s: Option<f64>,
    /// Wall-clock time, Unix seconds.
    pub unix_time: Option<f64>,
    /// Host numbers, if the host was sampled.
    pub host: Option<HostSample>,
    /// One entry per GPU; empty without NVML.
    #[serde(deserialize_with = "nullable")]
    pub gpus: Vec<GpuSample>,
    /// Why there is no GPU data.
    pub gpu_note: Option<String>,
}

/// One line of `metrics.jsonl`, told apart by `kind`; unknown kinds are skipped.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    /// A log point.
    Step(StepRecord),
    /// An epoch end.
    Epoch(EpochRecord),
    /// A system sample.
    System(SystemRecord),
    /// A kind this version does not read (`test`, or a newer writer's).
    #[serde(other)]
    Other,
}

/// An `f64` that may be infinite or NaN: written as a number when finite,
/// else as its text (`"inf"`, `"-inf"`, `"NaN"`); read from a number, that
/// text, or `null` (NaN: what `serde_json` makes of a non-finite number).
mod any_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_str(&v.to_string())
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Any {
            Number(f64),
            Text(String),
        }
        Ok(match Option::<Any>::deserialize(d)? {
            Some(Any::Number(v)) => v,
            Some(Any::Text(t)) => t.trim().parse().map_err(|_| {
                serde::de::Error::custom(format!("{t:?} is not a number, `inf` or `NaN`"))
            })?,
            None => f64::NAN,
        })
    }
}

#[cfg(test)]
mod any_f64_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An infinite loss scale (all fp16 steps overflowed) is written and read
    /// back. Before, the summary failed with "invalid type: null, expected
    /// f64" and was never written.
    #[test]
    fn a_non_finite_loss_scale_is_written_and_read() {
        let from_writer = serde_json::json!({"loss_scale": {
            "scale": f64::INFINITY, "growth_tracker": 0, "skipped_steps": 6
        }});
        let s: Summary = serde_json::from_value(from_writer).unwrap();
        assert!(s.loss_scale.unwrap().scale.is_nan(), "null reads as NaN");
        for v in [f64::INFINITY, f64::NEG_INFINITY, 3.0e38] {
            let rec = LossScaleRecord {
                scale: v,
                growth_tracker: 1,
                skipped_steps: 2,
            };
            let text = serde_json::to_string(&rec).unwrap();
            let back: LossScaleRecord = serde_json::from_str(&text).unwrap();
            assert_eq!(back, rec, "{text}");
        }
        let nan = LossScaleRecord {
            scale: f64::NAN,
            growth_tracker: 0,
            skipped_steps: 0,
        };
        let text = serde_json::to_string(&nan).unwrap();
        assert!(text.contains(r#""NaN""#), "{text}");
        assert!(serde_json::from_str::<LossScaleRecord>(&text)
            .unwrap()
            .scale
            .is_nan());
        let bad = r#"{"scale":"big","growth_tracker":0,"skipped_steps":0}"#;
        assert!(serde_json::from_str::<LossScaleRecord>(bad).is_err());
    }
}
