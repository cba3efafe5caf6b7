//! The GEMMs of a GPT training step at one shape, timed through Redline's
//! `gemm::matmul` on all compute threads: the forward `x W^T`, the input
//! gradient `dY W` and the weight gradient `dY^T x` of each linear layer
//! (bench/gpt_gemms.py runs the same products in PyTorch beside it).
//!
//! ```sh
//! cargo run --release -p redline-kernels --example gpt_gemms -- TOKENS WIDTH [REPS]
//! ```

use std::time::Instant;

use redline_kernels::gemm::{matmul, threads, Mat};

fn median_us(
    dst: &mut [f32],
    a: Mat<'_>,
    b: Mat<'_>,
    reps: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        if !matmul(dst, a, b, false) {
            return Err("shapes do not fit".into());
        }
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[reps / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let (tokens, c, reps) = (
        args.first().copied().unwrap_or(4096),
        args.get(1).copied().unwrap_or(128),
        args.get(2).copied().unwrap_or(21),
    );
    println!("threads {}; tokens {tokens}, width {c}", threads());
    println!("| layer | pass | m x k x n | us | GFLOP/s |");
    println!("| --- | --- | --- | ---: | ---: |");
    let fill = |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin()).collect() };
    for (name, fin, fout) in [
        ("qkv", c, 3 * c),
        ("proj", c, c),
        ("fc", c, 4 * c),
        ("fc-proj", 4 * c, c),
        ("head", c, 256),
    ] {
        let x = fill(tokens * fin, 0.37);
        let w = fill(fout * fin, 0.11);
        let dy = fill(tokens * fout, 0.23);
        let mut y = vec![0f32; tokens * fout];
        let mut dx = vec![0f32; tokens * fin];
        let mut dw = vec![0f32; fout * fin];
        let rows = [
            (
                "fwd",
                median_us(
                    &mut y,
                    Mat::new(&x, tokens, fin),
                    Mat::new(&w, fout, fin).t(),
                    reps,
                )?,
                (tokens, fin, fout),
            ),
            (
                "dx",
                median_us(
                    &mut dx,
                    Mat::new(&dy, tokens, fout),
                    Mat::new(&w, fout, fin),
                    reps,
                )?,
                (tokens, fout, fin),
            ),
            (
                "dw",
                median_us(
                    &mut dw,
                    Mat::new(&dy, tokens, fout).t(),
                    Mat::new(&x, tokens, fin),
                    reps,
                )?,
                (fout, tokens, fin),
            ),
        ];
        // The whole layer's forward (`redline_kernels::linear`: GEMM and bias).
        let dev = candle_core::Device::Cpu;
        let xt = candle_core::Tensor::from_vec(x.clone(), (tokens, fin), &dev)?;
        let wt = candle_core::Tensor::from_vec(w.clone(), (fout, fin), &dev)?;
        let bt = candle_core::Tensor::from_vec(fill(fout, 0.5), fout, &dev)?;
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t = Instant::now();
            drop(redline_kernels::linear(&xt, &wt, &bt, false)?);
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        times.sort_by(f64::total_cmp);
        let layer = times[reps / 2];
        let gf = 2.0 * (tokens * fin * fout) as f64 / layer / 1e3;
        println!("| {name} | layer fwd | {tokens}x{fin}x{fout} | {layer:.0} | {gf:.0} |");
        for (pass, us, (m, k, n)) in rows {
            let gf = 2.0 * (m * k * n) as f64 / us / 1e3;
            println!("| {name} | {pass} | {m}x{k}x{n} | {us:.0} | {gf:.0} |");
        }
    }
    Ok(())
}
