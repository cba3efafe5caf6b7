//! The fused causal attention's forward and backward on the CPU, median
//! milliseconds of 7 runs after 2 warm-ups, at nanoGPT's shakespeare-char
//! shape, GPT-2's and bench/gpt_cpu.py's small GPT's (16, 4, 256, 32); one line of JSON per shape for `bench/attention.py`,
//! which runs PyTorch's SDPA beside it on the same threads.
//!
//! `cargo run --release -p redline-kernels --example attention -- THREADS`

use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use redline_kernels::causal_attention;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    redline_kernels::gemm::set_threads(threads);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()?;
    for (b, h, t, d) in [
        (4usize, 6usize, 256usize, 64usize),
        (1, 12, 1024, 64),
        (16, 4, 256, 32),
    ] {
        let x = |s: f32| -> Result<Var, candle_core::Error> {
            let n = b * h * t * d;
            let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 + s).sin()).collect();
            Var::from_tensor(&Tensor::from_vec(v, (b, h, t, d), &Device::Cpu)?)
        };
        let (q, k, v) = (x(0.1)?, x(0.2)?, x(0.3)?);
        let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
        for run in 0..9 {
            let t0 = Instant::now();
            let o = causal_attention(&q, &k, &v)?;
            let t1 = Instant::now();
            let g = o.sum_all()?.backward()?;
            let t2 = Instant::now();
            assert!(g.get(&q).is_some());
            if run >= 2 {
                fwd.push((t1 - t0).as_secs_f64() * 1e3);
                bwd.push((t2 - t1).as_secs_f64() * 1e3);
            }
        }
        println!(
            "{{\"shape\": [{b}, {h}, {t}, {d}], \"threads\": {threads}, \"forward_ms\": {:.3}, \"backward_ms\": {:.3}}}",
            median(fwd),
            median(bwd)
        );
    }
    Ok(())
}
