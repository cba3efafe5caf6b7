//! The step's scalar bookkeeping kernels (`cuda/tally.cu`) on `cuda:0`.

use candle_core::{Device, Tensor, Var};

use super::gpu;

/// A step's sums and counters in one launch each (`cuda/tally.cu`) against
/// candle's ops they replace on the GPU (`sum + value.affine(scale, 0)`,
/// `counter.affine(1, 1)`), bit for bit, in place (the buffers keep their
/// addresses); tensors the kernels do not take are declined.
#[test]
fn cuda_step_sums_and_counters_match_candles_ops() {
    use redline_kernels::cuda::{count_up, step_sums};
    let dev = gpu();
    let scalar = |v: f32| Tensor::new(v, &dev).unwrap();
    let starts = [0.0f32, 1.0e30, 3.0e-39, 7.5, 0.1];
    let adds = [
        (0.1f32, 64.0f32),
        (3.333_333_3, 17.0),
        (1.0e-39, 3.0),
        (f32::NAN, 1.0),
        (0.2, 1.0 / 3.0),
    ];
    let sums: Vec<Var> = starts
        .iter()
        .map(|&v| Var::from_tensor(&scalar(v)).unwrap())
        .collect();
    let values: Vec<Tensor> = adds.iter().map(|&(v, _)| scalar(v)).collect();
    let items: Vec<(&Tensor, &Tensor, f32)> = sums
        .iter()
        .zip(&values)
        .zip(&adds)
        .map(|((s, v), &(_, k))| (s.as_tensor(), v, k))
        .collect();
    let before: Vec<u64> = sums.iter().map(|s| address(s.as_tensor())).collect();
    assert!(step_sums(&items).unwrap());
    for (i, ((s, v), &(_, k))) in sums.iter().zip(&values).zip(&adds).enumerate() {
        let want = (scalar(starts[i]) + v.affine(f64::from(k), 0.0).unwrap()).unwrap();
        let (g, w) = (
            s.as_tensor().to_scalar::<f32>().unwrap(),
            want.to_scalar::<f32>().unwrap(),
        );
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "sum {i}: {g:e} vs {w:e}"
        );
        assert_eq!(address(s.as_tensor()), before[i], "sum {i} moved");
    }
    let f64_sum = Tensor::new(1.0f64, &dev).unwrap();
    assert!(!step_sums(&[(&f64_sum, &values[0], 1.0)]).unwrap());
    let on_cpu = Tensor::new(1.0f32, &Device::Cpu).unwrap();
    assert!(!step_sums(&[(sums[0].as_tensor(), &on_cpu, 1.0)]).unwrap());

    let c32 = Var::from_tensor(&Tensor::from_slice(&[u32::MAX - 1], 1, &dev).unwrap()).unwrap();
    let c64 = Var::from_tensor(&Tensor::new(9_007_199_254_740_991.0f64, &dev).unwrap()).unwrap();
    for _ in 0..2 {
        let want32 = c32
            .as_tensor()
            .affine(1.0, 1.0)
            .unwrap()
            .to_vec1::<u32>()
            .unwrap();
        let want64 = c64
            .as_tensor()
            .affine(1.0, 1.0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!(count_up(c32.as_tensor()).unwrap() && count_up(c64.as_tensor()).unwrap());
        assert_eq!(c32.as_tensor().to_vec1::<u32>().unwrap(), want32);
        assert_eq!(c64.as_tensor().to_scalar::<f64>().unwrap(), want64);
    }
    assert!(!count_up(&values[0]).unwrap(), "an f32 is no counter");
}

/// The device address of a tensor's first element.
fn address(t: &Tensor) -> u64 {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let (s, l) = t.storage_and_layout();
    let candle_core::Storage::Cuda(c) = &*s else {
        panic!("not on the GPU")
    };
    let stream = c.device.cuda_stream();
    let base = match &c.slice {
        candle_core::cuda_backend::CudaStorageSlice::F32(v) => v.device_ptr(&stream).0,
        candle_core::cuda_backend::CudaStorageSlice::F64(v) => v.device_ptr(&stream).0,
        candle_core::cuda_backend::CudaStorageSlice::U32(v) => v.device_ptr(&stream).0,
        _ => panic!("an address of f32, f64 or u32 only"),
    };
    base + (l.start_offset() * t.dtype().size_in_bytes()) as u64
}
