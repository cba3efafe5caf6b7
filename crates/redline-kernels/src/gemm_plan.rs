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
}

impl GemmPlan {
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
    })
}

#[cfg(test)]
mod tests {
    // Index loops read as the math they check.
    #![allow(clippy::needless_range_loop)]

    use super::*;

    /// cuBLASLt's product on column-major storage, with the plan's epilogue.
    fn run(p: &GemmPlan, a: &[f32], b: &[f32], bias: &[f32]) -> Vec<f32> {
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
        let mut c = vec![0f32; p.ldc * p.n];
        for j in 0..p.n {
            for i in 0..p.m {
                let mut s: f32 = (0..p.k).map(|l| at(i, l) * bt(l, j)).sum();
                if matches!(p.epilogue, Epilogue::Bias | Epilogue::ReluBias) {
                    s += bias[i];
                }
                if matches!(p.epilogue, Epilogue::Relu | Epilogue::ReluBias) {
                    s = s.max(0.0);
                }
                c[i + j * p.ldc] = s;
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
