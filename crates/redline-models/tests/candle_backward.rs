//! The vendored candle-core's backward (`vendor/candle-core/REDLINE.md`): a
//! tensor's first gradient is stored as it comes, not added to a tensor of
//! zeros, and no two stored gradients are one tensor; ReLU's gradient is
//! PyTorch's (no gradient at 0, NaN kept with its gradient).

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor, Var};

/// The identity, whose backward hands back a gradient it keeps a handle to.
struct Identity {
    grad: std::sync::Arc<Mutex<Option<Tensor>>>,
}

impl CustomOp1 for Identity {
    fn name(&self) -> &'static str {
        "identity"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let v = s.as_slice::<f32>()?;
        let v = match l.contiguous_offsets() {
            Some((a, b)) => v[a..b].to_vec(),
            None => candle_core::bail!("identity: contiguous input only"),
        };
        Ok((CpuStorage::F32(v), l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let g = (grad * 2.0)?;
        if let Ok(mut kept) = self.grad.lock() {
            *kept = Some(g.clone());
        }
        Ok(Some(g))
    }
}

#[test]
fn a_first_gradient_is_stored_as_it_comes() -> Result<()> {
    let w = Var::from_tensor(&Tensor::new(&[1f32, -2., 3.], &Device::Cpu)?)?;
    let kept = std::sync::Arc::new(Mutex::new(None));
    let y = w.as_tensor().apply_op1(Identity { grad: kept.clone() })?;
    let grads = y.sum_all()?.backward()?;
    let got = grads.get(w.as_tensor()).cloned();
    let handed = kept.lock().ok().and_then(|g| g.clone());
    let (Some(got), Some(handed)) = (got, handed) else {
        panic!("no gradient for w, or the op's backward did not run");
    };
    assert_eq!(got.to_vec1::<f32>()?, [2.0, 2.0, 2.0]);
    // candle 0.11.1 stores zeros + g, a new tensor; the patched backward, g.
    assert_eq!(
        got.id(),
        handed.id(),
        "w's gradient is not the tensor the op handed back: candle-core's backward is \
         not the vendored one"
    );
    Ok(())
}

#[test]
fn two_inputs_of_one_sum_get_gradients_of_their_own() -> Result<()> {
    let dev = Device::Cpu;
    let a = Var::ones(3, DType::F32, &dev)?;
    let b = Var::ones(3, DType::F32, &dev)?;
    let c = Var::ones(3, DType::F32, &dev)?;
    // An add hands its gradient to both inputs; a broadcast sum hands a view.
    let loss = ((a.as_tensor() + b.as_tensor())? * 3.0)?.sum_all()?;
    let loss = (loss + c.as_tensor().sum_keepdim(0)?.squeeze(0)?)?;
    let grads = loss.backward()?;
    let g = |v: &Var| -> Result<Tensor> {
        grads
            .get(v.as_tensor())
            .cloned()
            .ok_or_else(|| candle_core::Error::Msg("no gradient".into()))
    };
    let (ga, gb, gc) = (g(&a)?, g(&b)?, g(&c)?);
    assert_ne!(ga.id(), gb.id(), "a and b share one gradient tensor");
    assert_eq!(ga.to_vec1::<f32>()?, [3.0; 3]);
    assert_eq!(gb.to_vec1::<f32>()?, [3.0; 3]);
    assert_eq!(gc.to_vec1::<f32>()?, [1.0; 3]);
    assert!(
        gc.is_contiguous(),
        "a broadcast gradient is stored contiguous"
    );
    // A gradient that arrives twice is summed.
    let twice = (a.as_tensor() * a.as_tensor())?.sum_all()?.backward()?;
    assert_eq!(
        twice
            .get(a.as_tensor())
            .map(|t| t.to_vec1::<f32>())
            .transpose()?,
        Some(vec![2.0; 3])
    );
    Ok(())
}

#[test]
fn relu_takes_no_gradient_at_zero_as_in_pytorch() -> Result<()> {
    // torch.relu(x).backward(g): x.grad = [0, 0, 3, 0, 5] for
    // x = [-1, 0, 2, -0.0, 4], g = [1, 2, 3, 4, 5]; candle-core 0.11.1 gave
    // [0, 2, 3, 4, 5] (its `arg >= 0`).
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let x = Var::from_tensor(
            &Tensor::new(&[-1f32, 0.0, 2.0, -0.0, 4.0], &Device::Cpu)?.to_dtype(dtype)?,
        )?;
        let g = Tensor::new(&[1f32, 2.0, 3.0, 4.0, 5.0], &Device::Cpu)?.to_dtype(dtype)?;
        let y = x.as_tensor().relu()?;
        let out = y.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        assert_eq!(out, [0.0, 0.0, 2.0, 0.0, 4.0], "{dtype:?}");
        let grads = (y * g)?.sum_all()?.backward()?;
        let dx = grads
            .get(x.as_tensor())
            .map(|d| d.to_dtype(DType::F32)?.to_vec1::<f32>())
            .transpose()?;
        assert_eq!(dx, Some(vec![0.0, 0.0, 3.0, 0.0, 5.0]), "{dtype:?}");
    }
    Ok(())
}

#[test]
fn relu_keeps_nan_and_passes_its_gradient_as_in_pytorch() -> Result<()> {
    // PyTorch 2.15: torch.relu(x) = [nan, 0, 0, 2, inf, 0] and, from
    // y.backward(g), x.grad = [3, 0, 0, 3, 3, 0] for x = [nan, -1, 0, 2, inf,
    // -inf], g = 3 (f32, bf16, f16 and f64 alike). candle-core 0.11.1 gave
    // relu(nan) = 0 (`max`) and no gradient there (`arg >= 0`).
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let x = [f32::NAN, -1.0, 0.0, 2.0, f32::INFINITY, f32::NEG_INFINITY];
        let x = Var::from_tensor(&Tensor::new(&x, &Device::Cpu)?.to_dtype(dtype)?)?;
        let y = x.as_tensor().relu()?;
        let out = y.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        assert!(out[0].is_nan(), "{dtype:?}: relu(nan) = {}", out[0]);
        assert_eq!(out[1..], [0.0, 0.0, 2.0, f32::INFINITY, 0.0], "{dtype:?}");
        let grads = y.affine(3.0, 0.0)?.sum_all()?.backward()?;
        let dx = grads
            .get(x.as_tensor())
            .map(|d| d.to_dtype(DType::F32)?.to_vec1::<f32>())
            .transpose()?;
        assert_eq!(dx, Some(vec![3.0, 0.0, 0.0, 3.0, 3.0, 0.0]), "{dtype:?}");
    }
    Ok(())
}

#[test]
fn relu_gives_an_off_unit_zero_whatever_its_gradient() -> Result<()> {
    // PyTorch 2.15: x.grad = [0, 0, inf, 0] for x = [-1, 0, 2, -3] and
    // g = [inf, nan, inf, -2], every 0 positive; `g * (x > 0)` gave
    // [nan, nan, inf, -0].
    let x = Var::from_tensor(&Tensor::new(&[-1f32, 0.0, 2.0, -3.0], &Device::Cpu)?)?;
    let g = Tensor::new(
        &[f32::INFINITY, f32::NAN, f32::INFINITY, -2.0],
        &Device::Cpu,
    )?;
    let grads = (x.as_tensor().relu()? * g)?.sum_all()?.backward()?;
    let dx = grads
        .get(x.as_tensor())
        .map(|d| d.to_vec1::<f32>())
        .transpose()?
        .unwrap_or_default();
    let bits: Vec<u32> = dx.iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, [0, 0, f32::INFINITY.to_bits(), 0], "{dx:?}");
    Ok(())
}

#[test]
fn a_bf16_sum_on_the_cpu_is_each_pair_added_and_rounded_once() -> Result<()> {
    // The fifth change's 16-lane add (vendor/candle-core/REDLINE.md): every
    // length around its 32-value steps, each sum the f32 sum of the two
    // values rounded to nearest even (normal values: the hardware and
    // software roundings agree), NaN and infinities carried.
    let value = |i: usize, s: f32| (i as f32 * 0.731 + s).sin() * 2f32.powi(i as i32 % 40 - 20);
    for n in [0, 1, 15, 16, 31, 32, 33, 64, 100, 1000] {
        let mut a: Vec<f32> = (0..n).map(|i| value(i, 0.3)).collect();
        let b: Vec<f32> = (0..n).map(|i| value(i, 1.9)).collect();
        if n > 40 {
            (a[3], a[35], a[36]) = (f32::NAN, f32::INFINITY, f32::NEG_INFINITY);
        }
        let a16: Vec<half::bf16> = a.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let b16: Vec<half::bf16> = b.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let ta = Tensor::from_slice(&a16, n, &Device::Cpu)?;
        let tb = Tensor::from_slice(&b16, n, &Device::Cpu)?;
        let got = (ta + tb)?.to_vec1::<half::bf16>()?;
        for (i, g) in got.iter().enumerate() {
            let want = half::bf16::from_f32(a16[i].to_f32() + b16[i].to_f32());
            let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
            assert!(same, "length {n}, value {i}: {g} against {want}");
        }
    }
    Ok(())
}
