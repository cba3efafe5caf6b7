//! `--precision bf16-mixed` against PyTorch's CPU autocast to bfloat16
//! (`tools/reference/make_golden_precision.py`: the fp32 goldens' init, data
//! and steps, forward and loss under `torch.autocast("cpu", bfloat16)`,
//! fp32 master weights and Adam). Tolerances, as measured here: losses
//! within 1e-2 relative (the bound; measured 8e-4 MLP, 2.3e-3 CNN);
//! each weight's update within 3% (MLP; measured 0.8%) or 10% (CNN, whose
//! 8 steps amplify bf16 rounding; measured 6.6%) relative L2 of PyTorch
//! bf16's, and nearer PyTorch's bf16 run than its fp32 run overall, so a
//! silent fp32 run fails (bf16 moves the updates 5-20% from fp32's).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{
    fails, golden, golden_job, golden_losses, json, rel_l2, step_losses, train_in, weights,
};

fn bf16_mixed_matches_autocast(model: &str, steps: usize, update_tol: f32) {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("w.safetensors"));
    let init = golden(&format!("{model}_init.safetensors"));
    let mut args = golden_job(model, 64, steps);
    args.extend(["--precision", "bf16-mixed", "--save", out.to_str().unwrap()].map(String::from));
    let stdout = train_in(&run, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(stdout.contains("precision bf16-mixed"), "{stdout}");
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["precision"], "bf16-mixed", "{summary}");
    assert!(
        summary["precision_path"]
            .as_str()
            .is_some_and(|p| p.contains("bf16-rounded")),
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
    let ours = step_losses(&run);
    let torch = golden_losses(&format!("bf16_mixed_{model}_trace.json"));
    assert_eq!(ours.len(), torch.len());
    for (i, (a, b)) in ours.iter().zip(&torch).enumerate() {
        assert!(
            (a - b).abs() / b < 1e-2,
            "step {}: ours {a}, autocast {b}",
            i + 1
        );
    }
    let (init, w) = (weights(&init), weights(&out));
    let bf16 = weights(&golden(&format!("bf16_mixed_{model}_final.safetensors")));
    let fp32 = weights(&golden(&format!("{model}_final.safetensors")));
    let (mut to_bf16, mut to_fp32) = (0.0, 0.0);
    for (name, t) in &w {
        assert_eq!(
            t.dtype(),
            candle_core::DType::F32,
            "{name}: master weights stay fp32"
        );
        let ours = (t - &init[name]).unwrap();
        let r = rel_l2(&ours, &(&bf16[name] - &init[name]).unwrap());
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
    bf16_mixed_matches_autocast("mlp", 20, 0.03);
}

#[test]
fn bf16_mixed_cnn_matches_pytorch_autocast() {
    bf16_mixed_matches_autocast("cnn", 8, 0.10);
}

#[test]
fn precisions_not_built_are_refused_by_name() {
    for (flag, says) in [
        ("16-mixed", "loss scaler"),
        ("bf16-true", "not built yet"),
        ("fp8", "expected 32-true"),
    ] {
        let err = fails(&["train", "--precision", flag, "--max-steps", "1"]);
        assert!(
            err.contains(says) && !err.contains("panicked"),
            "{flag}: {err}"
        );
    }
}
