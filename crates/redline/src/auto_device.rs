//! `--device auto`: with a GPU present, the job's own step is timed on the CPU
//! and on the GPU, and the faster one trains. A small model at a small batch
//! can run faster on the host than on a launch-bound GPU (issue 12 measured 0.32
//! against 1.70 s per MLP epoch on an H100 machine).

use anyhow::Context;
use redline_core::{Device, DeviceSpec, Precision};
use redline_data::{Dataset, Loader, LoaderConfig, Samples};
use redline_models::ModelConfig;
use redline_train::{probe, OptimizerConfig, TrainStep};

use crate::step_kind::StepKind;

/// Steps that pay first-use costs (kernel compilation) before the timing.
const WARMUP_STEPS: usize = 5;
/// Steps timed on each device.
const TIMED_STEPS: usize = 30;

/// The job the probe times: the run's model, step, optimizer and batch.
pub struct Job<'a> {
    /// The training split (a head of it is used).
    pub train: &'a Samples,
    /// The model, shaped for the data.
    pub model: &'a ModelConfig,
    /// Classification or regression, and the loss.
    pub step: StepKind,
    /// The run's optimizer.
    pub optimizer: &'a OptimizerConfig,
    /// Samples per step.
    pub batch_size: usize,
    /// The run's seed.
    pub seed: u64,
    /// 16-mixed's loss scaler, so that its step is timed with it.
    pub loss_scale: Option<redline_train::LossScale>,
}

/// The device to train on, and for `auto` with a choice to make, the line
/// saying what was measured.
pub fn choose(
    spec: DeviceSpec,
    selected: DeviceSpec,
    job: &Job<'_>,
) -> anyhow::Result<(Device, Option<String>)> {
    if spec != DeviceSpec::Auto || selected == DeviceSpec::Cpu {
        return Ok((Device::resolve(selected)?, None));
    }
    let mut timed = Vec::new();
    for candidate in [DeviceSpec::Cpu, selected] {
        let device = Device::resolve(candidate)?;
        let ms = step_ms(job, &device, Precision::Fp32)
            .with_context(|| format!("--device auto: timing the step on {device}"))?
            .step_ms;
        timed.push((device, ms));
    }
    let (line, pick) = verdict(&timed, TIMED_STEPS, WARMUP_STEPS);
    let device = timed.swap_remove(pick).0;
    Ok((device, Some(line)))
}

/// The step of `job` on `device` in `precision` (its milliseconds and
/// memory): a head of the training split, placed once, [`WARMUP_STEPS`]
/// untimed then [`TIMED_STEPS`] timed steps.
fn step_ms(
    job: &Job<'_>,
    device: &Device,
    precision: Precision,
) -> anyhow::Result<probe::Measured> {
    let batch = job.batch_size.clamp(1, job.train.len().max(1));
    let n = job.train.len().min((WARMUP_STEPS + TIMED_STEPS) * batch);
    let head: Vec<u32> = (0..n as u32).collect();
    let loader = Loader::placed_host(
        job.train.head(head.len())?,
        device.candle(),
        redline_data::Placement::Resident,
        LoaderConfig {
            batch_size: batch,
            shuffle: false,
            seed: job.seed,
            prefetch: 0,
            drop_last: false,
        },
    )?;
    let make = || -> redline_train::Result<Box<dyn TrainStep>> {
        let model = job.model.build(device, precision, job.seed)?;
        Ok(job.step.step(model))
    };
    // The job's scaler times 16-mixed; the fp32 run it is compared with has none.
    let loss_scale = job.loss_scale.filter(|_| precision == Precision::Fp16Mixed);
    Ok(probe::measure(
        &make,
        device,
        &loader,
        job.optimizer,
        loss_scale,
        (WARMUP_STEPS, TIMED_STEPS),
        false,
    )?)
}

/// A 16-bit precision measured against fp32 on the run's own job and device.
#[derive(Debug, Clone)]
pub struct PrecisionTiming {
    /// The sentence with both step times and the verdict.
    pub line: String,
    /// The 16-bit step time over the fp32 one.
    pub ratio: f64,
    /// One batch's activations in the 16-bit precision and in fp32 (bytes),
    /// and the batch.
    pub activations: Option<(u64, u64, usize)>,
}

/// A 16-bit precision timed against fp32 on the run's own job and device,
/// so that a 16-bit run slower than fp32 (a CPU without a native 16-bit
/// path) says so with both numbers: the line, and the 16-bit time over the
/// fp32 one. `None` for fp32.
pub fn precision_timing(
    job: &Job<'_>,
    device: &Device,
    precision: Precision,
) -> anyhow::Result<Option<PrecisionTiming>> {
    if precision == Precision::Fp32 {
        return Ok(None);
    }
    let context = || format!("--precision {precision}: timing the step against 32-true");
    let half_m = step_ms(job, device, precision).with_context(context)?;
    let full_m = step_ms(job, device, Precision::Fp32).with_context(context)?;
    let activations = match (&half_m.memory, &full_m.memory) {
        (Some(h), Some(f)) => Some((h.activations, f.activations, h.batch)),
        _ => None,
    };
    let (half, full) = (half_m.step_ms, full_m.step_ms);
    let ratio = half / full.max(1e-9);
    let verdict = if ratio > 1.05 {
        format!("{ratio:.2}x slower than 32-true here (--precision 32-true is faster on {device})")
    } else if ratio < 0.95 {
        format!("{:.2}x faster than 32-true", 1.0 / ratio)
    } else {
        "as fast as 32-true".to_string()
    };
    Ok(Some(PrecisionTiming {
        line: format!(
            "precision {precision}: {half:.3} ms per step against {full:.3} ms in 32-true on \
             {device} ({TIMED_STEPS} steps each after {WARMUP_STEPS} warm-up steps): {verdict}"
        ),
        ratio,
        activations,
    }))
}

/// The faster of the timed devices (the first on a tie) and the sentence
/// that says so, with every measurement.
fn verdict(timed: &[(Device, f64)], steps: usize, warmup: usize) -> (String, usize) {
    let pick = timed
        .iter()
        .enumerate()
        .min_by(|a, b| a.1 .1.total_cmp(&b.1 .1))
        .map_or(0, |(i, _)| i);
    let others: Vec<String> = timed
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != pick)
        .map(|(_, (d, ms))| format!("{ms:.3} ms on {d}"))
        .collect();
    let (device, ms) = &timed[pick];
    let line = format!(
        "device auto: {device}, {ms:.3} ms per step against {} (this model and batch, {steps} \
         steps each after {warmup} warm-up steps)",
        others.join(", ")
    );
    (line, pick)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redline_data::{TargetKind, Targets};
    use redline_train::RegressionLoss;

    #[test]
    fn the_verdict_names_the_faster_device_and_every_measurement() {
        let timed = vec![(Device::cpu(), 0.36), (Device::cpu(), 1.81)];
        let (line, pick) = verdict(&timed, 30, 5);
        assert_eq!(pick, 0);
        assert_eq!(
            line,
            "device auto: cpu, 0.360 ms per step against 1.810 ms on cpu (this model and batch, \
             30 steps each after 5 warm-up steps)"
        );
        let (_, pick) = verdict(&[(Device::cpu(), 2.0), (Device::cpu(), 1.5)], 30, 5);
        assert_eq!(pick, 1);
    }

    /// Without a GPU there is nothing to time: auto is the CPU, with no line.
    #[test]
    fn auto_without_a_gpu_is_the_cpu_untimed() -> anyhow::Result<()> {
        let train: Samples = redline_data::HostData::new(
            vec![0.5; 40],
            vec![4],
            Targets::Values(vec![1.0; 10]),
            TargetKind::Values(1),
            "t".into(),
        )?
        .into();
        let model = ModelConfig::for_data("mlp", &[4], 1, None)?;
        let job = Job {
            train: &train,
            model: &model,
            step: StepKind::Regress(RegressionLoss::Mse),
            optimizer: &OptimizerConfig::by_name("adam", 1e-3)?,
            batch_size: 4,
            seed: 0,
            loss_scale: None,
        };
        let (device, line) = choose(DeviceSpec::Auto, DeviceSpec::Cpu, &job)?;
        assert!(device.is_cpu() && line.is_none());
        Ok(())
    }
}
