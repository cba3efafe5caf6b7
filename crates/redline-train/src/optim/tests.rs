//! The unit tests of `optim.rs`.

use super::*;
use candle_core::{DType, Device, Var};

/// Back-propagates `loss` into `params`' gradients.
fn backward(loss: &Tensor, params: &[&Param]) -> Result<()> {
    let mut grads = loss.backward()?;
    for p in params {
        p.absorb(&mut grads)?;
    }
    Ok(())
}

/// Minimises (x - 3)^2 from 0; each optimizer must get close.
fn converges(cfg: OptimizerConfig, steps: usize) -> Result<f32> {
    let x = Param::new(Var::zeros(1, DType::F32, &Device::Cpu)?);
    let mut opt = cfg.build(vec![x.clone()])?;
    for _ in 0..steps {
        let loss = (x.as_tensor() - 3.0)?.sqr()?.sum_all()?;
        backward(&loss, &[&x])?;
        opt.step()?;
    }
    Ok(x.as_tensor().to_vec1::<f32>()?[0])
}

#[test]
fn all_optimizers_descend() -> Result<()> {
    assert!((converges(OptimizerConfig::by_name("adam", 0.1)?, 300)? - 3.0).abs() < 0.05);
    assert!((converges(OptimizerConfig::by_name("adamw", 0.1)?, 300)? - 3.0).abs() < 0.1);
    let sgd = OptimizerConfig::Sgd {
        lr: 0.05,
        momentum: 0.9,
        dampening: 0.0,
        nesterov: true,
        weight_decay: 0.0,
    };
    assert!((converges(sgd, 200)? - 3.0).abs() < 0.01);
    Ok(())
}

#[test]
fn adam_first_step_is_lr_times_sign() -> Result<()> {
    // With bias correction the first Adam step is lr * g/(|g| + eps').
    let x = converges(OptimizerConfig::by_name("adam", 0.01)?, 1)?;
    assert!((x - 0.01).abs() < 1e-6, "{x}");
    Ok(())
}

#[test]
fn generic_path_state_holds_no_graph_and_stays_in_place() -> Result<()> {
    // f64 parameters take the generic (tensor-op) path. The gradient of `w`
    // flows through an activation, so candle hands it over still attached
    // to the forward graph; the optimizer state must not keep that graph.
    // The state buffers are the same from step to step (updated in place,
    // as a captured graph needs): a clone taken after the first step sees
    // the later values.
    for name in ["adam", "adamw", "sgd"] {
        let w = Param::new(Var::new(&[0.5f64, -1.5, 2.0], &Device::Cpu)?);
        let mut cfg = OptimizerConfig::by_name(name, 0.1)?;
        if let OptimizerConfig::Sgd { momentum, .. } = &mut cfg {
            *momentum = 0.9;
        }
        let mut opt = cfg.build(vec![w.clone()])?;
        let mut first = None;
        let mut after_first = Vec::new();
        for i in 0..3 {
            let act = w.as_tensor().affine(2.0, 0.0)?.tanh()?;
            backward(&(act * w.as_tensor())?.sum_all()?, &[&w])?;
            opt.step()?;
            if i == 0 {
                let a = opt.state[0].generic.a.clone();
                after_first = match &a {
                    Some(a) => a.as_tensor().to_vec1::<f64>()?,
                    None => panic!("{name}: no state after a step"),
                };
                first = a;
            }
        }
        let (Some(first), Some(now)) = (&first, &opt.state[0].generic.a) else {
            panic!("{name}: state missing");
        };
        let now = now.as_tensor().to_vec1::<f64>()?;
        assert_eq!(
            first.as_tensor().to_vec1::<f64>()?,
            now,
            "{name}: not in place"
        );
        assert_ne!(after_first, now, "{name}: state did not change");
        for slot in &opt.state {
            for t in [&slot.generic.a, &slot.generic.b].into_iter().flatten() {
                // A variable of its own: no backprop op links it to the forward graph.
                assert!(
                    t.as_tensor().is_variable(),
                    "{name}: state is not its own buffer"
                );
            }
            assert!(
                slot.fused.a.is_empty(),
                "{name}: f64 must take the generic path"
            );
        }
    }
    Ok(())
}

/// A step of a linear layer from gradients the fused kernel wrote into
/// the parameters' buffers and one from candle's `GradStore` gradients
/// (the plain op, absorbed) give the same weights; the step takes them.
#[test]
fn fused_and_store_gradients_give_the_same_step() -> Result<()> {
    use redline_kernels::{linear, linear_param};
    let dev = Device::Cpu;
    let x = Tensor::arange(0f32, 12.0, &dev)?.reshape((3, 4))?.sin()?;
    let up = Tensor::arange(0f32, 6.0, &dev)?.reshape((3, 2))?.cos()?;
    let fresh = || -> Result<(Param, Param)> {
        let w = Tensor::arange(0f32, 8.0, &dev)?
            .reshape((2, 4))?
            .affine(0.1, -0.3)?;
        Ok((
            Param::new(Var::from_tensor(&w)?),
            Param::new(Var::zeros(2, DType::F32, &dev)?),
        ))
    };
    for name in ["adam", "adamw", "sgd"] {
        let cfg = OptimizerConfig::by_name(name, 0.1)?;
        let (w1, b1) = fresh()?;
        let mut fused = cfg.build(vec![w1.clone(), b1.clone()])?;
        let y = linear_param(&x, &w1, &b1, true)?;
        let grads = (y * &up)?.sum_all()?.backward()?;
        assert!(grads.get(w1.as_tensor()).is_none() && !w1.grad().is_empty());
        fused.step()?;
        assert!(w1.grad().is_empty() && b1.grad().is_empty());

        let (w2, b2) = fresh()?;
        let y = linear(&x, w2.as_tensor(), b2.as_tensor(), true)?;
        backward(&(y * &up)?.sum_all()?, &[&w2, &b2])?;
        cfg.build(vec![w2.clone(), b2.clone()])?.step()?;

        for (a, b) in [(&w1, &w2), (&b1, &b2)] {
            let d = (a.as_tensor() - b.as_tensor())?.abs()?.max_all()?;
            assert_eq!(d.to_scalar::<f32>()?, 0.0, "{name}");
        }
        let moved = (w1.as_tensor() - fresh()?.0.as_tensor())?
            .abs()?
            .sum_all()?;
        assert!(moved.to_scalar::<f32>()? > 0.0, "{name}: no update");
    }
    Ok(())
}

#[test]
fn zero_grad_drops_accumulated_gradients() -> Result<()> {
    let dev = Device::Cpu;
    let w = Param::new(Var::from_tensor(&Tensor::ones((2, 3), DType::F32, &dev)?)?);
    let b = Param::new(Var::zeros(2, DType::F32, &dev)?);
    let mut opt = OptimizerConfig::by_name("sgd", 1.0)?.build(vec![w.clone(), b.clone()])?;
    let x = Tensor::ones((1, 3), DType::F32, &dev)?;
    let y = redline_kernels::linear_param(&x, &w, &b, false)?;
    y.sum_all()?.backward()?;
    let g = b.grad().to_tensor(b.as_tensor())?;
    assert_eq!(
        g.map(|g| g.to_vec1::<f32>()).transpose()?,
        Some(vec![1.0, 1.0])
    );
    opt.zero_grad();
    opt.step()?;
    assert_eq!(w.as_tensor().sum_all()?.to_scalar::<f32>()?, 6.0);
    Ok(())
}

/// A learning-rate change reaches both paths at the next step: the fused
/// f32 loop and the generic f64 path (its rate held on the device) land on
/// the same weights, and both differ from a run without the change.
#[test]
fn set_lr_reaches_both_paths() -> Result<()> {
    let run = |dtype: DType, change: bool| -> Result<Vec<f64>> {
        let w = Param::new(Var::from_tensor(
            &Tensor::new(&[0.5f64, -1.5, 2.0], &Device::Cpu)?.to_dtype(dtype)?,
        )?);
        let mut opt = OptimizerConfig::by_name("adamw", 0.1)?.build(vec![w.clone()])?;
        for i in 0..6 {
            if change && i == 3 {
                opt.set_lr(0.01)?;
            }
            let loss = w.as_tensor().sqr()?.sum_all()?;
            backward(&loss, &[&w])?;
            opt.step()?;
        }
        assert_eq!(opt.hyper.is_some(), dtype == DType::F64, "{dtype:?}");
        Ok(w.as_tensor().to_dtype(DType::F64)?.to_vec1::<f64>()?)
    };
    let (fused, generic) = (run(DType::F32, true)?, run(DType::F64, true)?);
    let unchanged = run(DType::F64, false)?;
    for ((f, g), u) in fused.iter().zip(&generic).zip(&unchanged) {
        assert!((f - g).abs() < 1e-6, "{fused:?} vs {generic:?}");
        assert!(
            (g - u).abs() > 1e-3,
            "the change had no effect: {generic:?}"
        );
    }
    let mut opt = OptimizerConfig::by_name("sgd", 0.1)?.build(Vec::new())?;
    assert!(opt.set_lr(f64::NAN).is_err() && opt.set_lr(-1.0).is_err());
    assert_eq!(opt.lr(), 0.1);
    Ok(())
}

/// The fused GPU kernel's switch changes nothing off a CUDA device: the
/// generic path (f64 here) and the fused CPU loop (f32) give the same
/// weights with it on or off, for every optimizer.
#[test]
fn the_gpu_kernel_switch_leaves_the_cpu_alone() -> Result<()> {
    let run = |name: &str, dtype: DType, gpu: bool| -> Result<Vec<f64>> {
        let dev = Device::Cpu;
        let w = Param::new(Var::from_tensor(
            &Tensor::new(&[0.5f64, -1.5, 2.0, 0.25], &dev)?.to_dtype(dtype)?,
        )?);
        let b = Param::new(Var::from_tensor(
            &Tensor::new(&[0.1f64, -0.2], &dev)?.to_dtype(dtype)?,
        )?);
        let mut opt = OptimizerConfig::by_name(name, 0.05)?.build(vec![w.clone(), b.clone()])?;
        redline_kernels::fused_gpu::set_enabled(gpu);
        for _ in 0..5 {
            let loss = (w.as_tensor().sqr()?.sum_all()? + b.as_tensor().sum_all()?)?;
            backward(&loss, &[&w, &b])?;
            opt.step()?;
        }
        let mut out = w.as_tensor().to_dtype(DType::F64)?.to_vec1::<f64>()?;
        out.extend(b.as_tensor().to_dtype(DType::F64)?.to_vec1::<f64>()?);
        Ok(out)
    };
    for name in ["adam", "adamw", "sgd"] {
        for dtype in [DType::F32, DType::F64] {
            let (off, on) = (run(name, dtype, false)?, run(name, dtype, true)?);
            assert_eq!(off, on, "{name} {dtype:?}");
            assert!(off
                .iter()
                .zip([0.5, -1.5, 2.0, 0.25, 0.1, -0.2])
                .all(|(a, b)| a != &b));
        }
    }
    redline_kernels::fused_gpu::set_enabled(false);
    Ok(())
}

#[test]
fn bad_settings_are_refused() {
    assert!(OptimizerConfig::by_name("lion", 0.1).is_err());
    let nest = OptimizerConfig::Sgd {
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        nesterov: true,
        weight_decay: 0.0,
    };
    assert!(nest.build(vec![]).is_err());
    assert!(OptimizerConfig::by_name("adam", f64::NAN)
        .and_then(|c| c.build(vec![]).map(|_| ()))
        .is_err());
}
