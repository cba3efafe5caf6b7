//! Numerics against PyTorch: golden files made by `tools/reference/make_golden.py`
//! (torch 2.15 CPU, fp32): from a fixed init, N optimizer steps over the first
//! N*64 training images in file order. We check one forward pass (logits), the
//! gradients of one backward, every step's loss and the final weights.

// Tests may panic on unexpected values: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::Device as CDevice;
use common::{
    check_losses, check_series, flat, golden, load, max_rel, rel_l2, root, steps_config, trace,
    Losses,
};
use redline_core::{Device, Precision};
use redline_data::{Loader, LoaderConfig, Normalize, Placement, Split, SplitKind};
use redline_models::{Model, ModelConfig};
use redline_train::{
    loss::cross_entropy, Classifier, GradClip, OptimizerConfig, TrainConfig, Trainer,
};

/// The device the golden checks run on: the CPU, or (CUDA build, `cuda_*`
/// tests) the first GPU.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn on(gpu: bool) -> Device {
    if gpu {
        Device::resolve(redline_core::DeviceSpec::Cuda(0)).unwrap()
    } else {
        Device::cpu()
    }
}

/// The zoo's `mlp` or `cnn`, or `seq`: the model file `seq_model.toml`
/// (the layer set) shaped for Fashion-MNIST.
fn config(kind: &str) -> ModelConfig {
    if kind == "seq" {
        let file = golden("seq_model.toml");
        return ModelConfig::for_data(file.to_str().unwrap(), &[1, 28, 28], 10, None).unwrap();
    }
    ModelConfig::by_name(kind).unwrap()
}

fn model(kind: &str, init: &str, dev: &Device) -> Box<dyn Model> {
    let m = config(kind).build(dev, Precision::Fp32, 0).unwrap();
    m.params().load_safetensors(&golden(init)).unwrap();
    m
}

fn train_loader(batch: usize, dev: &Device, placement: Placement) -> Loader {
    let dir = root().join("data/fashion-mnist");
    let split = Split::load(
        &dir,
        SplitKind::Train,
        10,
        Normalize::default(),
        &CDevice::Cpu,
    )
    .unwrap();
    let cfg = LoaderConfig {
        batch_size: batch,
        shuffle: false,
        seed: 0,
        prefetch: 0,
        drop_last: false,
    };
    Loader::placed(split, dev.candle(), placement, cfg).unwrap()
}

/// Runs the reference's training: `steps` steps, file order, batch 64, no validation.
fn run(kind: &str, init: &str, opt: OptimizerConfig, steps: usize) -> (Box<dyn Model>, Vec<f64>) {
    run_on(kind, init, opt, steps, &Device::cpu(), Placement::Resident)
}

fn run_on(
    kind: &str,
    init: &str,
    opt: OptimizerConfig,
    steps: usize,
    dev: &Device,
    placement: Placement,
) -> (Box<dyn Model>, Vec<f64>) {
    let cfg = steps_config(steps);
    run_with(kind, init, opt, cfg, 64, dev, placement)
}

/// `run_on` with any loop settings and batch size.
fn run_with(
    kind: &str,
    init: &str,
    opt: OptimizerConfig,
    cfg: TrainConfig,
    batch: usize,
    dev: &Device,
    placement: Placement,
) -> (Box<dyn Model>, Vec<f64>) {
    let (model, losses, _) = run_logged(kind, init, opt, cfg, batch, dev, placement);
    (model, losses)
}

/// `run_with`, also returning the logged gradient norms.
fn run_logged(
    kind: &str,
    init: &str,
    opt: OptimizerConfig,
    cfg: TrainConfig,
    batch: usize,
    dev: &Device,
    placement: Placement,
) -> (Box<dyn Model>, Vec<f64>, Vec<f64>) {
    let losses = Arc::new(Mutex::new(Vec::new()));
    let norms = Arc::new(Mutex::new(Vec::new()));
    let mut trainer = Trainer::builder()
        .config(cfg)
        .optimizer(opt)
        .callback(Box::new(Losses(losses.clone(), norms.clone())))
        .build(Classifier::new(model(kind, init, dev)), dev.clone())
        .unwrap();
    trainer
        .fit(&train_loader(batch, dev, placement), None)
        .unwrap();
    let got = losses.lock().unwrap().clone();
    // Hand the model back by re-reading its parameters into a fresh one.
    let out = config(kind)
        .build(&Device::cpu(), Precision::Fp32, 0)
        .unwrap();
    out.params()
        .assign(&trainer.params().to_map(), Path::new("trained"))
        .unwrap();
    let norms = norms.lock().unwrap().clone();
    (out, got, norms)
}

fn first_batch_check(kind: &str, logits_tol: f64, grad_tol: f64) {
    first_batch_check_on(kind, logits_tol, grad_tol, &Device::cpu());
}

fn first_batch_check_on(kind: &str, logits_tol: f64, grad_tol: f64, dev: &Device) {
    first_batch_check_against(
        kind,
        &format!("{kind}_first_batch.safetensors"),
        logits_tol,
        grad_tol,
        dev,
    );
}

/// [`first_batch_check_on`] against the golden file `golden`.
fn first_batch_check_against(
    kind: &str,
    golden: &str,
    logits_tol: f64,
    grad_tol: f64,
    dev: &Device,
) {
    let m = model(kind, &format!("{kind}_init.safetensors"), dev);
    let want = load(golden);
    let batch = train_loader(64, dev, Placement::Resident)
        .epoch(0)
        .next()
        .unwrap()
        .unwrap();
    // Training mode, as the reference's step (batch norm uses the batch's statistics).
    let logits = m.forward_t(&batch.x, true).unwrap();
    assert!(
        max_rel(&logits, &want["logits"]) < logits_tol,
        "logits {:e}",
        max_rel(&logits, &want["logits"])
    );
    let loss = cross_entropy(&logits, &batch.y).unwrap();
    let l = loss.to_scalar::<f32>().unwrap();
    let wl = flat(&want["loss"])[0];
    assert!(((l - wl) / wl).abs() < 1e-5, "loss {l} vs {wl}");
    // The gradients land in the parameters' `.grad` (fused kernels or the
    // GradStore, moved): the one place the optimizer reads them.
    m.params().backward(&loss).unwrap();
    let errs: Vec<(String, f64)> = m
        .params()
        .iter()
        .map(|(name, _)| {
            let g = m.params().grad(name).unwrap().unwrap();
            let torch = &want[&format!("grad.{name}")];
            let Some(exact) = want.get(&format!("grad64.{name}")) else {
                return (name.to_string(), max_rel(&g, torch));
            };
            // Where the reference has float64 gradients (backprop through
            // batch statistics cancels digits), ours are held to the exact ones.
            let (ours, theirs) = (max_rel(&g, exact), max_rel(torch, exact));
            eprintln!("{name}: ours {ours:.2e}, PyTorch fp32 {theirs:.2e} from float64");
            (name.to_string(), ours)
        })
        .collect();
    assert!(
        errs.iter().all(|(_, r)| *r < grad_tol),
        "gradient rel errors: {errs:?}"
    );
}

#[test]
fn mlp_forward_and_gradients_match_pytorch() {
    first_batch_check("mlp", 1e-5, 1e-5);
}

/// 20 Adam steps of the MLP on `dev`, fed `placement`-wise, against PyTorch.
fn check_mlp_adam(dev: &Device, placement: Placement) {
    let (m, losses) = run_on(
        "mlp",
        "mlp_init.safetensors",
        OptimizerConfig::by_name("adam", 1e-3).unwrap(),
        20,
        dev,
        placement,
    );
    check_losses(&losses, &trace("mlp_trace.json"), 1e-5);
    let want = load("mlp_final.safetensors");
    for (name, var) in m.params().iter() {
        let r = max_rel(var.as_tensor(), &want[name]);
        assert!(r < 1e-4, "{placement}: {name}: rel {r:e}");
    }
}

/// 8 Adam steps of the CNN on `dev` against PyTorch.
fn check_cnn_adam(dev: &Device) {
    check_cnn_adam_with(dev, steps_config(8));
}

/// The CNN's 8 Adam steps under `cfg` (8 steps): PyTorch's losses and updates.
fn check_cnn_adam_with(dev: &Device, cfg: TrainConfig) {
    // On a GPU the pooling ties settle as PyTorch's CUDA run settles them,
    // not as the CPU golden's (see `cuda_cnn_forward_and_gradients_match_pytorch`):
    // the losses drift from the CPU trace by about 1e-5 by step 5.
    let loss_tol = if dev.is_cpu() { 1e-5 } else { 1e-4 };
    eprintln!("CNN Adam on {dev}: loss tolerance {loss_tol:e} against the CPU trace");
    let (m, losses) = run_with(
        "cnn",
        "cnn_init.safetensors",
        OptimizerConfig::by_name("adam", 1e-3).unwrap(),
        cfg,
        64,
        dev,
        Placement::Resident,
    );
    check_losses(&losses, &trace("cnn_trace.json"), loss_tol);
    // Adam divides by sqrt(v): tiny gradients amplify rounding, so compare the
    // weight *updates* by relative L2 rather than weights elementwise.
    let (init, want) = (load("cnn_init.safetensors"), load("cnn_final.safetensors"));
    for (name, var) in m.params().iter() {
        let ours = (var.as_tensor() - &init[name]).unwrap();
        let theirs = (&want[name] - &init[name]).unwrap();
        let r = rel_l2(&ours, &theirs);
        // Measured on the CPU: 7.1e-6 worst (fc1.weight). On a GPU the tied
        // pooling windows move the conv gradients by up to 0.9%, and Adam's
        // division by sqrt(v) magnifies that in the small conv biases: 8.5e-2
        // for conv1.bias on an H100, 8.3e-3 for conv1.weight
        // (bench/results/h100-2026-11-25/9-golden-cuda.log). A CUDA trace
        // golden of PyTorch's own 8 steps is the tighter check still to come.
        let tol = if dev.is_cpu() { 1e-4 } else { 0.15 };
        if !dev.is_cpu() {
            eprintln!("{name}: update rel L2 {r:e} from the CPU golden's");
        }
        assert!(r < tol, "{name}: update rel L2 {r:e}");
    }
}

/// One stage of the generic CNN: `(input, parameters) -> output`.
type Stage = fn(&candle_core::Tensor, &[candle_core::Tensor]) -> candle_core::Tensor;

fn conv_stage(h: &candle_core::Tensor, p: &[candle_core::Tensor]) -> candle_core::Tensor {
    redline_kernels::conv2d_generic(h, &p[0], &p[1], 1).unwrap()
}

fn pool_stage(h: &candle_core::Tensor, _: &[candle_core::Tensor]) -> candle_core::Tensor {
    redline_kernels::max_pool2d_generic(h, 2).unwrap()
}

fn relu_stage(h: &candle_core::Tensor, _: &[candle_core::Tensor]) -> candle_core::Tensor {
    h.relu().unwrap()
}

/// fc1, ReLU, fc2: the logits.
fn head_stage(h: &candle_core::Tensor, p: &[candle_core::Tensor]) -> candle_core::Tensor {
    let lin = |h: &candle_core::Tensor, w: &candle_core::Tensor, b: &candle_core::Tensor| {
        h.matmul(&w.t().unwrap()).unwrap().broadcast_add(b).unwrap()
    };
    let f1 = lin(&h.flatten_from(1).unwrap(), &p[0], &p[1])
        .relu()
        .unwrap();
    lin(&f1, &p[2], &p[3])
}

/// The zoo CNN from candle's generic ops and Redline's generic max pool (the
/// path of every device without fused kernels), stage by stage, with the
/// golden parameters each stage takes.
const GENERIC_CNN: [(&str, Stage, &[&str]); 7] = [
    ("conv1", conv_stage, &["conv1.weight", "conv1.bias"]),
    ("pool1", pool_stage, &[]),
    ("relu1", relu_stage, &[]),
    ("conv2", conv_stage, &["conv2.weight", "conv2.bias"]),
    ("pool2", pool_stage, &[]),
    ("relu2", relu_stage, &[]),
    (
        "head",
        head_stage,
        &["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
    ),
];

/// Mean cross-entropy of `logits` against class labels `y`.
fn mean_cross_entropy(
    logits: &candle_core::Tensor,
    y: &candle_core::Tensor,
) -> candle_core::Tensor {
    let labels = y
        .to_device(logits.device())
        .unwrap()
        .to_dtype(candle_core::DType::U32)
        .unwrap()
        .unsqueeze(1)
        .unwrap();
    let picked = logits.gather(&labels, 1).unwrap().squeeze(1).unwrap();
    (logits.log_sum_exp(candle_core::D::Minus1).unwrap() - picked)
        .unwrap()
        .mean_all()
        .unwrap()
}

/// The generic CNN's first-batch logits and gradients on `dev`, each
/// against `want` (max rel error).
fn generic_cnn_grads(
    init: &std::collections::HashMap<String, candle_core::Tensor>,
    x: &candle_core::Tensor,
    y: &candle_core::Tensor,
    dev: &Device,
    want: &std::collections::HashMap<String, candle_core::Tensor>,
) -> Vec<(String, f64)> {
    use candle_core::Var;
    let var = |n: &str| Var::from_tensor(&init[n].to_device(dev.candle()).unwrap()).unwrap();
    let mut vars: Vec<(&str, Var)> = Vec::new();
    let mut h = x.to_device(dev.candle()).unwrap();
    for (_, stage, names) in GENERIC_CNN {
        let params: Vec<_> = names.iter().map(|n| var(n)).collect();
        let tensors: Vec<_> = params.iter().map(|v| v.as_tensor().clone()).collect();
        h = stage(&h, &tensors);
        vars.extend(names.iter().copied().zip(params));
    }
    let grads = mean_cross_entropy(&h, y).backward().unwrap();
    let cpu = |t: &candle_core::Tensor| t.to_device(&CDevice::Cpu).unwrap();
    let mut out = vec![("logits".to_string(), max_rel(&cpu(&h), &want["logits"]))];
    for (n, v) in vars {
        let g = cpu(grads.get(v.as_tensor()).unwrap());
        out.push((n.to_string(), max_rel(&g, &want[&format!("grad.{n}")])));
    }
    out
}

/// The CNN from candle's generic ops and Redline's generic max pool (the
/// path of every device without fused kernels) against PyTorch on the CPU.
#[test]
fn generic_cnn_ops_match_pytorch() {
    let batch = train_loader(64, &Device::cpu(), Placement::Resident)
        .epoch(0)
        .next()
        .unwrap()
        .unwrap();
    let errs = generic_cnn_grads(
        &load("cnn_init.safetensors"),
        &batch.x,
        &batch.y,
        &Device::cpu(),
        &load("cnn_first_batch.safetensors"),
    );
    assert!(errs.iter().all(|(_, e)| *e < 1e-5), "{errs:?}");
}

#[test]
fn mlp_adam_matches_pytorch() {
    check_mlp_adam(&Device::cpu(), Placement::Resident);
}

#[test]
fn mlp_adam_matches_pytorch_when_streamed() {
    check_mlp_adam(&Device::cpu(), Placement::Streaming);
}

#[test]
fn mlp_adamw_matches_pytorch() {
    let opt = OptimizerConfig::AdamW {
        lr: 1e-3,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let (m, losses) = run("mlp", "mlp_init.safetensors", opt, 20);
    check_losses(&losses, &trace("mlp_adamw_trace.json"), 1e-5);
    let want = load("mlp_adamw_final.safetensors");
    for (name, var) in m.params().iter() {
        assert!(max_rel(var.as_tensor(), &want[name]) < 1e-4, "{name}");
    }
}

#[test]
fn mlp_sgd_nesterov_matches_pytorch() {
    let opt = OptimizerConfig::Sgd {
        lr: 0.05,
        momentum: 0.9,
        dampening: 0.0,
        nesterov: true,
        weight_decay: 1e-4,
    };
    let (m, losses) = run("mlp", "mlp_init.safetensors", opt, 20);
    check_losses(&losses, &trace("mlp_sgd_trace.json"), 1e-5);
    let want = load("mlp_sgd_final.safetensors");
    for (name, var) in m.params().iter() {
        assert!(max_rel(var.as_tensor(), &want[name]) < 1e-4, "{name}");
    }
}

#[test]
fn cnn_forward_and_gradients_match_pytorch() {
    // Convolutions sum in a different order than oneDNN: measured 3.2e-6 worst (conv1.weight).
    first_batch_check("cnn", 1e-5, 1e-5);
}

#[test]
fn cnn_adam_matches_pytorch() {
    check_cnn_adam(&Device::cpu());
}

/// The CNN's first batch through the generic ops a GPU runs without fused
/// kernels (candle's im2col convolution, Redline's max-pool built from candle
/// primitives, matmul, log-softmax), here on the CPU: the formulas match
/// PyTorch, so a gap on a GPU comes from its arithmetic, not from them.
/// Measured 3.2e-6 worst (conv1.weight).
#[test]
fn cnn_generic_ops_match_pytorch() {
    use candle_core::{DType, Tensor, Var};
    use redline_kernels::{conv2d_generic, max_pool2d_generic};
    let init = load("cnn_init.safetensors");
    let want = load("cnn_first_batch.safetensors");
    let batch = train_loader(64, &Device::cpu(), Placement::Resident)
        .epoch(0)
        .next()
        .unwrap()
        .unwrap();
    let vars: std::collections::HashMap<&str, Var> = init
        .iter()
        .map(|(k, v)| (k.as_str(), Var::from_tensor(v).unwrap()))
        .collect();
    let p = |n: &str| vars[n].as_tensor();
    let mut h = batch.x.clone();
    for c in ["conv1", "conv2"] {
        let y = conv2d_generic(&h, p(&format!("{c}.weight")), p(&format!("{c}.bias")), 1).unwrap();
        h = max_pool2d_generic(&y, 2).unwrap().relu().unwrap();
    }
    let dense = |x: &Tensor, l: &str| {
        x.matmul(&p(&format!("{l}.weight")).t().unwrap())
            .unwrap()
            .broadcast_add(p(&format!("{l}.bias")))
            .unwrap()
    };
    let logits = dense(
        &dense(&h.flatten_from(1).unwrap(), "fc1").relu().unwrap(),
        "fc2",
    );
    assert!(max_rel(&logits, &want["logits"]) < 1e-5);
    let logp = candle_nn::ops::log_softmax(&logits, 1).unwrap();
    let targets = batch.y.to_dtype(DType::U32).unwrap().unsqueeze(1).unwrap();
    let loss = logp
        .gather(&targets, 1)
        .unwrap()
        .mean_all()
        .unwrap()
        .neg()
        .unwrap();
    let grads = loss.backward().unwrap();
    for (name, var) in &vars {
        let g = grads.get(var.as_tensor()).unwrap();
        let r = max_rel(g, &want[&format!("grad.{name}")]);
        assert!(r < 1e-5, "{name}: rel {r:e}");
    }
}

#[test]
fn layer_set_forward_and_gradients_match_pytorch() {
    // Conv (fused with ReLU and max pool), a residual conv + GELU block, a
    // strided residual block with batch norm and a projection shortcut, average
    // pooling, Linear, LayerNorm, ReLU, Dropout(0): PyTorch's nn.Sequential
    // names load as they are. Gradients against float64: measured 7.4e-5 worst
    // (0.bias, below two batch norms), where PyTorch's fp32 gets 1.6e-5; batch
    // norm backpropagates through candle's generic mean/var ops, not PyTorch's
    // closed-form backward.
    first_batch_check("seq", 1e-5, 1e-4);
}

#[test]
fn layer_set_adam_matches_pytorch() {
    let (m, losses) = run(
        "seq",
        "seq_init.safetensors",
        OptimizerConfig::by_name("adam", 1e-3).unwrap(),
        8,
    );
    check_losses(&losses, &trace("seq_trace.json"), 1e-5);
    let (init, want) = (load("seq_init.safetensors"), load("seq_final.safetensors"));
    for (name, var) in m.params().iter() {
        let ours = (var.as_tensor() - &init[name]).unwrap();
        let theirs = (&want[name] - &init[name]).unwrap();
        let r = rel_l2(&ours, &theirs);
        assert!(r < 1e-4, "{name}: update rel L2 {r:e}");
    }
    // Batch norm's running statistics (buffers) after 8 training batches.
    let mut buffers = 0;
    for (name, var) in m.params().state() {
        let t = var.as_tensor();
        if name.ends_with("num_batches_tracked") {
            let n = t.to_scalar::<i64>().unwrap();
            assert_eq!(n, want[name].to_scalar::<i64>().unwrap(), "{name}");
            assert_eq!(n, 8);
            buffers += 1;
        } else if name.contains("running_") {
            let r = max_rel(t, &want[name]);
            assert!(r < 1e-5, "{name}: rel {r:e}");
            buffers += 1;
        }
    }
    assert_eq!(buffers, 6, "two batch norms, three buffers each");
}

/// 20 steps of the MLP with the given loop settings against a PyTorch
/// trace and final weights (`tools/reference/make_golden_grads.py`).
fn check_mlp_grads(name: &str, opt: OptimizerConfig, cfg: TrainConfig, batch: usize) {
    let cfg = TrainConfig {
        epochs: 1,
        max_steps: Some(20),
        log_every: 1,
        validate: false,
        ..cfg
    };
    let (m, losses, norms) = run_logged(
        "mlp",
        "mlp_init.safetensors",
        opt,
        cfg,
        batch,
        &Device::cpu(),
        Placement::Resident,
    );
    let t = trace(&format!("{name}_trace.json"));
    check_losses(&losses, &t, 1e-5);
    if t.get("grad_norms").is_some() {
        check_series(&norms, &t, "grad_norms", 1e-5);
    }
    let want = load(&format!("{name}_final.safetensors"));
    for (p, var) in m.params().iter() {
        let r = max_rel(var.as_tensor(), &want[p]);
        assert!(r < 1e-4, "{name}: {p}: rel {r:e}");
    }
}

#[test]
fn clip_grad_norm_matches_pytorch() {
    // Every step's norm (about 2) is above 0.5: every step is clipped.
    let cfg = TrainConfig {
        clip: Some(GradClip::Norm { max_norm: 0.5 }),
        ..TrainConfig::default()
    };
    let adam = OptimizerConfig::by_name("adam", 1e-3).unwrap();
    check_mlp_grads("mlp_clip_norm", adam, cfg, 64);
}

#[test]
fn clip_grad_value_matches_pytorch() {
    let cfg = TrainConfig {
        clip: Some(GradClip::Value { limit: 0.01 }),
        ..TrainConfig::default()
    };
    let sgd = OptimizerConfig::Sgd {
        lr: 0.05,
        momentum: 0.9,
        dampening: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    check_mlp_grads("mlp_clip_value", sgd, cfg, 64);
}

#[test]
fn four_accumulated_micro_batches_match_pytorch() {
    let cfg = TrainConfig {
        accumulate: 4,
        ..TrainConfig::default()
    };
    let adam = OptimizerConfig::by_name("adam", 1e-3).unwrap();
    check_mlp_grads("mlp_accumulate", adam, cfg, 16);
}

#[test]
fn four_micro_batches_of_16_step_as_one_batch_of_64() {
    // The accumulated run against the plain Adam run's PyTorch weights: the
    // same 20 updates over the same 1280 images, summed in another order.
    let cfg = TrainConfig {
        epochs: 1,
        max_steps: Some(20),
        log_every: 1,
        validate: false,
        accumulate: 4,
        ..TrainConfig::default()
    };
    let adam = OptimizerConfig::by_name("adam", 1e-3).unwrap();
    let dev = Device::cpu();
    let (m, losses) = run_with(
        "mlp",
        "mlp_init.safetensors",
        adam,
        cfg,
        16,
        &dev,
        Placement::Resident,
    );
    check_losses(&losses, &trace("mlp_trace.json"), 1e-5);
    let want = load("mlp_final.safetensors");
    for (name, var) in m.params().iter() {
        let r = max_rel(var.as_tensor(), &want[name]);
        assert!(r < 1e-4, "{name}: rel {r:e}");
    }
}

/// The same checks on the first GPU, fed both ways (run on a GPU machine:
/// `cargo test --release --features cuda -p redline-train --test golden cuda_`).
#[cfg(feature = "cuda")]
#[path = "golden/cuda.rs"]
mod cuda;
