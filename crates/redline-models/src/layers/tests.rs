use super::*;
use candle_core::{DType, Device};
use redline_core::Precision;
use redline_kernels::{conv2d_generic, max_pool2d_generic};
use std::collections::HashMap;

fn parse(text: &str, input: &[usize], outputs: usize) -> Result<SequentialConfig> {
    let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
    let path = dir.path().join("net.toml");
    std::fs::write(&path, text).map_err(|e| Error::Config(e.to_string()))?;
    SequentialConfig::from_file(&path, input, outputs)
}

fn init() -> Initializer {
    Initializer::new(0, &redline_core::Device::cpu(), Precision::Fp32)
}

const CNN: &str = r#"
[model]
layers = [
  { type = "conv2d", out = 4, kernel = 3, padding = 1 },
  { type = "relu" },
  { type = "maxpool2d", kernel = 2 },
  { type = "residual", layers = [
      { type = "conv2d", out = 4, kernel = 3, padding = 1 },
      { type = "gelu" },
  ] },
  { type = "avgpool2d", kernel = 2 },
  { type = "flatten" },
  { type = "linear", out = 8 },
  { type = "layernorm" },
  { type = "relu" },
  { type = "dropout", p = 0.5 },
  { type = "linear" },
]
"#;

#[test]
fn shapes_follow_the_data_and_names_follow_nn_sequential() -> Result<()> {
    let cfg = parse(CNN, &[1, 8, 8], 3)?;
    assert_eq!(cfg.name, "net");
    let shapes = cfg.shapes()?;
    assert_eq!(shapes[2], vec![4, 4, 4]);
    assert_eq!(shapes[5], vec![16]);
    assert_eq!(shapes.last(), Some(&vec![3]));
    let model = cfg.build(&mut init())?;
    let names: Vec<&str> = model.params().iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "0.weight",
            "0.bias",
            "3.body.0.weight",
            "3.body.0.bias",
            "6.weight",
            "6.bias",
            "7.weight",
            "7.bias",
            "10.weight",
            "10.bias"
        ]
    );
    // conv+relu+pool fused into one layer; linear+relu not (layernorm between).
    let spans: Vec<&str> = model.body.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(spans[0], "0.conv2d+relu+maxpool2d");
    let x = Tensor::ones((2, 1, 8, 8), DType::F32, &Device::Cpu)?;
    assert_eq!(model.forward(&x)?.dims(), &[2, 3]);
    Ok(())
}

#[test]
fn fused_neighbours_compute_what_the_separate_layers_do() -> Result<()> {
    let text = r#"[model]
layers = [
  { type = "conv2d", out = 3, kernel = 3, padding = 1 },
  { type = "maxpool2d", kernel = 2 },
  { type = "relu" },
  { type = "flatten" },
  { type = "linear", out = 5 },
  { type = "relu" },
  { type = "linear" },
]"#;
    let model = parse(text, &[2, 6, 6], 4)?.build(&mut init())?;
    let p = |n: &str| -> Result<Tensor> {
        match model.params().get(n) {
            Some(v) => Ok(v.as_tensor().clone()),
            None => Err(Error::Config(format!("no {n}"))),
        }
    };
    let x = Tensor::arange(0f32, 144.0, &Device::Cpu)?
        .reshape((2, 2, 6, 6))?
        .sin()?;
    let h = conv2d_generic(&x, &p("0.weight")?, &p("0.bias")?, 1)?;
    let h = max_pool2d_generic(&h, 2)?.relu()?.flatten_from(1)?;
    let h = h
        .matmul(&p("4.weight")?.t()?)?
        .broadcast_add(&p("4.bias")?)?
        .relu()?;
    let want = h
        .matmul(&p("6.weight")?.t()?)?
        .broadcast_add(&p("6.bias")?)?;
    let got = model.forward(&x)?;
    let diff = (got - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(diff < 1e-5, "{diff}");
    Ok(())
}

/// BatchNorm2d then ReLU, and a residual block then ReLU, build as one layer
/// each and compute, in training and in eval mode, what the separate ops
/// do: the batch norm's formula, a ReLU, the residual sum.
#[test]
fn batch_norm_and_residual_sums_fuse_the_relu_after_them() -> Result<()> {
    let text = r#"[model]
layers = [
  { type = "batchnorm2d" },
  { type = "relu" },
  { type = "residual", layers = [{ type = "batchnorm2d" }] },
  { type = "relu" },
]"#;
    let model = parse(text, &[3, 4, 5], 1)?.build(&mut init())?;
    let spans: Vec<&str> = model.body.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(spans, ["0.batchnorm2d+relu", "2.residual+relu"]);
    let x = Tensor::arange(0f32, 120.0, &Device::Cpu)?
        .reshape((2, 3, 4, 5))?
        .sin()?;
    // Training: batch statistics (weights ones, biases zeros as built).
    let bn = |t: &Tensor| -> Result<Tensor> {
        let m = t.mean_keepdim(3)?.mean_keepdim(2)?.mean_keepdim(0)?;
        let c = t.broadcast_sub(&m)?;
        let v = c.sqr()?.mean_keepdim(3)?.mean_keepdim(2)?.mean_keepdim(0)?;
        Ok(c.broadcast_div(&(v + 1e-5)?.sqrt()?)?)
    };
    let h = bn(&x)?.relu()?;
    let want = (&h + bn(&h)?)?.relu()?;
    let got = model.forward_t(&x, true)?;
    let diff = (got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(diff < 1e-5, "training: {diff}");
    let zeros = want
        .flatten_all()?
        .to_vec1::<f32>()?
        .iter()
        .filter(|v| **v == 0.0)
        .count();
    assert!(zeros > 10, "the ReLUs stop something: {zeros} zeros");
    // Eval: the running statistics (one step of momentum 0.1 from 0 and 1).
    let e = model.forward(&x)?;
    assert!(e.flatten_all()?.to_vec1::<f32>()?.iter().all(|v| *v >= 0.0));
    Ok(())
}

/// `groups` makes a grouped (here depthwise, two outputs a channel)
/// convolution: PyTorch's weight shape `(Cout, Cin/groups, k, k)`, the
/// output of candle's grouped convolution, and the gradient reaches every
/// parameter; groups that do not divide the channels are refused with the fix.
#[test]
fn grouped_and_depthwise_convolutions_build_from_groups() -> Result<()> {
    let text = "[model]\nlayers = [{ type = \"conv2d\", out = 6, kernel = 3, padding = 1, \
                stride = 2, groups = 3 }]";
    let model = parse(text, &[3, 7, 6], 1)?.build(&mut init())?;
    let w = model
        .params()
        .get("0.weight")
        .map(|v| v.as_tensor().clone());
    let w = w.ok_or_else(|| Error::Config("no 0.weight".into()))?;
    assert_eq!(w.dims(), [6, 1, 3, 3]);
    let b = model.params().get("0.bias").map(|v| v.as_tensor().clone());
    let b = b.ok_or_else(|| Error::Config("no 0.bias".into()))?;
    let x = Tensor::arange(0f32, 252.0, &Device::Cpu)?
        .reshape((2, 3, 7, 6))?
        .sin()?;
    let want = x
        .conv2d(&w, 1, 2, 1, 3)?
        .broadcast_add(&b.reshape((1, 6, 1, 1))?)?;
    let got = model.forward_t(&x, true)?;
    assert_eq!(got.dims(), [2, 6, 4, 3]);
    let diff = (&got - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(diff < 1e-5, "{diff}");
    let bad = "[model]\nlayers = [{ type = \"conv2d\", out = 4, kernel = 3, groups = 2 }]";
    let err = match parse(bad, &[3, 7, 6], 1) {
        Ok(_) => panic!("groups 2 over 3 channels was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("groups 2") && err.contains("HINT"), "{err}");
    Ok(())
}

#[test]
fn dropout_drops_in_training_only_and_is_seeded() -> Result<()> {
    let text = "[model]\nlayers = [{ type = \"dropout\", p = 0.25 }]";
    let cfg = parse(text, &[4000], 1)?;
    let x = Tensor::ones((1, 4000), DType::F32, &Device::Cpu)?;
    let a = cfg.build(&mut init())?;
    let eval = a.forward(&x)?.sum_all()?.to_scalar::<f32>()?;
    assert_eq!(eval, 4000.0);
    let y = a.forward_t(&x, true)?.flatten_all()?.to_vec1::<f32>()?;
    let kept = y.iter().filter(|v| **v != 0.0).count();
    assert!((2800..3200).contains(&kept), "{kept} of 4000 kept");
    assert!(y
        .iter()
        .all(|v| *v == 0.0 || (*v - 1.0 / 0.75).abs() < 1e-6));
    let b = cfg.build(&mut init())?;
    assert_eq!(b.forward_t(&x, true)?.flatten_all()?.to_vec1::<f32>()?, y);
    Ok(())
}

#[test]
fn embedding_looks_up_rows() -> Result<()> {
    let text = r#"[model]
layers = [{ type = "embedding", num = 5, dim = 3 }, { type = "flatten" }, { type = "linear" }]"#;
    let model = parse(text, &[2], 2)?.build(&mut init())?;
    let w = model
        .params()
        .get("0.weight")
        .map(|v| v.as_tensor().clone());
    let ids = Tensor::new(&[[4f32, 0.0]], &Device::Cpu)?;
    let h = model.body[0].1.forward_t(&ids, false)?;
    assert_eq!(h.dims(), &[1, 2, 3]);
    if let Some(w) = w {
        assert_eq!(
            h.get(0)?.get(0)?.to_vec1::<f32>()?,
            w.get(4)?.to_vec1::<f32>()?
        );
    }
    Ok(())
}

#[test]
fn bad_files_name_the_layer_and_the_fix() {
    let err = |text: &str, input: &[usize]| -> String {
        match parse(text, input, 3) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    };
    let m = err("[model]\nlayers = [{ type = \"linear\" }]", &[1, 4, 4]);
    assert!(
        m.contains("layer 0 (linear)") && m.contains("flatten"),
        "{m}"
    );
    let m = err(
        "[model]\nlayers = [{ type = \"conv2d\", out = 2, kernal = 3 }]",
        &[1, 4, 4],
    );
    assert!(m.contains("kernal"), "{m}");
    let m = err("[model]\nlayers = [{ type = \"lstm\" }]", &[4]);
    assert!(m.contains("lstm") && m.contains("docs/models.md"), "{m}");
    let m = err(
        "[model]\nlayers = [{ type = \"residual\", layers = [{ type = \"linear\", out = 2 }] }]",
        &[4],
    );
    assert!(m.contains("same shape"), "{m}");
    let m = err("[model]\nlayers = []", &[4]);
    assert!(m.contains("no layers"), "{m}");
    // Names a state dict cannot hold, and pools PyTorch refuses.
    for bad in ["", "../x", "a b", ".fc", "fc."] {
        let m = err(
            &format!("[model]\nlayers = [{{ type = \"linear\", name = {bad:?} }}]"),
            &[4],
        );
        assert!(
            m.contains("layer 0 (linear)") && m.contains("name ="),
            "{bad:?}: {m}"
        );
    }
    let m = err(
        "[model]\nlayers = [{ type = \"conv2d\", out = 2, kernel = 3, init = \"xavier\" }]",
        &[1, 4, 4],
    );
    assert!(
        m.contains("xavier") && m.contains("kaiming_normal_fan_out"),
        "{m}"
    );
    let m = err(
        "[model]\nlayers = [{ type = \"maxpool2d\", kernel = 3, stride = 2, padding = 2 }]",
        &[1, 8, 8],
    );
    assert!(m.contains("more than half the window"), "{m}");
    let m = err(
        "[model]\nlayers = [{ type = \"avgpool2d\", kernel = 3, padding = 2 }]",
        &[1, 8, 8],
    );
    assert!(m.contains("more than half the window"), "{m}");
    let m = err(
        "[model]\nlayers = [{ type = \"avgpool2d\", kernel = 5, stride = 0 }]",
        &[1, 8, 8],
    );
    assert!(m.contains("do not fit a 8x8 input"), "{m}");
    let m = err(
        "[model]\nlayers = [{ type = \"avgpool2d\", kernel = 2, ceil_mode = true }]",
        &[1, 8, 8],
    );
    assert!(m.contains("ceil_mode"), "{m}");
}

/// `avgpool2d` takes PyTorch's stride, padding and `count_include_pad`
/// (shapes by PyTorch's floor formula; values: a corner window of 3/2/1
/// over ones averages 4/9 with the padding counted, 1 without), and a ReLU
/// into global average pooling is one fused layer.
#[test]
fn average_pools_take_stride_padding_and_the_divisor_rule() -> Result<()> {
    for (inc, corner) in [("true", 4.0 / 9.0), ("false", 1.0)] {
        let text = format!(
            "[model]\nlayers = [{{ type = \"avgpool2d\", kernel = 3, stride = 2, padding = 1, \
             count_include_pad = {inc} }}, {{ type = \"relu\" }}, \
             {{ type = \"adaptiveavgpool2d\" }}]"
        );
        let cfg = parse(&text, &[2, 7, 6], 1)?;
        assert_eq!(cfg.shapes()?[0], vec![2, 4, 3]);
        let model = cfg.build(&mut init())?;
        let spans: Vec<&str> = model.body.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(spans, ["0.avgpool2d", "1.relu+adaptiveavgpool2d"]);
        let x = Tensor::ones((1, 2, 7, 6), DType::F32, &Device::Cpu)?;
        let pooled = model.body[0].1.forward_t(&x, true)?;
        let v: Vec<f32> = pooled.flatten_all()?.to_vec1()?;
        assert!((v[0] - corner).abs() < 1e-6, "{inc}: corner {}", v[0]);
        assert_eq!(model.forward(&x)?.dims(), [1, 2, 1, 1]);
    }
    Ok(())
}

/// Two layers given one name are refused when built, by the name.
#[test]
fn a_name_given_twice_is_refused() -> Result<()> {
    let text = "[model]\nlayers = [{ type = \"linear\", out = 4, name = \"fc\" }, \
                { type = \"linear\", name = \"fc\" }]";
    let e = parse(text, &[4], 2)?
        .build(&mut init())
        .err()
        .map(|e| e.to_string());
    assert!(
        e.as_deref()
            .is_some_and(|e| e.contains("\"fc.weight\" registered twice")),
        "{e:?}"
    );
    Ok(())
}

#[test]
fn batch_norm_normalises_by_the_batch_in_training_and_keeps_running_stats() -> Result<()> {
    let text = "[model]\nlayers = [{ type = \"batchnorm2d\", momentum = 0.5 }]";
    let model = parse(text, &[2, 3, 3], 1)?.build(&mut init())?;
    // Channel 0 holds 0..17, channel 1 holds 100.
    let x = Tensor::arange(0f32, 36.0, &Device::Cpu)?.reshape((2, 2, 3, 3))?;
    let ch1 = Tensor::full(100f32, (2, 1, 3, 3), &Device::Cpu)?;
    let x = Tensor::cat(&[&x.narrow(1, 0, 1)?, &ch1], 1)?;
    let y = model.forward_t(&x, true)?;
    let m = y
        .mean_keepdim(3)?
        .mean_keepdim(2)?
        .mean_keepdim(0)?
        .flatten_all()?;
    assert!(
        m.to_vec1::<f32>()?.iter().all(|v| v.abs() < 1e-5),
        "zero mean per channel"
    );
    let state: HashMap<&str, Tensor> = model
        .params()
        .state()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    let rm = state["0.running_mean"].to_vec1::<f32>()?;
    assert!(
        (rm[1] - 50.0).abs() < 1e-4,
        "half of the batch mean 100: {rm:?}"
    );
    assert_eq!(state["0.num_batches_tracked"].to_scalar::<i64>()?, 1);
    assert_eq!(
        model.params().len(),
        2,
        "weight and bias train; the buffers do not"
    );
    // Eval mode uses the running statistics: a constant channel is no longer zero.
    let e = model
        .forward(&x)?
        .narrow(1, 1, 1)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    assert!(e.iter().all(|v| *v > 1.0), "{e:?}");
    // Buffers are saved and loaded with the weights.
    let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
    let file = dir.path().join("bn.safetensors");
    model.params().save_safetensors(&file)?;
    let fresh = parse(text, &[2, 3, 3], 1)?.build(&mut init())?;
    fresh.params().load_safetensors(&file)?;
    let back = fresh.params().to_map();
    assert_eq!(back["0.running_mean"].to_vec1::<f32>()?, rm);
    Ok(())
}

#[test]
fn the_zoo_resnet_fits_cifar_and_other_square_images() -> Result<()> {
    for (dims, batch) in [([3, 32, 32], 2), ([1, 28, 28], 3)] {
        let cfg = crate::ModelConfig::for_data("resnet", &dims, 10, None)?;
        assert_eq!(cfg.name(), "resnet");
        let model = cfg.build(&redline_core::Device::cpu(), Precision::Fp32, 0)?;
        let x = Tensor::ones((batch, dims[0], dims[1], dims[2]), DType::F32, &Device::Cpu)?;
        assert_eq!(model.forward_t(&x, true)?.dims(), &[batch, 10]);
    }
    let m = crate::ModelConfig::for_data("resnet", &[3, 32, 32], 10, Some(&[8]));
    assert!(m.is_err(), "--hidden does not shape the resnet");
    Ok(())
}

#[test]
fn relu_gives_no_gradient_at_zero_as_pytorch() -> Result<()> {
    // A ReLU the layer set does not fuse (after a flatten): its gradient at
    // exactly 0 is 0, as torch.relu's, not 1 as candle's relu.
    let text = r#"[model]
layers = [{ type = "flatten" }, { type = "relu" }, { type = "linear" }]"#;
    let model = parse(text, &[3], 2)?.build(&mut init())?;
    let x = candle_core::Var::new(&[[-1f32, 0.0, 2.0]], &Device::Cpu)?;
    let h = model.body[1].1.forward_t(x.as_tensor(), true)?;
    let grads = h.sum_all()?.backward()?;
    let dx = grads.get(x.as_tensor()).map(|g| g.to_vec2::<f32>());
    assert_eq!(dx.transpose()?, Some(vec![vec![0.0, 0.0, 1.0]]));
    Ok(())
}

#[test]
fn gelu_takes_pytorchs_erf_or_gpt2s_tanh_form() -> Result<()> {
    let text = |form: &str| {
        format!("[model]\nlayers = [{{ type = \"gelu\"{form} }}, {{ type = \"linear\" }}]")
    };
    let erf = parse(&text(""), &[3], 2)?;
    assert_eq!(
        erf.layers[0],
        LayerSpec::Gelu {
            approximate: GeluForm::None
        }
    );
    // The default is not written back: old files and new read alike.
    let written = toml::to_string(&erf.layers[0]).map_err(|e| Error::Config(e.to_string()))?;
    assert!(!written.contains("approximate"), "{written}");
    let tanh = parse(&text(", approximate = \"tanh\""), &[3], 2)?;
    let x = Tensor::new(&[[-1.5f32, 0.3, 2.0]], &Device::Cpu)?;
    let want = |v: f32| {
        let inner = (2.0f32 / std::f32::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
        0.5 * v * (1.0 + inner.tanh())
    };
    let got = tanh.build(&mut init())?.body[0].1.forward_t(&x, false)?;
    for (g, v) in got
        .flatten_all()?
        .to_vec1::<f32>()?
        .iter()
        .zip([-1.5f32, 0.3, 2.0])
    {
        assert!((g - want(v)).abs() < 1e-6, "{g} vs {}", want(v));
    }
    let e = parse(&text(", approximate = \"sigmoid\""), &[3], 2).err();
    assert!(e.is_some(), "an unknown form is refused");
    Ok(())
}

#[test]
fn positions_add_the_first_t_rows_of_a_learned_table() -> Result<()> {
    let text = r#"[model]
layers = [
  { type = "embedding", num = 5, dim = 3 },
  { type = "positions", max = 4, name = "wpe" },
  { type = "flatten" },
  { type = "linear" },
]"#;
    let model = parse(text, &[2], 2)?.build(&mut init())?;
    let (wte, wpe) = (
        model
            .params()
            .get("0.weight")
            .map(|v| v.as_tensor().clone()),
        model
            .params()
            .get("wpe.weight")
            .map(|v| v.as_tensor().clone()),
    );
    let (Some(wte), Some(wpe)) = (wte, wpe) else {
        panic!("parameters 0.weight and wpe.weight");
    };
    assert_eq!(wpe.dims(), &[4, 3]);
    let ids = Tensor::new(&[[4f32, 1.0]], &Device::Cpu)?;
    let h = model.body[0].1.forward_t(&ids, false)?;
    let h = model.body[1].1.forward_t(&h, false)?;
    let want = (wte.get(4)? + wpe.get(0)?)?.to_vec1::<f32>()?;
    assert_eq!(h.get(0)?.get(0)?.to_vec1::<f32>()?, want);
    let want = (wte.get(1)? + wpe.get(1)?)?.to_vec1::<f32>()?;
    assert_eq!(h.get(0)?.get(1)?.to_vec1::<f32>()?, want);
    // A sequence longer than the table is refused by shape, naming both.
    let e = parse(text, &[5], 2)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("layer 1 (positions)") && e.contains("max = 4"),
        "{e}"
    );
    Ok(())
}

/// A strided 16-bit convolution on the CPU (bf16-true and bf16-mixed),
/// plain or grouped (depthwise, two outputs a channel), is the fp32
/// convolution of the rounded operands, bias added, rounded once, on
/// Redline's fused kernels: the output is candle's fp32 convolution of the
/// same operands to within one bf16 rounding, dx comes back in bf16 equal
/// to candle's gradient of the same within bf16's rounding, and the
/// gradient reaches the weight.
#[test]
fn strided_bf16_convolutions_are_the_fp32_convolution_of_rounded_operands() -> Result<()> {
    for (out, groups) in [(5, 1), (6, 3)] {
        let text = format!(
            "[model]\nlayers = [{{ type = \"conv2d\", out = {out}, kernel = 3, padding = 1, \
             stride = 2, groups = {groups} }}]"
        );
        for precision in [Precision::Bf16True, Precision::Bf16Mixed] {
            let what = format!("{precision:?}, {groups} groups");
            let mut init = Initializer::new(0, &redline_core::Device::cpu(), precision);
            // 9x9: candle's strided dx (the reference) has the input's size
            // only where the windows end on its last row and column.
            let model = parse(&text, &[3, 9, 9], 1)?.build(&mut init)?;
            let get = |n: &str| -> Result<Tensor> {
                let p = model.params().get(n).map(|v| v.as_tensor().clone());
                p.ok_or_else(|| Error::Config(format!("no {n}")))
            };
            let round = |t: &Tensor| -> Result<Tensor> {
                Ok(t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?)
            };
            let (w, b) = (round(&get("0.weight")?)?, round(&get("0.bias")?)?);
            let x = Tensor::arange(0f32, 486.0, &Device::Cpu)?
                .reshape((2, 3, 9, 9))?
                .sin()?;
            let x = x.to_dtype(DType::BF16)?;
            let xv = candle_core::Var::from_tensor(&x)?;
            let xr = candle_core::Var::from_tensor(&round(&x)?)?;
            let want32 = xr
                .as_tensor()
                .conv2d(&w, 1, 2, 1, groups)?
                .broadcast_add(&b.reshape((1, out, 1, 1))?)?;
            let want = round(&want32)?;
            let got = model.forward_t(xv.as_tensor(), true)?;
            assert_eq!(
                (got.dims(), got.dtype()),
                (&[2, out, 5, 5][..], DType::BF16)
            );
            let got = got.to_dtype(DType::F32)?;
            close(&what, &got, &want)?;
            // bf16 values: the output's cast hands the layer its gradient
            // rounded to bf16.
            let up = round(
                &Tensor::arange(0f32, (50 * out) as f32, &Device::Cpu)?
                    .reshape((2, out, 5, 5))?
                    .cos()?,
            )?;
            let grads = (&got * &up)?.sum_all()?.backward()?;
            let dx = grads.get(xv.as_tensor());
            assert_eq!(
                dx.map(|t| t.dtype()),
                Some(DType::BF16),
                "{what}: dx in the input's dtype"
            );
            let want_dx = (&want32 * &up)?.sum_all()?.backward()?;
            let want_dx = want_dx.get(xr.as_tensor()).map(round).transpose()?;
            match (dx, want_dx) {
                (Some(dx), Some(want_dx)) => close(&what, &dx.to_dtype(DType::F32)?, &want_dx)?,
                _ => panic!("{what}: no dx"),
            }
            let dw = grads.get(&get("0.weight")?).map(|t| t.dims().to_vec());
            assert_eq!(dw, Some(vec![out, 3 / groups, 3, 3]), "{what}: dW");
        }
    }
    Ok(())
}

/// `got` within one bf16 rounding of `want`, element by element.
fn close(what: &str, got: &Tensor, want: &Tensor) -> Result<()> {
    let (g, w8) = (
        got.flatten_all()?.to_vec1::<f32>()?,
        want.flatten_all()?.to_vec1::<f32>()?,
    );
    assert_eq!(g.len(), w8.len(), "{what}: sizes");
    for (i, (a, e)) in g.iter().zip(&w8).enumerate() {
        assert!(
            (a - e).abs() <= e.abs() / 128.0 + 1e-5,
            "{what} [{i}]: {a} vs {e}"
        );
    }
    Ok(())
}
