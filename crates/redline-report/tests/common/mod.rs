//! Writes synthetic run directories in the documented format (docs/run-dir.md):
//! an MLP on MNIST-sized data, 938 steps per epoch, logged every 50 steps.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;

/// What the fixture run looks like.
pub struct Fixture {
    pub device: &'static str,
    pub epochs: u64,
    pub status: &'static str,
    pub breakdown: bool,
    pub system: bool,
    pub profile: bool,
}

impl Default for Fixture {
    fn default() -> Self {
        Self {
            device: "cpu",
            epochs: 10,
            status: "finished",
            breakdown: true,
            system: true,
            profile: true,
        }
    }
}

const STEPS_PER_EPOCH: u64 = 938;
const BATCH: u64 = 64;
const LOG_EVERY: u64 = 50;
const EPOCH_S: f64 = 0.71;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Deterministic jitter in [-1, 1].
fn jitter(i: f64) -> f64 {
    (i * 12.9898).sin() * 0.6 + (i * 3.7).cos() * 0.4
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// Writes the run into `dir` (created if needed).
pub fn write_run(dir: &Path, f: &Fixture) {
    std::fs::create_dir_all(dir).unwrap();
    let gpu = f.device.starts_with("cuda");
    let total_steps = f.epochs * STEPS_PER_EPOCH;
    let wall = f.epochs as f64 * (EPOCH_S + 0.05) + 0.6;
    let mut lines = String::new();
    let mut sys_t = 0.0;
    let mut sys_i = 0.0;
    let mut push_system = |lines: &mut String, until: f64| {
        while f.system && sys_t <= until {
            let warm = if sys_t < 0.6 { 0.3 } else { 1.0 };
            let core = |k: f64| (88.0 * warm + 6.0 * jitter(sys_i + k)).clamp(0.0, 100.0);
            let per_core = [core(0.0), core(1.0)];
            let mut gpus = Vec::new();
            if gpu {
                gpus.push(json!({
                    "index": 0, "name": "NVIDIA H100 80GB HBM3",
                    "utilization_gpu_percent": 52.0 * warm + 8.0 * jitter(sys_i),
                    "utilization_memory_percent": 21.0 * warm + 4.0 * jitter(sys_i + 2.0),
                    "memory_used": (2.1 + 0.1 * warm) * GIB, "memory_total": 79.6 * GIB,
                    "temperature_c": 41.0 + 3.0 * warm, "power_w": 180.0 * warm + 70.0,
                    "power_limit_w": 700.0, "sm_clock_mhz": 1980.0, "memory_clock_mhz": 2619.0,
                    "processes": [{"pid": 4242, "name": "redline", "memory_used": (1.9 * GIB) as u64}]
                }));
            }
            let rec = json!({
                "kind": "system", "t_s": sys_t, "unix_time": 1_795_000_000.0 + sys_t,
                "host": {
                    "cpu_percent_per_core": per_core,
                    "cpu_percent": (per_core[0] + per_core[1]) / 2.0,
                    "memory_used": (3.1 + 0.2 * warm) * GIB, "memory_total": 7.7 * GIB,
                    "process_cpu_percent": 176.0 * warm + 10.0 * jitter(sys_i + 5.0),
                    "process_rss": ((0.25 + 0.1 * warm) * GIB) as u64,
                    "processes": [{"pid": 4242, "name": "redline", "cpu_percent": 176.0 * warm, "rss": ((0.25 + 0.1 * warm) * GIB) as u64}]
                },
                "gpus": gpus,
                "gpu_note": if gpu { serde_json::Value::Null } else { json!("NVML unavailable: libnvidia-ml.so.1: cannot open shared object file") }
            });
            writeln!(lines, "{rec}").unwrap();
            sys_t += 0.5;
            sys_i += 1.0;
        }
    };
    let mut step = 0;
    for epoch in 1..=f.epochs {
        let t0 = (epoch - 1) as f64 * (EPOCH_S + 0.05);
        for s in 1..=STEPS_PER_EPOCH {
            step += 1;
            if step % LOG_EVERY != 0 {
                continue;
            }
            let x = step as f64;
            let loss = 0.28 + 2.0 * (-x / 900.0).exp() + 0.06 * jitter(x);
            let elapsed = t0 + EPOCH_S * s as f64 / STEPS_PER_EPOCH as f64;
            let sps =
                84_500.0 + 3_000.0 * jitter(x + 1.0) - if s <= LOG_EVERY { 9_000.0 } else { 0.0 };
            push_system(&mut lines, elapsed);
            let rec = json!({"kind": "step", "step": step, "epoch": epoch, "loss": loss,
                "lr": 0.001, "samples_per_s": sps, "elapsed_s": elapsed});
            writeln!(lines, "{rec}").unwrap();
        }
        let e = epoch as f64;
        let rec = json!({"kind": "epoch", "epoch": epoch,
            "train_loss": 0.30 + 0.55 / e, "train_accuracy": 0.985 - 0.16 / e,
            "val_loss": 0.33 + 0.45 / e, "val_accuracy": 0.975 - 0.13 / e,
            "epoch_s": EPOCH_S, "eval_s": 0.05, "steps": STEPS_PER_EPOCH, "samples": 60_000});
        writeln!(lines, "{rec}").unwrap();
    }
    push_system(&mut lines, wall);
    write(dir, "metrics.jsonl", &lines);

    let failed = f.status == "failed";
    write(
        dir,
        "summary.json",
        &json!({"model": "mlp", "device": f.device, "started": "2026-11-22 03:10:00",
            "started_unix": 1_795_000_000, "status": f.status,
            "error": if failed { json!("epoch 3: loss is NaN at step 2101 (lr 0.5 too high?)") } else { serde_json::Value::Null },
            "epochs": f.epochs, "steps": total_steps, "samples": f.epochs * 60_000,
            "batch_size": BATCH, "wall_s": wall, "train_s": f.epochs as f64 * EPOCH_S,
            "eval_s": f.epochs as f64 * 0.05, "samples_per_s": 84_500.0,
            "test_loss": 0.375, "test_accuracy": 0.962, "host_syncs_per_step": 0.021,
            "threads": 2, "free_cores": 1.9, "logical_cores": 2, "prefetch": 2,
            "profiler": if f.profile { "simple" } else { "off" },
            "device_choice": (f.device != "cpu").then_some(
                "device auto: cuda:0, 0.210 ms per step against 0.360 ms on cpu (this model and \
                 batch, 30 steps each after 5 warm-up steps)"),
            "cuda_graph": if f.device == "cpu" {
                "off (the device is the CPU; CUDA graphs need a CUDA device)"
            } else {
                "on (the step captured at step 3, replayed for 9378 steps)"
            },
            "matmul_precision": (f.device != "cpu").then_some("highest (fp32 products)"),
            "gpu_conv": (f.device != "cpu").then_some("cuDNN 9.19.0")})
        .to_string(),
    );
    write(
        dir,
        "config.toml",
        "# redline train --config this-file runs it again\nmodel = \"mlp\"\ndataset = \"mnist\"\n\
         epochs = 10\nbatch_size = 64\nlr = 0.001\noptimizer = \"adam\"\nthreads = 2\nprefetch = 2\n\
         profiler = \"simple\"\nnote = \"<b>escaped</b> & kept\"\n",
    );
    if f.breakdown {
        write(
            dir,
            "breakdown.json",
            &breakdown(wall, total_steps, f.device).to_string(),
        );
    }
    if f.profile {
        let rows = [
            ("training_step", 0.22),
            ("backward", 0.41),
            ("optimizer", 0.12),
            ("data", 0.04),
            ("host_sync", 0.01),
        ];
        let mut out: Vec<serde_json::Value> = rows
            .iter()
            .map(|(a, share)| {
                let total = wall * share;
                json!({"action": a, "calls": total_steps, "mean_ms": 1000.0 * total / total_steps as f64,
                    "total_s": total, "percent": 100.0 * share})
            })
            .collect();
        let rest: f64 = 1.0 - rows.iter().map(|r| r.1).sum::<f64>();
        out.push(
            json!({"action": "other", "calls": 1, "mean_ms": 1000.0 * wall * rest,
            "total_s": wall * rest, "percent": 100.0 * rest}),
        );
        write(
            dir,
            "profile.json",
            &json!({"wall_s": wall, "mode": "simple", "rows": out}).to_string(),
        );
    }
}

fn breakdown(wall: f64, steps: u64, device: &str) -> serde_json::Value {
    let shares = [0.784, 0.045, 0.0, 0.008, 0.068, 0.095];
    let categories: Vec<_> = redline_report::Category::ALL
        .iter()
        .zip(shares)
        .map(|(c, s)| json!({"name": c.key(), "seconds": wall * s, "percent": 100.0 * s}))
        .collect();
    let bin = steps.div_ceil(400);
    let mut rows = Vec::new();
    let mut first = 1;
    while first <= steps {
        let last = (first + bin - 1).min(steps);
        let x = first as f64;
        let warm = if first < 200 { 1.8 } else { 1.0 };
        let epoch_start = (first - 1) % STEPS_PER_EPOCH < bin;
        rows.push(json!({"first_step": first, "last_step": last,
            "compute_ms": 0.59 * warm + 0.03 * jitter(x),
            "data_wait_ms": if epoch_start { 0.45 } else { 0.02 + 0.01 * jitter(x + 3.0).abs() },
            "transfer_ms": 0.0,
            "host_sync_ms": 0.006 + 0.004 * jitter(x + 7.0).abs(),
            "overhead_ms": 0.05 + 0.01 * jitter(x + 9.0)}));
        first = last + 1;
    }
    let mut b = json!({"wall_s": wall, "steps": steps, "device": device,
        "rule": "each step's time goes to the first category that was waiting; time outside steps is idle",
        "categories": categories, "timeline": {"bin_steps": bin, "rows": rows}});
    if device != "cpu" {
        // A launch-bound GPU: kernels ran 41.5% of the wall time.
        b["gpu"] = json!({"source": "cupti", "percent": 41.5, "kernel_s": 0.415 * wall,
            "wall_s": wall, "kernels": 40 * steps, "steps": steps, "kernels_per_step": 40.0,
            "mean_kernel_us": 3.1, "dropped": 0,
            "top": [{"name": "gemm_f32", "calls": 2 * steps, "total_ms": 0.2 * wall * 1e3,
                "mean_us": 9.0, "percent": 48.0}]});
    }
    b
}
