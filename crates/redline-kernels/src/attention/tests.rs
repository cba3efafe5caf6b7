use super::*;
use candle_core::{Device, Var};

fn inputs(shape: (usize, usize, usize, usize), seed: u64) -> Result<[Var; 3]> {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let mk = |salt: u64| -> Result<Var> {
        let v: Vec<f32> = (0..n)
            .map(|i| {
                (((i as u64 * 2654435761 + seed * 97 + salt * 13) % 1000) as f32 / 500.0) - 1.0
            })
            .collect();
        Ok(Var::from_tensor(&Tensor::from_vec(
            v,
            shape,
            &Device::Cpu,
        )?)?)
    };
    Ok([mk(1)?, mk(2)?, mk(3)?])
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

#[test]
fn the_fused_kernel_matches_the_masked_softmax_forward_and_backward() -> Result<()> {
    // T = 530 spans three key blocks, the last one partial: the online
    // softmax's rescaling, and gradients summed across key blocks.
    for shape in [(1, 1, 1, 4), (2, 3, 17, 8), (1, 2, 64, 16), (1, 2, 530, 8)] {
        let [q, k, v] = inputs(shape, 7)?;
        let go = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?;
        let fused = causal_attention(&q, &k, &v)?;
        let plain = generic(&q, &k, &v)?;
        assert!(max_diff(&fused, &plain)? < 1e-5, "{shape:?} forward");
        let gf = (fused * &go)?.sum_all()?.backward()?;
        let gp = (plain * &go)?.sum_all()?.backward()?;
        for (x, name) in [(&q, "dq"), (&k, "dk"), (&v, "dv")] {
            let (a, b) = (gf.get(x), gp.get(x));
            let (Some(a), Some(b)) = (a, b) else {
                panic!("{shape:?} {name} missing");
            };
            assert!(max_diff(a, b)? < 1e-4, "{shape:?} {name}");
        }
    }
    Ok(())
}

#[test]
fn the_first_query_sees_only_the_first_key() -> Result<()> {
    let [q, k, v] = inputs((1, 1, 5, 3), 3)?;
    let o = causal_attention(&q, &k, &v)?;
    let first = o.narrow(2, 0, 1)?.flatten_all()?.to_vec1::<f32>()?;
    let v0 = v.narrow(2, 0, 1)?.flatten_all()?.to_vec1::<f32>()?;
    assert_eq!(first, v0);
    Ok(())
}

#[test]
fn mismatched_shapes_are_refused_by_name() -> Result<()> {
    let [q, k, _] = inputs((1, 1, 4, 2), 1)?;
    let v = Tensor::zeros((1, 1, 3, 2), DType::F32, &Device::Cpu)?;
    let e = causal_attention(&q, &k, &v)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("must have one shape"), "{e}");
    Ok(())
}

#[test]
fn dropout_in_the_fused_kernel_matches_the_masked_reference_both_ways() -> Result<()> {
    let drop = DropDraw { p: 0.3, seed: 11 };
    for shape in [(1, 2, 9, 4), (2, 1, 130, 8)] {
        let [q, k, v] = inputs(shape, 5)?;
        let go = Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?;
        let fused = causal_attention_dropout(&q, &k, &v, Some(drop))?;
        let plain = generic_dropout(&q, &k, &v, Some(drop))?;
        assert!(max_diff(&fused, &plain)? < 1e-5, "{shape:?} forward");
        // Not the output without dropout.
        assert!(max_diff(&fused, &causal_attention(&q, &k, &v)?)? > 1e-2);
        let gf = (fused * &go)?.sum_all()?.backward()?;
        let gp = (plain * &go)?.sum_all()?.backward()?;
        for (x, name) in [(&q, "dq"), (&k, "dk"), (&v, "dv")] {
            let (Some(a), Some(b)) = (gf.get(x), gp.get(x)) else {
                panic!("{shape:?} {name} missing");
            };
            assert!(max_diff(a, b)? < 1e-4, "{shape:?} {name}");
        }
    }
    Ok(())
}

#[test]
fn the_dropout_mask_drops_about_p_and_follows_its_seed() -> Result<()> {
    let (heads, t) = (4, 64);
    let mask = |seed| dropout_mask(DropDraw { p: 0.2, seed }, heads, t, &Device::Cpu);
    let a = mask(1)?.flatten_all()?.to_vec1::<f32>()?;
    let dropped = a.iter().filter(|&&x| x == 0.0).count() as f64 / a.len() as f64;
    assert!((dropped - 0.2).abs() < 0.02, "{dropped}");
    assert!(a.iter().all(|&x| x == 0.0 || (x - 1.25).abs() < 1e-6));
    assert_eq!(a, mask(1)?.flatten_all()?.to_vec1::<f32>()?);
    assert_ne!(a, mask(2)?.flatten_all()?.to_vec1::<f32>()?);
    let [q, k, v] = inputs((1, 1, 4, 2), 1)?;
    let bad = causal_attention_dropout(&q, &k, &v, Some(DropDraw { p: 1.0, seed: 0 }));
    assert!(bad.is_err());
    Ok(())
}
