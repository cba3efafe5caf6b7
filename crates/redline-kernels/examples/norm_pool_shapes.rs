//! Times the non-convolution kernels of a ResNet-18 training step on the
//! CPU at its shapes: the stem's 3x3/2 max pool (padding 1) and the
//! training batch norms (with and without their ReLU), forward and
//! backward, as the redline binary runs them (freed memory reused).
//!
//! `cargo run --release -p redline-kernels --example norm_pool_shapes -- [--threads N] [--batch B] [--size S] [--reps R] [--dtype f32|bf16|bf16-mixed] [--resnet50]`
//!
//! `--dtype bf16` times the batch norms of `bf16-true` (bf16 input and
//! parameters), `bf16-mixed` those of a bf16 input under f32 parameters;
//! `--resnet50` ResNet-50's batch-norm shapes (its stages' widths and the
//! bottlenecks' 4x ones) instead of ResNet-18's.

use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var};
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
    let args: Vec<String> = std::env::args().collect();
    let dtype = args
        .iter()
        .position(|a| a == "--dtype")
        .and_then(|i| args.get(i + 1))
        .map_or("f32", String::as_str);
    let (xd, pd) = match dtype {
        "f32" => (DType::F32, DType::F32),
        "bf16" => (DType::BF16, DType::BF16),
        "bf16-mixed" => (DType::BF16, DType::F32),
        other => return Err(format!("--dtype {other}: f32, bf16 or bf16-mixed").into()),
    };
    let shapes: Vec<(usize, usize)> = if args.iter().any(|a| a == "--resnet50") {
        (0..4)
            .flat_map(|i| {
                let side = size / (4 << i);
                [(64 << i, side), (256 << i, side)]
            })
            .collect()
    } else {
        (0..4).map(|i| (64 << i, size / (4 << i))).collect()
    };
    let elem = xd.size_in_bytes() as f64;
    println!("batch norms: input {xd:?}, parameters {pd:?}");
    for (c, side) in std::iter::once((64, stem)).chain(shapes) {
        let x = Tensor::randn(0f32, 1.0, (batch, c, side, side), &dev)?.to_dtype(xd)?;
        let x = Var::from_tensor(&x)?;
        let w = Param::new(Var::from_tensor(&Tensor::ones(c, pd, &dev)?)?);
        let bb = Param::new(Var::from_tensor(&Tensor::zeros(c, pd, &dev)?)?);
        for relu in [true, false] {
            let (f, b) = time(reps, &x, &|x| {
                batch_norm2d_train(x, &w, &bb, 1e-5, relu)
                    .map(|o| o.y)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))
            })?;
            let bytes = (batch * c * side * side) as f64 * elem * 3.0;
            let name = if relu { "bn+relu" } else { "bn" };
            println!(
                "| {name} | {c} | {side} | {f:.2} | {b:.2} | {:.1} |",
                bytes / f / 1e6
            );
        }
    }
    Ok(())
}
