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

/// A matrix read through explicit strides: element `(r, c)` at `data[r *
/// rs + c * cs]` (a plane of an interleaved buffer, or a transpose).
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    /// The elements, from `(0, 0)` on.
    pub(crate) data: &'a [f32],
    /// Rows.
    pub(crate) rows: usize,
    /// Columns.
    pub(crate) cols: usize,
    /// Step between rows.
    pub(crate) rs: usize,
    /// Step between columns.
    pub(crate) cs: usize,
}

impl View<'_> {
    /// Whether every element lies inside `data` (an empty view always).
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `dst (m x n, rows ldd apart) = [dst +] a (m x k) * b (k x n)` on the
/// calling thread (for callers that split the work across threads
/// themselves). Returns false (and leaves `dst` untouched) when the shapes
/// disagree or an element would lie outside its slice.
#[must_use]
pub(crate) fn matmul_views(
    (dst, ldd): (&mut [f32], usize),
    a: View<'_>,
    b: View<'_>,
    accumulate: bool,
) -> bool {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let dst_fits = m == 0 || n == 0 || (n <= ldd && (m - 1) * ldd + n <= dst.len());
    if b.rows != k || !a.fits() || !b.fits() || !dst_fits {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        if !accumulate {
            dst.chunks_mut(ldd).take(m).for_each(|r| r[..n].fill(0.0));
        }
        return true;
    }
    let s = |v: usize| v as isize;
    // SAFETY: every element of a, b and dst was checked above to lie inside
    // its slice; dst does not alias a or b (a &mut and two & borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            s(ldd),
            accumulate,
            a.data.as_ptr(),
            s(a.cs),
            s(a.rs),
            b.data.as_ptr(),
            s(b.cs),
            s(b.rs),
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            Parallelism::None,
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
    fn strided_views_match_naive() {
        // a: plane 1 of a (5, 3 planes, 4) buffer; b: the transpose of a
        // (3, 4) row-major matrix; dst rows 7 apart.
        let (m, k, n) = (5, 4, 3);
        let buf: Vec<f32> = (0..m * 3 * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let a: Vec<f32> = (0..m * k)
            .map(|i| buf[(i / k) * 3 * k + k + i % k])
            .collect();
        let bt: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.21).cos()).collect();
        let b = transpose(&bt, n, k);
        let want = naive(&a, &b, m, k, n);
        let mut dst = vec![1.0f32; (m - 1) * 7 + n];
        let av = View {
            data: &buf[k..],
            rows: m,
            cols: k,
            rs: 3 * k,
            cs: 1,
        };
        let bv = View {
            data: &bt,
            rows: k,
            cols: n,
            rs: 1,
            cs: k,
        };
        assert!(matmul_views((&mut dst, 7), av, bv, false));
        for i in 0..m {
            for j in 0..n {
                assert!(
                    (dst[i * 7 + j] - want[i * n + j]).abs() < 1e-5,
                    "({i}, {j})"
                );
            }
            // The gaps between rows are left as they were.
            if i + 1 < m {
                assert_eq!(&dst[i * 7 + n..(i + 1) * 7], &[1.0; 4]);
            }
        }
        // Accumulating adds the product again.
        assert!(matmul_views((&mut dst, 7), av, bv, true));
        assert!((dst[7 + 1] - 2.0 * want[n + 1]).abs() < 1e-5);
        // A view reaching past its slice, or a dst too short, is refused.
        let long = View { rows: m + 1, ..av };
        assert!(!matmul_views((&mut dst, 7), long, bv, false));
        assert!(!matmul_views((&mut dst[..20], 7), av, bv, false));
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
