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

/// What a replayed graph's nodes cost on this GPU, by kind, to weigh the
/// step's nodes (the summary's `cuda_graph` line counts them by kind). Three
/// graphs of `N` ops each: one-thread kernels (`count_up`); candle's op that
/// allocates, launches and frees (`affine` into a new tensor, dropped); the
/// same written back into the variable (`Var::set`: a copy), as the step's
/// bookkeeping ran before `cuda/tally.cu`. Prints a `graph-node-cost` line
/// (microseconds per node from timed back-to-back replays); checks each
/// graph's kinds and that every replay ran.
#[test]
fn cuda_graph_node_costs() {
    use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
    use redline_kernels::cuda::{count_up, graph_node_kinds};
    const N: usize = 64;
    const WARM: usize = 10;
    const TIMED: usize = 200;
    let dev = gpu();
    let Device::Cuda(cuda) = &dev else {
        panic!("not a CUDA device")
    };
    let stream = cuda.cuda_stream();
    let c = Var::from_tensor(&Tensor::from_slice(&[0u32], 1, &dev).unwrap()).unwrap();
    let capture = |op: &dyn Fn()| -> CudaGraph {
        stream.synchronize().unwrap();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .unwrap();
        for _ in 0..N {
            op();
        }
        stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .unwrap()
            .expect("a graph")
    };
    // Microseconds per replay, and the graph's kinds: (kernels, copies,
    // allocations, frees, nodes).
    let run = |g: &CudaGraph| -> (f64, [usize; 5]) {
        let (total, kinds) = graph_node_kinds(g).expect("the node count");
        let count = |k: u32| kinds.iter().filter(|&&x| x == k).count();
        for _ in 0..WARM {
            g.launch().unwrap();
        }
        stream.synchronize().unwrap();
        let ctx = stream.context();
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (a, b) = (
            ctx.new_event(timing).unwrap(),
            ctx.new_event(timing).unwrap(),
        );
        a.record(&stream).unwrap();
        for _ in 0..TIMED {
            g.launch().unwrap();
        }
        b.record(&stream).unwrap();
        let us = f64::from(a.elapsed_ms(&b).unwrap()) * 1e3 / TIMED as f64;
        (us, [count(0), count(1), count(10), count(11), total])
    };
    let counter = || c.as_tensor().to_vec1::<u32>().unwrap()[0] as usize;
    let kernels = capture(&|| assert!(count_up(c.as_tensor()).unwrap()));
    let (t_kernel, k_kernel) = run(&kernels);
    assert_eq!(
        k_kernel,
        [N, 0, 0, 0, N],
        "kernels, copies, allocations, frees, nodes"
    );
    assert_eq!(
        counter(),
        N * (WARM + TIMED),
        "every replay of the kernels ran"
    );
    let allocating = capture(&|| drop(c.as_tensor().affine(1.0, 1.0).unwrap()));
    let (t_alloc, k_alloc) = run(&allocating);
    let copying = capture(&|| c.set(&c.as_tensor().affine(1.0, 1.0).unwrap()).unwrap());
    let (t_copy, k_copy) = run(&copying);
    assert_eq!(
        counter(),
        2 * N * (WARM + TIMED),
        "every replay of the copies ran"
    );
    let n = N as f64;
    println!(
        "graph-node-cost: {N} one-thread kernels {t_kernel:.1} us a replay ({:.2} us a kernel \
         node); allocate+kernel+free {t_alloc:.1} us {k_alloc:?} (+{:.2} us an allocation and \
         free); +copy back {t_copy:.1} us {k_copy:?} (+{:.2} us a copy node) \
         [kinds: kernels, copies, allocations, frees, nodes]",
        t_kernel / n,
        (t_alloc - t_kernel) / n,
        (t_copy - t_alloc) / n,
    );
    assert_eq!(k_alloc[0], N, "one kernel per op: {k_alloc:?}");
    assert_eq!(
        k_copy[..2],
        [N, N],
        "a kernel and a copy per op: {k_copy:?}"
    );
}
