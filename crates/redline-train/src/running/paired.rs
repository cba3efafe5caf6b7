//! A step's sums into the epoch's and the log window's [`Running`] at once.
//! Where both are updated in place (graph mode) and the device can add in
//! place (the fused kernels on a GPU: `redline_kernels::cuda::step_sums`),
//! every sum of the step is one launch: the loss's product by the batch and
//! its adds into both, and each metric's add. Otherwise candle's ops do it
//! as [`Running::add`] and [`Running::add_extra`] do, an op and a copy per
//! sum. Either way the sums end with the same bits and the counts agree.

use candle_core::Tensor;

use super::{batch_loss_sum, Running};
use crate::error::Result;
use crate::step::Metric;

/// Adds `value * scale` into each sum in place, in order, with the bits of
/// `sum + value.affine(scale, 0)`; `Ok(false)`, with nothing changed, where
/// it cannot (the caller takes candle's ops then).
pub(crate) type InPlaceSums<'a> = &'a dyn Fn(&[(&Tensor, &Tensor, f32)]) -> Result<bool>;

/// The device's in-place adder: the fused kernel where the kernels are on
/// in a CUDA build, else none.
pub(crate) fn device_sums(items: &[(&Tensor, &Tensor, f32)]) -> Result<bool> {
    #[cfg(feature = "cuda")]
    if redline_kernels::fused_gpu::enabled() {
        return Ok(redline_kernels::cuda::step_sums(items)?);
    }
    let _ = items;
    Ok(false)
}

/// A step's mean loss over `samples` and its metrics into `epoch`, and its
/// loss into `window` (which tracks no step metrics), through `sums` where
/// both are in place and it takes them.
pub(crate) fn add_step(
    epoch: &mut Running,
    window: &mut Running,
    mean_loss: &Tensor,
    samples: usize,
    metrics: &[Metric],
    sums: InPlaceSums<'_>,
) -> Result<()> {
    if epoch.in_place && window.in_place {
        epoch.name_metrics(metrics)?;
        let loss = mean_loss.detach();
        let values: Vec<Tensor> = metrics.iter().map(|m| m.sum.detach()).collect();
        let scale = samples as f32;
        let mut items = vec![
            (&epoch.loss_sum, &loss, scale),
            (&window.loss_sum, &loss, scale),
        ];
        items.extend(
            epoch
                .metrics
                .iter()
                .zip(&values)
                .map(|(s, v)| (&s.sum, v, 1.0)),
        );
        if sums(&items)? {
            epoch.samples += samples;
            window.samples += samples;
            for (s, m) in epoch.metrics.iter_mut().zip(metrics) {
                s.count += m.count;
            }
            return Ok(());
        }
    }
    let loss_sum = batch_loss_sum(mean_loss, samples)?;
    epoch.add(&loss_sum, samples, metrics)?;
    window.add_loss(&loss_sum, samples)
}

/// A metric of the loop's own (`grad_norm`) into both, as
/// [`Running::add_extra`] into each.
pub(crate) fn add_extra(
    epoch: &mut Running,
    window: &mut Running,
    m: &Metric,
    sums: InPlaceSums<'_>,
) -> Result<()> {
    if epoch.in_place && window.in_place {
        let value = m.sum.detach();
        let i = epoch.extra_slot(m, value.device())?;
        let j = window.extra_slot(m, value.device())?;
        if let (Some(e), Some(w)) = (epoch.extras.get(i), window.extras.get(j)) {
            if sums(&[(&e.sum, &value, 1.0), (&w.sum, &value, 1.0)])? {
                for s in [epoch.extras.get_mut(i), window.extras.get_mut(j)]
                    .into_iter()
                    .flatten()
                {
                    s.count += m.count;
                }
                return Ok(());
            }
        }
    }
    epoch.add_extra(m)?;
    window.add_extra(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};
    use redline_core::host::HostReads;

    /// The kernel's arithmetic with candle's CPU ops, written in place.
    fn cpu_sums(items: &[(&Tensor, &Tensor, f32)]) -> Result<bool> {
        for (sum, value, scale) in items {
            let v = value.to_dtype(DType::F32)?.affine(f64::from(*scale), 0.0)?;
            Var::from_tensor(sum)?.set(&(*sum + v)?)?;
        }
        Ok(true)
    }

    fn declines(_: &[(&Tensor, &Tensor, f32)]) -> Result<bool> {
        Ok(false)
    }

    fn scalar(v: f32) -> Result<Tensor> {
        Ok(Tensor::new(v, &Device::Cpu)?)
    }

    /// Three steps (losses and metrics of awkward bits), a loop metric at
    /// two of them, into in-place sums: the epoch's and the window's state.
    fn run(sums: InPlaceSums<'_>, in_place: bool) -> Result<Vec<super::super::RunningState>> {
        let (mut epoch, mut window) = (
            Running::with(&Device::Cpu, in_place)?,
            Running::with(&Device::Cpu, in_place)?,
        );
        let steps = [
            (0.1f32, 64, 7.0f32),
            (1.0e-7, 64, 0.0),
            (3.3333333, 17, 16.0),
        ];
        for (k, (loss, n, correct)) in steps.into_iter().enumerate() {
            let m = [
                Metric::mean("accuracy", scalar(correct)?, n as f64),
                Metric::mean("mae", scalar(loss * 0.3)?, 2.0 * n as f64),
            ];
            add_step(&mut epoch, &mut window, &scalar(loss)?, n, &m, sums)?;
            if k != 1 {
                let norm = Metric::mean("grad_norm", scalar(loss + 0.7)?, 1.0);
                add_extra(&mut epoch, &mut window, &norm, sums)?;
            }
        }
        let reads = HostReads::new();
        Ok(vec![epoch.state(&reads)?, window.state(&reads)?])
    }

    /// The paired adds (through the in-place adder, and where it declines)
    /// end as the separate adds of each sum do, bit for bit, with the same
    /// counts and samples.
    #[test]
    fn paired_adds_equal_the_separate_ones() -> Result<()> {
        let want = run(&declines, false)?;
        assert_eq!(want[0].samples, 145);
        assert_eq!(want[0].metrics.len(), 2);
        assert!(
            want[1].metrics.is_empty(),
            "the window tracks the loss alone"
        );
        assert_eq!((want[1].extras.len(), want[1].extras[0].count), (1, 2.0));
        for (sums, in_place) in [
            (&cpu_sums as InPlaceSums<'_>, true),
            (&declines, true),
            (&cpu_sums, false),
        ] {
            assert_eq!(run(sums, in_place)?, want, "in place {in_place}");
        }
        Ok(())
    }

    /// The adder takes every sum of a step in one call: the loss into both,
    /// then each metric; and a loop metric's two.
    #[test]
    fn one_call_per_step_takes_every_sum() -> Result<()> {
        let calls = std::cell::RefCell::new(Vec::new());
        let count = |items: &[(&Tensor, &Tensor, f32)]| -> Result<bool> {
            calls
                .borrow_mut()
                .push(items.iter().map(|i| i.2).collect::<Vec<_>>());
            cpu_sums(items)
        };
        run(&count, true)?;
        let calls = calls.into_inner();
        assert_eq!(calls.len(), 5, "{calls:?}");
        assert_eq!(calls[0], [64.0, 64.0, 1.0, 1.0]);
        assert_eq!(calls[1], [1.0, 1.0]);
        assert_eq!(calls[3], [17.0, 17.0, 1.0, 1.0]);
        assert_eq!(calls[4], [1.0, 1.0]);
        Ok(())
    }
}
