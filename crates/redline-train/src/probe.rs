//! Timing a job's training step on a device, for `--device auto` and the
//! batch-size finder: fresh steps from the caller, so the probe trains
//! nothing the run keeps.

use redline_core::Device;
use redline_data::Loader;

use crate::error::{Error, Result};
use crate::graph::GraphMode;
use crate::optim::OptimizerConfig;
use crate::step::TrainStep;
use crate::trainer::{TrainConfig, Trainer};

/// What [`measure`] timed.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Milliseconds per optimizer step.
    pub step_ms: f64,
    /// GPU busy % (kernel time / wall) over the timed fit, on a GPU with
    /// the kernel trace.
    pub gpu_busy_pct: Option<f64>,
    /// The step's memory, as the timed fit measured it.
    pub memory: Option<crate::memory::MemorySplit>,
}

/// Milliseconds per optimizer step of a step from `make` on `device`,
/// measured over `timed` steps of `train`. A first fit of `warmup` steps, with
/// another step from `make`, pays the first-use costs (kernel compilation,
/// allocator growth) outside the measurement. Each fit ends with a read of
/// its sums, so the time covers the device finishing the work, not only the
/// host queueing it.
pub fn step_ms(
    make: &dyn Fn() -> Result<Box<dyn TrainStep>>,
    device: &Device,
    train: &Loader,
    optimizer: &OptimizerConfig,
    warmup: usize,
    timed: usize,
) -> Result<f64> {
    Ok(measure(make, device, train, optimizer, None, (warmup, timed), false)?.step_ms)
}

/// [`step_ms`] with `loss_scale`'s scaler in the step (`16-mixed`), and
/// with `kernel_trace` on a GPU, how busy the GPU was.
pub fn measure(
    make: &dyn Fn() -> Result<Box<dyn TrainStep>>,
    device: &Device,
    train: &Loader,
    optimizer: &OptimizerConfig,
    loss_scale: Option<crate::scaler::LossScale>,
    (warmup, timed): (usize, usize),
    kernel_trace: bool,
) -> Result<Measured> {
    type Fit = (usize, f64, Option<f64>, Option<crate::memory::MemorySplit>);
    let fit = |steps: usize, trace: bool| -> Result<Fit> {
        let cfg = TrainConfig {
            epochs: 0,
            max_steps: Some(steps),
            log_every: steps,
            validate: false,
            divergence_threshold: None,
            // What the run itself does: on a GPU the step is captured where
            // it can be, so the probe times replays, not eager launches.
            cuda_graph: GraphMode::Auto,
            kernel_trace: trace,
            loss_scale,
            ..TrainConfig::default()
        };
        let mut trainer = Trainer::builder()
            .config(cfg)
            .optimizer(optimizer.clone())
            .build(make()?, device.clone())?;
        let summary = trainer.fit(train, None)?;
        let busy = match &summary.gpu_busy {
            Some(Ok(g)) => Some(g.percent),
            _ => None,
        };
        Ok((summary.steps, summary.train_s, busy, summary.memory))
    };
    if warmup > 0 {
        fit(warmup, false)?;
    }
    let (steps, secs, gpu_busy_pct, memory) = fit(timed.max(1), kernel_trace)?;
    if steps == 0 || !(secs.is_finite() && secs > 0.0) {
        return Err(Error::Config(format!(
            "the device probe ran {steps} steps in {secs} s: nothing to compare"
        )));
    }
    Ok(Measured {
        step_ms: 1e3 * secs / steps as f64,
        gpu_busy_pct,
        memory,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::Classifier;
    use candle_core::Tensor;
    use redline_core::Precision;
    use redline_data::{LoaderConfig, Split, TargetKind};
    use redline_models::ModelConfig;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn times_a_fresh_step_per_fit() -> Result<()> {
        let cpu = candle_core::Device::Cpu;
        let n = 640;
        let labels: Vec<u32> = (0..n as u32).map(|i| i % 10).collect();
        let split = Split {
            x: Tensor::rand(0f32, 1.0, (n, 1, 28, 28), &cpu)?,
            y: Tensor::from_vec(labels, n, &cpu)?,
            target: TargetKind::Classes(10),
            source: "probe-test".into(),
        };
        let train = Loader::new(
            split,
            LoaderConfig {
                batch_size: 64,
                ..LoaderConfig::default()
            },
        )?;
        let dev = Device::cpu();
        let made = AtomicUsize::new(0);
        let make = || -> Result<Box<dyn TrainStep>> {
            made.fetch_add(1, Ordering::Relaxed);
            let model = ModelConfig::by_name("mlp")?.build(&dev, Precision::Fp32, 0)?;
            Ok(Box::new(Classifier::new(model)))
        };
        let adam = OptimizerConfig::by_name("adam", 1e-3)?;
        let ms = step_ms(&make, &dev, &train, &adam, 2, 5)?;
        assert!(ms.is_finite() && ms > 0.0, "{ms}");
        assert_eq!(made.load(Ordering::Relaxed), 2, "a fresh step for each fit");
        Ok(())
    }
}
