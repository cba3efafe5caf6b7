//! The golden checks on the first GPU (`golden.rs`' `mod cuda`, in its own
//! file): run on a GPU machine with
//! `cargo test --release --features cuda -p redline-train --test golden cuda_`,
//! or as `golden cuda_` from `scripts/gpu-bundle.sh`'s bundle.

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
    let vjp = |stage: Stage, names: &[&str], input: &Tensor, up: Option<&Tensor>, dev: &Device| {
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

/// Streamed images cross to the GPU as bytes (a quarter of fp32's) through
/// the pinned slots and the copy stream, and are normalised there after the
/// batch's fence: the batches equal the CPU's, whose gather normalises as
/// it writes, bit for bit (issue 48's item 4). Random crops and flips, every
/// byte value, a partial last batch.
#[test]
fn cuda_streamed_images_cross_as_bytes_and_equal_the_cpus() {
    use redline_data::stage::stage_for;
    use redline_data::stream::{worker_pool, ChannelNorm, Streamed, Transform, View};
    let tmp = tempfile::tempdir().unwrap();
    for (class, n) in [("a", 7u32), ("b", 6)] {
        std::fs::create_dir_all(tmp.path().join(class)).unwrap();
        for i in 0..n {
            let img = image::RgbImage::from_fn(40 + i, 36, |x, y| {
                let p = (y * 40 + x * 3 + i * 17) as u8;
                image::Rgb([p, p.wrapping_add(85), 255 - p])
            });
            img.save(tmp.path().join(class).join(format!("{i}.png")))
                .unwrap();
        }
    }
    let (list, _) = redline_data::image_folder::listing(tmp.path(), None).unwrap();
    let view = View {
        transform: Transform::RandomResizedCrop {
            size: 32,
            hflip: true,
        },
        norm: ChannelNorm::IMAGENET,
        channels: 3,
        side: (32, 32),
        skip_bad: false,
    };
    let s = Streamed::new(Arc::new(list), view, worker_pool(2).unwrap(), 5).unwrap();
    let gpu = on(true).candle().clone();
    let mut on_gpu = stage_for(&gpu, &s, 8, 2).unwrap();
    let mut on_cpu = stage_for(&CDevice::Cpu, &s, 8, 2).unwrap();
    let order: Vec<u32> = (0..13).rev().collect();
    for (slot, idx) in order.chunks(8).enumerate() {
        let staged = on_gpu.stage(slot, &s, idx).unwrap();
        assert_eq!(staged.x.dtype(), candle_core::DType::U8, "bytes cross");
        let (x, y) = staged.ready().unwrap();
        let (cx, cy) = on_cpu.stage(slot, &s, idx).unwrap().ready().unwrap();
        assert_eq!(x.dims(), cx.dims());
        let flat = |t: &candle_core::Tensor| {
            t.to_device(&CDevice::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        assert_eq!(flat(&x), flat(&cx), "batch {slot}");
        assert_eq!(
            y.to_device(&CDevice::Cpu)
                .unwrap()
                .to_vec1::<u32>()
                .unwrap(),
            cy.to_vec1::<u32>().unwrap()
        );
    }
}
