//! A program that uses the trainer as a library gets the same run folder as
//! `redline train`: records, summary, breakdown and report, from `Run`.

use std::path::PathBuf;

use candle_core::Tensor;
use redline_core::{Device, Precision};
use redline_data::{Loader, LoaderConfig, Split, TargetKind};
use redline_models::{MlpConfig, ModelConfig};
use redline_run::records::{Record, RunStatus, Summary};
use redline_run::{Ending, Run};
use redline_train::{Classifier, Trainer};

type R = anyhow::Result<()>;

/// 24 samples of 4 features: class 1 where the first feature is positive.
fn loader() -> anyhow::Result<Loader> {
    let n = 24;
    let x: Vec<f32> = (0..n * 4)
        .map(|i| ((i * 7919) % 13) as f32 / 6.0 - 1.0)
        .collect();
    let y: Vec<u32> = (0..n).map(|i| u32::from(x[i * 4] > 0.0)).collect();
    let split = Split {
        x: Tensor::from_vec(x, (n, 4), &candle_core::Device::Cpu)?,
        y: Tensor::from_vec(y, n, &candle_core::Device::Cpu)?,
        target: TargetKind::Classes(2),
        source: PathBuf::from("synthetic"),
    };
    let cfg = LoaderConfig {
        batch_size: 8,
        shuffle: false,
        prefetch: 0,
        ..LoaderConfig::default()
    };
    Ok(Loader::new(split, cfg)?)
}

fn trainer(run: &Run) -> anyhow::Result<Trainer> {
    let model = ModelConfig::Mlp(MlpConfig {
        in_features: 4,
        hidden: vec![8],
        classes: 2,
    })
    .build(&Device::cpu(), Precision::Fp32, 0)?;
    Ok(Trainer::builder()
        .epochs(2)
        .log_every(1)
        .callback(run.callback())
        .build(Classifier::new(model), Device::cpu())?)
}

fn records(dir: &std::path::Path) -> anyhow::Result<Vec<Record>> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl"))?;
    Ok(text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

#[test]
fn a_library_fit_leaves_the_cli_run_folder_and_report() -> R {
    let tmp = tempfile::tempdir()?;
    let mut run = Run::create_in(None, tmp.path(), "mlp")?;
    run.set("batch_size", serde_json::json!(8))?;
    run.set("my_note", serde_json::json!({"any": "value"}))?;
    // A typed field of the wrong type is refused when set, not lost at the end.
    let err = run
        .set("threads", serde_json::json!("four"))
        .err()
        .map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("summary.json field")));
    run.monitor(std::time::Duration::from_millis(20));
    run.report(Box::new(|d| {
        redline_report::write_report(d).map_err(|e| e.to_string())
    }));
    let mut t = trainer(&run)?;
    let data = loader()?;
    let fit = t.fit(&data, Some(&data))?;
    let test = t.test(&data)?;
    let done = run.finish(
        &mut t,
        Ending::Finished {
            fit: &fit,
            test: Some(&test),
        },
    )?;

    assert!(done.dir.starts_with(tmp.path()));
    for f in [
        "metrics.jsonl",
        "metrics.csv",
        "summary.json",
        "breakdown.json",
        "report.html",
    ] {
        assert!(done.dir.join(f).is_file(), "{f} missing");
    }
    assert!(matches!(&done.report, Some(Ok(p)) if p.ends_with("report.html")));
    // Every record reads back as the type the report reads.
    let recs = records(&done.dir)?;
    let steps = recs.iter().filter(|r| matches!(r, Record::Step(_))).count();
    let epochs: Vec<_> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Epoch(e) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!((steps, epochs.len()), (6, 2), "3 steps an epoch, 2 epochs");
    assert!(epochs[1].val_accuracy.is_some() && epochs[1].train_loss.is_some());
    let summary: Summary =
        serde_json::from_str(&std::fs::read_to_string(done.dir.join("summary.json"))?)?;
    assert_eq!(summary.status, RunStatus::Finished);
    assert_eq!(summary.model, "mlp");
    assert_eq!(summary.device, "cpu");
    assert_eq!(
        (summary.epochs, summary.steps, summary.batch_size),
        (Some(2), Some(6), Some(8))
    );
    assert_eq!(
        summary.test_accuracy,
        Some(test.metrics.get("accuracy").unwrap_or(-1.0))
    );
    assert_eq!(summary.test_loss, Some(test.loss));
    assert!(summary.error.is_none());
    assert_eq!(
        summary.headline().map(|h| h.0),
        Some("test accuracy".into())
    );
    assert_eq!(done.summary.steps, summary.steps);
    assert_eq!(summary.threads, None);
    assert_eq!(summary.other["my_note"]["any"], "value");
    Ok(())
}

#[test]
fn a_failed_or_interrupted_run_says_so_in_its_summary() -> R {
    let tmp = tempfile::tempdir()?;
    for (ending, status) in [
        (Ending::Failed("loss is NaN at step 3"), RunStatus::Failed),
        (
            Ending::Interrupted("interrupted by SIGINT after step 2"),
            RunStatus::Interrupted,
        ),
    ] {
        let run = Run::create_in(None, tmp.path(), "mlp")?;
        let mut t = trainer(&run)?;
        let done = run.finish(&mut t, ending)?;
        let text = std::fs::read_to_string(done.dir.join("summary.json"))?;
        let summary: Summary = serde_json::from_str(&text)?;
        assert_eq!(summary.status, status, "{text}");
        let error = summary.error.unwrap_or_default();
        assert!(error.contains("step"), "{error}");
        assert_eq!(summary.steps, None, "no fit numbers without a finished fit");
        assert!(done.report.is_none(), "no report hook, no report");
    }
    // Two runs in the same second get two folders.
    assert_eq!(std::fs::read_dir(tmp.path())?.count(), 2);
    Ok(())
}

#[test]
fn a_folder_holding_a_run_is_refused_and_left_alone() -> R {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("mine");
    let run = Run::create(Some(&dir), "mlp")?;
    assert!(dir.join("pid").is_file(), "a live run names its process");
    // Dropped before `finish` (an early `?` in the program): recorded as failed.
    drop(run);
    let summary: Summary =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json"))?)?;
    assert_eq!(summary.status, RunStatus::Failed);
    assert!(summary
        .error
        .is_some_and(|e| e.contains("before it finished")));
    assert!(!dir.join("pid").exists());
    let before = std::fs::read_to_string(dir.join("metrics.jsonl"))?;
    let err = Run::create(Some(&dir), "cnn").err().map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("already holds a run")));
    assert_eq!(std::fs::read_to_string(dir.join("metrics.jsonl"))?, before);
    Ok(())
}

/// What `summary.json` holds for a finished `fit`.
fn summary_of(fit: &redline_train::FitSummary) -> redline_run::Result<Summary> {
    redline_run::summarize(Default::default(), Ending::Finished { fit, test: None }, 0)
}

#[test]
fn summary_json_carries_gpu_busy_or_why_it_is_missing() -> R {
    let tmp = tempfile::tempdir()?;
    let run = Run::create_in(None, tmp.path(), "mlp")?;
    let mut t = trainer(&run)?;
    let mut fit = t.fit(&loader()?, None)?;
    drop(run);
    assert!(fit.gpu_busy.is_none(), "the CPU has no GPU figure");
    assert!(
        fit.matmul_precision.is_none(),
        "the CPU's products are fp32"
    );
    let cpu = summary_of(&fit)?;
    assert!(cpu.gpu_busy.is_none() && cpu.gpu_busy_note.is_none());
    assert!(cpu.matmul_precision.is_none());
    assert!(
        fit.gpu_conv.is_none() && cpu.gpu_conv.is_none(),
        "no GPU convolution"
    );
    fit.matmul_precision = Some(redline_core::MatmulPrecision::High);
    fit.gpu_conv = Some("cuDNN 9.19.0".into());
    let gpu = summary_of(&fit)?;
    assert_eq!(
        gpu.matmul_precision.as_deref(),
        Some("high (TF32 products, fp32 accumulation)")
    );
    assert_eq!(gpu.gpu_conv.as_deref(), Some("cuDNN 9.19.0"));

    let mut tally = redline_profile::KernelTally::new(0);
    let k = tally.name_id("affine_f32");
    tally.add(&mut [redline_profile::KernelSpan {
        start_ns: 0,
        end_ns: 250,
        name: k,
    }]);
    let busy = tally.finish(1000, fit.steps, "cupti");
    fit.gpu_busy = Some(Ok(busy.clone()));
    let s = summary_of(&fit)?;
    let back: Summary = serde_json::from_str(&serde_json::to_string(&s)?)?;
    assert_eq!(back.gpu_busy.as_ref(), Some(&busy));
    assert!((back.gpu_busy.map_or(0.0, |g| g.percent) - 25.0).abs() < 1e-9);

    fit.gpu_busy = Some(Err("libcupti was not found".into()));
    let s = summary_of(&fit)?;
    assert_eq!(
        s.gpu_busy_note.as_deref(),
        Some("not measured: libcupti was not found")
    );
    assert!(s.gpu_busy.is_none());
    Ok(())
}
