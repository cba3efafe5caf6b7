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
mod cuda {
    use super::*;

    #[test]
    fn cuda_mlp_forward_and_gradients_match_pytorch() {
        first_batch_check_on("mlp", 1e-5, 1e-5, &on(true));
    }

    /// The CNN's first batch against PyTorch's on CUDA (cuDNN, fp32, no
    /// TF32: `tools/reference/cnn_ties.py --write`). Against the CPU golden
    /// the conv gradients differ by up to 0.87%, and PyTorch's own CUDA run
    /// differs from it by the same amounts
    /// (`bench/results/h100-2026-11-25/7-cnn-ties-torch-cuda.log`): max
    /// pooling routes each window's gradient to one maximum, the first
    /// batch's flat backgrounds tie or nearly tie tens of thousands of
    /// windows, and a GPU convolution's fp32 sums (about 1e-6 of the largest
    /// output off the CPU's) settle some of them the other way.
    #[test]
    fn cuda_cnn_forward_and_gradients_match_pytorch() {
        first_batch_check_against(
            "cnn",
            "cnn_cuda_first_batch.safetensors",
            1e-5,
            1e-5,
            &on(true),
        );
    }

    /// The CNN with the fused GPU kernels (implicit-GEMM convolution, then
    /// bias, pooling and ReLU in one kernel): forward, gradients, and 8 Adam
    /// steps eagerly and as a CUDA graph, at the CPU's tolerances.
    #[test]
    fn cuda_cnn_matches_pytorch_with_the_fused_kernels() {
        redline_kernels::fused_gpu::set_conv_cudnn(false);
        check_cnn_fused(false);
    }

    /// The CNN's first batch with the fused kernels on, its convolutions on
    /// cuDNN or on Redline's kernels (`cudnn`, checked by what the kernels
    /// recorded), then 8 Adam steps with them eagerly and as a CUDA graph.
    fn check_cnn_fused(cudnn: bool) {
        use redline_kernels::fused_gpu::take_conv_ran;
        redline_kernels::fused_gpu::set_enabled(true);
        take_conv_ran();
        first_batch_check_against(
            "cnn",
            "cnn_cuda_first_batch.safetensors",
            1e-5,
            1e-5,
            &on(true),
        );
        assert_eq!(take_conv_ran(), (cudnn, !cudnn), "(cuDNN, Redline's) ran");
        redline_kernels::fused_gpu::set_enabled(false);
        for graph in [redline_train::GraphMode::Off, redline_train::GraphMode::On] {
            check_cnn_adam_with(
                &on(true),
                TrainConfig {
                    cuda_graph: graph,
                    fused_kernels: redline_train::GraphMode::On,
                    ..steps_config(8)
                },
            );
        }
    }

    /// `--gpu-conv cudnn`: the CNN's first batch, then 8 Adam steps eagerly
    /// and as a CUDA graph (cuDNN's calls inside the captured step), at the
    /// CPU's tolerances. The switch is reset even if a check fails.
    #[test]
    fn cuda_cnn_matches_pytorch_through_cudnn() {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                redline_kernels::fused_gpu::set_conv_cudnn(false);
                redline_kernels::fused_gpu::set_enabled(false);
            }
        }
        let _reset = Reset;
        redline_train::set_gpu_conv("cudnn").unwrap_or_else(|e| panic!("{e}"));
        check_cnn_fused(true);
    }

    /// The CNN's 8 Adam steps captured as a CUDA graph on candle's ops.
    #[test]
    fn cuda_cnn_adam_matches_pytorch_as_a_cuda_graph() {
        check_cnn_adam_with(
            &on(true),
            TrainConfig {
                cuda_graph: redline_train::GraphMode::On,
                ..steps_config(8)
            },
        );
    }

    /// The generic CNN's stages (`GENERIC_CNN`, then the loss): forward and
    /// backward run on the CPU; each stage's vector-Jacobian product then
    /// runs on `gpu` from the CPU's stage input and upstream gradient.
    /// Returns each stage's gradient errors (input and parameters), GPU
    /// against CPU.
    fn generic_cnn_stages(
        init: &std::collections::HashMap<String, candle_core::Tensor>,
        x: &candle_core::Tensor,
        y: &candle_core::Tensor,
        cpu: &Device,
        gpu: &Device,
    ) -> Vec<(String, f64)> {
        use candle_core::{Tensor, Var};
        // The vjp of `stage` at `input` with upstream `up` (none: the
        // loss's) on `dev`: the input's gradient and the parameters', on
        // the CPU.
        let vjp =
            |stage: Stage, names: &[&str], input: &Tensor, up: Option<&Tensor>, dev: &Device| {
                let d = dev.candle();
                let var = |t: &Tensor| Var::from_tensor(&t.to_device(d).unwrap()).unwrap();
                let iv = var(input);
                let pv: Vec<Var> = names.iter().map(|n| var(&init[*n])).collect();
                let pt: Vec<Tensor> = pv.iter().map(|v| v.as_tensor().clone()).collect();
                let out = stage(iv.as_tensor(), &pt);
                let loss = match up {
                    Some(u) => (&out * u.to_device(d).unwrap()).unwrap().sum_all().unwrap(),
                    None => mean_cross_entropy(&out, y),
                };
                let g = loss.backward().unwrap();
                let cpu_of = |v: &Var| {
                    g.get(v.as_tensor())
                        .unwrap()
                        .to_device(&CDevice::Cpu)
                        .unwrap()
                };
                std::iter::once(&iv)
                    .chain(&pv)
                    .map(cpu_of)
                    .collect::<Vec<_>>()
            };
        // Forward on the CPU, keeping each stage's input.
        let mut inputs = vec![x.clone()];
        for (_, stage, names) in GENERIC_CNN {
            let params: Vec<_> = names.iter().map(|n| init[*n].clone()).collect();
            inputs.push(stage(inputs.last().unwrap(), &params));
        }
        // Backward stage by stage on the CPU, comparing the GPU's vjp.
        let mut up: Option<Tensor> = None;
        let mut errs = Vec::new();
        for (i, (name, stage, names)) in GENERIC_CNN.into_iter().enumerate().rev() {
            let on_cpu = vjp(stage, names, &inputs[i], up.as_ref(), cpu);
            let on_gpu = vjp(stage, names, &inputs[i], up.as_ref(), gpu);
            for (k, (a, b)) in on_gpu.iter().zip(&on_cpu).enumerate() {
                let what = if k == 0 { "input" } else { names[k - 1] };
                errs.push((format!("{name} {what} grad"), max_rel(a, b)));
            }
            up = Some(on_cpu[0].clone());
        }
        errs
    }

    /// A step that claims to be capturable but reads its loss back to the
    /// host every step: its capture must fail.
    struct HostRead(Classifier<Box<dyn Model>>);

    impl redline_train::TrainStep for HostRead {
        fn params(&self) -> &redline_models::Params {
            self.0.params()
        }
        fn training_step(
            &self,
            batch: &redline_data::Batch,
        ) -> redline_train::Result<redline_train::StepOutput> {
            let out = self.0.training_step(batch)?;
            out.loss
                .to_dtype(candle_core::DType::F32)?
                .to_scalar::<f32>()?;
            Ok(out)
        }
        fn validation_step(
            &self,
            batch: &redline_data::Batch,
        ) -> redline_train::Result<redline_train::StepOutput> {
            self.0.validation_step(batch)
        }
        fn capture_safe(&self) -> std::result::Result<(), String> {
            Ok(())
        }
    }

    /// A capture that fails (a read-back inside the step) leaves the context
    /// usable: the fit goes on eagerly, says why, and matches PyTorch.
    #[test]
    fn cuda_a_failed_capture_falls_back_to_eager_steps() {
        let dev = on(true);
        let losses = Arc::new(Mutex::new(Vec::new()));
        let norms = Arc::new(Mutex::new(Vec::new()));
        let mut trainer = Trainer::builder()
            .config(TrainConfig {
                cuda_graph: redline_train::GraphMode::On,
                ..steps_config(20)
            })
            .optimizer(OptimizerConfig::by_name("adam", 1e-3).unwrap())
            .callback(Box::new(Losses(losses.clone(), norms)))
            .build(
                HostRead(Classifier::new(model("mlp", "mlp_init.safetensors", &dev))),
                dev.clone(),
            )
            .unwrap();
        let fit = trainer
            .fit(&train_loader(64, &dev, Placement::Resident), None)
            .unwrap();
        eprintln!("cuda graph: {}", fit.cuda_graph);
        assert!(
            matches!(fit.cuda_graph, redline_train::GraphStatus::Failed(_)),
            "{}",
            fit.cuda_graph
        );
        check_losses(&losses.lock().unwrap(), &trace("mlp_trace.json"), 1e-5);
    }

    /// Sets the stop flag after step `1`, as a signal would.
    struct StopAt(Arc<std::sync::atomic::AtomicBool>, usize);

    impl redline_train::Callback for StopAt {
        fn name(&self) -> &str {
            "stop-at"
        }
        fn on_event(&mut self, e: &redline_train::Event<'_>) -> Result<(), String> {
            if matches!(e, redline_train::Event::StepEnd { step, .. } if *step == self.1) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        }
    }

    /// Graph mode (a GPU's default) stopped by a signal mid-epoch: its step
    /// checkpoints and the signal's are written, and the run resumed from
    /// the signal's ends with the uninterrupted captured run's weights, bit
    /// for bit (after the resume: two eager warm-up steps, a new capture,
    /// replays). Before, graph mode wrote neither checkpoint and restarted
    /// the epoch at its first batch.
    #[test]
    fn cuda_graph_mode_resumes_mid_epoch_bit_for_bit() {
        use redline_train::checkpoint::{self, CheckpointConfig};
        let dev = on(true);
        let train = train_loader(64, &dev, Placement::Resident);
        let identity =
            std::collections::BTreeMap::from([("model".to_string(), serde_json::json!("mlp"))]);
        let dir = tempfile::tempdir().unwrap();
        let build = |ckpt: bool, stop_at: Option<usize>| -> Trainer {
            let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut b = Trainer::builder()
                .config(TrainConfig {
                    cuda_graph: redline_train::GraphMode::On,
                    ..steps_config(20)
                })
                .optimizer(OptimizerConfig::by_name("adam", 1e-3).unwrap())
                .stop_when(flag.clone());
            if let Some(step) = stop_at {
                b = b.callback(Box::new(StopAt(flag, step)));
            }
            if ckpt {
                b = b.checkpoints(CheckpointConfig {
                    dir: dir.path().to_path_buf(),
                    every: Some(5),
                    keep_last: 10,
                    monitor: None,
                    identity: identity.clone(),
                });
            }
            let m = Classifier::new(model("mlp", "mlp_init.safetensors", &dev));
            b.build(m, dev.clone()).unwrap()
        };
        let bits = |t: &Trainer| -> Vec<(String, Vec<u32>)> {
            t.params()
                .state()
                .map(|(n, v)| {
                    let v = v
                        .as_tensor()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap();
                    (n.to_string(), v.iter().map(|x| x.to_bits()).collect())
                })
                .collect()
        };
        let mut whole = build(false, None);
        whole.fit(&train, None).unwrap();
        let mut first = build(true, Some(12));
        let err = first.fit(&train, None).err();
        assert!(
            matches!(
                err,
                Some(redline_train::Error::Interrupted { step: 12, .. })
            ),
            "{err:?}"
        );
        let steps: Vec<usize> = checkpoint::list(dir.path()).iter().map(|c| c.0).collect();
        assert_eq!(steps, [5, 10, 12], "the step checkpoints and the signal's");
        let mut second = build(true, None);
        let shapes: Vec<(String, Vec<usize>)> = second
            .params()
            .state()
            .map(|(n, v)| (n.to_string(), v.as_tensor().dims().to_vec()))
            .collect();
        let (loaded, refused) = checkpoint::latest_good(dir.path(), &identity, &shapes).unwrap();
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!((loaded.meta.step, loaded.meta.batch), (12, 12));
        second.resume_from(loaded).unwrap();
        let fit = second.fit(&train, None).unwrap();
        eprintln!("cuda graph after the resume: {}", fit.cuda_graph);
        assert!(
            matches!(fit.cuda_graph, redline_train::GraphStatus::Replayed { .. }),
            "{}",
            fit.cuda_graph
        );
        assert_eq!(fit.steps, 20);
        assert!(
            bits(&second) == bits(&whole),
            "weights differ from the uninterrupted run's"
        );
    }

    /// The CNN's eager GPU path (candle's conv2d and its backward, Redline's
    /// generic max pool) against the CPU on the first batch, where plain
    /// image regions tie in the pooling windows: the batch the GPU loader
    /// gives, the whole generic CNN against PyTorch (the CPU's golden on the
    /// CPU, PyTorch's CUDA run on the GPU), and each stage's backward with
    /// the real upstream gradient. Prints every error: the per-layer
    /// evidence of docs/cuda-graphs.md.
    #[test]
    fn cuda_cnn_ops_match_the_cpu_on_real_data() {
        let (gpu, cpu) = (on(true), Device::cpu());
        let init = load("cnn_init.safetensors");
        let batch = train_loader(64, &cpu, Placement::Resident)
            .epoch(0)
            .next()
            .unwrap()
            .unwrap();
        let mut worst = Vec::new();
        // The batch as the GPU's resident loader gives it, against the CPU's.
        let on_gpu = train_loader(64, &gpu, Placement::Resident)
            .epoch(0)
            .next()
            .unwrap()
            .unwrap();
        let gx = on_gpu.x.to_device(&CDevice::Cpu).unwrap();
        worst.push(("batch x (GPU loader)".into(), max_rel(&gx, &batch.x)));
        let (gy, cy) = (
            on_gpu
                .y
                .to_device(&CDevice::Cpu)
                .unwrap()
                .to_dtype(candle_core::DType::F32)
                .unwrap(),
            batch.y.to_dtype(candle_core::DType::F32).unwrap(),
        );
        worst.push(("batch y (GPU loader)".into(), max_rel(&gy, &cy)));
        // The whole CNN from generic ops against PyTorch's first-batch
        // gradients: on the CPU, on the GPU with the CPU's batch, and on the
        // GPU with its loader's batch. The GPU's against PyTorch's CUDA run:
        // the pooling ties settle as they do on a GPU (see
        // `cuda_cnn_forward_and_gradients_match_pytorch`).
        let (want, want_cuda) = (
            load("cnn_first_batch.safetensors"),
            load("cnn_cuda_first_batch.safetensors"),
        );
        for (what, dev, bx, by, want) in [
            ("CPU", &cpu, &batch.x, &batch.y, &want),
            ("GPU, CPU batch", &gpu, &batch.x, &batch.y, &want_cuda),
            ("GPU, GPU batch", &gpu, &on_gpu.x, &on_gpu.y, &want_cuda),
        ] {
            for (name, e) in super::generic_cnn_grads(&init, bx, by, dev, want) {
                worst.push((format!("generic CNN on {what}: {name} vs PyTorch"), e));
            }
        }
        // Stage by stage with the real upstream gradients: each stage's
        // vector-Jacobian product on the GPU from the CPU's input and
        // upstream gradient, against the CPU's.
        for (name, e) in generic_cnn_stages(&init, &batch.x, &batch.y, &cpu, &gpu) {
            worst.push((format!("stage {name}"), e));
        }
        for (what, e) in &worst {
            eprintln!("{what}: max rel error {e:.3e}");
        }
        let bad: Vec<_> = worst.iter().filter(|(_, e)| *e > 1e-5).collect();
        assert!(bad.is_empty(), "{bad:?}");
    }

    #[test]
    fn cuda_mlp_adam_matches_pytorch_resident_and_streaming() {
        check_mlp_adam(&on(true), Placement::Resident);
        check_mlp_adam(&on(true), Placement::Streaming);
    }

    #[test]
    fn cuda_cnn_adam_matches_pytorch() {
        check_cnn_adam(&on(true));
    }

    /// The MLP with PyTorch's initial weights and Adam 1e-3 on cuda:0 under
    /// `cfg`, with `callback` attached when given.
    fn mlp_adam_trainer(
        cfg: TrainConfig,
        callback: Option<Box<dyn redline_train::Callback>>,
    ) -> Trainer {
        let dev = on(true);
        let mut builder = Trainer::builder()
            .config(cfg)
            .optimizer(OptimizerConfig::by_name("adam", 1e-3).unwrap());
        if let Some(cb) = callback {
            builder = builder.callback(cb);
        }
        builder
            .build(
                Classifier::new(model("mlp", "mlp_init.safetensors", &dev)),
                dev.clone(),
            )
            .unwrap()
    }

    /// A fit's GPU busy figure, which must have been measured.
    fn measured_busy(fit: &redline_train::FitSummary) -> redline_train::GpuBusy {
        let busy = match &fit.gpu_busy {
            Some(Ok(b)) => b.clone(),
            other => panic!("no GPU busy figure: {other:?}"),
        };
        eprintln!("{}", busy.line());
        busy
    }

    /// GPU busy from CUPTI's kernel records: present, within (0, 100], and
    /// counting the dozens of kernels an eager MLP step launches.
    #[test]
    fn cuda_fit_reports_gpu_busy_from_the_kernel_trace() {
        let dev = on(true);
        let mut trainer = mlp_adam_trainer(steps_config(30), None);
        let fit = trainer
            .fit(&train_loader(64, &dev, Placement::Resident), None)
            .unwrap();
        let busy = measured_busy(&fit);
        for r in &busy.top {
            eprintln!("  {:>6} {:>10.3} ms  {}", r.calls, r.total_ms, r.name);
        }
        assert_eq!(busy.steps, 30);
        assert!(
            busy.percent > 0.0 && busy.percent <= 100.0,
            "{}",
            busy.percent
        );
        assert!(busy.kernels_per_step >= 10.0, "{}", busy.kernels_per_step);
        assert!(busy.mean_kernel_us > 0.0);
        assert!(!busy.top.is_empty());
        let profile = trainer.finish_profile().unwrap();
        assert_eq!(profile.breakdown.gpu.as_ref(), Some(&busy));
        // A second fit in the same process traces again.
        let again = trainer
            .fit(&train_loader(64, &dev, Placement::Resident), None)
            .unwrap();
        assert!(
            matches!(again.gpu_busy, Some(Ok(_))),
            "{:?}",
            again.gpu_busy
        );
    }

    /// The MLP's 20 Adam steps on cuda:0 under `cfg`: PyTorch's losses and
    /// final weights; returns how the step ran.
    fn check_mlp_adam_config(cfg: TrainConfig, placement: Placement) -> redline_train::GraphStatus {
        let dev = on(true);
        let losses = Arc::new(Mutex::new(Vec::new()));
        let norms = Arc::new(Mutex::new(Vec::new()));
        let mut trainer = mlp_adam_trainer(cfg, Some(Box::new(Losses(losses.clone(), norms))));
        let fit = trainer
            .fit(&train_loader(64, &dev, placement), None)
            .unwrap();
        check_losses(&losses.lock().unwrap(), &trace("mlp_trace.json"), 1e-5);
        eprintln!("cuda graph: {}", fit.cuda_graph);
        let want = load("mlp_final.safetensors");
        for (name, var) in trainer.params().iter() {
            let got = var.as_tensor().to_device(&CDevice::Cpu).unwrap();
            let r = max_rel(&got, &want[name]);
            assert!(r < 1e-4, "{}: {name}: rel {r:e}", fit.cuda_graph);
        }
        fit.cuda_graph
    }

    /// The MLP's 20 Adam steps with the step captured as a CUDA graph (2
    /// eager warm-up steps, the capture, 17 replays): PyTorch's losses and
    /// weights, as eagerly.
    #[test]
    fn cuda_mlp_adam_matches_pytorch_as_a_cuda_graph() {
        // Resident: the cursor draws each batch inside the graph; streaming:
        // each batch is copied into the graph's static buffers.
        for placement in [Placement::Resident, Placement::Streaming] {
            let status = check_mlp_adam_config(
                TrainConfig {
                    cuda_graph: redline_train::GraphMode::On,
                    ..steps_config(20)
                },
                placement,
            );
            assert!(
                matches!(
                    status,
                    redline_train::GraphStatus::Replayed {
                        captured_at: 3,
                        replays: 18,
                        nodes: Some(_)
                    }
                ),
                "{placement:?}: {status}"
            );
        }
    }

    /// Without kernel records (`--kernel-trace off` here, no libcupti on a
    /// user's machine), a replayed graph's CUDA-event times give GPU busy.
    #[test]
    fn cuda_graph_replays_give_gpu_busy_without_the_kernel_trace() {
        let dev = on(true);
        let cfg = TrainConfig {
            cuda_graph: redline_train::GraphMode::On,
            kernel_trace: false,
            ..steps_config(40)
        };
        let mut trainer = mlp_adam_trainer(cfg, None);
        let fit = trainer
            .fit(&train_loader(64, &dev, Placement::Resident), None)
            .unwrap();
        let busy = measured_busy(&fit);
        assert_eq!(busy.source, "graph replay events");
        assert!(
            busy.percent > 0.0 && busy.percent <= 100.0,
            "{}",
            busy.percent
        );
        assert!(busy.note.contains("--kernel-trace off"), "{}", busy.note);
    }

    /// The same with the multi-tensor optimizer kernel (issue 13), eagerly
    /// and captured in the graph.
    #[test]
    fn cuda_mlp_adam_matches_pytorch_with_the_fused_optimizer() {
        for graph in [redline_train::GraphMode::Off, redline_train::GraphMode::On] {
            let status = check_mlp_adam_config(
                TrainConfig {
                    cuda_graph: graph,
                    fused_kernels: redline_train::GraphMode::On,
                    ..steps_config(20)
                },
                Placement::Resident,
            );
            assert_eq!(
                matches!(status, redline_train::GraphStatus::Replayed { .. }),
                graph == redline_train::GraphMode::On,
                "{status}"
            );
        }
    }
}
