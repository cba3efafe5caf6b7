#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use candle_core::{DType, Device, Var};

fn values(n: usize, f: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * f).sin() + 0.1).collect()
}

/// The kept fraction is `1 - p`, and the two elements that share a hash
/// (`2j`, `2j + 1`) are as independent as neighbours that do not.
#[test]
fn keeps_one_minus_p_and_neighbours_independently() {
    let n = 1 << 20;
    for p in [0.1f32, 0.2, 0.5] {
        let d = DropDraw { p, seed: 42 };
        let k: Vec<bool> = (0..n).map(|i| keeps(d, i)).collect();
        let q = f64::from(1.0 - p);
        let kept = k.iter().filter(|b| **b).count() as f64 / n as f64;
        // 1e6 draws: one standard deviation is below 5e-4.
        assert!((kept - q).abs() < 3e-3, "p {p}: kept {kept}");
        for offset in [0usize, 1] {
            let both = (0..n / 2 - 1)
                .filter(|j| k[2 * j + offset] && k[2 * j + offset + 1])
                .count() as f64
                / (n / 2 - 1) as f64;
            assert!(
                (both - q * q).abs() < 4e-3,
                "p {p}, pairs at offset {offset}: both kept {both}, independent {}",
                q * q
            );
        }
    }
}

#[test]
fn seeds_draw_other_masks_and_the_same_seed_the_same_one() {
    let n = 4096;
    let a = mask_values(DropDraw { p: 0.3, seed: 1 }, n);
    let b = mask_values(DropDraw { p: 0.3, seed: 2 }, n);
    assert_eq!(a, mask_values(DropDraw { p: 0.3, seed: 1 }, n));
    let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert!(differ > n / 5, "{differ} of {n} differ");
    assert!(a.iter().all(|m| *m == 0.0 || *m == 1.0 / 0.7));
}

/// The fused passes, across thread chunks and an odd length, equal
/// `x * mask` and `h + x * mask` bit for bit, and their gradients are
/// `g * mask` and `g`.
#[test]
fn the_fused_passes_equal_the_mask_both_ways() {
    let n = 2 * CHUNK + 77;
    let d = DropDraw { p: 0.2, seed: 7 };
    let m = mask_values(d, n);
    for (i, v) in m.iter().enumerate() {
        assert_eq!(*v != 0.0, keeps(d, i), "element {i}");
    }
    let (xs, hs, up) = (values(n, 0.37), values(n, 0.11), values(n, 0.23));
    let dev = Device::Cpu;
    let x = Var::from_vec(xs.clone(), n, &dev).unwrap();
    let h = Var::from_vec(hs.clone(), n, &dev).unwrap();
    let u = Tensor::from_vec(up.clone(), n, &dev).unwrap();

    let y = dropout(x.as_tensor(), d).unwrap();
    let want: Vec<f32> = xs.iter().zip(&m).map(|(x, m)| x * m).collect();
    assert_eq!(y.to_vec1::<f32>().unwrap(), want);
    let g = (&y * &u).unwrap().sum_all().unwrap().backward().unwrap();
    let want: Vec<f32> = up.iter().zip(&m).map(|(u, m)| u * m).collect();
    assert_eq!(g.get(&x).unwrap().to_vec1::<f32>().unwrap(), want);

    let y = dropout_add(h.as_tensor(), x.as_tensor(), d).unwrap();
    let want: Vec<f32> = hs
        .iter()
        .zip(&xs)
        .zip(&m)
        .map(|((h, x), m)| h + x * m)
        .collect();
    assert_eq!(y.to_vec1::<f32>().unwrap(), want);
    let g = (&y * &u).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(&h).unwrap().to_vec1::<f32>().unwrap(), up);
    let want: Vec<f32> = up.iter().zip(&m).map(|(u, m)| u * m).collect();
    assert_eq!(g.get(&x).unwrap().to_vec1::<f32>().unwrap(), want);
}

/// 16-bit tensors take candle's ops with the same mask: the same elements
/// are dropped.
#[test]
fn sixteen_bit_tensors_drop_the_same_elements() {
    let n = 1001;
    let d = DropDraw { p: 0.5, seed: 3 };
    let x = Tensor::from_vec(values(n, 0.5), n, &Device::Cpu).unwrap();
    let fused = dropout(&x, d).unwrap().to_vec1::<f32>().unwrap();
    let half = dropout(&x.to_dtype(DType::BF16).unwrap(), d)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    for (i, (a, b)) in fused.iter().zip(&half).enumerate() {
        assert_eq!(*a == 0.0, *b == 0.0, "element {i}");
    }
}

#[test]
fn a_residual_of_another_shape_is_refused() {
    let dev = Device::Cpu;
    let h = Tensor::zeros((2, 3), DType::F32, &dev).unwrap();
    let x = Tensor::zeros((3, 2), DType::F32, &dev).unwrap();
    let err = dropout_add(&h, &x, DropDraw { p: 0.1, seed: 0 })
        .unwrap_err()
        .to_string();
    assert!(err.contains("dropout_add"), "{err}");
}
