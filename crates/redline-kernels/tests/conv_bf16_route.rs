//! The 16-bit CPU convolution's bf16 route (`conv2d_strided_in` with BF16
//! products: the bf16 pixel-major kernels where the channels allow, else
//! im2col and the native bf16 GEMM, operands rounded as they are packed)
//! against the fp32 convolution of the rounded operands, forward and
//! backward, on each shape class ResNet's bf16 steps run through it: a 3x3
//! stride-1 convolution (input gradient as a transposed convolution), 3x3
//! and 1x1 stride-2 downsampling (col2im), and the 7x7 stride-2 stem, on
//! channel counts that take each path.
//! Only the order of the f32 sums differs, so the two agree to a few f32
//! roundings of the largest output; an operand left unrounded moves them by
//! about bf16's step (2^-9 relative), a hundred times more.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use candle_core::{DType, Device, Tensor, Var};
use redline_kernels::{conv2d_strided, conv2d_strided_in};

/// `sin(a i + b) * scale`, shaped, f32 (not bf16 values).
fn wave(dims: &[usize], (a, b): (f32, f32), scale: f32) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (a * i as f32 + b).sin() * scale).collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

fn bf16(t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// `got` within `tol` of the largest `want` everywhere.
fn agree(what: &str, got: &Tensor, want: &Tensor, tol: f32) {
    let (g, w) = (values(got), values(want));
    assert_eq!(g.len(), w.len(), "{what}: lengths");
    let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (i, (a, e)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - e).abs() <= tol * scale,
            "{what} [{i}]: {a} vs {e} (largest {scale})"
        );
    }
}

/// Output, dx, dW and db of `f` at `x`, `w`, `b`, the loss `sum(y * g)`.
fn run(
    f: impl Fn(&Tensor, &Tensor, &Tensor) -> redline_kernels::Result<Tensor>,
    (x, w, b): (&Tensor, &Tensor, &Tensor),
    g: &Tensor,
) -> [Tensor; 4] {
    let (xv, wv, bv) = (
        Var::from_tensor(x).unwrap(),
        Var::from_tensor(w).unwrap(),
        Var::from_tensor(b).unwrap(),
    );
    let y = f(xv.as_tensor(), wv.as_tensor(), bv.as_tensor()).unwrap();
    let grads = (&y * g).unwrap().sum_all().unwrap().backward().unwrap();
    let grad = |v: &Var| grads.get(v.as_tensor()).unwrap().clone();
    [y, grad(&xv), grad(&wv), grad(&bv)]
}

#[test]
fn bf16_products_are_the_fp32_convolution_of_rounded_operands() {
    // (batch, cin, cout, side, kernel, stride, padding)
    let classes = [
        (2, 16, 16, 12, 3, 1, 1),
        (2, 16, 32, 12, 3, 2, 1),
        (3, 16, 32, 10, 1, 2, 0),
        (2, 3, 16, 20, 7, 2, 3),
        // The pixel-major bf16 kernels (64-channel multiples): forward,
        // and stride 1's input gradient as the transposed convolution.
        (2, 64, 64, 9, 3, 1, 1),
        (2, 32, 128, 9, 3, 2, 1),
        // A 6x6 map: the pixel-major forward, the whole-batch GEMMs
        // backward.
        (3, 64, 64, 6, 3, 1, 1),
    ];
    for (i, (n, cin, cout, side, k, stride, pad)) in classes.into_iter().enumerate() {
        let s = i as f32;
        let x = wave(&[n, cin, side, side], (0.37, s), 1.0);
        let w = wave(&[cout, cin, k, k], (0.11, s + 1.0), 0.2);
        let b = wave(&[cout], (0.7, s + 2.0), 0.5);
        let out = (side + 2 * pad - k) / stride + 1;
        // The gradient reaching a 16-bit convolution is 16-bit already.
        let g = bf16(&wave(&[n, cout, out, out], (0.23, s + 3.0), 1.0));
        let what = format!("{k}x{k}/{stride}, {cin}->{cout}, {side} px");

        // Operands that are bf16 values already, as the casts before it
        // leave them: every output and gradient as the fp32 convolution's.
        let (xr, wr) = (bf16(&x), bf16(&w));
        let got = run(
            |x, w, b| conv2d_strided_in(x, w, b, (pad, stride), DType::BF16),
            (&xr, &wr, &b),
            &g,
        );
        let want = run(
            |x, w, b| conv2d_strided(x, w, b, pad, stride),
            (&xr, &wr, &b),
            &g,
        );
        for (name, (a, e)) in ["y", "dx", "dW", "db"].iter().zip(got.iter().zip(&want)) {
            agree(&format!("{what} {name}"), a, e, 2e-5);
        }

        // fp32 operands are rounded as they are packed.
        let y = conv2d_strided_in(&x, &w, &b, (pad, stride), DType::BF16).unwrap();
        agree(&format!("{what} y, fp32 operands"), &y, &want[0], 2e-5);
    }
}

/// A stem's odd input channels cannot be paired: its bf16 forward runs the
/// fp32 direct kernels on the operands rounded to bf16 (exact products),
/// so it is the fp32 convolution of the rounded operands bit for bit, and
/// its backward stays within the sums' rounding of it.
#[test]
fn odd_channel_stems_are_the_fp32_direct_forward_of_rounded_operands() {
    let (x, w, b) = (
        wave(&[2, 3, 64, 64], (0.37, 0.0), 1.0),
        wave(&[64, 3, 7, 7], (0.11, 1.0), 0.2),
        wave(&[64], (0.7, 2.0), 0.5),
    );
    let (xr, wr) = (bf16(&x), bf16(&w));
    let y = conv2d_strided_in(&x, &w, &b, (3, 2), DType::BF16).unwrap();
    let want = conv2d_strided(&xr, &wr, &b, 3, 2).unwrap();
    let (got, exact) = (values(&y), values(&want));
    let first = got
        .iter()
        .zip(&exact)
        .position(|(a, e)| a.to_bits() != e.to_bits());
    assert_eq!(first, None, "stem forward differs at this index");
    let g = bf16(&wave(&[2, 64, 32, 32], (0.23, 3.0), 1.0));
    let got = run(
        |x, w, b| conv2d_strided_in(x, w, b, (3, 2), DType::BF16),
        (&xr, &wr, &b),
        &g,
    );
    let want = run(|x, w, b| conv2d_strided(x, w, b, 3, 2), (&xr, &wr, &b), &g);
    for (name, (a, e)) in ["y", "dx", "dW", "db"].iter().zip(got.iter().zip(&want)) {
        agree(&format!("stem {name}"), a, e, 2e-5);
    }
}
