#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use candle_core::{Device, Var};

/// `qkv (B, T, 3C)` of values in [-1, 1).
fn qkv(b: usize, t: usize, c: usize, seed: u64) -> Var {
    let n = b * t * 3 * c;
    let v: Vec<f32> = (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 500.0) - 1.0)
        .collect();
    Var::from_tensor(&Tensor::from_vec(v, (b, t, 3 * c), &Device::Cpu).unwrap()).unwrap()
}

/// What the model did before: the heads split with candle's ops, the
/// fused kernel, the heads joined.
fn split_path(qkv: &Tensor, heads: usize, drop: Option<DropDraw>) -> Tensor {
    let (b, t, c3) = qkv.dims3().unwrap();
    let (c, d) = (c3 / 3, c3 / 3 / heads);
    let part = |i: usize| {
        qkv.narrow(2, i * c, c)
            .unwrap()
            .reshape((b, t, heads, d))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
    };
    let y = causal_attention_dropout(&part(0), &part(1), &part(2), drop).unwrap();
    y.transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((b, t, c))
        .unwrap()
}

/// Outputs and `dqkv` equal the split path's bit for bit: several samples
/// and heads, lengths across the 64-row blocks, with and without dropout.
#[test]
fn equals_the_split_heads_bit_for_bit_both_ways() {
    for (b, t, heads, d, p) in [
        (3, 70, 4, 16, 0.0),
        (2, 130, 2, 8, 0.3),
        (1, 5, 3, 4, 0.0),
        (4, 64, 1, 32, 0.5),
    ] {
        let c = heads * d;
        let x = qkv(b, t, c, (t + d) as u64);
        let drop = Some(DropDraw { p, seed: 11 });
        let packed = causal_self_attention(x.as_tensor(), heads, drop).unwrap();
        let split = split_path(x.as_tensor(), heads, drop);
        assert_eq!(packed.dims(), &[b, t, c]);
        let what = format!("B {b} T {t} heads {heads} x {d} dropout {p}");
        assert_eq!(
            packed.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            split.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            "{what}: outputs"
        );
        let up = Tensor::randn(0f32, 1.0, (b, t, c), &Device::Cpu).unwrap();
        let ga = (&packed * &up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gb = (&split * &up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let (ga, gb) = (ga.get(&x).unwrap(), gb.get(&x).unwrap());
        assert_eq!(
            ga.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            gb.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            "{what}: dqkv"
        );
    }
}

/// 16-bit inputs are widened, attended in f32 and rounded back once.
#[test]
fn sixteen_bit_inputs_round_the_f32_result_once() {
    let x = qkv(2, 20, 12, 3);
    let half = x.as_tensor().to_dtype(DType::BF16).unwrap();
    let got = causal_self_attention(&half, 3, None).unwrap();
    assert_eq!(got.dtype(), DType::BF16);
    let want = causal_self_attention(&half.to_dtype(DType::F32).unwrap(), 3, None)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    assert_eq!(
        got.flatten_all().unwrap().to_vec1::<half::bf16>().unwrap(),
        want.flatten_all().unwrap().to_vec1::<half::bf16>().unwrap()
    );
}

#[test]
fn widths_that_do_not_split_into_heads_are_refused() {
    for (c3, heads) in [(10, 1), (12, 0), (12, 3), (0, 1)] {
        let x = Tensor::zeros((1, 2, c3), DType::F32, &Device::Cpu).unwrap();
        let err = causal_self_attention(&x, heads, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("heads"), "{c3} / {heads}: {err}");
    }
}
