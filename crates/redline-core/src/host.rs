//! Reads of tensors back to the host. Every such read waits for the device, so
//! all of them go through these functions, which count them: the trainer
//! reports host syncs per step (the tutorials' `.item()` warning, measured).

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{Tensor, WithDType};

use crate::error::Result;

static HOST_READS: AtomicU64 = AtomicU64::new(0);

/// Number of host reads made by this process so far.
pub fn host_reads() -> u64 {
    HOST_READS.load(Ordering::Relaxed)
}

/// Reads a scalar (rank-0 or single-element) tensor to the host.
pub fn scalar<T: WithDType>(t: &Tensor) -> Result<T> {
    HOST_READS.fetch_add(1, Ordering::Relaxed);
    let t = if t.rank() == 0 {
        t.clone()
    } else {
        t.flatten_all()?.squeeze(0)?
    };
    Ok(t.to_scalar::<T>()?)
}

/// Reads a tensor of any rank to the host as a flat vector.
pub fn vec<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
    HOST_READS.fetch_add(1, Ordering::Relaxed);
    Ok(t.flatten_all()?.to_vec1::<T>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn reads_are_counted() -> Result<()> {
        let before = host_reads();
        let t = Tensor::new(&[1.5f32, 2.5], &Device::Cpu)?;
        assert_eq!(vec::<f32>(&t)?, vec![1.5, 2.5]);
        assert_eq!(scalar::<f32>(&t.sum_all()?)?, 4.0);
        assert!(host_reads() >= before + 2);
        Ok(())
    }
}
