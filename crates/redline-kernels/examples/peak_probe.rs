//! How repeatable the CPU's measured peak is (the MFU issue asks for
//! within 10% on a quiet machine): the probe `redline train` runs at start
//! (`redline_kernels::peak_probe::measure`, 250 ms), ten times per dtype
//! and thread count, with the spread (max / min - 1) of the ten.
//!
//! `cargo run --release -p redline-kernels --example peak_probe [THREADS...]`
//! (default: 1 and all usable cores). Check `uptime` first.

use std::time::Duration;

use candle_core::DType;
use redline_kernels::gemm::set_threads;
use redline_kernels::peak_probe::measure;

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut threads: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if threads.is_empty() {
        threads = vec![1, cores];
        threads.dedup();
    }
    println!(
        "{:>7} {:>5} {:>10} {:>10} {:>10} {:>7}",
        "threads", "gemm", "min GF/s", "median", "max", "spread"
    );
    for &n in &threads {
        set_threads(n);
        for dtype in [DType::F32, DType::BF16] {
            let mut v: Vec<f64> = (0..10)
                .map(|_| measure(dtype, Duration::from_millis(250)) / 1e9)
                .collect();
            v.sort_by(f64::total_cmp);
            let gemm = if redline_kernels::gemm_bf16::route(dtype) == DType::BF16 {
                "bf16"
            } else {
                "fp32"
            };
            println!(
                "{n:>7} {gemm:>5} {:>10.1} {:>10.1} {:>10.1} {:>6.1}%",
                v[0],
                (v[4] + v[5]) / 2.0,
                v[9],
                100.0 * (v[9] / v[0] - 1.0)
            );
        }
    }
}
