//! Device-side running sums of the loss and the step's named metrics.
//!
//! Each step adds into tensors; nothing is read back until a log point or the
//! end of an epoch, where every sum comes back in one host sync, so the hot
//! loop never waits for the device.

use std::borrow::Cow;

use candle_core::{DType, Device, Tensor};
use redline_core::host::HostReads;

use crate::error::{Error, Result};
use crate::events::MetricValues;
use crate::step::Metric;

/// The summed loss of a batch from its mean loss, detached from the graph;
/// computed once per step and shared by every running sum.
pub(crate) fn batch_loss_sum(mean_loss: &Tensor, batch: usize) -> Result<Tensor> {
    Ok(mean_loss
        .detach()
        .to_dtype(DType::F32)?
        .affine(batch as f64, 0.0)?)
}

/// One metric's running sum and count.
struct Sum {
    name: Cow<'static, str>,
    sum: Tensor,
    count: f64,
}

/// Sums over a window of steps, kept on the device.
pub(crate) struct Running {
    /// Sum of per-sample losses (`mean_loss * batch`).
    loss_sum: Tensor,
    /// The step's metrics, in the order it returns them.
    metrics: Vec<Sum>,
    /// Samples added (a host counter: no read needed).
    pub samples: usize,
}

/// What a [`Running`] reads back: the mean loss and each metric's value.
pub(crate) struct Means {
    pub loss: f64,
    pub metrics: MetricValues,
}

impl Running {
    pub fn new(device: &Device) -> Result<Self> {
        Ok(Self {
            loss_sum: Tensor::zeros((), DType::F32, device)?,
            metrics: Vec::new(),
            samples: 0,
        })
    }

    /// Adds a batch: `loss_sum` is the batch's summed loss (scalar, detached:
    /// see [`batch_loss_sum`]) over `samples`, and the step's metrics.
    pub fn add(&mut self, loss_sum: &Tensor, samples: usize, metrics: &[Metric]) -> Result<()> {
        self.add_loss(loss_sum, samples)?;
        if self.metrics.is_empty() {
            // The first batch names the metrics; every later one must match.
            self.metrics = metrics
                .iter()
                .map(|m| {
                    let zero = Tensor::zeros((), DType::F32, m.sum.device())?;
                    Ok(Sum {
                        name: m.name.clone(),
                        sum: zero,
                        count: 0.0,
                    })
                })
                .collect::<Result<_>>()?;
        }
        let names = |it: &mut dyn Iterator<Item = &str>| it.collect::<Vec<_>>().join(", ");
        if metrics.len() != self.metrics.len()
            || metrics
                .iter()
                .zip(&self.metrics)
                .any(|(m, s)| m.name != s.name)
        {
            return Err(Error::Config(format!(
                "the step returned metrics [{}] after [{}]: a step must return the same \
                 metrics, in the same order, every time",
                names(&mut metrics.iter().map(|m| m.name.as_ref())),
                names(&mut self.metrics.iter().map(|s| s.name.as_ref())),
            )));
        }
        for (s, m) in self.metrics.iter_mut().zip(metrics) {
            s.sum = (&s.sum + m.sum.detach().to_dtype(DType::F32)?)?;
            s.count += m.count;
        }
        Ok(())
    }

    /// Adds only a batch's summed loss (for windows that track no metrics).
    pub fn add_loss(&mut self, loss_sum: &Tensor, samples: usize) -> Result<()> {
        self.loss_sum = (&self.loss_sum + loss_sum)?;
        self.samples += samples;
        Ok(())
    }

    /// Reads the mean loss and every metric back in one host sync (NaN for
    /// an empty window).
    pub fn read(&self, reads: &HostReads) -> Result<Means> {
        if self.samples == 0 {
            return Ok(Means {
                loss: f64::NAN,
                metrics: MetricValues::default(),
            });
        }
        let sums: Vec<&Tensor> = std::iter::once(&self.loss_sum)
            .chain(self.metrics.iter().map(|s| &s.sum))
            .collect();
        let all = reads.vec::<f32>(&Tensor::stack(&sums, 0)?)?;
        let metrics = self
            .metrics
            .iter()
            .zip(&all[1..])
            .map(|(s, &v)| (s.name.to_string(), v as f64 / s.count))
            .collect();
        Ok(Means {
            loss: all[0] as f64 / self.samples as f64,
            metrics: MetricValues(metrics),
        })
    }

    /// Reads only the mean loss (one host sync).
    pub fn read_loss(&self, reads: &HostReads) -> Result<f64> {
        if self.samples == 0 {
            return Ok(f64::NAN);
        }
        Ok(reads.scalar::<f32>(&self.loss_sum)? as f64 / self.samples as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(v: f32) -> Result<Tensor> {
        Ok(Tensor::new(v, &Device::Cpu)?)
    }

    #[test]
    fn sums_read_back_as_means_over_their_counts() -> Result<()> {
        let mut r = Running::new(&Device::Cpu)?;
        let m = |v: f32, n: f64| -> Result<Vec<Metric>> {
            Ok(vec![
                Metric::mean("accuracy", scalar(v)?, n),
                Metric::mean("mae", scalar(2.0 * v)?, 4.0 * n),
            ])
        };
        r.add(&scalar(6.0)?, 4, &m(3.0, 4.0)?)?;
        r.add(&scalar(2.0)?, 2, &m(1.0, 2.0)?)?;
        let reads = HostReads::new();
        let got = r.read(&reads)?;
        assert_eq!(got.loss, 8.0 / 6.0);
        assert_eq!(got.metrics.get("accuracy"), Some(4.0 / 6.0));
        assert_eq!(got.metrics.get("mae"), Some(8.0 / 24.0));
        assert_eq!(r.read_loss(&reads)?, 8.0 / 6.0);
        assert_eq!(reads.count(), 2, "one sync per read, all sums at once");
        Ok(())
    }

    #[test]
    fn changing_metric_names_is_an_error() -> Result<()> {
        let mut r = Running::new(&Device::Cpu)?;
        r.add(&scalar(1.0)?, 1, &[Metric::mean("a", scalar(1.0)?, 1.0)])?;
        let err = r
            .add(&scalar(1.0)?, 1, &[Metric::mean("b", scalar(1.0)?, 1.0)])
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("[b] after [a]")));
        Ok(())
    }

    #[test]
    fn an_empty_window_reads_nan() -> Result<()> {
        let r = Running::new(&Device::Cpu)?;
        let reads = HostReads::new();
        assert!(r.read(&reads)?.loss.is_nan() && r.read_loss(&reads)?.is_nan());
        assert_eq!(reads.count(), 0, "nothing to read, no sync");
        Ok(())
    }
}
