//! Helpers shared by the kernel timing examples (`conv_shapes`,
//! `norm_pool_shapes`, `conv_paths`): flags and medians.

/// The value after `--name` on the command line, or `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of `v` (the upper one of an even count).
#[allow(dead_code)] // conv_paths times through the library's own medians.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `--threads` [2], `--batch` [32], `--size` [224] and `--reps` [5]: sets
/// the compute threads, reuses freed host memory as the redline binary
/// does (buffers not unmapped between runs), prints the run's line and
/// returns `(batch, size, reps)`.
pub fn setup() -> (usize, usize, usize) {
    let (threads, batch, size, reps) = (
        arg("--threads", 2),
        arg("--batch", 32),
        arg("--size", 224),
        arg("--reps", 5),
    );
    redline_kernels::gemm::set_threads(threads);
    redline_core::host_alloc::reuse_freed_memory();
    println!("threads {threads}, batch {batch}, input {size} px, median of {reps}");
    (batch, size, reps)
}
