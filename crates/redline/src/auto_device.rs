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
/// Steps timed on each device, at most.
const TIMED_STEPS: usize = 30;
/// Fewest steps timed: a slow step is timed this many times.
const MIN_TIMED_STEPS: usize = 3;
/// About how long the timed steps of one measurement may take, judged by
/// the warm-up's steps: ResNet-18 at 224 px on two cores takes about a
/// second a step, and 35 steps in each of two precisions held a 16-bit
/// run for 75 s before its training began.
const TIMED_BUDGET_MS: f64 = 3000.0;

/// How many steps to time after warm-up steps of `warm_ms` each.
fn timed_steps(warm_ms: f64) -> usize {
    if !(warm_ms.is_finite() && warm_ms > 0.0) {
        return TIMED_STEPS;
    }
    ((TIMED_BUDGET_MS / warm_ms) as usize).clamp(MIN_TIMED_STEPS, TIMED_STEPS)
}

/// `"30 steps each"`, or `"30 and 3 steps"` when the measurements timed
/// different numbers of steps.
fn step_counts(steps: &[usize]) -> String {
    match steps {
        [first, rest @ ..] if rest.iter().all(|s| s == first) => format!("{first} steps each"),
        _ => {
            let all: Vec<String> = steps.iter().map(usize::to_string).collect();
            format!("{} steps", all.join(" and "))
        }
    }
}

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
    let (mut timed, mut steps) = (Vec::new(), Vec::new());
    for candidate in [DeviceSpec::Cpu, selected] {
        let device = Device::resolve(candidate)?;
        let (m, n) = step_ms(job, &device, Precision::Fp32)
            .with_context(|| format!("--device auto: timing the step on {device}"))?;
        timed.push((device, m.step_ms));
        steps.push(n);
    }
    let (line, pick) = verdict(&timed, &step_counts(&steps), WARMUP_STEPS);
    let device = timed.swap_remove(pick).0;
    Ok((device, Some(line)))
}

/// The step of `job` on `device` in `precision` (its milliseconds and
/// memory) and how many steps were timed: a head of the training split,
/// placed once, [`WARMUP_STEPS`] warm-up steps, then [`TIMED_STEPS`] timed
/// steps, or fewer when the warm-up's were slow ([`timed_steps`]).
fn step_ms(
    job: &Job<'_>,
    device: &Device,
    precision: Precision,
) -> anyhow::Result<(probe::Measured, usize)> {
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
    let fit = |steps: usize| {
        probe::measure(
            &make,
            device,
            &loader,
            job.optimizer,
            loss_scale,
            (0, steps),
            false,
        )
    };
    let steps = timed_steps(fit(WARMUP_STEPS)?.step_ms);
    Ok((fit(steps)?, steps))
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
    let (half_m, half_n) = step_ms(job, device, precision).with_context(context)?;
    let (full_m, full_n) = step_ms(job, device, Precision::Fp32).with_context(context)?;
    let counts = step_counts(&[half_n, full_n]);
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
             {device} ({counts} after {WARMUP_STEPS} warm-up steps): {verdict}"
        ),
        ratio,
        activations,
    }))
}

/// The faster of the timed devices (the first on a tie) and the sentence
/// that says so, with every measurement.
fn verdict(timed: &[(Device, f64)], steps: &str, warmup: usize) -> (String, usize) {
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
         after {warmup} warm-up steps)",
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
        let (line, pick) = verdict(&timed, &step_counts(&[30, 30]), 5);
        assert_eq!(pick, 0);
        assert_eq!(
            line,
            "device auto: cpu, 0.360 ms per step against 1.810 ms on cpu (this model and batch, \
             30 steps each after 5 warm-up steps)"
        );
        let (line, pick) = verdict(
            &[(Device::cpu(), 2.0), (Device::cpu(), 1.5)],
            &step_counts(&[30, 4]),
            5,
        );
        assert_eq!(pick, 1);
        assert!(line.ends_with("(this model and batch, 30 and 4 steps after 5 warm-up steps)"));
    }

    /// A slow step is timed fewer times, never fewer than three; a fast or
    /// unmeasurable one thirty times.
    #[test]
    fn slow_steps_are_timed_fewer_times() {
        assert_eq!(timed_steps(0.3), TIMED_STEPS);
        assert_eq!(timed_steps(100.0), TIMED_STEPS);
        assert_eq!(timed_steps(200.0), 15);
        assert_eq!(timed_steps(1100.0), MIN_TIMED_STEPS);
        assert_eq!(timed_steps(f64::NAN), TIMED_STEPS);
        assert_eq!(step_counts(&[3, 3]), "3 steps each");
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
