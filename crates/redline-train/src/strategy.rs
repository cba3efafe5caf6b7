//! How the fit spreads over processes (Lightning's `Strategy`): one process,
//! or data-parallel ranks (PyTorch's `DistributedDataParallel`) joined by a
//! [`Collectives`] backend.
//!
//! The loop calls it at its seams, never inside the step: parameters and
//! buffers are broadcast from rank 0 before the first step; between backward
//! and the update the gradients are averaged across ranks in buckets (about
//! 25 MB, PyTorch's `bucket_cap_mb`), divided by the world size before the
//! sum as PyTorch's default communication hook does; with gradient
//! accumulation only the last micro-batch's update reduces (`no_sync`);
//! metric sums are reduced at log points and epoch ends only. The first
//! bucket also carries a word per parameter (did any rank produce its
//! gradient) and the stop word (did any rank get a signal), so every rank
//! skips the same parameters and stops after the same step at no extra cost.

use std::time::{Duration, Instant};

use candle_core::{DType, Tensor};
use redline_dist::{Collectives, Single};
use redline_kernels::grad::{GradRef, Param};
use redline_models::Params;

use crate::error::{Error, Result};

/// PyTorch DDP's default bucket size (`bucket_cap_mb=25`), in f32 elements.
pub const BUCKET_ELEMS: usize = 25 * 1024 * 1024 / 4;

/// One rank's share of a data-parallel fit: its training seconds and
/// where its wall time went (the breakdown's categories, in seconds).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankTimes {
    /// The rank.
    pub rank: usize,
    /// Seconds the rank's epochs trained.
    pub train_s: f64,
    /// `(category key, seconds)` in the breakdown's order.
    pub seconds: Vec<(String, f64)>,
}

impl RankTimes {
    /// Seconds in the category `key` (`compute`, `communication`, ...).
    pub fn get(&self, key: &str) -> f64 {
        self.seconds
            .iter()
            .find(|(k, _)| k == key)
            .map_or(0.0, |(_, s)| *s)
    }
}

/// One process, or data-parallel ranks.
pub struct Strategy {
    comm: Box<dyn Collectives>,
    bucket_elems: usize,
    /// Reused between steps: no allocation per step.
    buf: std::cell::RefCell<Vec<f32>>,
    /// The buckets, made at the first reduce (and again if the parameters
    /// change): each parameter's element count, and the buckets' indices.
    plan: std::cell::RefCell<(Vec<usize>, Vec<Vec<usize>>)>,
    /// Time spent in gradient all-reduces, and how many.
    reduce_time: std::cell::Cell<(Duration, usize)>,
}

impl std::fmt::Debug for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Strategy")
            .field("backend", &self.comm.backend())
            .field("rank", &self.comm.rank())
            .field("world_size", &self.comm.world_size())
            .finish()
    }
}

impl Default for Strategy {
    fn default() -> Self {
        Self::single()
    }
}

impl Strategy {
    /// One process: every hook is a no-op.
    pub fn single() -> Self {
        Self::ddp(Box::new(Single))
    }

    /// Data-parallel ranks over `comm` (a world of one behaves as [`Strategy::single`]).
    pub fn ddp(comm: Box<dyn Collectives>) -> Self {
        Self {
            comm,
            bucket_elems: BUCKET_ELEMS,
            buf: Default::default(),
            plan: Default::default(),
            reduce_time: Default::default(),
        }
    }

    /// The collectives backend, given back (to wrap it in another, such as
    /// NCCL over MPI).
    pub fn into_comm(self) -> Box<dyn Collectives> {
        self.comm
    }

    /// Buckets of at most `elems` f32 values (at least one parameter each).
    pub fn with_bucket_elems(mut self, elems: usize) -> Self {
        self.bucket_elems = elems.max(1);
        self
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// Whether there is more than one rank.
    pub fn is_distributed(&self) -> bool {
        self.world_size() > 1
    }

    /// Whether this is rank 0 (the one that writes files).
    pub fn is_global_zero(&self) -> bool {
        self.rank() == 0
    }

    /// This rank's part of every epoch ([`redline_data::Loader::shard`]):
    /// `pad` for training (every rank takes the same steps), not for
    /// evaluation (each sample counted once).
    pub fn shard(&self, pad: bool) -> redline_data::Shard {
        redline_data::Shard {
            rank: self.rank(),
            world: self.world_size(),
            pad,
        }
    }

    /// The collectives, for callers that reduce their own values.
    pub fn comm(&self) -> &dyn Collectives {
        self.comm.as_ref()
    }

    /// Seconds spent in gradient all-reduces so far, and their count.
    pub fn reduce_seconds(&self) -> (f64, usize) {
        let (d, n) = self.reduce_time.get();
        (d.as_secs_f64(), n)
    }

    /// Fails unless every rank passed the same `text` (a configuration, the
    /// parameter shapes), naming the first rank that differs and the first
    /// line that does.
    pub fn check_same(&self, what: &str, text: &str) -> Result<()> {
        if !self.is_distributed() {
            return Ok(());
        }
        let all = self.comm.all_gather_bytes(
            text.as_bytes(),
            &format!("comparing the {what} of every rank"),
        )?;
        let mine = String::from_utf8_lossy(&all[0]).into_owned();
        for (r, theirs) in all.iter().enumerate().skip(1) {
            let theirs = String::from_utf8_lossy(theirs);
            if theirs != mine {
                let line = mine
                    .lines()
                    .zip(theirs.lines())
                    .find(|(a, b)| a != b)
                    .map(|(a, b)| format!("rank 0 has `{a}`, rank {r} has `{b}`"))
                    .unwrap_or_else(|| {
                        format!(
                            "rank 0 has {} lines, rank {r} has {}",
                            mine.lines().count(),
                            theirs.lines().count()
                        )
                    });
                return Err(Error::Dist(redline_dist::Error::Mismatch(format!(
                    "the ranks were started with different {what}: {line}\nHINT: every rank \
                     must run the same command on the same data (check the hostfile's \
                     machines have the same files and redline version)"
                ))));
            }
        }
        Ok(())
    }

    /// Copies rank 0's parameters and buffers to every rank (DDP's start).
    pub fn broadcast_params(&self, params: &Params) -> Result<()> {
        if !self.is_distributed() {
            return Ok(());
        }
        for (name, var) in params.state() {
            let t = var.as_tensor();
            let mut v = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            self.comm
                .broadcast(&mut v, 0, &format!("broadcast of parameter {name}"))?;
            let from0 = Tensor::from_vec(v, t.shape(), t.device())?.to_dtype(t.dtype())?;
            var.set(&from0)?;
        }
        Ok(())
    }

    /// Averages the gradients of `params` across ranks, in place; `stop`
    /// is this rank's stop request. Returns whether any rank asked to stop.
    /// `step` (the step this update makes) names the collective.
    pub fn reduce_gradients(&self, params: &[&Param], stop: bool, step: usize) -> Result<bool> {
        if !self.is_distributed() {
            return Ok(stop);
        }
        let start = Instant::now();
        let world = self.world_size() as f32;
        let mut plan = self.plan.borrow_mut();
        let same = plan.0.len() == params.len()
            && plan
                .0
                .iter()
                .zip(params)
                .all(|(&n, p)| n == p.as_tensor().elem_count());
        if !same {
            let numels: Vec<usize> = params.iter().map(|p| p.as_tensor().elem_count()).collect();
            *plan = (numels.clone(), buckets(&numels, self.bucket_elems));
        }
        let (numels, buckets) = &*plan;
        let mut present = vec![false; params.len()];
        let mut buf = self.buf.borrow_mut();
        let n_buckets = buckets.len();
        let mut any_stop = stop;
        for (k, bucket) in buckets.iter().enumerate() {
            buf.clear();
            if k == 0 {
                // The control words: stop, then one per parameter.
                buf.push(if stop { 1.0 } else { 0.0 });
                buf.extend(
                    params
                        .iter()
                        .map(|p| if p.grad().is_empty() { 0.0 } else { 1.0 }),
                );
            }
            for &i in bucket {
                let p = params[i];
                let packed = p.grad().with(|g| -> Result<()> {
                    match g {
                        GradRef::Host(v) => buf.extend(v.iter().map(|x| x / world)),
                        GradRef::Tensor(t) => {
                            let v = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                            buf.extend(v.iter().map(|x| x / world));
                        }
                    }
                    Ok(())
                });
                match packed {
                    Some(r) => r?,
                    None => buf.extend(std::iter::repeat_n(0.0, numels[i])),
                }
            }
            let op = if n_buckets == 1 {
                format!("gradient all-reduce of step {step}")
            } else {
                format!(
                    "gradient all-reduce of step {step} (bucket {} of {n_buckets})",
                    k + 1
                )
            };
            self.comm.all_reduce_sum(&mut buf, &op)?;
            let mut off = 0;
            if k == 0 {
                any_stop = buf[0] > 0.0;
                for (i, p) in present.iter_mut().enumerate() {
                    *p = buf[1 + i] > 0.0;
                }
                off = 1 + params.len();
            }
            for &i in bucket {
                let n = numels[i];
                // A parameter no rank produced a gradient for stays without
                // one, as in one process (the optimizer skips it).
                if present[i] {
                    params[i]
                        .grad()
                        .overwrite(&buf[off..off + n], params[i].as_tensor())?;
                }
                off += n;
            }
        }
        let (d, n) = self.reduce_time.get();
        self.reduce_time.set((d + start.elapsed(), n + 1));
        Ok(any_stop)
    }

    /// Every rank's [`RankTimes`] (an all-gather; empty in one process).
    pub fn gather_times(&self, train_s: f64, seconds: [f64; 7]) -> Result<Vec<RankTimes>> {
        if !self.is_distributed() {
            return Ok(Vec::new());
        }
        let mine = RankTimes {
            rank: self.rank(),
            train_s,
            seconds: redline_profile::Category::ALL
                .iter()
                .map(|c| (c.key().to_string(), seconds[c.index()]))
                .collect(),
        };
        let bytes = serde_json::to_vec(&mine).map_err(|e| Error::Config(e.to_string()))?;
        let all = self
            .comm
            .all_gather_bytes(&bytes, "gathering the ranks' times")?;
        all.iter()
            .map(|b| {
                serde_json::from_slice(b).map_err(|e| {
                    Error::Dist(redline_dist::Error::Mismatch(format!(
                        "a rank's times did not parse: {e}"
                    )))
                })
            })
            .collect()
    }

    /// Sums `values` over the ranks in place (metric sums and counts).
    pub fn reduce_sums(&self, values: &mut [f64], what: &str) -> Result<()> {
        if !self.is_distributed() {
            return Ok(());
        }
        Ok(self.comm.all_reduce_sum_f64(values, what)?)
    }
}

/// Parameter indices in buckets of at most `cap` elements (at least one
/// parameter each), in reverse order, as DDP buckets them: the last layer's
/// gradients are the first a backward pass finishes.
fn buckets(numels: &[usize], cap: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut size = 0usize;
    for i in (0..numels.len()).rev() {
        match out.last_mut() {
            Some(b) if size + numels[i] <= cap => b.push(i),
            _ => {
                out.push(vec![i]);
                size = 0;
            }
        }
        size += numels[i];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn param(v: &[f32]) -> Result<Param> {
        Ok(Param::new(Var::from_tensor(&Tensor::new(
            v,
            &Device::Cpu,
        )?)?))
    }

    #[test]
    fn buckets_run_last_layer_first_and_hold_at_least_one_parameter() {
        assert_eq!(
            buckets(&[4, 2, 3, 1], 5),
            vec![vec![3, 2], vec![1], vec![0]]
        );
        assert_eq!(
            buckets(&[10, 1], 5),
            vec![vec![1], vec![0]],
            "an oversized one alone"
        );
        assert_eq!(buckets(&[1, 1, 1], 100), vec![vec![2, 1, 0]]);
    }

    #[test]
    fn one_process_leaves_gradients_alone_and_passes_the_stop() -> Result<()> {
        let s = Strategy::single();
        let p = param(&[1.0, 2.0])?;
        p.grad()
            .absorb(&Tensor::new(&[3.0f32, 4.0], &Device::Cpu)?)?;
        assert!(s.reduce_gradients(&[&p], true, 1)?);
        assert!(!s.reduce_gradients(&[&p], false, 2)?);
        let g = p
            .grad()
            .to_tensor(p.as_tensor())?
            .map(|t| t.to_vec1::<f32>());
        assert_eq!(g.transpose()?, Some(vec![3.0, 4.0]));
        s.check_same("configurations", "a")?;
        assert_eq!(s.reduce_seconds().1, 0, "nothing was reduced");
        Ok(())
    }
}
