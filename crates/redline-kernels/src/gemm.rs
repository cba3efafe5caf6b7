//! Safe row-major f32 GEMM over slices, with the process's thread policy.
//!
//! `dst = (accumulate ? dst : 0) + a * b` where each operand is a row-major
//! matrix given with its transpose flag. Small products run single-threaded:
//! splitting them costs more than it saves (see `bench/NOTES.md`).

use std::sync::atomic::{AtomicUsize, Ordering};

use gemm::Parallelism;

/// Multiply-adds below which a GEMM stays on one thread (measured with
/// `examples/gemm_crossover.rs`; see `bench/NOTES.md`).
pub const PARALLEL_MIN_FLOPS: usize = 40_000_000;

static PARALLEL_MIN: AtomicUsize = AtomicUsize::new(PARALLEL_MIN_FLOPS);

/// Overrides the single-thread threshold (0 = always split; for measurements).
pub fn set_parallel_min_flops(n: usize) {
    PARALLEL_MIN.store(n, Ordering::Relaxed);
}

/// Sets the number of compute threads used by fused kernels (the thread
/// policy itself lives in `redline_core::threads`).
pub fn set_threads(n: usize) {
    redline_core::threads::set_compute_threads(n);
}

/// Compute threads fused kernels may use: see
/// [`redline_core::threads::compute_threads`].
pub fn threads() -> usize {
    redline_core::threads::compute_threads()
}

/// A row-major matrix operand: `rows x cols` as stored, optionally transposed.
#[derive(Debug, Clone, Copy)]
pub struct Mat<'a> {
    /// Elements, row-major, `rows * cols` of them.
    pub data: &'a [f32],
    /// Rows as stored.
    pub rows: usize,
    /// Columns as stored.
    pub cols: usize,
    /// Use the transpose.
    pub t: bool,
}

impl<'a> Mat<'a> {
    /// A stored `rows x cols` matrix.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            t: false,
        }
    }

    /// The same matrix, transposed (no copy).
    pub fn t(self) -> Self {
        Self { t: !self.t, ..self }
    }

    /// Logical (rows, cols) after the transpose flag.
    pub(crate) fn shape(&self) -> (usize, usize) {
        if self.t {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// (column stride, row stride) of the logical matrix.
    fn strides(&self) -> (isize, isize) {
        if self.t {
            (self.cols as isize, 1)
        } else {
            (1, self.cols as isize)
        }
    }
}

/// `dst (m x n) = [dst +] a (m x k) * b (k x n)`. Panics never: returns false
/// (and leaves `dst` untouched) when shapes or lengths disagree.
#[must_use]
pub fn matmul(dst: &mut [f32], a: Mat<'_>, b: Mat<'_>, accumulate: bool) -> bool {
    let (m, k, n) = match sizes(dst, &a, &b, accumulate) {
        Some(Some(mkn)) => mkn,
        Some(None) => return true,
        None => return false,
    };
    let threads = threads();
    let par = if threads > 1 && m * n * k >= PARALLEL_MIN.load(Ordering::Relaxed) {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    let ((a_cs, a_rs), (b_cs, b_rs)) = (a.strides(), b.strides());
    // SAFETY: the lengths were checked above against m, n, k and the strides
    // describe row-major (or transposed row-major) storage inside those bounds.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            par,
        );
    }
    true
}

/// A product's `(m, k, n)` to compute: `None` when shapes or lengths
/// disagree (`dst` untouched), `Some(None)` when there is nothing to multiply
/// (an empty `dst`, or `k = 0`: `dst` zeroed unless accumulating).
pub(crate) fn sizes(
    dst: &mut [f32],
    a: &Mat<'_>,
    b: &Mat<'_>,
    accumulate: bool,
) -> Option<Option<(usize, usize, usize)>> {
    let ((m, k), (k2, n)) = (a.shape(), b.shape());
    if k != k2
        || dst.len() != m * n
        || a.data.len() != a.rows * a.cols
        || b.data.len() != b.rows * b.cols
    {
        return None;
    }
    if k == 0 && !accumulate {
        dst.fill(0.0);
    }
    Some((m > 0 && n > 0 && k > 0).then_some((m, k, n)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    /// The `c x r` transpose of a row-major `r x c` matrix.
    pub(crate) fn transpose(x: &[f32], r: usize, c: usize) -> Vec<f32> {
        let mut t = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                t[j * r + i] = x[i * c + j];
            }
        }
        t
    }

    #[test]
    fn all_transpose_combinations_match_naive() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let want = naive(&a, &b, m, k, n);
        let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
        for (ma, mb) in [
            (Mat::new(&a, m, k), Mat::new(&b, k, n)),
            (Mat::new(&at, k, m).t(), Mat::new(&b, k, n)),
            (Mat::new(&a, m, k), Mat::new(&bt, n, k).t()),
            (Mat::new(&at, k, m).t(), Mat::new(&bt, n, k).t()),
        ] {
            let mut c = vec![1.0; m * n];
            assert!(matmul(&mut c, ma, mb, false));
            for (x, y) in c.iter().zip(&want) {
                assert!((x - y).abs() < 1e-5);
            }
            assert!(matmul(&mut c, ma, mb, true));
            for (x, y) in c.iter().zip(&want) {
                assert!((x - 2.0 * y).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn shape_mismatch_is_refused() {
        let mut c = vec![0.0; 4];
        assert!(!matmul(
            &mut c,
            Mat::new(&[1.0; 6], 2, 3),
            Mat::new(&[1.0; 4], 2, 2),
            false
        ));
    }
}
