//! One test per rule: it fires on a number past its threshold and stays quiet below.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::records::{Category, CategoryShare};
use crate::records::{GpuSample, HostSample, Summary, SystemRecord};

/// A run of one process whose breakdown has `percents` (compute, data wait,
/// transfer, host sync, overhead, idle) of a 10 s wall; no communication.
fn run_with(percents: [f64; 6]) -> RunData {
    let [c, d, t, h, o, i] = percents;
    ranked_run_with([c, d, t, h, 0.0, o, i])
}

/// A run whose breakdown has `percents` (in [`Category::ALL`] order) of a 10 s wall.
fn ranked_run_with(percents: [f64; 7]) -> RunData {
    let categories = Category::ALL
        .iter()
        .zip(percents)
        .map(|(cat, p)| CategoryShare {
            name: cat.key().into(),
            seconds: p / 10.0,
            percent: p,
        })
        .collect();
    RunData {
        summary: Some(Summary {
            device: "cpu".into(),
            batch_size: Some(256),
            ..Default::default()
        }),
        breakdown: Some(Breakdown {
            wall_s: 10.0,
            steps: 1000,
            device: "cpu".into(),
            categories,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn quiet() -> RunData {
    run_with([70.0, 5.0, 0.0, 2.0, 10.0, 13.0])
}

fn summary(run: &mut RunData) -> &mut Summary {
    run.summary.as_mut().unwrap()
}

/// The advice whose text contains `needle`.
fn find(run: &RunData, needle: &str) -> Option<Advice> {
    advice(run).into_iter().find(|a| a.text.contains(needle))
}

#[test]
fn quiet_run_gets_no_warnings() {
    let a = advice(&quiet());
    assert!(a.iter().all(|a| a.level != Level::Warn), "{a:?}");
}

#[test]
fn data_wait_fires_at_ten_percent_and_cites_it() {
    let mut run = run_with([60.0, 31.0, 0.0, 1.0, 5.0, 3.0]);
    summary(&mut run).prefetch = Some(2);
    let a = find(&run, "data wait").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(a.text.starts_with(
        "data wait is 31% of step time: raise --prefetch or keep the dataset on the device"
    ));
    assert!(a.text.contains("--prefetch is 2 now"), "{}", a.text);
    assert!(find(&run_with([80.0, 9.9, 0.0, 1.0, 5.0, 4.1]), "data wait").is_none());
}

#[test]
fn host_syncs_per_step_bands() {
    let mut run = quiet();
    summary(&mut run).host_syncs_per_step = Some(0.0);
    assert_eq!(find(&run, "0 host syncs").unwrap().level, Level::Good);

    summary(&mut run).host_syncs_per_step = Some(0.02);
    let a = find(&run, "host syncs per step").unwrap();
    assert_eq!(a.level, Level::Good);
    assert_eq!(
        a.text,
        "0.02 host syncs per step: read-backs only at log points"
    );

    summary(&mut run).host_syncs_per_step = Some(1.0);
    let a = find(&run, "host syncs per step").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(a.text.contains(".item()"), "{}", a.text);

    summary(&mut run).host_syncs_per_step = Some(0.2);
    assert_eq!(
        find(&run, "host syncs per step").unwrap().level,
        Level::Info
    );

    summary(&mut run).host_syncs_per_step = None;
    assert!(find(&run, "host syncs per step").is_none());
}

#[test]
fn host_sync_time_fires_at_five_percent() {
    let a = find(&run_with([70.0, 2.0, 0.0, 7.0, 10.0, 11.0]), "host sync is").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(
        a.text.contains("7% of wall time (0.70 s of 10.00 s)"),
        "{}",
        a.text
    );
    assert!(find(&run_with([70.0, 2.0, 0.0, 4.9, 10.0, 13.1]), "host sync is").is_none());
}

#[test]
fn overhead_fires_at_fifteen_percent() {
    let a = find(&run_with([70.0, 2.0, 0.0, 1.0, 18.0, 9.0]), "overhead").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(
        a.text.contains("18%") && a.text.contains("--batch-size"),
        "{}",
        a.text
    );
    assert!(find(&run_with([70.0, 2.0, 0.0, 1.0, 14.9, 12.1]), "overhead").is_none());
}

#[test]
fn communication_fires_at_twenty_percent() {
    let run = ranked_run_with([60.0, 2.0, 0.0, 1.0, 27.0, 5.0, 5.0]);
    let a = find(&run, "gradient all-reduce").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(
        a.text.contains("27%") && a.text.contains("--accumulate"),
        "{}",
        a.text
    );
    let run = ranked_run_with([70.0, 2.0, 0.0, 1.0, 19.0, 4.0, 4.0]);
    assert!(find(&run, "gradient all-reduce").is_none());
}

#[test]
fn idle_fires_at_twenty_percent() {
    let a = find(&run_with([65.0, 2.0, 0.0, 1.0, 7.0, 25.0]), "idle is").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(a.text.contains("25%"), "{}", a.text);
    assert!(find(&run_with([70.0, 2.0, 0.0, 1.0, 7.1, 19.9]), "idle is").is_none());
}

fn gpu_run(util: &[f64]) -> RunData {
    let mut run = quiet();
    let s = summary(&mut run);
    s.device = "cuda:0".into();
    s.batch_size = Some(64);
    run.system = util
        .iter()
        .map(|&u| SystemRecord {
            gpus: vec![GpuSample {
                utilization_gpu_percent: Some(u),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    run
}

#[test]
fn low_gpu_utilization_suggests_a_larger_batch() {
    let a = find(&gpu_run(&[55.0, 64.2]), "GPU").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(
        a.text
            .starts_with("batch 64 leaves the GPU 40% idle: try a larger --batch-size such as 256"),
        "{}",
        a.text
    );
    assert!(find(&gpu_run(&[90.0, 95.0]), "GPU").is_none());
    // A CPU run with an idle GPU in the machine is not the GPU's fault.
    let mut cpu = gpu_run(&[0.0]);
    summary(&mut cpu).device = "cpu".into();
    assert!(find(&cpu, "GPU").is_none());
}

fn cpu_run(threads: u64, process_cpu: &[f64]) -> RunData {
    let mut run = quiet();
    summary(&mut run).threads = Some(threads);
    run.system = process_cpu
        .iter()
        .map(|&c| SystemRecord {
            host: Some(HostSample {
                process_cpu_percent: Some(c),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    run
}

#[test]
fn idle_compute_threads_are_reported() {
    let a = find(&cpu_run(2, &[80.0, 100.0]), "threads busy").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(
        a.text.starts_with("compute threads busy only 45%"),
        "{}",
        a.text
    );
    assert!(find(&cpu_run(2, &[190.0, 180.0]), "threads busy").is_none());
    assert!(find(&cpu_run(2, &[]), "threads busy").is_none());
}

#[test]
fn oversubscribed_threads_name_the_free_cores() {
    let mut run = quiet();
    summary(&mut run).threads = Some(4);
    summary(&mut run).free_cores = Some(1.9);
    let a = find(&run, "oversubscribed").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert_eq!(
        a.text,
        "threads oversubscribed: 4 compute threads on 1.9 free cores: use --threads 2"
    );
    summary(&mut run).threads = Some(2);
    assert!(find(&run, "oversubscribed").is_none());
    summary(&mut run).free_cores = Some(0.2);
    assert!(find(&run, "use --threads 1").is_some());
}

#[test]
fn short_steps_at_a_small_batch_suggest_a_larger_one() {
    // compute 70% of 10 s over 1000 steps = 7 ms per step: not short.
    let mut run = quiet();
    summary(&mut run).batch_size = Some(64);
    assert!(find(&run, "ms per step").is_none());
    // 0.5 ms per step at batch 64: short.
    run.breakdown.as_mut().unwrap().steps = 14_000;
    let a = find(&run, "ms per step").unwrap();
    assert_eq!(a.level, Level::Info);
    assert!(
        a.text
            .starts_with("compute is 0.50 ms per step at batch 64"),
        "{}",
        a.text
    );
    // Same step time at batch 128: the batch is not small.
    summary(&mut run).batch_size = Some(128);
    assert!(find(&run, "ms per step").is_none());
}

#[test]
fn high_compute_share_is_good_news() {
    let a = find(&run_with([84.0, 2.0, 0.0, 1.0, 5.0, 8.0]), "compute is 84%").unwrap();
    assert_eq!(a.level, Level::Good);
    assert!(find(
        &run_with([79.0, 2.0, 0.0, 1.0, 10.0, 8.0]),
        "of wall time: the device"
    )
    .is_none());
}

/// The H100 run of issue 12: compute 96% of the host's wall time, NVML 32%.
#[test]
fn a_starved_gpu_is_never_called_busy() {
    let mut run = gpu_run(&[30.0, 34.0]);
    run.breakdown = run_with([96.0, 0.5, 0.5, 1.0, 1.0, 1.0]).breakdown;
    let all = advice(&run);
    assert!(all.iter().all(|a| !a.text.contains("kept busy")), "{all:?}");
    let a = find(&run, "launch-bound").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(
        a.text
            .contains("96% of wall time issuing compute, 9.60 ms of it per step")
            && a.text.contains("busy only 32%")
            && a.text.contains("over 2 samples"),
        "{}",
        a.text
    );
    // One finding for one cause: the batch-size warning does not repeat it.
    assert!(find(&run, "leaves the GPU").is_none(), "{all:?}");
}

#[test]
fn a_gpu_run_is_called_busy_only_on_nvml_evidence() {
    let mut busy = gpu_run(&[91.0, 95.0]);
    busy.breakdown = run_with([90.0, 1.0, 1.0, 1.0, 4.0, 3.0]).breakdown;
    let a = find(&busy, "the GPU was busy 93%").unwrap();
    assert_eq!(a.level, Level::Good);
    // No NVML samples: the host's share is stated as what it is.
    let mut blind = gpu_run(&[]);
    blind.breakdown = busy.breakdown.clone();
    let a = find(&blind, "issuing compute").unwrap();
    assert_eq!(a.level, Level::Info);
    assert!(
        a.text.contains("does not show that the GPU was busy"),
        "{}",
        a.text
    );
    assert!(advice(&blind).iter().all(|a| a.level != Level::Good));
    // In between: a plain statement of both numbers.
    let mut mid = gpu_run(&[70.0]);
    mid.breakdown = busy.breakdown.clone();
    assert_eq!(find(&mid, "GPU was busy 70%").unwrap().level, Level::Info);
}

#[test]
fn warnings_come_first() {
    let mut run = run_with([60.0, 31.0, 0.0, 1.0, 5.0, 3.0]);
    summary(&mut run).host_syncs_per_step = Some(0.0);
    let levels: Vec<Level> = advice(&run).iter().map(|a| a.level).collect();
    let mut sorted = levels.clone();
    sorted.sort();
    assert_eq!(levels, sorted);
    assert_eq!(levels.first(), Some(&Level::Warn));
}

#[test]
fn empty_run_gets_no_advice() {
    assert!(advice(&RunData::default()).is_empty());
}

/// A GPU run whose breakdown has `percents` and whose kernel trace says the
/// GPU ran kernels `busy` percent of the wall time.
fn traced(percents: [f64; 6], busy: f64, nvml: &[f64]) -> RunData {
    let mut run = gpu_run(nvml);
    let mut b = run_with(percents).breakdown.unwrap();
    b.device = "cuda:0".into();
    b.gpu = Some(crate::records::GpuBusy {
        source: "cupti".into(),
        percent: busy,
        kernel_s: busy / 10.0,
        wall_s: 10.0,
        kernels: 40_000,
        steps: 1000,
        kernels_per_step: 40.0,
        mean_kernel_us: 2.5,
        ..Default::default()
    });
    run.breakdown = Some(b);
    run
}

#[test]
fn kernel_time_names_a_launch_bound_gpu_with_its_kernels() {
    // The H100 run: compute 96% of wall, kernels 32%, NVML 32%.
    let run = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 32.0, &[31.0, 33.0]);
    let all = advice(&run);
    let a = find(&run, "launch-bound").unwrap();
    assert_eq!(a.level, Level::Warn);
    for part in [
        "the GPU ran kernels only 32% of wall time",
        "kernel time 3.20 s of 10.00 s wall, from cupti",
        "NVML mean utilization 32% over 2 samples",
        "40 kernels per step, 2.5 µs each on average",
        "for at least 64% of wall time the host was issuing compute",
        "--cuda-graph on",
    ] {
        assert!(a.text.contains(part), "{part:?} not in {}", a.text);
    }
    // One finding: no NVML-based launch warning or batch-size warning beside it,
    // and nothing calls this GPU busy.
    assert_eq!(
        all.iter().filter(|a| a.text.contains("GPU")).count(),
        1,
        "{all:?}"
    );
    assert!(all
        .iter()
        .all(|a| a.level != Level::Good || !a.text.contains("busy")));
}

#[test]
fn kernel_time_names_data_and_sync_bound_gpus() {
    let data = traced([30.0, 55.0, 0.0, 5.0, 5.0, 5.0], 25.0, &[]);
    let a = find(&data, "data-bound").unwrap();
    assert!(a.text.contains("waited for data 55%"), "{}", a.text);
    let sync = traced([30.0, 5.0, 0.0, 55.0, 5.0, 5.0], 25.0, &[]);
    let a = find(&sync, "sync-bound").unwrap();
    assert!(a.text.contains("read-backs 55%"), "{}", a.text);
    assert_eq!(a.level, Level::Warn);
}

#[test]
fn kernel_time_calls_the_gpu_busy_only_when_it_was() {
    let run = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 93.0, &[]);
    let a = find(&run, "ran kernels 93%").unwrap();
    assert_eq!(a.level, Level::Good);
    assert!(!a.text.contains("--matmul-precision"), "{}", a.text);
    // A busy GPU on exact fp32 products is shown the TF32 lever, once.
    let mut exact = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 93.0, &[]);
    summary(&mut exact).matmul_precision = Some("highest (fp32 products)".into());
    let a = find(&exact, "ran kernels 93%").unwrap();
    assert!(a.text.contains("--matmul-precision high"), "{}", a.text);
    summary(&mut exact).matmul_precision = Some("high (TF32 products, fp32 accumulation)".into());
    let a = find(&exact, "ran kernels 93%").unwrap();
    assert!(!a.text.contains("--matmul-precision"), "{}", a.text);
    // A graph that already replays is not told to capture one.
    let mut graphed = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 40.0, &[]);
    summary(&mut graphed).cuda_graph =
        Some("on (the step captured at step 3, replayed for 935 steps)".into());
    let a = find(&graphed, "launch-bound").unwrap();
    assert!(!a.text.contains("--cuda-graph on"), "{}", a.text);
    // The summary's figure serves when the breakdown has none.
    let mut summary_only = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 93.0, &[]);
    let g = summary_only.breakdown.as_mut().unwrap().gpu.take();
    summary(&mut summary_only).gpu_busy = g;
    assert!(find(&summary_only, "ran kernels 93%").is_some());
    // A CPU run's stray figure is ignored.
    let mut cpu = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 10.0, &[]);
    summary(&mut cpu).device = "cpu".into();
    assert!(find(&cpu, "kernels").is_none());
}

#[test]
fn a_16_bit_run_slower_than_fp32_says_so_with_both_numbers() {
    let mut run = quiet();
    let line = "precision bf16-mixed: 0.420 ms per step against 0.290 ms in 32-true on cpu";
    let s = summary(&mut run);
    s.other.insert("precision_timing".into(), line.into());
    s.other.insert("precision_vs_fp32".into(), 1.45.into());
    let a = find(&run, "0.420 ms per step").unwrap();
    assert_eq!(a.level, Level::Warn);
    assert!(a.text.contains("--precision 32-true"), "{}", a.text);
    summary(&mut run)
        .other
        .insert("precision_vs_fp32".into(), 0.7.into());
    assert!(
        find(&run, "0.420 ms per step").is_none(),
        "faster: no warning"
    );
}

#[test]
fn a_16_bit_runs_activations_say_what_batch_now_fits_or_that_none_does() {
    let with = |bytes: u64, fp32: u64| {
        let mut run = quiet();
        let s = summary(&mut run);
        s.other.insert("precision".into(), "bf16-mixed".into());
        s.other.insert(
            "precision_activations".into(),
            serde_json::json!({"bytes": bytes, "fp32_bytes": fp32, "batch": 64}),
        );
        run
    };
    let half = with(1 << 20, 2 << 20);
    let a = find(&half, "MiB of activations").unwrap();
    assert_eq!(a.level, Level::Info);
    assert!(
        a.text
            .contains("1.00 MiB of activations per batch of 64 against 2.00 MiB")
            && a.text.contains("--batch-size 128"),
        "{}",
        a.text
    );
    let same = with(2 << 20, 2 << 20);
    let a = find(&same, "MiB of activations").unwrap();
    assert!(a.text.contains("saves no activation memory"), "{}", a.text);
    // Between the two: nothing worth saying.
    assert!(find(&with(7 << 17, 1 << 20), "MiB of activations").is_none());
    assert!(find(&quiet(), "MiB of activations").is_none());
}

#[test]
fn a_bf16_true_run_says_what_its_state_takes_against_fp32() {
    let with = |precision: &str| {
        let mut run = quiet();
        let s = summary(&mut run);
        s.other.insert("precision".into(), precision.into());
        s.other.insert(
            "memory".into(),
            serde_json::json!({"parameters": 1 << 20, "gradients": 1 << 20,
                               "optimizer": 2 << 20, "activations": 5, "batch": 64}),
        );
        run
    };
    let a = find(&with("bf16-true"), "optimizer state in").unwrap();
    assert_eq!(a.level, Level::Info);
    assert!(
        a.text.contains("4.00 MiB, where 32-true holds 8.00 MiB"),
        "{}",
        a.text
    );
    assert!(find(&with("bf16-mixed"), "optimizer state in").is_none());
    assert!(find(&quiet(), "optimizer state in").is_none());
}

/// `summary.json`'s `flops` with `mfu` of a peak from `source`, at
/// `per_step` FLOPs a step.
fn flops(mfu: f64, source: &str, per_step: f64) -> redline_train::mfu::FlopsSummary {
    let peak = 989.4e12;
    redline_train::mfu::FlopsSummary {
        train_per_sample: 1_000_000,
        per_step,
        achieved_per_s: mfu * peak,
        peak_per_s: Some(peak),
        peak_source: source.into(),
        mfu: Some(mfu),
    }
}

#[test]
fn a_busy_gpu_with_little_math_is_told_why_with_the_numbers() {
    // The MLP: kernels 93% of wall, MFU 2%, fp32 products, tiny steps.
    let mut run = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 93.0, &[]);
    summary(&mut run).batch_size = Some(64);
    summary(&mut run).flops = Some(flops(0.02, "NVIDIA H100 datasheet, SXM (tf32 dense)", 5e7));
    let a = find(&run, "MFU is only 2.0%").unwrap();
    assert_eq!(a.level, Level::Warn);
    for part in [
        "GPU busy (kernel time) is 93% of wall time",
        "19.8 TFLOP/s of 989 TFLOP/s",
        "--precision bf16-mixed",
        "a step is 50.0 MFLOP of math, 0.1 us at the peak",
        "batch 64: a larger --batch-size (e.g. 256",
    ] {
        assert!(a.text.contains(part), "{part:?} missing: {}", a.text);
    }
    // bf16 already, big steps, big batch: none of the three, but still said.
    let mut big = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 93.0, &[]);
    summary(&mut big).batch_size = Some(1024);
    summary(&mut big).flops = Some(flops(0.2, "NVIDIA H100 datasheet, SXM (bf16 dense)", 1e13));
    let a = find(&big, "MFU is only 20.0%").unwrap();
    assert!(
        !a.text.contains("bf16-mixed") && !a.text.contains("batch 1024"),
        "{}",
        a.text
    );
    assert!(a.text.contains("narrow for the device"), "{}", a.text);
}

#[test]
fn mfu_advice_stays_quiet_when_the_device_idles_or_the_math_is_fast() {
    // Not busy: the kernel-time rule names the cause; this one says nothing.
    let mut idle = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 40.0, &[]);
    summary(&mut idle).flops = Some(flops(0.02, "x (fp32 dense)", 5e7));
    assert!(find(&idle, "MFU is only").is_none());
    // Above 30%: no warning; from 50% good news.
    let mut ok = traced([96.0, 0.0, 0.0, 1.0, 2.0, 1.0], 93.0, &[]);
    summary(&mut ok).flops = Some(flops(0.35, "x (bf16 dense)", 1e13));
    assert!(find(&ok, "MFU").is_none());
    summary(&mut ok).flops = Some(flops(0.55, "x (bf16 dense)", 1e13));
    assert_eq!(
        find(&ok, "MFU is 55.0%").map(|a| a.level),
        Some(Level::Good)
    );
}

#[test]
fn the_breakdown_line_reads_mfu_against_the_busy_time() {
    let mut run = quiet();
    assert_eq!(efficiency_line(&run), None);
    summary(&mut run).flops_note = Some("the model does not count its FLOPs".into());
    let line = efficiency_line(&run).unwrap();
    assert!(
        line.contains("not known: the model does not count"),
        "{line}"
    );
    summary(&mut run).flops = Some(flops(0.35, "measured: the fp32 GEMM on 2 threads", 1e9));
    let line = efficiency_line(&run).unwrap();
    // Compute is 70% of wall in `quiet`: 35% / 0.7 = 50% while busy.
    assert!(line.contains("MFU 35.0%"), "{line}");
    assert!(line.contains("compute was 70.0% of wall time"), "{line}");
    assert!(line.contains("the math ran at 50.0% of peak"), "{line}");
}

#[test]
fn a_streamed_run_names_its_bound_with_the_numbers() {
    let mut run = quiet();
    assert!(
        find(&run, "bounds this run").is_none(),
        "resident data: no rule"
    );
    let pipeline = |busy: f64, bound: &str| {
        serde_json::json!({"workers": 2, "images": 1000, "busy_s": 3.2, "images_per_s": 310.0,
                           "workers_busy": busy, "samples_per_s": 297.0, "bound": bound})
    };
    summary(&mut run)
        .other
        .insert("data_pipeline".into(), pipeline(0.96, "data"));
    let a = find(&run, "the data bounds this run").unwrap();
    assert_eq!(a.level, Level::Warn);
    for part in [
        "2 decode workers make 310 images/s with all busy and were busy 96% of the fit",
        "trained 297 samples/s",
        "--workers",
        "redline pack",
        "--stream off",
    ] {
        assert!(a.text.contains(part), "{part:?}: {}", a.text);
    }
    summary(&mut run)
        .other
        .insert("data_pipeline".into(), pipeline(0.25, "model"));
    let a = find(&run, "the model bounds this run").unwrap();
    assert_eq!(a.level, Level::Good);
    assert!(a.text.contains("(1.0x what training took)"), "{}", a.text);
}
