//! `--precision bf16-mixed` and `16-mixed` against PyTorch's CPU autocast
//! (to bfloat16; to float16 with `torch.amp.GradScaler`).
//!
//! bf16-mixed (`bf16_mixed_*` of `tools/reference/make_golden_precision.py`: the
//! fp32 goldens' init, data and steps, forward and loss under
//! `torch.autocast("cpu", bfloat16)`, fp32 master weights and Adam). Bounds,
//! with what this machine measured: losses within 2e-3 relative (the issue
//! asks 1e-2; 4.5e-4 MLP, 3.5e-4 CNN); each weight's update within 5e-3
//! (MLP; 1.5e-4 measured) or 5% (CNN; 3.8% measured, in fc1.bias) relative
//! L2 of PyTorch bf16's, and nearer PyTorch's bf16 run than its fp32 run
//! overall, so a silent fp32 run fails. The CNN's bound is wide because
//! bf16 rounding turns last-bit differences of the sums into flipped ties
//! and flipped signs of near-zero gradients, which Adam turns into whole
//! `lr` steps: at 2 threads the same run measured 4.4e-4.
//!
//! 16-mixed (`fp16_mixed_*` with GradScaler's defaults, `fp16_overflow_*`
//! made to overflow): the scale after every step and the skipped-step count
//! exactly PyTorch's; losses within 1e-3 (1.9e-4 measured); each update
//! within 5e-3 of PyTorch fp16's (1.4e-3 measured; PyTorch's own fp16 and
//! fp32 runs differ by 0.4-4%), and five times nearer it than the fp32 run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{
    fails, golden, golden_job, golden_losses, json, jsonl, rel_l2, step_losses, train_in, weights,
};

/// One compute thread, as PyTorch's references ran. The CPU kernels split
/// their gradient sums by thread, and a 16-bit rounding can turn a last-bit
/// difference of those sums into a tie that pooling breaks the other way:
/// with the default (the cores free at start, which varies with what else
/// runs), the CNN's bf16 update moved 2% on a loaded machine.
const ONE_THREAD: [&str; 2] = ["--threads", "1"];

/// A finished golden job (`golden_job`: the goldens' init, data order and
/// batch) at one thread in `precision`, with `extra` flags, its weights
/// saved: the temporary folder (kept alive), the run folder, the saved
/// weights and stdout.
struct Job {
    _dir: tempfile::TempDir,
    run: std::path::PathBuf,
    out: std::path::PathBuf,
    stdout: String,
}

fn run_job(model: &str, steps: usize, precision: &str, extra: &[&str]) -> Job {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("w.safetensors"));
    let mut args = golden_job(model, 64, steps);
    args.extend(["--precision", precision, "--save", out.to_str().unwrap()].map(String::from));
    args.extend(ONE_THREAD.map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    let stdout = train_in(&run, &args.iter().map(String::as_str).collect::<Vec<_>>());
    Job {
        _dir: dir,
        run,
        out,
        stdout,
    }
}

fn bf16_mixed_matches_autocast(model: &str, steps: usize, loss_tol: f64, update_tol: f32) {
    let Job {
        run,
        out,
        stdout,
        _dir,
    } = run_job(model, steps, "bf16-mixed", &[]);
    let init = golden(&format!("{model}_init.safetensors"));
    assert!(stdout.contains("precision bf16-mixed"), "{stdout}");
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["precision"], "bf16-mixed", "{summary}");
    // The path this CPU takes: Redline's AVX-512 BF16 GEMM where it has
    // the instruction (`--cpu-bf16-gemm auto`), else the fp32 GEMM of the
    // rounded operands.
    let native = std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "avx512_bf16"));
    let path = if native { "vdpbf16ps" } else { "bf16-rounded" };
    assert!(
        summary["precision_path"]
            .as_str()
            .is_some_and(|p| p.contains(path)),
        "{summary}"
    );
    // Timed against fp32 at start, both numbers kept.
    let timing = summary["precision_timing"].as_str().unwrap_or_default();
    assert!(
        timing.contains("ms per step against") && timing.contains("in 32-true"),
        "{summary}"
    );
    assert!(summary["precision_vs_fp32"]
        .as_f64()
        .is_some_and(|r| r > 0.0));
    let report = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(
        report.contains("precision: bf16-mixed on the CPU"),
        "the report's header"
    );
    // The memory split, with fp32 master weights, and both precisions'
    // activations measured at start on the run's batch.
    let mem = &summary["memory"];
    let params: u64 = weights(&init)
        .values()
        .map(|t| t.elem_count() as u64 * 4)
        .sum();
    assert_eq!(mem["parameters"].as_u64(), Some(params), "{summary}");
    assert_eq!(mem["gradients"].as_u64(), Some(params), "{summary}");
    assert_eq!(mem["optimizer"].as_u64(), Some(2 * params), "{summary}");
    assert!(
        mem["activations"].as_u64().is_some_and(|a| a > 0),
        "{summary}"
    );
    let acts = &summary["precision_activations"];
    assert_eq!(acts["batch"].as_u64(), Some(64), "{summary}");
    assert!(
        acts["fp32_bytes"].as_u64().is_some_and(|a| a > 0),
        "{summary}"
    );
    assert!(report.contains("memory: parameters"), "the report's header");
    assert!(stdout.contains("memory: parameters"), "{stdout}");
    let ours = step_losses(&run);
    let torch = golden_losses(&format!("bf16_mixed_{model}_trace.json"));
    assert_eq!(ours.len(), torch.len());
    for (i, (a, b)) in ours.iter().zip(&torch).enumerate() {
        eprintln!("{model} bf16 loss {}: rel {:e}", i + 1, (a - b).abs() / b);
        assert!(
            (a - b).abs() / b < loss_tol,
            "step {}: ours {a}, autocast {b}",
            i + 1
        );
    }
    let (init, w) = (weights(&init), weights(&out));
    let bf16 = weights(&golden(&format!("bf16_mixed_{model}_final.safetensors")));
    let fp32 = weights(&golden(&format!("fp32_{model}_final.safetensors")));
    let (mut to_bf16, mut to_fp32) = (0.0, 0.0);
    // The golden's tensors (the CNN's leaves out fc1.weight, for size).
    for name in bf16.keys() {
        let t = &w[name];
        assert_eq!(
            t.dtype(),
            candle_core::DType::F32,
            "{name}: master weights stay fp32"
        );
        let ours = (t - &init[name]).unwrap();
        let r = rel_l2(&ours, &(&bf16[name] - &init[name]).unwrap());
        eprintln!("{model} bf16 {name}: update vs PyTorch bf16 {r:e}");
        assert!(
            r < update_tol,
            "{model} {name}: update {r:e} from autocast's"
        );
        to_bf16 += r;
        to_fp32 += rel_l2(&ours, &(&fp32[name] - &init[name]).unwrap());
    }
    assert!(
        to_bf16 < to_fp32,
        "{model}: nearer PyTorch's fp32 run ({to_fp32}) than its bf16 run ({to_bf16})"
    );
}

#[test]
fn bf16_mixed_mlp_matches_pytorch_autocast() {
    bf16_mixed_matches_autocast("mlp", 20, 2e-3, 5e-3);
}

#[test]
fn bf16_mixed_cnn_matches_pytorch_autocast() {
    bf16_mixed_matches_autocast("cnn", 20, 5e-3, 0.05);
}

/// `--precision 16-mixed` against PyTorch's fp16 autocast with
/// `torch.amp.GradScaler` (`<prefix>_<model>_*` of
/// make_golden_precision.py). The scale after every step and the count of
/// skipped steps must equal PyTorch's exactly: the overflow run's first
/// steps overflow and back off, then the scale grows every 3 clean steps
/// and overflows again, so a scaler that misses an inf, skips a clean step
/// or grows at the wrong step fails.
fn fp16_mixed_matches_gradscaler(model: &str, steps: usize, prefix: &str, extra: &[&str]) {
    let Job {
        run,
        out,
        stdout,
        _dir,
    } = run_job(model, steps, "16-mixed", extra);
    let init = golden(&format!("{model}_init.safetensors"));
    let trace = json(&golden(&format!("{prefix}_{model}_trace.json")));
    let scales: Vec<f64> = trace["scales"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let skipped = trace["skipped_steps"].as_u64().unwrap();
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["precision"], "16-mixed", "{summary}");
    assert!(
        summary["precision_path"]
            .as_str()
            .is_some_and(|p| p.contains("fp16-rounded") && p.contains("loss scale")),
        "{summary}"
    );
    assert_eq!(
        summary["loss_scale"]["skipped_steps"].as_u64(),
        Some(skipped),
        "{model} {prefix}: skipped steps, PyTorch's {skipped}: {summary}"
    );
    assert_eq!(
        summary["loss_scale"]["scale"].as_f64(),
        scales.last().copied()
    );
    assert!(
        stdout.contains(&format!("{skipped} of {steps} steps skipped on overflow")),
        "{stdout}"
    );
    let records = jsonl(&run.join("metrics.jsonl"));
    let ours_scales: Vec<f64> = records
        .iter()
        .filter(|r| r["kind"] == "step")
        .map(|r| r["loss_scale"].as_f64().unwrap())
        .collect();
    assert_eq!(
        ours_scales, scales,
        "{model} {prefix}: the scale after each step"
    );

    let ours = step_losses(&run);
    let torch = golden_losses(&format!("{prefix}_{model}_trace.json"));
    assert_eq!(ours.len(), torch.len());
    for (i, (a, b)) in ours.iter().zip(&torch).enumerate() {
        eprintln!(
            "{model} {prefix} loss {}: rel {:e}",
            i + 1,
            (a - b).abs() / b
        );
        assert!(
            (a - b).abs() / b < 1e-3,
            "{prefix} step {}: ours {a}, autocast {b}",
            i + 1
        );
    }
    let (init, w) = (weights(&init), weights(&out));
    let fp16 = weights(&golden(&format!("{prefix}_{model}_final.safetensors")));
    let fp32 = weights(&golden(&format!("fp32_{model}_final.safetensors")));
    let (mut to_fp16, mut to_fp32) = (0.0, 0.0);
    // The golden's tensors (the CNN's leaves out fc1.weight, for size).
    for name in fp16.keys() {
        let t = &w[name];
        assert_eq!(
            t.dtype(),
            candle_core::DType::F32,
            "{name}: master weights stay fp32"
        );
        let ours = (t - &init[name]).unwrap();
        let r = rel_l2(&ours, &(&fp16[name] - &init[name]).unwrap());
        let r32 = rel_l2(&ours, &(&fp32[name] - &init[name]).unwrap());
        let torch32 = rel_l2(
            &(&fp16[name] - &init[name]).unwrap(),
            &(&fp32[name] - &init[name]).unwrap(),
        );
        eprintln!(
            "{model} {prefix} {name}: update vs PyTorch fp16 {r:e}, vs its fp32 {r32:e} \
             (PyTorch fp16 vs fp32 {torch32:e})"
        );
        assert!(
            r < 5e-3,
            "{model} {prefix} {name}: update {r:e} from PyTorch's"
        );
        to_fp16 += r;
        to_fp32 += r32;
    }
    assert!(
        to_fp16 * 5.0 < to_fp32,
        "{model} {prefix}: not clearly nearer PyTorch's fp16 run ({to_fp16}) than its fp32 run \
         ({to_fp32})"
    );
}

#[test]
fn fp16_mixed_mlp_matches_pytorch_gradscaler() {
    fp16_mixed_matches_gradscaler("mlp", 20, "fp16_mixed", &[]);
}

#[test]
fn fp16_mixed_mlp_overflows_as_pytorchs_gradscaler() {
    fp16_mixed_matches_gradscaler(
        "mlp",
        20,
        "fp16_overflow",
        &["--loss-scale", "dynamic:init=16777216:interval=3"],
    );
}

/// Lightning's order with accumulation and clipping: every micro-batch's
/// loss scaled by the same scale, the sum unscaled once, then clipped
/// (so the norm is of the true gradients), then the step or its skip.
#[test]
fn fp16_mixed_unscales_before_clipping_and_after_accumulating() {
    fp16_mixed_matches_gradscaler(
        "mlp",
        10,
        "fp16_accum_clip",
        &[
            "--loss-scale",
            "dynamic:init=16777216:interval=3",
            "--accumulate",
            "2",
            "--clip-grad-norm",
            "0.5",
        ],
    );
}

#[test]
fn fp16_mixed_cnn_matches_pytorch_gradscaler() {
    fp16_mixed_matches_gradscaler("cnn", 20, "fp16_mixed", &[]);
}

#[test]
fn fp16_mixed_cnn_overflows_as_pytorchs_gradscaler() {
    fp16_mixed_matches_gradscaler(
        "cnn",
        20,
        "fp16_overflow",
        &["--loss-scale", "dynamic:init=16777216:interval=3"],
    );
}

/// `--precision bf16-true` against PyTorch's bf16 model (Lightning's
/// `HalfPrecision`: `model.to(bfloat16)`, bf16 inputs, Adam over bf16
/// parameters; `tools/reference/make_golden_precision.py`). Everything
/// Redline keeps is bf16: the saved weights, and the memory split counts 2
/// bytes per parameter for the weights, the gradients and each of Adam's
/// moments.
///
/// Two references: `bf16_true_*` computes the loss in bf16 from the bf16
/// logits, as a Lightning `training_step` does; Redline computes every loss
/// in fp32 (the bf16 log-softmax rounds each log-probability by up to 2^-9
/// relative, and its gradient carries that noise), so it is compared with
/// looser bounds there (measured: losses 9.9e-3, updates 3.1e-2 MLP and
/// 6.5e-2 CNN). `bf16_true_fp32_loss_*` takes the loss of `logits.float()`,
/// Redline's choice, which leaves the rest of the bf16 step to check: the
/// first `exact` losses equal PyTorch's to 1e-6 (the same bf16 forward, and
/// the bf16 Adam's rounding on the first updates), then losses within
/// 2.3e-3 and updates within 7.4e-3 (MLP) and 4.7e-2 (CNN) measured, as
/// bf16 rounding flips on last-bit differences of the sums move single
/// weights by a whole bf16 step. Every run is nearer PyTorch's bf16 run
/// than its fp32 run.
fn bf16_true_matches_pytorch(
    model: &str,
    prefix: &str,
    exact: usize,
    loss_tol: f64,
    update_tol: f32,
) {
    let Job {
        run,
        out,
        stdout,
        _dir,
    } = run_job(model, 20, "bf16-true", &[]);
    let init = golden(&format!("{model}_init.safetensors"));
    assert!(stdout.contains("precision bf16-true"), "{stdout}");
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["precision"], "bf16-true", "{summary}");
    assert!(
        summary["precision_path"]
            .as_str()
            .is_some_and(|p| p.contains("bf16 parameters")),
        "{summary}"
    );
    let n: u64 = weights(&init).values().map(|t| t.elem_count() as u64).sum();
    let mem = &summary["memory"];
    assert_eq!(mem["parameters"].as_u64(), Some(2 * n), "{summary}");
    assert_eq!(mem["gradients"].as_u64(), Some(2 * n), "{summary}");
    assert_eq!(mem["optimizer"].as_u64(), Some(4 * n), "{summary}");
    let ours = step_losses(&run);
    let torch = golden_losses(&format!("{prefix}_{model}_trace.json"));
    assert_eq!(ours.len(), torch.len());
    for (i, (a, b)) in ours.iter().zip(&torch).enumerate() {
        eprintln!(
            "{model} {prefix} loss {}: rel {:e}",
            i + 1,
            (a - b).abs() / b
        );
        let tol = if i < exact { 1e-6 } else { loss_tol };
        assert!(
            (a - b).abs() / b < tol,
            "step {}: ours {a}, PyTorch bf16 {b}",
            i + 1
        );
    }
    let f32s = |m: std::collections::HashMap<String, candle_core::Tensor>| {
        m.into_iter()
            .map(|(k, t)| (k, t.to_dtype(candle_core::DType::F32).unwrap()))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let w = weights(&out);
    assert!(
        w.values().all(|t| t.dtype() == candle_core::DType::BF16),
        "bf16-true saves bf16 weights"
    );
    let (init, w) = (f32s(weights(&init)), f32s(w));
    let bf16 = f32s(weights(&golden(&format!(
        "{prefix}_{model}_final.safetensors"
    ))));
    let fp32 = weights(&golden(&format!("fp32_{model}_final.safetensors")));
    let (mut to_bf16, mut to_fp32) = (0.0, 0.0);
    for name in bf16.keys() {
        let ours = (&w[name] - &init[name]).unwrap();
        let r = rel_l2(&ours, &(&bf16[name] - &init[name]).unwrap());
        let r32 = rel_l2(&ours, &(&fp32[name] - &init[name]).unwrap());
        eprintln!("{model} {prefix} {name}: update vs PyTorch bf16 {r:e}, vs its fp32 {r32:e}");
        assert!(
            r < update_tol,
            "{model} {name}: update {r:e} from PyTorch's"
        );
        to_bf16 += r;
        to_fp32 += r32;
    }
    assert!(
        to_bf16 < to_fp32,
        "{model}: nearer PyTorch's fp32 run ({to_fp32}) than its bf16 run ({to_bf16})"
    );
}

#[test]
fn bf16_true_mlp_matches_pytorch() {
    bf16_true_matches_pytorch("mlp", "bf16_true", 0, 2e-2, 0.1);
}

#[test]
fn bf16_true_cnn_matches_pytorch() {
    bf16_true_matches_pytorch("cnn", "bf16_true", 0, 2e-2, 0.15);
}

#[test]
fn bf16_true_mlp_matches_pytorch_with_an_fp32_loss() {
    bf16_true_matches_pytorch("mlp", "bf16_true_fp32_loss", 3, 5e-3, 2e-2);
}

#[test]
fn bf16_true_cnn_matches_pytorch_with_an_fp32_loss() {
    bf16_true_matches_pytorch("cnn", "bf16_true_fp32_loss", 2, 5e-3, 0.1);
}

#[test]
fn precisions_not_built_and_bad_scales_are_refused_by_name() {
    for (args, says) in [
        (
            &["--precision", "bf16-true", "--loss-scale", "dynamic"][..],
            "only --precision 16-mixed scales the loss",
        ),
        (&["--precision", "fp8"][..], "expected 32-true"),
        (
            &["--precision", "bf16-mixed", "--loss-scale", "dynamic"][..],
            "only --precision 16-mixed scales the loss",
        ),
        (
            &["--precision", "16-mixed", "--loss-scale", "dynamic:init=0"][..],
            "init must be a finite fp32 number > 0",
        ),
        (
            &["--precision", "16", "--loss-scale", "static:128"][..],
            "HINT: dynamic[:init=65536]",
        ),
    ] {
        let mut all = vec!["train", "--max-steps", "1"];
        all.extend_from_slice(args);
        let err = fails(&all);
        assert!(
            err.contains(says) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

/// Every layer of the layer set in every precision: the layer-set golden
/// model (a strided conv without bias, BatchNorm, residual blocks with a
/// shortcut, GELU, average pooling, LayerNorm, dropout) trains a few steps
/// in each 16-bit precision, and its first loss (same seed, same init,
/// rounded for bf16-true) is fp32's to 16-bit accuracy. A strided
/// convolution once reached candle's CPU bf16 convolution, which has no
/// bf16 matmul, and bf16-true's BatchNorm mixed fp32 running statistics
/// with bf16 activations: both failed the run.
#[test]
fn every_layer_trains_in_every_precision() {
    let model = golden("seq_model.toml");
    let first_loss = |precision: &str| -> f64 {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let out = dir.path().join("w.safetensors");
        let stdout = train_in(
            &run,
            &[
                "--model",
                model.to_str().unwrap(),
                "--precision",
                precision,
                "--max-steps",
                "3",
                "--log-every",
                "1",
                "--threads",
                "1",
                "--save",
                out.to_str().unwrap(),
            ],
        );
        assert!(
            precision == "32-true" || stdout.contains(&format!("precision {precision}")),
            "{stdout}"
        );
        let losses = step_losses(&run);
        assert_eq!(losses.len(), 3, "{precision}");
        assert!(
            losses.iter().all(|l| l.is_finite()),
            "{precision}: {losses:?}"
        );
        if precision == "bf16-true" {
            // Buffers follow the parameters, as `module.to(bfloat16)`.
            let w = weights(&out);
            let rm = w.iter().find(|(k, _)| k.ends_with("running_mean"));
            assert_eq!(
                rm.map(|(_, t)| t.dtype()),
                Some(candle_core::DType::BF16),
                "{:?}",
                w.keys().collect::<Vec<_>>()
            );
        }
        losses[0]
    };
    let fp32 = first_loss("32-true");
    for precision in ["bf16-mixed", "16-mixed", "bf16-true"] {
        let l = first_loss(precision);
        eprintln!("{precision}: first loss {l}, fp32 {fp32}");
        assert!(
            (l - fp32).abs() / fp32 < 2e-2,
            "{precision}: {l} against fp32's {fp32}"
        );
    }
}

/// `--cpu-bf16-gemm`: `off` takes the fp32 GEMM of the bf16-rounded
/// operands and says so; `on` runs Redline's AVX-512 BF16 kernel where the
/// CPU has the instruction and is refused, naming it, where it has not. Both
/// GEMMs give PyTorch's bf16 losses within the bf16-mixed bound. (After
/// these 5 steps their weights were the same bits on a Zen 4: sums of bf16
/// products are often exact in f32 in any order.)
#[test]
fn the_cpu_bf16_gemm_flag_picks_the_gemm_and_says_which() {
    let native = std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "avx512_bf16"));
    let want = golden_losses("bf16_mixed_mlp_trace.json");
    let path = |job: &Job| {
        json(&job.run.join("summary.json"))["precision_path"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let close = |job: &Job| {
        let got = step_losses(&job.run);
        assert_eq!(got.len(), 5);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 2e-3 * w.abs(), "{g} vs PyTorch's {w}");
        }
    };
    let off = run_job("mlp", 5, "bf16-mixed", &["--cpu-bf16-gemm", "off"]);
    assert!(path(&off).contains("bf16-rounded"), "{}", path(&off));
    close(&off);
    if native {
        assert!(path(&off).contains("--cpu-bf16-gemm off"), "{}", path(&off));
        let on = run_job("mlp", 5, "bf16-mixed", &["--cpu-bf16-gemm", "on"]);
        assert!(path(&on).contains("vdpbf16ps"), "{}", path(&on));
        close(&on);
    } else {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let mut args = vec!["train".to_string()];
        args.extend(golden_job("mlp", 64, 2));
        args.extend(["--precision", "bf16-mixed", "--cpu-bf16-gemm", "on"].map(String::from));
        args.extend(["--device", "cpu", "--run-dir", run.to_str().unwrap()].map(String::from));
        let err = fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(err.contains("no AVX-512 BF16"), "{err}");
    }
}
