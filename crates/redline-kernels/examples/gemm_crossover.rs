//! Measures where a GEMM starts to gain from a second thread on this machine.
//! Prints median microseconds for 1 and N threads per shape; the crossover sets
//! `ops::gemm::PARALLEL_MIN_FLOPS`.
//!
//! `cargo run --release -p redline-core --example gemm_crossover`

use std::time::Instant;

use redline_kernels::gemm::{
    matmul, set_parallel_min_flops, set_threads, threads, Mat, PARALLEL_MIN_FLOPS,
};

fn median_us(m: usize, k: usize, n: usize, reps: usize) -> f64 {
    let a: Vec<f32> = (0..m * k).map(|i| (i as f32).sin()).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i as f32).cos()).collect();
    let mut c = vec![0f32; m * n];
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let ok = matmul(&mut c, Mat::new(&a, m, k), Mat::new(&b, k, n), false);
        times.push(t.elapsed().as_secs_f64() * 1e6);
        assert!(ok);
    }
    times.sort_by(f64::total_cmp);
    times[reps / 2]
}

fn main() {
    let all = threads();
    println!("threads available: {all}; current PARALLEL_MIN_FLOPS = {PARALLEL_MIN_FLOPS}");
    println!(
        "{:>22} {:>12} {:>10} {:>10} {:>7}",
        "m x k x n", "mult-adds", "1 thr us", "N thr us", "gain"
    );
    // Shapes of the MLP/CNN steps (fwd, dW, dx) and a sweep around them.
    let shapes = [
        (64, 784, 128),
        (128, 64, 784),
        (64, 128, 10),
        (256, 784, 128),
        (512, 784, 128),
        (128, 512, 784),
        (64, 288, 196),
        (12544, 288, 64),
        (64, 3136, 128),
        (128, 64, 3136),
        (1024, 784, 128),
        (32, 32, 32),
        (200, 200, 200),
        (400, 400, 400),
    ];
    for (m, k, n) in shapes {
        // The crossover check forces each mode regardless of the threshold.
        set_threads(1);
        let one = median_us(m, k, n, 31);
        set_threads(all);
        set_parallel_min_flops(0);
        let multi = median_us(m, k, n, 31);
        set_parallel_min_flops(PARALLEL_MIN_FLOPS);
        let flops = m * k * n;
        println!(
            "{:>22} {:>12} {:>10.1} {:>10.1} {:>7.2}",
            format!("{m}x{k}x{n}"),
            flops,
            one,
            multi,
            one / multi
        );
    }
}
