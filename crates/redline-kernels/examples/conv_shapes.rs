//! Times the fused CPU convolution on ResNet's shapes, forward and backward
//! (dW, db, dx), and prints ms and GFLOP/s per shape; `bench/conv_shapes.py`
//! runs PyTorch's on the same shapes beside it.
//!
//! `cargo run --release -p redline-kernels --example conv_shapes -- [--threads N] [--batch B] [--size S] [--reps R] [--no-dx] [--bf16] [--io16 [--io16-casts]] [--resnet50] [--only TEXT] [--patch8 [--patch-cout N]]`

use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use redline_kernels::grad::Param;
use redline_kernels::{conv2d_strided_in, conv2d_strided_param};

/// ResNet-18's convolutions at input side `s`: (name, cin, cout, k, stride, pad, input side).
fn shapes(s: usize) -> Vec<(&'static str, usize, usize, usize, usize, usize, usize)> {
    if std::env::args().any(|a| a == "--patch8") {
        // Issue 52's first row: bench/models/patch8.toml's convolution,
        // with `--patch-cout N` output channels [default 8].
        return vec![("patch 8x8/8", 3, arg("--patch-cout", 8), 8, 8, 0, s)];
    }
    let (s1, s2, s3, s4) = (s / 4, s / 8, s / 16, s / 32);
    if std::env::args().any(|a| a == "--resnet50") {
        // ResNet-50's bottleneck 1x1 convolutions, into and out of each stage's width.
        return vec![
            ("layer1 1x1 in", 256, 64, 1, 1, 0, s1),
            ("layer1 1x1 out", 64, 256, 1, 1, 0, s1),
            ("layer2 1x1 in", 512, 128, 1, 1, 0, s2),
            ("layer2 1x1 out", 128, 512, 1, 1, 0, s2),
            ("layer3 1x1 in", 1024, 256, 1, 1, 0, s3),
            ("layer3 1x1 out", 256, 1024, 1, 1, 0, s3),
            ("layer4 1x1 in", 2048, 512, 1, 1, 0, s4),
            ("layer4 1x1 out", 512, 2048, 1, 1, 0, s4),
            ("layer2 down 1x1/2", 256, 512, 1, 2, 0, s1),
            ("layer3 down 1x1/2", 512, 1024, 1, 2, 0, s2),
            ("layer4 down 1x1/2", 1024, 2048, 1, 2, 0, s3),
        ];
    }
    vec![
        ("conv1 7x7/2", 3, 64, 7, 2, 3, s),
        ("layer1 3x3", 64, 64, 3, 1, 1, s1),
        ("layer2.0.conv1 3x3/2", 64, 128, 3, 2, 1, s1),
        ("layer2 3x3", 128, 128, 3, 1, 1, s2),
        ("layer2 down 1x1/2", 64, 128, 1, 2, 0, s1),
        ("layer3.0.conv1 3x3/2", 128, 256, 3, 2, 1, s2),
        ("layer3 3x3", 256, 256, 3, 1, 1, s3),
        ("layer3 down 1x1/2", 128, 256, 1, 2, 0, s2),
        ("layer4.0.conv1 3x3/2", 256, 512, 3, 2, 1, s3),
        ("layer4 3x3", 512, 512, 3, 1, 1, s4),
        ("layer4 down 1x1/2", 256, 512, 1, 2, 0, s3),
    ]
}

mod common;

use common::{arg, median};

/// A strided bf16 convolution as the layer set runs it under `bf16-true`:
/// the parameters rounded by recorded casts, then the bf16-storage kernels
/// (`conv2d_bf16`), or with `casts` the fp32 op between casts.
fn strided16(
    x: &Tensor,
    (w, b): (&Param, &Param),
    geometry: (usize, usize),
    casts: bool,
) -> Result<Tensor, Box<dyn std::error::Error>> {
    use redline_kernels::cast16::{round_to, to_dtype};
    let bf = candle_core::DType::BF16;
    let (wr, br) = (round_to(w.as_tensor(), bf)?, round_to(b.as_tensor(), bf)?);
    if !casts {
        if let Some(y) = redline_kernels::conv2d_bf16(x, &wr, &br, geometry)? {
            return Ok(y);
        }
    }
    let y = conv2d_strided_in(&round_to(x, bf)?, &wr, &br, geometry, bf)?;
    Ok(to_dtype(&y, bf)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (batch, size, reps) = common::setup();
    println!(
        "| conv | cin | cout | k/s | in | fwd ms | bwd ms | fwd GFLOP/s | bwd GFLOP/s |\n| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"
    );
    let dev = Device::Cpu;
    // --only TEXT: the shapes whose name contains TEXT.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    // --bf16: bf16 products on the native bf16 GEMM (im2col).
    let bf16 = args.iter().any(|a| a == "--bf16");
    // --io16: bf16 activations in and out (bf16-true's convolution,
    // `conv2d_in`: cast-free where the kernels read bf16); stride 1, and
    // strided 1x1 ones (`conv2d_bf16`, the layer set's route for them).
    // --io16-casts: those strided 1x1 ones as the fp32 op between casts
    // (their route before stop 72).
    let io16 = args.iter().any(|a| a == "--io16");
    let casts = args.iter().any(|a| a == "--io16-casts");
    for (name, cin, cout, k, stride, pad, side) in shapes(size) {
        if !name.contains(only.as_str()) || (io16 && stride != 1 && k != 1) {
            continue;
        }
        let xt = Tensor::randn(0f32, 1.0, (batch, cin, side, side), &dev)?;
        let xt = if io16 {
            xt.to_dtype(candle_core::DType::BF16)?
        } else {
            xt
        };
        let xv = Var::from_tensor(&xt)?;
        // --no-dx: the input untracked (a first layer), dW and db only.
        let x = if std::env::args().any(|a| a == "--no-dx") {
            xt
        } else {
            xv.as_tensor().clone()
        };
        let w = Param::new(Var::from_tensor(&Tensor::randn(
            0f32,
            0.05,
            (cout, cin, k, k),
            &dev,
        )?)?);
        let b = Param::new(Var::from_tensor(&Tensor::zeros(
            cout,
            candle_core::DType::F32,
            &dev,
        )?)?);
        let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
        for _ in 0..reps + 1 {
            let t = Instant::now();
            let y = if io16 && stride != 1 {
                strided16(&x, (&w, &b), (pad, stride), casts)?
            } else if io16 {
                let bf = candle_core::DType::BF16;
                redline_kernels::conv2d_in(&x, &w, &b, pad, None, bf)?
            } else if bf16 {
                let (wt, bt) = (w.as_tensor(), b.as_tensor());
                conv2d_strided_in(&x, wt, bt, (pad, stride), candle_core::DType::BF16)?
            } else {
                conv2d_strided_param(&x, &w, &b, pad, stride)?
            };
            let f = t.elapsed().as_secs_f64();
            // candle seeds the backward with ones shaped as `y`: dy = 1.
            let t = Instant::now();
            let _g = y.backward()?;
            bwd.push(t.elapsed().as_secs_f64());
            fwd.push(f);
            w.grad().clear();
            b.grad().clear();
        }
        let (fwd, bwd) = (median(fwd[1..].to_vec()), median(bwd[1..].to_vec()));
        let o = (side + 2 * pad - k) / stride + 1;
        let flops = 2.0 * (batch * cout * o * o * cin * k * k) as f64;
        println!(
            "| {name} | {cin} | {cout} | {k}/{stride} | {side} | {:.1} | {:.1} | {:.0} | {:.0} |",
            fwd * 1e3,
            bwd * 1e3,
            flops / fwd / 1e9,
            2.0 * flops / bwd / 1e9
        );
    }
    Ok(())
}
