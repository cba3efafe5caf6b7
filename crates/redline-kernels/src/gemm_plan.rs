//! A linear layer's three GEMMs as cuBLASLt calls. cuBLASLt is column-major
//! and Redline's tensors are row-major; a row-major `(r, c)` matrix is a
//! column-major `(c, r)` one, so each product is planned on the transposes.
//! The epilogue (bias, ReLU) runs inside the forward GEMM.
//!
//! The plans are plain data, checked on the CPU against a column-major
//! reference GEMM that reads the operands as cuBLASLt does; the CUDA side
//! (`crate::cuda::linear`) only hands them to cuBLASLt.

use crate::error::{Error, Result};

/// What cuBLASLt does to the product before writing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// Nothing (`CUBLASLT_EPILOGUE_DEFAULT`).
    Default,
    /// Add a bias per output row of the column-major result (`..._BIAS`).
    Bias,
    /// ReLU (`..._RELU`).
    Relu,
    /// Add the bias, then ReLU (`..._RELU_BIAS`).
    ReluBias,
}

/// The epilogue for a layer with or without bias and ReLU.
pub fn epilogue(bias: bool, relu: bool) -> Epilogue {
    match (bias, relu) {
        (true, true) => Epilogue::ReluBias,
        (true, false) => Epilogue::Bias,
        (false, true) => Epilogue::Relu,
        (false, false) => Epilogue::Default,
    }
}

/// One column-major `C (m, n) = op(A) (m, k) · op(B) (k, n)`, as cuBLASLt's
/// `cublasLtMatmul` takes it: leading dimensions of the stored matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmPlan {
    /// `op(A) = A^T`.
    pub transa: bool,
    /// `op(B) = B^T`.
    pub transb: bool,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// Leading dimension of A as stored.
    pub lda: usize,
    /// Leading dimension of B as stored.
    pub ldb: usize,
    /// Leading dimension of C.
    pub ldc: usize,
    /// What happens to C before it is written.
    pub epilogue: Epilogue,
    /// Products in one strided-batched call (1: a plain GEMM): product `i`
    /// reads A at `i * stride_a`, B at `i * stride_b` and writes C at
    /// `i * stride_c` (elements).
    pub batch: usize,
    /// Elements between consecutive products' A.
    pub stride_a: usize,
    /// Elements between consecutive products' B.
    pub stride_b: usize,
    /// Elements between consecutive products' C.
    pub stride_c: usize,
}

impl GemmPlan {
    /// The fields of a plain (one-product) plan that the constructors do not
    /// set: one product, no strides.
    const ONE: GemmPlan = GemmPlan {
        transa: false,
        transb: false,
        m: 0,
        n: 0,
        k: 0,
        lda: 0,
        ldb: 0,
        ldc: 0,
        epilogue: Epilogue::Default,
        batch: 1,
        stride_a: 0,
        stride_b: 0,
        stride_c: 0,
    };

    /// Rows and columns of A as stored (column-major).
    pub fn a_dims(&self) -> (usize, usize) {
        if self.transa {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        }
    }

    /// Rows and columns of B as stored (column-major).
    pub fn b_dims(&self) -> (usize, usize) {
        if self.transb {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        }
    }
}

fn check(batch: usize, fan_in: usize, fan_out: usize) -> Result<()> {
    if batch == 0 || fan_in == 0 || fan_out == 0 {
        return Err(Error::Shape(format!(
            "linear on the GPU: batch {batch}, {fan_in} inputs and {fan_out} outputs must all \
             be above 0"
        )));
    }
    Ok(())
}

/// `y (B, out) = x (B, in) · W (out, in)^T + b`, ReLU when `relu`:
/// column-major `y^T (out, B) = W (out, in) · x^T (in, B)` with A = W (stored `(in, out)`,
/// transposed), B = x (stored `(in, B)`), the bias per row of `y^T`.
pub fn linear_forward(batch: usize, fan_in: usize, fan_out: usize, relu: bool) -> Result<GemmPlan> {
    check(batch, fan_in, fan_out)?;
    Ok(GemmPlan {
        transa: true,
        transb: false,
        m: fan_out,
        n: batch,
        k: fan_in,
        lda: fan_in,
        ldb: fan_in,
        ldc: fan_out,
        epilogue: epilogue(true, relu),
        ..GemmPlan::ONE
    })
}

/// `dW (out, in) = dz (B, out)^T · x (B, in)`: column-major
/// `dW^T (in, out) = x^T (in, B) · dz (B, out)` with A = x (stored
/// `(in, B)`), B = dz (stored `(out, B)`, transposed).
pub fn linear_weight_grad(batch: usize, fan_in: usize, fan_out: usize) -> Result<GemmPlan> {
    check(batch, fan_in, fan_out)?;
    Ok(GemmPlan {
        transa: false,
        transb: true,
        m: fan_in,
        n: fan_out,
        k: batch,
        lda: fan_in,
        ldb: fan_out,
        ldc: fan_in,
        epilogue: Epilogue::Default,
        ..GemmPlan::ONE
    })
}

/// Splits of the weight gradient's reduction over the batch
/// ([`linear_weight_grad_split`]) for a layer of `fan_in` inputs and `fan_out`
/// outputs at `batch`: 8, 4 or 2 where the batch divides into chunks of 64
/// rows or more and dW alone has few output tiles (at most 256 tiles of
/// 64x64 with the splits), else 1. cuBLASLt's own choice for a small dW over a
/// long batch is latency-bound: at batch 512 the MLP's weight-gradient GEMM
/// took 51.7 us (one kernel of 25 or fewer thread blocks on 132 SMs; H100,
/// bench/results/h100-2026-11-26/call3). The count depends on the shape
/// alone, so the sums' order, and their bits, are the same on every run.
pub fn weight_grad_splits(batch: usize, fan_in: usize, fan_out: usize) -> usize {
    let tiles = fan_in.div_ceil(64) * fan_out.div_ceil(64);
    [8, 4, 2]
        .into_iter()
        .find(|&s| batch.is_multiple_of(s) && batch / s >= 64 && tiles * s <= 256)
        .unwrap_or(1)
}

/// [`linear_weight_grad`] split into `splits` products over consecutive
/// chunks of `batch / splits` rows, in one strided-batched call: product `i`
/// is the chunk's `dW` into the `i`-th of `splits` `(out, in)` blocks, to be
/// added in order ([`weight_grad_splits`] picks the count).
pub fn linear_weight_grad_split(
    batch: usize,
    fan_in: usize,
    fan_out: usize,
    splits: usize,
) -> Result<GemmPlan> {
    let whole = linear_weight_grad(batch, fan_in, fan_out)?;
    if splits == 0 || !batch.is_multiple_of(splits) {
        return Err(Error::Shape(format!(
            "linear on the GPU: a batch of {batch} does not split into {splits} equal chunks"
        )));
    }
    let rows = batch / splits;
    Ok(GemmPlan {
        k: rows,
        batch: splits,
        stride_a: rows * fan_in,
        stride_b: rows * fan_out,
        stride_c: fan_in * fan_out,
        ..whole
    })
}

/// `dx (B, in) = dz (B, out) · W (out, in)`: column-major
/// `dx^T (in, B) = W^T (in, out) · dz^T (out, B)` with A = W (stored
/// `(in, out)`), B = dz (stored `(out, B)`).
pub fn linear_input_grad(batch: usize, fan_in: usize, fan_out: usize) -> Result<GemmPlan> {
    check(batch, fan_in, fan_out)?;
    Ok(GemmPlan {
        transa: false,
        transb: false,
        m: fan_in,
        n: batch,
        k: fan_out,
        lda: fan_in,
        ldb: fan_out,
        ldc: fan_in,
        epilogue: Epilogue::Default,
        ..GemmPlan::ONE
    })
}

#[cfg(test)]
mod tests {
    // Index loops read as the math they check.
    #![allow(clippy::needless_range_loop)]

    use super::*;

    /// cuBLASLt's product on column-major storage, with the plan's epilogue;
    /// a batched plan's products at their strides (C holds them all).
    fn run(p: &GemmPlan, a: &[f32], b: &[f32], bias: &[f32]) -> Vec<f32> {
        let mut c = vec![0f32; p.stride_c * (p.batch - 1) + p.ldc * p.n];
        for q in 0..p.batch {
            let (a, b) = (&a[q * p.stride_a..], &b[q * p.stride_b..]);
            let at = |i: usize, l: usize| {
                if p.transa {
                    a[l + i * p.lda]
                } else {
                    a[i + l * p.lda]
                }
            };
            let bt = |l: usize, j: usize| {
                if p.transb {
                    b[j + l * p.ldb]
                } else {
                    b[l + j * p.ldb]
                }
            };
            for j in 0..p.n {
                for i in 0..p.m {
                    let mut s: f32 = (0..p.k).map(|l| at(i, l) * bt(l, j)).sum();
                    if matches!(p.epilogue, Epilogue::Bias | Epilogue::ReluBias) {
                        s += bias[i];
                    }
                    if matches!(p.epilogue, Epilogue::Relu | Epilogue::ReluBias) {
                        s = s.max(0.0);
                    }
                    c[q * p.stride_c + i + j * p.ldc] = s;
                }
            }
        }
        c
    }

    fn vals(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32) * 0.37 + seed).sin()).collect()
    }

    /// Row-major `(r, c)` element `(i, j)`.
    fn rm(v: &[f32], c: usize, i: usize, j: usize) -> f32 {
        v[i * c + j]
    }

    const B: usize = 5;
    const IN: usize = 7;
    const OUT: usize = 3;

    #[test]
    fn forward_is_x_times_w_transposed_plus_bias_then_relu() {
        let (x, w, bias) = (vals(B * IN, 0.1), vals(OUT * IN, 1.3), vals(OUT, 2.0));
        for relu in [false, true] {
            let p = linear_forward(B, IN, OUT, relu).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(p.a_dims(), (IN, OUT), "W as stored");
            assert_eq!(p.b_dims(), (IN, B), "x as stored");
            let y = run(&p, &w, &x, &bias);
            for i in 0..B {
                for o in 0..OUT {
                    let mut want: f32 = (0..IN).map(|l| rm(&x, IN, i, l) * rm(&w, IN, o, l)).sum();
                    want += bias[o];
                    if relu {
                        want = want.max(0.0);
                    }
                    assert!((rm(&y, OUT, i, o) - want).abs() < 1e-5, "y[{i}][{o}]");
                }
            }
        }
    }

    #[test]
    fn weight_gradient_is_dz_transposed_times_x() {
        let (x, dz) = (vals(B * IN, 0.4), vals(B * OUT, 0.9));
        let p = linear_weight_grad(B, IN, OUT).unwrap_or_else(|e| panic!("{e}"));
        let dw = run(&p, &x, &dz, &[]);
        for o in 0..OUT {
            for l in 0..IN {
                let want: f32 = (0..B).map(|i| rm(&dz, OUT, i, o) * rm(&x, IN, i, l)).sum();
                assert!((rm(&dw, IN, o, l) - want).abs() < 1e-5, "dW[{o}][{l}]");
            }
        }
    }

    #[test]
    fn a_split_weight_gradient_adds_up_to_the_whole() {
        const BATCH: usize = 12;
        let (x, dz) = (vals(BATCH * IN, 0.4), vals(BATCH * OUT, 0.9));
        let whole = linear_weight_grad(BATCH, IN, OUT).unwrap_or_else(|e| panic!("{e}"));
        let want = run(&whole, &x, &dz, &[]);
        for splits in [1, 2, 3, 4, 6, 12] {
            let p =
                linear_weight_grad_split(BATCH, IN, OUT, splits).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!((p.batch, p.k), (splits, BATCH / splits));
            let parts = run(&p, &x, &dz, &[]);
            assert_eq!(parts.len(), splits * IN * OUT, "{splits} blocks of dW");
            for e in 0..IN * OUT {
                let sum: f32 = (0..splits).map(|q| parts[q * IN * OUT + e]).sum();
                assert!((sum - want[e]).abs() < 1e-5, "{splits} splits: dW[{e}]");
            }
            // Each block is its own chunk of rows: the first alone is not the whole.
            if splits > 1 {
                assert!((0..IN * OUT).any(|e| (parts[e] - want[e]).abs() > 1e-3));
            }
        }
        for bad in [0, 5, 13] {
            let e = linear_weight_grad_split(BATCH, IN, OUT, bad).map_err(|e| e.to_string());
            assert!(e.is_err_and(|e| e.contains("equal chunks")), "{bad}");
        }
    }

    #[test]
    fn the_weight_gradient_splits_where_the_batch_is_long_and_dw_small() {
        // The MLP at batch 512: fc1 (26 tiles) and fc2 (2) into chunks of 64 rows.
        assert_eq!(weight_grad_splits(512, 784, 128), 8);
        assert_eq!(weight_grad_splits(512, 128, 10), 8);
        // The CNN's fc1 (98 tiles) only in two; batch 384 in chunks of 96.
        assert_eq!(weight_grad_splits(512, 3136, 128), 2);
        assert_eq!(weight_grad_splits(384, 784, 128), 4);
        // The default job (batch 64), chunks under 64 rows, a large dW: whole.
        assert_eq!(weight_grad_splits(64, 784, 128), 1);
        assert_eq!(weight_grad_splits(100, 784, 128), 1);
        assert_eq!(weight_grad_splits(4096, 4096, 4096), 1);
        assert_eq!(weight_grad_splits(513, 784, 128), 1);
    }

    #[test]
    fn input_gradient_is_dz_times_w() {
        let (w, dz) = (vals(OUT * IN, 0.2), vals(B * OUT, 1.7));
        let p = linear_input_grad(B, IN, OUT).unwrap_or_else(|e| panic!("{e}"));
        let dx = run(&p, &w, &dz, &[]);
        for i in 0..B {
            for l in 0..IN {
                let want: f32 = (0..OUT)
                    .map(|o| rm(&dz, OUT, i, o) * rm(&w, IN, o, l))
                    .sum();
                assert!((rm(&dx, IN, i, l) - want).abs() < 1e-5, "dx[{i}][{l}]");
            }
        }
    }

    #[test]
    fn epilogues_and_empty_shapes() {
        assert_eq!(epilogue(true, true), Epilogue::ReluBias);
        assert_eq!(epilogue(true, false), Epilogue::Bias);
        assert_eq!(epilogue(false, true), Epilogue::Relu);
        assert_eq!(epilogue(false, false), Epilogue::Default);
        assert_eq!(
            linear_forward(4, 3, 2, false).map(|p| p.epilogue).ok(),
            Some(Epilogue::Bias)
        );
        for bad in [(0, 3, 2), (4, 0, 2), (4, 3, 0)] {
            let e = linear_forward(bad.0, bad.1, bad.2, true)
                .err()
                .map(|e| e.to_string());
            assert!(e.is_some_and(|e| e.contains("must all be above 0")));
            assert!(linear_weight_grad(bad.0, bad.1, bad.2).is_err());
            assert!(linear_input_grad(bad.0, bad.1, bad.2).is_err());
        }
    }
}
