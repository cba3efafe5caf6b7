//! Reads of tensors back to the host. Every such read waits for the device, so
//! the trainer makes all of them through its own [`HostReads`], which counts
//! them: the trainer reports host syncs per step (the tutorials' `.item()`
//! warning, measured). The counter belongs to its owner, not to the process,
//! so two trainers in one process (or tests running in parallel) keep
//! separate counts.

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{Tensor, WithDType};

use crate::error::Result;

/// Counted reads of tensors to the host.
#[derive(Debug, Default)]
pub struct HostReads {
    count: AtomicU64,
}

impl HostReads {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads made through this counter so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Reads a scalar (rank-0 or single-element) tensor to the host.
    pub fn scalar<T: WithDType>(&self, t: &Tensor) -> Result<T> {
        self.count.fetch_add(1, Ordering::Relaxed);
        let t = if t.rank() == 0 {
            t.clone()
        } else {
            t.flatten_all()?.squeeze(0)?
        };
        Ok(t.to_scalar::<T>()?)
    }

    /// Reads a tensor of any rank to the host as a flat vector.
    pub fn vec<T: WithDType>(&self, t: &Tensor) -> Result<Vec<T>> {
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(t.flatten_all()?.to_vec1::<T>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn reads_are_counted_per_counter() -> Result<()> {
        let (a, b) = (HostReads::new(), HostReads::new());
        let t = Tensor::new(&[1.5f32, 2.5], &Device::Cpu)?;
        assert_eq!(a.vec::<f32>(&t)?, vec![1.5, 2.5]);
        assert_eq!(a.scalar::<f32>(&t.sum_all()?)?, 4.0);
        assert_eq!(b.scalar::<f32>(&t.narrow(0, 1, 1)?)?, 2.5);
        assert_eq!((a.count(), b.count()), (2, 1));
        Ok(())
    }
}
