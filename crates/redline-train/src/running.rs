//! Device-side running sums of the loss and the step's named metrics.
//!
//! Each step adds into tensors; nothing is read back until a log point or the
//! end of an epoch, where every sum comes back in one host sync, so the hot
//! loop never waits for the device.
//!
//! [`Running::with`] `in_place` sums for a step captured as a CUDA graph: each sum is
//! a buffer updated in place (its address never changes, so a replay adds into
//! it), [`Running::reset`] zeroes the same buffers, and the host-side counts a
//! replay cannot update are added with [`Running::recount`].

use std::borrow::Cow;

use candle_core::{DType, Device, Tensor, Var};
use redline_core::host::HostReads;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::events::MetricValues;
use crate::step::Metric;

pub(crate) mod paired;

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

/// Host counters of a [`Running`]: samples, then each metric's count (the
/// step's, then the extras). The difference of two is what one step added.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // made by the CUDA graph driver
pub(crate) struct Tally {
    samples: usize,
    counts: Vec<f64>,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the CUDA graph driver
impl Tally {
    /// What was added between `before` and `self` (same metrics in both).
    pub fn since(&self, before: &Tally) -> Result<Tally> {
        if before.counts.len() != self.counts.len() {
            return Err(Error::Config(format!(
                "metrics changed while a step was measured ({} then {})",
                before.counts.len(),
                self.counts.len()
            )));
        }
        Ok(Tally {
            samples: self.samples.saturating_sub(before.samples),
            counts: self
                .counts
                .iter()
                .zip(&before.counts)
                .map(|(a, b)| a - b)
                .collect(),
        })
    }
}

/// `slot += x`: a new tensor, or written into `slot`'s own buffer.
fn accumulate(slot: &mut Tensor, x: &Tensor, in_place: bool) -> Result<()> {
    let next = (&*slot + x)?;
    if in_place {
        Var::from_tensor(slot)?.set(&next)?;
    } else {
        *slot = next;
    }
    Ok(())
}

/// A zero sum; a buffer of its own (a variable) when updated in place.
fn zero(device: &Device, in_place: bool) -> Result<Tensor> {
    Ok(if in_place {
        Var::zeros((), DType::F32, device)?.as_tensor().clone()
    } else {
        Tensor::zeros((), DType::F32, device)?
    })
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
    /// Sums are buffers updated in place (see the module docs).
    in_place: bool,
}

/// One running sum as a checkpoint holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SumState {
    /// The metric's name.
    pub name: String,
    /// Its sum (f32, as the device holds it; exact in JSON).
    pub sum: f32,
    /// Its count.
    pub count: f64,
}

/// A [`Running`]'s sums and counts, read back for a checkpoint.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunningState {
    /// Sum of per-sample losses.
    pub loss_sum: f32,
    /// The step's metrics.
    pub metrics: Vec<SumState>,
    /// The loop's own metrics (`grad_norm`).
    pub extras: Vec<SumState>,
    /// Samples added.
    pub samples: usize,
}

/// What a [`Running`] reads back: the mean loss and each metric's value.
pub(crate) struct Means {
    pub loss: f64,
    pub metrics: MetricValues,
    /// Samples the means are over (all ranks' when read across them).
    pub samples: usize,
}

impl Running {
    pub fn new(device: &Device) -> Result<Self> {
        Self::with(device, false)
    }

    /// Sums updated in place or not (see the module docs).
    pub fn with(device: &Device, in_place: bool) -> Result<Self> {
        Ok(Self {
            loss_sum: zero(device, in_place)?,
            metrics: Vec::new(),
            extras: Vec::new(),
            samples: 0,
            in_place,
        })
    }

    /// Zeroes every sum and count, keeping the metrics' names (and, in place,
    /// the same buffers).
    pub fn reset(&mut self) -> Result<()> {
        let in_place = self.in_place;
        for slot in std::iter::once(&mut self.loss_sum).chain(
            self.metrics
                .iter_mut()
                .chain(self.extras.iter_mut())
                .map(|s| &mut s.sum),
        ) {
            if in_place {
                Var::from_tensor(slot)?.set(&slot.zeros_like()?)?;
            } else {
                *slot = slot.zeros_like()?;
            }
        }
        for s in self.metrics.iter_mut().chain(self.extras.iter_mut()) {
            s.count = 0.0;
        }
        self.samples = 0;
        Ok(())
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the CUDA graph driver
    /// The host counters now.
    pub fn tally(&self) -> Tally {
        Tally {
            samples: self.samples,
            counts: self
                .metrics
                .iter()
                .chain(&self.extras)
                .map(|s| s.count)
                .collect(),
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the CUDA graph driver
    /// Sets the host counters back to `to` (a [`Running::tally`] of these
    /// sums): a step whose device work never ran (a failed capture) is
    /// uncounted.
    pub fn restore(&mut self, to: &Tally) -> Result<()> {
        let n = self.metrics.len() + self.extras.len();
        if to.counts.len() > n {
            return Err(Error::Config(format!(
                "a tally of {} metrics for sums of {n}",
                to.counts.len()
            )));
        }
        self.samples = to.samples;
        // Metrics first named by the undone step go back to zero counts.
        let counts = to.counts.iter().copied().chain(std::iter::repeat(0.0));
        for (s, c) in self
            .metrics
            .iter_mut()
            .chain(self.extras.iter_mut())
            .zip(counts)
        {
            s.count = c;
        }
        Ok(())
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the CUDA graph driver
    /// Adds `step` (one step's [`Tally::since`]) to the host counters: what a
    /// replayed step added on the device without running [`Running::add`].
    pub fn recount(&mut self, step: &Tally) -> Result<()> {
        let n = self.metrics.len() + self.extras.len();
        if step.counts.len() != n {
            return Err(Error::Config(format!(
                "a step tally of {} metrics for sums of {n}",
                step.counts.len()
            )));
        }
        self.samples += step.samples;
        for (s, c) in self
            .metrics
            .iter_mut()
            .chain(self.extras.iter_mut())
            .zip(&step.counts)
        {
            s.count += c;
        }
        Ok(())
    }

    /// Adds a metric the loop computes (not the step), by name.
    pub fn add_extra(&mut self, m: &Metric) -> Result<()> {
        let sum = m.sum.detach().to_dtype(DType::F32)?;
        let i = self.extra_slot(m, sum.device())?;
        let in_place = self.in_place;
        if let Some(s) = self.extras.get_mut(i) {
            accumulate(&mut s.sum, &sum, in_place)?;
            s.count += m.count;
        }
        Ok(())
    }

    /// The index of the loop's metric `m` among the extras, added with a
    /// zero sum and count where it is new.
    fn extra_slot(&mut self, m: &Metric, device: &Device) -> Result<usize> {
        if let Some(i) = self.extras.iter().position(|s| s.name == m.name) {
            return Ok(i);
        }
        self.extras.push(Sum {
            name: m.name.clone(),
            sum: zero(device, self.in_place)?,
            count: 0.0,
        });
        Ok(self.extras.len() - 1)
    }

    /// Adds a batch: `loss_sum` is the batch's summed loss (scalar, detached:
    /// see [`batch_loss_sum`]) over `samples`, and the step's metrics.
    pub fn add(&mut self, loss_sum: &Tensor, samples: usize, metrics: &[Metric]) -> Result<()> {
        self.add_loss(loss_sum, samples)?;
        self.name_metrics(metrics)?;
        for (s, m) in self.metrics.iter_mut().zip(metrics) {
            accumulate(
                &mut s.sum,
                &m.sum.detach().to_dtype(DType::F32)?,
                self.in_place,
            )?;
            s.count += m.count;
        }
        Ok(())
    }

    /// Names the step's metrics at the first batch (zero sums), and refuses
    /// a later batch's that do not match them.
    fn name_metrics(&mut self, metrics: &[Metric]) -> Result<()> {
        if self.metrics.is_empty() {
            // The first batch names the metrics; every later one must match.
            self.metrics = metrics
                .iter()
                .map(|m| {
                    let zero = zero(m.sum.device(), self.in_place)?;
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
        Ok(())
    }

    /// Adds only a batch's summed loss (for windows that track no metrics).
    pub fn add_loss(&mut self, loss_sum: &Tensor, samples: usize) -> Result<()> {
        accumulate(&mut self.loss_sum, loss_sum, self.in_place)?;
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
                samples: 0,
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

    /// [`Running::read`] (all sums) or [`Running::read_loss_and_extras`]
    /// (`metrics: false`) summed over every rank of `strategy` first: the
    /// ranks' metric names are gathered, so a rank that saw no batch (a
    /// small evaluation shard) still adds its zeros. Every rank must call it
    /// at the same point; `what` names the collective.
    pub fn read_across(
        &self,
        reads: &HostReads,
        strategy: &crate::strategy::Strategy,
        metrics: bool,
        what: &str,
    ) -> Result<Means> {
        if !strategy.is_distributed() {
            return if metrics {
                self.read(reads)
            } else {
                let (loss, metrics) = self.read_loss_and_extras(reads)?;
                Ok(Means {
                    loss,
                    metrics,
                    samples: self.samples,
                })
            };
        }
        let sums: Vec<&Sum> = if metrics {
            self.metrics.iter().chain(&self.extras).collect()
        } else {
            self.extras.iter().collect()
        };
        let names: Vec<&str> = sums.iter().map(|s| s.name.as_ref()).collect();
        let gathered = strategy.comm().all_gather_bytes(
            names.join("\n").as_bytes(),
            &format!("{what} (metric names)"),
        )?;
        let mut union: Vec<String> = Vec::new();
        for rank_names in &gathered {
            for n in String::from_utf8_lossy(rank_names).split('\n') {
                if !n.is_empty() && !union.iter().any(|u| u == n) {
                    union.push(n.to_string());
                }
            }
        }
        let tensors: Vec<&Tensor> = std::iter::once(&self.loss_sum)
            .chain(sums.iter().map(|s| &s.sum))
            .collect();
        let host = reads.vec::<f32>(&Tensor::stack(&tensors, 0)?)?;
        // [loss sum, samples, (sum, count) per name]
        let mut v = vec![0f64; 2 + 2 * union.len()];
        v[0] = f64::from(host[0]);
        v[1] = self.samples as f64;
        for (j, name) in union.iter().enumerate() {
            if let Some(k) = names.iter().position(|n| n == name) {
                v[2 + 2 * j] = f64::from(host[1 + k]);
                v[3 + 2 * j] = sums[k].count;
            }
        }
        strategy.reduce_sums(&mut v, what)?;
        let metrics = union
            .into_iter()
            .enumerate()
            .map(|(j, name)| (name, v[2 + 2 * j] / v[3 + 2 * j]))
            .collect();
        Ok(Means {
            loss: if v[1] > 0.0 { v[0] / v[1] } else { f64::NAN },
            metrics: MetricValues(metrics),
            samples: v[1] as usize,
        })
    }

    /// The sums and counts as they stand (one host sync): what a
    /// checkpoint saves of a partial epoch or log window.
    pub fn state(&self, reads: &HostReads) -> Result<RunningState> {
        let tensors: Vec<&Tensor> = std::iter::once(&self.loss_sum)
            .chain(self.metrics.iter().chain(&self.extras).map(|s| &s.sum))
            .collect();
        let all = reads.vec::<f32>(&Tensor::stack(&tensors, 0)?)?;
        let named = |sums: &[Sum], values: &[f32]| -> Vec<SumState> {
            sums.iter()
                .zip(values)
                .map(|(s, &v)| SumState {
                    name: s.name.to_string(),
                    sum: v,
                    count: s.count,
                })
                .collect()
        };
        let m = self.metrics.len();
        Ok(RunningState {
            loss_sum: all.first().copied().unwrap_or(0.0),
            metrics: named(&self.metrics, all.get(1..1 + m).unwrap_or_default()),
            extras: named(&self.extras, all.get(1 + m..).unwrap_or_default()),
            samples: self.samples,
        })
    }

    /// Sets the sums and counts to `st` (a [`Running::state`]), on `device`:
    /// the same values, bit for bit, so later sums are the same too.
    pub fn load_state(&mut self, st: &RunningState, device: &Device) -> Result<()> {
        let in_place = self.in_place;
        let value = |v: f32| -> Result<Tensor> {
            let mut t = zero(device, in_place)?;
            accumulate(&mut t, &Tensor::new(v, device)?, in_place)?;
            Ok(t)
        };
        let sums = |v: &[SumState]| -> Result<Vec<Sum>> {
            v.iter()
                .map(|s| {
                    Ok(Sum {
                        name: Cow::Owned(s.name.clone()),
                        sum: value(s.sum)?,
                        count: s.count,
                    })
                })
                .collect()
        };
        self.loss_sum = value(st.loss_sum)?;
        self.metrics = sums(&st.metrics)?;
        self.extras = sums(&st.extras)?;
        self.samples = st.samples;
        Ok(())
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
            samples: self.samples,
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

    /// In-place sums give the plain sums' values in the same buffers; a
    /// reset zeroes those buffers; recount adds a measured step's counts.
    #[test]
    fn in_place_sums_keep_their_buffers() -> Result<()> {
        let reads = HostReads::new();
        let m = |v: f32| -> Result<Vec<Metric>> { Ok(vec![Metric::mean("acc", scalar(v)?, 2.0)]) };
        let mut plain = Running::new(&Device::Cpu)?;
        let mut kept = Running::with(&Device::Cpu, true)?;
        for r in [&mut plain, &mut kept] {
            r.add(&scalar(3.0)?, 2, &m(1.0)?)?;
            r.add_extra(&Metric::mean("grad_norm", scalar(2.0)?, 1.0))?;
        }
        // Handles taken now see every later write: the buffers never change.
        let (loss_buf, acc_buf) = (kept.loss_sum.clone(), kept.metrics[0].sum.clone());
        let before = kept.tally();
        for r in [&mut plain, &mut kept] {
            r.add(&scalar(5.0)?, 2, &m(2.0)?)?;
            r.add_extra(&Metric::mean("grad_norm", scalar(4.0)?, 1.0))?;
        }
        let step = kept.tally().since(&before)?;
        let (a, b) = (plain.read(&reads)?, kept.read(&reads)?);
        assert_eq!((a.loss, a.metrics.0.clone()), (b.loss, b.metrics.0.clone()));
        assert_eq!(b.loss, 2.0);
        assert_eq!(loss_buf.to_scalar::<f32>()?, 8.0);
        assert_eq!(acc_buf.to_scalar::<f32>()?, 3.0);
        assert!(!plain.loss_sum.is_variable() && kept.loss_sum.is_variable());

        // A replay adds on the device only; recount adds its host counts.
        kept.recount(&step)?;
        assert_eq!(kept.samples, 6);
        assert_eq!(kept.tally().counts, vec![6.0, 3.0]);

        kept.reset()?;
        assert_eq!(
            loss_buf.to_scalar::<f32>()?,
            0.0,
            "reset writes the same buffer"
        );
        assert_eq!(acc_buf.to_scalar::<f32>()?, 0.0);
        assert_eq!(
            kept.tally(),
            Tally {
                samples: 0,
                counts: vec![0.0, 0.0]
            }
        );
        assert!(kept.read(&reads)?.loss.is_nan());
        plain.reset()?;
        assert_eq!(plain.tally(), kept.tally());
        kept.recount(&step)?;
        kept.restore(&Tally {
            samples: 0,
            counts: vec![0.0, 0.0],
        })?;
        assert_eq!(kept.tally(), plain.tally());
        assert!(kept
            .recount(&Tally {
                samples: 1,
                counts: vec![1.0]
            })
            .is_err());
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
