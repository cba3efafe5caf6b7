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
    /// Metrics the loop adds itself (`grad_norm`, once per optimizer step),
    /// after the step's.
    extras: Vec<Sum>,
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
            extras: Vec::new(),
            samples: 0,
        })
    }

    /// Adds a metric the loop computes (not the step), by name.
    pub fn add_extra(&mut self, m: &Metric) -> Result<()> {
        let sum = m.sum.detach().to_dtype(DType::F32)?;
        match self.extras.iter_mut().find(|s| s.name == m.name) {
            Some(s) => {
                s.sum = (&s.sum + sum)?;
                s.count += m.count;
            }
            None => self.extras.push(Sum {
                name: m.name.clone(),
                sum,
                count: m.count,
            }),
        }
        Ok(())
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
        self.read_sums(reads, self.metrics.iter().chain(&self.extras))
    }

    /// Reads the mean loss and the loop's own metrics, not the step's (one
    /// host sync; the loss alone when there are none).
    pub fn read_loss_and_extras(&self, reads: &HostReads) -> Result<(f64, MetricValues)> {
        if self.samples == 0 {
            return Ok((f64::NAN, MetricValues::default()));
        }
        if self.extras.is_empty() {
            let loss = reads.scalar::<f32>(&self.loss_sum)? as f64 / self.samples as f64;
            return Ok((loss, MetricValues::default()));
        }
        let m = self.read_sums(reads, self.extras.iter())?;
        Ok((m.loss, m.metrics))
    }

    /// The loss and `sums` as means, in one host sync.
    fn read_sums<'a>(
        &self,
        reads: &HostReads,
        sums: impl Iterator<Item = &'a Sum> + Clone,
    ) -> Result<Means> {
        let tensors: Vec<&Tensor> = std::iter::once(&self.loss_sum)
            .chain(sums.clone().map(|s| &s.sum))
            .collect();
        let all = reads.vec::<f32>(&Tensor::stack(&tensors, 0)?)?;
        let metrics = sums
            .zip(&all[1..])
            .map(|(s, &v)| (s.name.to_string(), v as f64 / s.count))
            .collect();
        Ok(Means {
            loss: all[0] as f64 / self.samples as f64,
            metrics: MetricValues(metrics),
        })
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
        assert_eq!(r.read_loss_and_extras(&reads)?.0, 8.0 / 6.0);
        assert_eq!(reads.count(), 2, "one sync per read, all sums at once");
        r.add_extra(&Metric::mean("grad_norm", scalar(3.0)?, 1.0))?;
        r.add_extra(&Metric::mean("grad_norm", scalar(5.0)?, 1.0))?;
        let (loss, extras) = r.read_loss_and_extras(&reads)?;
        assert_eq!((loss, extras.get("grad_norm")), (8.0 / 6.0, Some(4.0)));
        assert_eq!(
            extras.get("accuracy"),
            None,
            "the step's metrics are not read"
        );
        let all = r.read(&reads)?.metrics;
        let names: Vec<&str> = all.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["accuracy", "mae", "grad_norm"]);
        assert_eq!(reads.count(), 4);
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
        assert!(r.read(&reads)?.loss.is_nan() && r.read_loss_and_extras(&reads)?.0.is_nan());
        assert_eq!(reads.count(), 0, "nothing to read, no sync");
        Ok(())
    }
}
