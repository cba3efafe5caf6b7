//! The CPU's peak FLOP/s, measured rather than looked up: a CPU's real
//! rate depends on its vector units, clocks under load and the cores a run
//! may use, which no table knows. The probe times the GEMM the run's
//! products take ([`crate::gemm_bf16::route`]: the fp32 GEMM, or the native
//! bf16 one) on square matrices large enough to reach its best rate, on the
//! process's compute threads, and keeps the fastest product: the rate the
//! machine's math can reach, against which MFU is read.

use std::time::{Duration, Instant};

use candle_core::DType;

use crate::gemm::Mat;

/// The probe's matrix side: a 1024 x 1024 x 1024 product is 2.1 GFLOP,
/// tens of milliseconds on a few cores, big enough for the GEMM's packing
/// and threading to cost next to nothing.
pub const SIDE: usize = 1024;

/// FLOP/s of the fastest of the products the probe ran in about `budget`
/// (at least three) in the GEMM a run in `dtype` takes, on this process's
/// compute threads. 0 when the GEMM refused the shapes (it never should).
pub fn measure(dtype: DType, budget: Duration) -> f64 {
    let gemm = crate::gemm_bf16::route(dtype);
    let n = SIDE;
    // Values whose products stay finite and away from subnormals.
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| ((i % 89) as f32 - 44.0) / 64.0)
        .collect();
    let mut dst = vec![0f32; n * n];
    let flops = 2.0 * (n * n * n) as f64;
    let start = Instant::now();
    let mut best = 0f64;
    let mut runs = 0;
    // The first product warms the caches and the thread pool: not counted.
    if !crate::gemm_bf16::matmul_in(
        gemm,
        &mut dst,
        Mat::new(&a, n, n),
        Mat::new(&b, n, n),
        false,
    ) {
        return 0.0;
    }
    while runs < 3 || start.elapsed() < budget {
        let t = Instant::now();
        let ok = crate::gemm_bf16::matmul_in(
            gemm,
            &mut dst,
            Mat::new(&a, n, n),
            Mat::new(&b, n, n),
            false,
        );
        let secs = t.elapsed().as_secs_f64();
        if !ok {
            return 0.0;
        }
        if secs > 0.0 {
            best = best.max(flops / secs);
        }
        runs += 1;
        if runs >= 1000 {
            break;
        }
    }
    std::hint::black_box(&dst);
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_measures_a_positive_finite_rate() {
        for dtype in [DType::F32, DType::BF16] {
            let r = measure(dtype, Duration::from_millis(1));
            assert!(r.is_finite() && r > 1e6, "{dtype:?}: {r}");
        }
    }
}
