#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::grad::{outputs_and_grads, weighted_grads};
use candle_core::{Device, Var};

/// Deterministic values: a per-channel offset and scale (so that the
/// statistics differ by channel) times a sine.
fn data(dims: (usize, usize, usize, usize), seed: f32) -> Tensor {
    let (b, c, h, w) = dims;
    let v: Vec<f32> = (0..b * c * h * w)
        .map(|i| {
            let ch = (i / (h * w)) % c;
            (i as f32 * 0.731 + seed).sin() * (1.0 + ch as f32) + ch as f32 * 3.0 - 2.0
        })
        .collect();
    Tensor::from_vec(v, (b, c, h, w), &Device::Cpu).unwrap()
}

fn channel_data(c: usize, seed: f32) -> Tensor {
    let v: Vec<f32> = (0..c).map(|i| 0.5 + (i as f32 + seed).cos()).collect();
    Tensor::from_vec(v, c, &Device::Cpu).unwrap()
}

/// Each value rounded to bf16 (to nearest even), kept in f32.
fn bf16_rounded(v: Vec<f32>) -> Vec<f32> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// The generic formula in f64 (candle's autograd), then a ReLU when `relu`:
/// `[y, dx, dW, db, mean, var]`.
fn reference(
    x: &Tensor,
    (w, b): (&Tensor, &Tensor),
    up: &Tensor,
    eps: f64,
    relu: bool,
) -> [Vec<f32>; 6] {
    let f64v = |t: &Tensor| Var::from_tensor(&t.to_dtype(DType::F64).unwrap()).unwrap();
    let (xv, wv, bv) = (f64v(x), f64v(w), f64v(b));
    let mut out =
        batch_norm2d_train_generic(xv.as_tensor(), wv.as_tensor(), bv.as_tensor(), eps).unwrap();
    if relu {
        out.y = out.y.relu().unwrap();
    }
    let up = up.to_dtype(DType::F64).unwrap();
    let g = (&out.y * &up)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let get = |v: &Var| flat(g.get(v.as_tensor()).unwrap());
    [
        flat(&out.y),
        get(&xv),
        get(&wv),
        get(&bv),
        flat(&out.mean),
        flat(&out.var),
    ]
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}[{i}]: fused {g}, f64 reference {w} (scale {scale})"
        );
    }
}

#[test]
fn fused_forward_backward_and_statistics_match_the_f64_formula() {
    // Planes of 1 (ResNet's last stage at small inputs), 7x7 (tails of the
    // eight-lane sums), 16x16 (whole lanes), one sample and several; alone
    // and with the fused ReLU (a good share of the outputs stopped). Maps
    // of 64 values and fewer go by blocks of channels (`blocked.rs`): 300
    // channels of 2x2 make several blocks, the last one shorter; 9x9 goes
    // channel by channel.
    let shapes = [
        (4, 3, 1, 1),
        (2, 5, 7, 7),
        (3, 2, 16, 16),
        (1, 4, 3, 5),
        (2, 300, 2, 2),
        (2, 3, 9, 9),
    ];
    for relu in [false, true] {
        for (i, dims) in shapes.into_iter().enumerate() {
            let seed = i as f32;
            let x = data(dims, seed);
            let w = channel_data(dims.1, seed);
            let b = channel_data(dims.1, seed + 9.0).affine(1.0, -0.5).unwrap();
            let up = data(dims, seed + 4.0);
            let eps = 1e-5;
            let xv = Var::from_tensor(&x).unwrap();
            let wp = Param::new(Var::from_tensor(&w).unwrap());
            let bp = Param::new(Var::from_tensor(&b).unwrap());
            let out = batch_norm2d_train(xv.as_tensor(), &wp, &bp, eps, relu).unwrap();
            let [y, dx, dw, db] = outputs_and_grads(&out.y, &up, &xv, &wp, &bp).unwrap();
            let want = reference(&x, (&w, &b), &up, eps, relu);
            let what = format!("{dims:?} relu {relu}");
            if relu && y.len() > 8 {
                let zeros = y.iter().filter(|v| **v == 0.0).count();
                assert!(
                    zeros > y.len() / 8 && zeros < y.len() * 7 / 8,
                    "{what}: {zeros} zeros"
                );
            }
            close(&format!("{what} y"), &y, &want[0], 1e-5);
            close(&format!("{what} dx"), &dx, &want[1], 1e-4);
            close(&format!("{what} dW"), &dw, &want[2], 1e-5);
            close(&format!("{what} db"), &db, &want[3], 1e-5);
            close(&format!("{what} mean"), &flat(&out.mean), &want[4], 1e-6);
            close(&format!("{what} var"), &flat(&out.var), &want[5], 1e-6);
        }
    }
}

#[test]
fn an_untracked_input_gets_no_gradient_but_the_parameters_do() {
    let dims = (2, 3, 4, 4);
    let x = data(dims, 1.0);
    let wp = Param::new(Var::from_tensor(&channel_data(3, 0.0)).unwrap());
    let bp = Param::new(Var::from_tensor(&channel_data(3, 1.0)).unwrap());
    let out = batch_norm2d_train(&x, &wp, &bp, 1e-5, false).unwrap();
    let g = (&out.y * data(dims, 2.0))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert!(g.get(&x).is_none());
    let dw = wp.grad().to_tensor(wp.as_tensor()).unwrap().unwrap();
    assert_eq!(dw.dims(), [3]);
    assert!(flat(&dw).iter().any(|v| *v != 0.0));
}

#[test]
fn a_nan_input_spreads_to_its_channel_only_and_passes_the_relu() {
    let dims = (2, 3, 2, 2);
    let mut v = flat(&data(dims, 0.0));
    v[4] = f32::NAN; // sample 0, channel 1
    let x = Tensor::from_vec(v, dims, &Device::Cpu).unwrap();
    let wp = Param::new(Var::from_tensor(&channel_data(3, 0.0)).unwrap());
    let bp = Param::new(Var::from_tensor(&channel_data(3, 1.0)).unwrap());
    for relu in [false, true] {
        let out = batch_norm2d_train(&x, &wp, &bp, 1e-5, relu).unwrap();
        let y = flat(&out.y);
        for (i, v) in y.iter().enumerate() {
            assert_eq!(v.is_nan(), (i / 4) % 3 == 1, "relu {relu}: y[{i}] = {v}");
        }
    }
}

#[test]
fn mismatched_parameters_are_refused_with_their_shapes() {
    let x = data((2, 3, 2, 2), 0.0);
    let wp = Param::new(Var::from_tensor(&channel_data(4, 0.0)).unwrap());
    let bp = Param::new(Var::from_tensor(&channel_data(4, 1.0)).unwrap());
    let err = batch_norm2d_train(&x, &wp, &bp, 1e-5, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("3 channels") && err.contains("[4]"), "{err}");
}

/// bf16 tensors (`bf16-true`) take the fused kernel on bf16 storage
/// (`bf16.rs`): the output and every gradient are the f32 kernel's on the
/// widened values, rounded once to bf16, bit for bit (candle's bf16 ops,
/// the path before the casts, round each intermediate and differ), and
/// within bf16's rounding of the f64 formula. Planes of 1, 7x7 (tails of
/// the vectors) and 16x16, and one sample and several; several blocks of
/// channels (300 of 2x2) and a 9x9 map on the channel-by-channel path.
#[test]
fn bf16_tensors_take_the_f32_kernels_arithmetic() {
    let shapes = [
        (2, 3, 4, 5),
        (4, 3, 1, 1),
        (3, 2, 7, 7),
        (2, 4, 16, 16),
        (2, 300, 2, 2),
        (2, 3, 9, 9),
    ];
    for (i, dims) in shapes.into_iter().enumerate() {
        let seed = i as f32 * 0.7;
        let bf = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
        let (x16, w16, b16) = (
            bf(data(dims, 0.3 + seed)),
            bf(channel_data(dims.1, 0.1 + seed)),
            bf(channel_data(dims.1, 0.9 + seed)),
        );
        let up = bf(data(dims, 1.7 + seed));
        for relu in [false, true] {
            let what = format!("{dims:?} relu {relu}");
            // The 16-bit route: dx through candle, dW and db through the buffers.
            let xv = Var::from_tensor(&x16).unwrap();
            let (w, b) = (
                Param::new(Var::from_tensor(&w16).unwrap()),
                Param::new(Var::from_tensor(&b16).unwrap()),
            );
            let out = batch_norm2d_train(xv.as_tensor(), &w, &b, 1e-5, relu).unwrap();
            assert_eq!(out.y.dtype(), DType::BF16);
            let mut g = weighted_grads(&out.y, &up).unwrap();
            let dx = g.get(xv.as_tensor()).unwrap();
            assert_eq!(dx.dtype(), DType::BF16, "{what}");
            let dx = flat(dx);
            w.absorb(&mut g).unwrap();
            b.absorb(&mut g).unwrap();
            let grad = |p: &Param| p.grad().to_tensor(p.as_tensor()).unwrap().unwrap();
            assert_eq!(grad(&w).dtype(), DType::BF16, "{what}");
            let got = [flat(&out.y), dx, flat(&grad(&w)), flat(&grad(&b))];
            // The f32 kernel on the widened values, each result rounded to bf16.
            let f32v = |t: &Tensor| Var::from_tensor(&t.to_dtype(DType::F32).unwrap()).unwrap();
            let xf = f32v(&x16);
            let (wf, bf32) = (Param::new(f32v(&w16)), Param::new(f32v(&b16)));
            let outf = batch_norm2d_train(xf.as_tensor(), &wf, &bf32, 1e-5, relu).unwrap();
            let upf = up.to_dtype(DType::F32).unwrap();
            let [y, dx, dw, db] = outputs_and_grads(&outf.y, &upf, &xf, &wf, &bf32).unwrap();
            let want = [
                bf16_rounded(y),
                bf16_rounded(dx),
                bf16_rounded(dw),
                bf16_rounded(db),
            ];
            for (name, (g, w)) in ["y", "dx", "dW", "db"].iter().zip(got.iter().zip(&want)) {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(bits(g) == bits(w), "{what}: {name} differs");
            }
            let f64ref = reference(&x16, (&w16, &b16), &up, 1e-5, relu);
            for (i, name) in ["y", "dx", "dW", "db"].iter().enumerate() {
                close(&format!("{what} {name}"), &got[i], &f64ref[i], 1e-2);
            }
            assert_eq!(flat(&out.mean), flat(&outf.mean), "{what}");
            assert_eq!(flat(&out.var), flat(&outf.var), "{what}");
        }
    }
}

/// Under bf16 an untracked input gets no gradient while the parameters do,
/// and a NaN spreads to its own channel only, passing the ReLU.
#[test]
fn bf16_untracked_inputs_and_nans() {
    let dims = (2, 3, 2, 2);
    let mut v = flat(&data(dims, 0.0));
    v[4] = f32::NAN; // sample 0, channel 1
    let x = Tensor::from_vec(v, dims, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let param = |seed| {
        let t = channel_data(3, seed).to_dtype(DType::BF16).unwrap();
        Param::new(Var::from_tensor(&t).unwrap())
    };
    let (wp, bp) = (param(0.0), param(1.0));
    for relu in [false, true] {
        let out = batch_norm2d_train(&x, &wp, &bp, 1e-5, relu).unwrap();
        let y = flat(&out.y);
        for (i, v) in y.iter().enumerate() {
            assert_eq!(v.is_nan(), (i / 4) % 3 == 1, "relu {relu}: y[{i}] = {v}");
        }
        let up = data(dims, 2.0).to_dtype(DType::BF16).unwrap();
        let g = weighted_grads(&out.y, &up).unwrap();
        assert!(g.get(&x).is_none());
        let db = flat(&bp.grad().to_tensor(bp.as_tensor()).unwrap().unwrap());
        assert!(db[0].is_finite() && db[0] != 0.0, "relu {relu}: {db:?}");
        wp.grad().clear();
        bp.grad().clear();
    }
}

/// A bf16 input under f32 parameters (`bf16-mixed`) is normalised as if
/// cast to f32 and its output stored in bf16 (PyTorch's CPU autocast): dW
/// and db are the f32 kernel's on the widened input and output gradient
/// bit for bit, and y and dx its y and dx rounded to bf16, in bf16.
#[test]
fn bf16_input_under_f32_parameters_is_the_f32_kernel_on_the_widened_input() {
    for (i, dims) in [
        (2, 3, 4, 5),
        (3, 2, 7, 7),
        (4, 3, 1, 1),
        (2, 300, 2, 2),
        (2, 3, 9, 9),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = i as f32 * 0.3;
        let x16 = data(dims, 0.5 + seed).to_dtype(DType::BF16).unwrap();
        let up = data(dims, 2.5 + seed).to_dtype(DType::BF16).unwrap();
        for relu in [false, true] {
            let what = format!("{dims:?} relu {relu}");
            let params = || {
                (
                    Param::new(Var::from_tensor(&channel_data(dims.1, seed)).unwrap()),
                    Param::new(Var::from_tensor(&channel_data(dims.1, seed + 2.0)).unwrap()),
                )
            };
            let (w, b) = params();
            let xv = Var::from_tensor(&x16).unwrap();
            let out = batch_norm2d_train(xv.as_tensor(), &w, &b, 1e-5, relu).unwrap();
            assert_eq!(out.y.dtype(), DType::BF16, "{what}");
            let [y, dx, dw, db] = outputs_and_grads(&out.y, &up, &xv, &w, &b).unwrap();
            let dx_t = weighted_grads(&out.y, &up).unwrap();
            assert_eq!(dx_t.get(xv.as_tensor()).unwrap().dtype(), DType::BF16);

            let (wf, bf) = params();
            let xf = Var::from_tensor(&x16.to_dtype(DType::F32).unwrap()).unwrap();
            let outf = batch_norm2d_train(xf.as_tensor(), &wf, &bf, 1e-5, relu).unwrap();
            let upf = up.to_dtype(DType::F32).unwrap();
            let [yf, dxf, dwf, dbf] = outputs_and_grads(&outf.y, &upf, &xf, &wf, &bf).unwrap();
            let (yf, dxf) = (bf16_rounded(yf), bf16_rounded(dxf));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (name, got, want) in [
                ("y", &y, &yf),
                ("dx", &dx, &dxf),
                ("dW", &dw, &dwf),
                ("db", &db, &dbf),
            ] {
                assert!(bits(got) == bits(want), "{what}: {name} differs");
            }
        }
    }
}
