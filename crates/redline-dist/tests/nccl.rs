//! The NCCL backend on a real GPU (CUDA build with the `nccl` feature; run
//! by the GPU check): a communicator of one rank on cuda:0 whose all-reduce
//! and broadcast are the identity, as every rank's sum over one rank is,
//! through device buffers that grow between calls.

#![cfg(feature = "nccl")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use redline_core::{Device, DeviceSpec};
use redline_dist::{Collectives, NcclComm, Single};

#[test]
fn a_communicator_of_one_on_cuda_0_reduces_and_broadcasts() {
    let dev = Device::resolve(DeviceSpec::Cuda(0)).expect("a GPU (this test is the GPU check's)");
    let cuda = dev.candle().as_cuda_device().unwrap();
    let comm = NcclComm::init(
        redline_core::cuda::stream(cuda),
        Box::new(Single),
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(
        (comm.rank(), comm.world_size(), comm.backend()),
        (0, 1, "nccl")
    );
    for n in [3usize, 1000, 101_770] {
        let want: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let mut v = want.clone();
        let start = Instant::now();
        comm.all_reduce_sum(&mut v, "all-reduce").unwrap();
        println!(
            "nccl all-reduce of {n} f32 on 1 rank: {:?}",
            start.elapsed()
        );
        assert_eq!(v, want, "n = {n}");
        comm.broadcast(&mut v, 0, "broadcast").unwrap();
        assert_eq!(v, want);
    }
    assert!(comm.broadcast(&mut [1.0], 1, "bad root").is_err());
    comm.barrier("barrier").unwrap();
}
