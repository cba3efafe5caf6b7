//! The collectives data-parallel training needs, behind one trait: the
//! gradient all-reduce, the parameter broadcast at start, the all-gather that
//! compares configurations, and a barrier. [`Single`] is the world of one: every
//! collective is the identity and costs nothing.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::error::Result;

/// Collective operations over every rank of the job. Each call names what it
/// is for (`op`, e.g. "gradient all-reduce of step 12"), so a timeout can
/// say where the job stopped. Every rank must make the same calls in the
/// same order.
pub trait Collectives {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// The backend's name (`single`, `mpi`).
    fn backend(&self) -> &'static str;
    /// Element-wise sum of `buf` over the ranks, in place (every rank gets it).
    fn all_reduce_sum(&self, buf: &mut [f32], op: &str) -> Result<()>;
    /// [`Collectives::all_reduce_sum`] in f64 (metric sums and counts).
    fn all_reduce_sum_f64(&self, buf: &mut [f64], op: &str) -> Result<()>;
    /// Copies `root`'s `buf` into every rank's.
    fn broadcast(&self, buf: &mut [f32], root: usize, op: &str) -> Result<()>;
    /// Every rank's bytes, in rank order.
    fn all_gather_bytes(&self, mine: &[u8], op: &str) -> Result<Vec<Vec<u8>>>;
    /// Waits until every rank arrives.
    fn barrier(&self, op: &str) -> Result<()>;
    /// A flag the process's signal handler sets: a collective that waits on
    /// other ranks after it is set gives up (the launcher is tearing the job
    /// down) instead of waiting out the timeout.
    fn set_interrupt(&mut self, _flag: Arc<AtomicBool>) {}
}

/// A world of one process: rank 0 of 1, every collective the identity.
#[derive(Debug, Default, Clone, Copy)]
pub struct Single;

impl Collectives for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn backend(&self) -> &'static str {
        "single"
    }
    fn all_reduce_sum(&self, _buf: &mut [f32], _op: &str) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _buf: &mut [f64], _op: &str) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _buf: &mut [f32], _root: usize, _op: &str) -> Result<()> {
        Ok(())
    }
    fn all_gather_bytes(&self, mine: &[u8], _op: &str) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
    fn barrier(&self, _op: &str) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_world_of_one_leaves_everything_as_it_is() {
        let s = Single;
        let mut v = vec![1.5f32, -2.0];
        s.all_reduce_sum(&mut v, "t").unwrap();
        s.broadcast(&mut v, 0, "t").unwrap();
        assert_eq!(v, [1.5, -2.0]);
        assert_eq!(
            s.all_gather_bytes(b"abc", "t").unwrap(),
            vec![b"abc".to_vec()]
        );
        assert_eq!((s.rank(), s.world_size()), (0, 1));
    }
}
