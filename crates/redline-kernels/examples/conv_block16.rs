//! The CNN's conv blocks (3x3 conv, pad 1, ReLU, 2x2 max pool) in fp32 and
//! in bf16 (`--precision bf16-mixed`'s fused CPU path), forward and backward
//! timed apart: median milliseconds of 41 runs at batch 64, on the compute
//! threads given (default: every core), set as the trainer sets them.
//!
//! `cargo run --release -p redline-kernels --example conv_block16 [threads] [f32|bf16] [1|2]`

use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var};
use redline_kernels::conv2d_in;
use redline_kernels::grad::Param;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // A second argument, f32 or bf16, runs that dtype alone (for profiling).
    let only = match std::env::args().nth(2).as_deref() {
        Some("f32") => Some(DType::F32),
        Some("bf16") => Some(DType::BF16),
        _ => None,
    };
    // As the trainer sets them: rayon's pool, the compute threads, and
    // candle's elementwise pool (whose idle workers spin).
    redline_core::threads::configure(Some(threads));
    let dev = Device::Cpu;
    println!(
        "{:>22} {:>6} {:>9} {:>9} {:>9}  (batch 64, {threads} threads, median ms of 41)",
        "block", "dtype", "fwd ms", "bwd ms", "total"
    );
    // (Cin, Cout, side): the zoo CNN's conv1 (its input not tracked) and conv2.
    // A third argument, 1 or 2, runs that block alone.
    let block = std::env::args()
        .nth(3)
        .and_then(|s| s.parse::<usize>().ok());
    let blocks = [(1, 32, 28, false), (32, 64, 14, true)];
    for (i, &(cin, cout, side, tracked)) in blocks.iter().enumerate() {
        if block.is_some_and(|n| n != i + 1) {
            continue;
        }
        let x0 = Tensor::randn(0f32, 1.0, (64, cin, side, side), &dev)?;
        let w = Param::new(Var::from_tensor(&Tensor::randn(
            0f32,
            0.2,
            (cout, cin, 3, 3),
            &dev,
        )?)?);
        let b = Param::new(Var::from_tensor(&Tensor::randn(0f32, 0.1, cout, &dev)?)?);
        let g = Tensor::randn(0f32, 1.0, (64, cout, side / 2, side / 2), &dev)?;
        for dtype in [DType::F32, DType::BF16] {
            if only.is_some_and(|o| o != dtype) {
                continue;
            }
            let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
            for _ in 0..41 {
                let xv = Var::from_tensor(&x0)?;
                let x = if tracked {
                    xv.as_tensor().to_dtype(dtype)?
                } else {
                    x0.clone()
                };
                let t = Instant::now();
                let y = conv2d_in(&x, &w, &b, 1, Some(2), dtype)?;
                fwd.push(t.elapsed().as_secs_f64() * 1e3);
                // The loss's own backward (the product with g, the sum, the
                // cast) timed on a detached copy and taken off.
                let yd = Var::from_tensor(&y.detach())?;
                let base = (yd.as_tensor().to_dtype(DType::F32)? * &g)?.sum_all()?;
                let t = Instant::now();
                drop(base.backward()?);
                let loss_ms = t.elapsed().as_secs_f64() * 1e3;
                let loss = (y.to_dtype(DType::F32)? * &g)?.sum_all()?;
                let t = Instant::now();
                let mut grads = loss.backward()?;
                bwd.push(t.elapsed().as_secs_f64() * 1e3 - loss_ms);
                w.absorb(&mut grads)?;
                b.absorb(&mut grads)?;
                w.grad().clear();
                b.grad().clear();
            }
            let (f, bk) = (median(fwd), median(bwd));
            println!(
                "{:>22} {:>6} {:>9.3} {:>9.3} {:>9.3}",
                format!("conv {cin}->{cout} {side}x{side}"),
                format!("{dtype:?}"),
                f,
                bk,
                f + bk
            );
        }
    }
    Ok(())
}
