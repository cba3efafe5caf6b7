//! The bf16 GEMM (AVX-512 BF16) against the fp32 GEMM on the shapes of the
//! MLP's and the CNN's steps, one thread, median microseconds of 31 runs,
//! each shape in the three layouts the layers use (forward `a b^T`, input
//! gradient `a b`, weight gradient `a^T b`).
//!
//! `cargo run --release -p redline-kernels --example gemm_bf16`

use std::time::Instant;

use redline_kernels::gemm::{matmul, set_threads, Mat};
use redline_kernels::gemm_bf16::{available, matmul_bf16};

fn median_us(mut f: impl FnMut() -> bool) -> f64 {
    let mut times: Vec<f64> = (0..31)
        .map(|_| {
            let t = Instant::now();
            assert!(f());
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[15]
}

fn main() {
    if !available() {
        println!("this CPU has no AVX-512 BF16: the bf16 GEMM falls back to fp32");
    }
    set_threads(1);
    println!(
        "{:>16} {:>6} {:>10} {:>10} {:>7}",
        "m x k x n", "layout", "fp32 us", "bf16 us", "speedup"
    );
    // (m, k, n): MLP b64 fc1 forward, dx, dW; fc2; CNN conv2 per sample
    // (forward, dx, dW in the wide layout); CNN fc1 (forward, dW).
    let shapes = [
        (64, 784, 128, "a b^T"),
        (64, 128, 784, "a b"),
        (128, 64, 784, "a^T b"),
        (64, 128, 10, "a b^T"),
        (64, 288, 224, "a b"),
        (288, 64, 224, "a^T b"),
        (64, 224, 288, "a b^T"),
        (64, 3136, 128, "a b^T"),
        (128, 64, 3136, "a^T b"),
        (512, 784, 128, "a b^T"),
    ];
    for (m, k, n, layout) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let (ma, mb) = match layout {
            "a b^T" => (Mat::new(&a, m, k), Mat::new(&b, n, k).t()),
            "a^T b" => (Mat::new(&a, k, m).t(), Mat::new(&b, k, n)),
            _ => (Mat::new(&a, m, k), Mat::new(&b, k, n)),
        };
        let mut c = vec![0f32; m * n];
        let f32_us = median_us(|| matmul(&mut c, ma, mb, false));
        let bf16_us = median_us(|| matmul_bf16(&mut c, ma, mb, false));
        println!(
            "{:>16} {:>6} {:>10.1} {:>10.1} {:>7.2}",
            format!("{m}x{k}x{n}"),
            layout,
            f32_us,
            bf16_us,
            f32_us / bf16_us
        );
    }
}
