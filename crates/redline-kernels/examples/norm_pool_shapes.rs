//! Times the non-convolution kernels of a ResNet-18 training step on the
//! CPU at its shapes: the stem's 3x3/2 max pool (padding 1) and the
//! training batch norms (with and without their ReLU), forward and
//! backward, as the redline binary runs them (freed memory reused).
//!
//! `cargo run --release -p redline-kernels --example norm_pool_shapes -- [--threads N] [--batch B] [--size S] [--reps R]`

use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use redline_kernels::batch_norm::batch_norm2d_train;
use redline_kernels::grad::Param;
use redline_kernels::max_pool2d_window;

mod common;

use common::median;

/// Forward and backward medians (ms) of `f` over `reps` runs after one warm-up.
fn time(
    reps: usize,
    x: &Var,
    f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
    for _ in 0..reps + 1 {
        let t = Instant::now();
        let y = f(x.as_tensor())?;
        fwd.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let _g = y.backward()?;
        bwd.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median(fwd[1..].to_vec()), median(bwd[1..].to_vec())))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (batch, size, reps) = common::setup();
    println!("| op | c | side | fwd ms | bwd ms | fwd GB/s |\n| --- | ---: | ---: | ---: | ---: | ---: |");
    let dev = Device::Cpu;
    let stem = size / 2;
    let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (batch, 64, stem, stem), &dev)?)?;
    let (f, b) = time(reps, &x, &|x| {
        max_pool2d_window(x, 3, 2, 1).map_err(|e| candle_core::Error::Msg(e.to_string()))
    })?;
    let bytes = (batch * 64 * stem * stem * 4) as f64 * 1.25;
    println!(
        "| maxpool 3/2 p1 | 64 | {stem} | {f:.2} | {b:.2} | {:.1} |",
        bytes / f / 1e6
    );
    for (c, side) in [
        (64, stem),
        (64, size / 4),
        (128, size / 8),
        (256, size / 16),
        (512, size / 32),
    ] {
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (batch, c, side, side), &dev)?)?;
        let w = Param::new(Var::from_tensor(&Tensor::ones(
            c,
            candle_core::DType::F32,
            &dev,
        )?)?);
        let bb = Param::new(Var::from_tensor(&Tensor::zeros(
            c,
            candle_core::DType::F32,
            &dev,
        )?)?);
        for relu in [true, false] {
            let (f, b) = time(reps, &x, &|x| {
                batch_norm2d_train(x, &w, &bb, 1e-5, relu)
                    .map(|o| o.y)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))
            })?;
            let bytes = (batch * c * side * side * 4) as f64 * 3.0;
            let name = if relu { "bn+relu" } else { "bn" };
            println!(
                "| {name} | {c} | {side} | {f:.2} | {b:.2} | {:.1} |",
                bytes / f / 1e6
            );
        }
    }
    Ok(())
}
