#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use candle_core::DType;

use super::*;
use crate::conv_reference::{close, forward_operands, vals};

/// Geometries the Winograd kernels can take: odd and even maps (a last
/// row and column of tiles cut short), non-square ones, padding 0, 1 and
/// 2, more output than input channels and the reverse, several panels
/// and a last product tile of fewer than [`PX`] tiles (3 samples of 16
/// tiles).
fn shapes() -> Vec<Geom> {
    vec![
        Geom::sized(3, (64, 64), (7, 7), (3, 3, 1), 1),
        Geom::sized(2, (64, 128), (6, 5), (3, 3, 1), 1),
        Geom::sized(2, (128, 64), (9, 8), (3, 3, 0), 1),
        Geom::sized(2, (64, 64), (5, 5), (3, 3, 2), 1),
        Geom::sized(1, (64, 64), (14, 14), (3, 3, 1), 1),
    ]
}

/// The Winograd forward equals the im2col + GEMM forward to rounding.
#[test]
fn forward_matches_the_im2col_forward() -> candle_core::Result<()> {
    if !simd::available() {
        eprintln!("no AVX-512 here: the Winograd kernels are not run");
        return Ok(());
    }
    for g in shapes() {
        assert!(g.winograd_runs(), "{g:?}");
        let (x, w, b) = forward_operands(&g);
        let stored = g.permute_taps(&w, true);
        let mut got = vec![f32::NAN; g.b * g.out_len()];
        g.forward_winograd("test", &g.wino_weights_stored(&stored), &b, &x, &mut got)?;
        close(
            &format!("{g:?} forward"),
            &got,
            &g.reference_forward(&w, &b, &x)?,
        );
    }
    Ok(())
}

/// The Winograd weight gradient and bias gradient equal `dy * cols^T` and
/// the row sums of dy, summed over the samples, dW as stored.
#[test]
fn weight_grad_matches_the_im2col_product() -> candle_core::Result<()> {
    for g in shapes() {
        let (x, dy) = (vals(g.b * g.in_len(), 0.29), vals(g.b * g.out_len(), 0.13));
        let mut got = vec![f32::NAN; g.cout * g.k() + g.cout];
        g.weight_grad_winograd("test", &x, &dy, &mut got)?;
        let mut want = g.reference_weight_grad(&x, &dy)?;
        g.unpermute_weight_grad(&mut want);
        close(&format!("{g:?} dW and db"), &got, &want);
    }
    Ok(())
}

/// The input gradient as the transposed convolution's Winograd forward,
/// its weights transformed from the stored ones, equals `w^T * dy`
/// followed by col2im.
#[test]
fn input_grad_matches_col2im() -> candle_core::Result<()> {
    if !simd::available() {
        eprintln!("no AVX-512 here: the Winograd kernels are not run");
        return Ok(());
    }
    for g in shapes() {
        let t = g.transposed().filter(Geom::winograd_runs).unwrap();
        let (w, dy) = (vals(g.cout * g.k(), 0.11), vals(g.b * g.out_len(), 0.13));
        let stored = g.permute_taps(&w, true);
        let mut got = vec![f32::NAN; g.b * g.in_len()];
        let zeros = vec![0f32; t.cout];
        t.forward_winograd(
            "test",
            &g.wino_weights_flipped(&t, &stored),
            &zeros,
            &dy,
            &mut got,
        )?;
        let want = g.reference_input_grad(&w, &dy)?;
        close(&format!("{g:?} dx"), &got, &want);
    }
    Ok(())
}

/// No sum depends on the number of threads: the forward and the weight
/// gradient give the same bits on one thread and on three.
#[test]
fn the_thread_count_changes_no_bit() -> candle_core::Result<()> {
    if !simd::available() {
        return Ok(());
    }
    let g = Geom::sized(5, (64, 64), (7, 7), (3, 3, 1), 1);
    let (x, w, b) = forward_operands(&g);
    let u = g.wino_weights_stored(&g.permute_taps(&w, true));
    let dy = vals(g.b * g.out_len(), 0.13);
    let run = |threads: usize| -> candle_core::Result<(Vec<f32>, Vec<f32>)> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut y = vec![0f32; g.b * g.out_len()];
            g.forward_winograd("test", &u, &b, &x, &mut y)?;
            let mut dwb = vec![0f32; g.cout * g.k() + g.cout];
            g.weight_grad_winograd("test", &x, &dy, &mut dwb)?;
            Ok((y, dwb))
        })
    };
    let (one, three) = (run(1)?, run(3)?);
    assert!(one
        .0
        .iter()
        .zip(&three.0)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(one
        .1
        .iter()
        .zip(&three.1)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    Ok(())
}

/// Operands of the wrong length are refused with the op's name, not read
/// past their end.
#[test]
fn wrong_lengths_are_refused() {
    let g = Geom::sized(2, (16, 16), (7, 7), (3, 3, 1), 1);
    let u = vec![0f32; 16 * XI * 16];
    let (x, b) = (vec![0f32; g.b * g.in_len() - 1], vec![0f32; 16]);
    let mut out = vec![0f32; g.b * g.out_len()];
    let err = g
        .forward_winograd("conv-test", &u, &b, &x, &mut out)
        .unwrap_err();
    assert!(err.to_string().contains("conv-test: input"), "{err}");
    let x = vec![0f32; g.b * g.in_len()];
    let err = g
        .forward_winograd("conv-test", &u[1..], &b, &x, &mut out)
        .unwrap_err();
    assert!(err.to_string().contains("Winograd weights"), "{err}");
}

/// ResNet's stride-1 3x3 convolutions on 7x7 to 56x56 maps take the
/// Winograd forward, and on 7x7 to 28x28 maps its weight gradient;
/// 2x2 maps, strides, other kernels, thin layers and bf16 products do
/// not.
#[test]
fn the_rules_choose_resnets_small_maps() {
    if !simd::available() {
        assert!(!Geom::sized(32, (512, 512), (7, 7), (3, 3, 1), 1).winograd());
        return;
    }
    let resnet = |c: usize, side: usize| Geom::sized(32, (c, c), (side, side), (3, 3, 1), 1);
    for (c, side) in [(512, 7), (256, 14), (128, 28)] {
        assert!(resnet(c, side).winograd_weight_grad(), "{c} at {side}");
    }
    assert!(resnet(64, 56).winograd() && !resnet(64, 56).winograd_weight_grad());
    assert!(!resnet(512, 2).winograd());
    let strided = Geom::sized(32, (256, 256), (14, 14), (3, 3, 1), 2);
    let five = Geom::sized(32, (256, 256), (14, 14), (5, 5, 2), 1);
    let thin = Geom::sized(32, (16, 256), (14, 14), (3, 3, 1), 1);
    let bf16 = Geom {
        gemm: DType::BF16,
        ..resnet(256, 14)
    };
    for g in [strided, five, thin, bf16] {
        assert!(!g.winograd(), "{g:?}");
    }
}
