//! What `redline train` prints after the fit: the summary table and the
//! lines about how it ran (graphs, precision, memory, checkpoints, `--save`),
//! then what the run folder holds.

use redline_profile::Mode;
use redline_run::Finished;
use redline_train::{EvalResult, FitSummary, Trainer};

use crate::cli::TrainArgs;
use crate::summary;

/// The summary table of a fit (and its test pass) and how it ran.
pub(super) fn print(
    args: &TrainArgs,
    (fit, test): (&FitSummary, Option<&EvalResult>),
    trainer: &Trainer,
    data: &super::loaders::Loaders,
) -> anyhow::Result<()> {
    summary::print(fit, test, data.batch_size)?;
    // Perplexity and tokens/s where the targets are next tokens.
    if let Some(line) = summary::language_model(fit, test, data.target) {
        println!("{line}");
    }
    if !trainer.device().is_cpu() {
        println!("cuda graph: {}", fit.cuda_graph);
    }
    if let Some(p) = fit.matmul_precision {
        println!("matmul precision: {}", p.describe());
    } else if args.matmul_precision != "highest" {
        println!(
            "matmul precision: --matmul-precision {} has no effect on the CPU (its fp32 \
             products are always full fp32)",
            args.matmul_precision
        );
    }
    if let Some(c) = &fit.gpu_conv {
        println!("convolutions: {c} (--gpu-conv {})", args.gpu_conv);
    }
    if let Some(m) = &fit.memory {
        println!("memory: {}", m.line());
    }
    if let Some(s) = &fit.loss_scale {
        println!(
            "loss scale: {} at the end, {} of {} steps skipped on overflow",
            s.scale, s.skipped_steps, fit.steps
        );
    }
    match &fit.flops {
        Some(Ok(f)) => println!(
            "flops: {} per sample (forward and backward), {}",
            redline_train::mfu::amount(f.train_per_sample as f64),
            f.line()
        ),
        Some(Err(why)) => println!("MFU: not shown: {why}"),
        None => {}
    }
    match &fit.gpu_busy {
        Some(Ok(g)) => println!("{}", g.line()),
        Some(Err(why)) => println!("GPU busy: not measured: {why}"),
        None => {}
    }
    if let Some(c) = &fit.checkpoints {
        println!(
            "checkpoints: {} written{}",
            c.written,
            c.last
                .as_ref()
                .map_or(String::new(), |p| format!(", the last {}", p.display()))
        );
        for f in &c.failed {
            println!("  checkpoint failed: {f}");
        }
    }
    Ok(())
}

/// The device's memory after the fit (a GPU's; nothing on the CPU): the
/// pool was trimmed, so peak is the run's high-water mark.
pub(super) fn print_memory(trainer: &Trainer) {
    if let Ok(Some(mem)) = trainer.memory() {
        println!(
            "device memory: peak allocated {:.1} MiB, pool {:.1} MiB after trim, {:.1} of {:.1} \
             GiB free",
            mem.peak_allocated as f64 / 1048576.0,
            mem.reserved as f64 / 1048576.0,
            mem.device_free as f64 / 1073741824.0,
            mem.device_total as f64 / 1073741824.0
        );
    }
}

/// What became of `--save`: written, or why not (`fast_dev_run`, or the
/// fit's `untrained` reason).
pub(super) fn print_save(args: &TrainArgs, fast_dev_run: Option<usize>, untrained: Option<&str>) {
    match (&args.save, fast_dev_run, untrained) {
        (Some(path), Some(_), _) => println!(
            "--save {}: not written by a fast dev run (it checks that the run works)",
            path.display()
        ),
        (Some(path), None, Some(why)) => {
            println!("--save {}: not written: {why}", path.display())
        }
        (Some(path), None, None) => println!("saved weights to {}", path.display()),
        (None, _, _) => {}
    }
}

/// Why a fit left the weights as they started, if it did: no optimizer
/// step was taken (every step skipped on an fp16 overflow, or none run).
pub(super) fn untrained(fit: &redline_train::FitSummary) -> Option<String> {
    let skipped = fit.loss_scale.as_ref().map_or(0, |s| s.skipped_steps);
    if fit.steps as u64 > skipped {
        return None;
    }
    Some(match skipped {
        0 => "no optimizer step ran, so the weights are the initial ones".into(),
        n => format!(
            "all {n} optimizer steps were skipped on fp16 overflow, so the weights are the \
             initial ones\nHINT: lower --loss-scale's init (PyTorch's default is 65536)"
        ),
    })
}

/// Prints what the run left behind: the profile table and breakdown line,
/// the trace, and where the folder and report are.
pub(super) fn report(done: &Finished) {
    let segments = done
        .summary
        .other
        .get("segments")
        .and_then(|v| serde_json::from_value::<Vec<redline_run::segments::Segment>>(v.clone()).ok())
        .filter(|s| s.len() > 1);
    if let Some(segs) = segments {
        let this = segs.last().and_then(redline_run::segments::Segment::wall_s);
        println!(
            "resumed run: {} segments, {:.2} s of wall time in all (this one {:.2} s); \
             summary.json's numbers are the run's totals",
            segs.len(),
            redline_run::segments::total_wall_s(&segs),
            this.unwrap_or(0.0)
        );
    }
    if let Some(p) = &done.profile {
        if p.mode != Mode::Off {
            print!("{}", p.table());
        }
        if let Some(t) = &p.trace {
            println!(
                "trace: {} ({} spans; open in https://ui.perfetto.dev or chrome://tracing)",
                done.dir.join("trace.json").display(),
                t.spans.len()
            );
        }
        println!("{}", p.breakdown.line());
    }
    match &done.report {
        Some(Ok(page)) => println!(
            "run folder: {}  (report: {})",
            done.dir.display(),
            page.display()
        ),
        Some(Err(e)) => {
            println!("run folder: {}", done.dir.display());
            eprintln!("warning: report not written: {e}");
        }
        None => println!("run folder: {}", done.dir.display()),
    }
}
