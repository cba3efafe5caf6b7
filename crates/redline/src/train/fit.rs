//! The fit stage of `redline train`: the trainer assembled from the plan,
//! `fit` then the test pass (Lightning's `trainer.fit` + `trainer.test`),
//! `--save`, and how the run ended, written into its folder.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Context;
use redline_models::Model;
use redline_run::{Ending, Run};
use redline_train::checkpoint::{CheckpointConfig, Loaded};
use redline_train::{EvalResult, FitSummary, JsonlMetrics, TrainConfig, Trainer};

use super::loaders::Loaders;
use super::results;
use crate::cli::TrainArgs;
use crate::plan::Plan;
use crate::progress::Progress;
use crate::signals::Stopped;

/// A rank other than 0 trains its shard (and tests it) and keeps no folder;
/// a signal's stop ends it with success (rank 0 reports the stop).
pub(super) fn other_rank(
    mut plan: Plan,
    data: Loaders,
    (model, resume_from): (Box<dyn Model>, Option<Loaded>),
    loop_cfg: TrainConfig,
) -> anyhow::Result<()> {
    let mut trainer = Trainer::builder()
        .config(loop_cfg)
        .optimizer(plan.opt_cfg.clone())
        .model_name(plan.model_cfg.name())
        .stop_when(Arc::clone(&plan.stop.flag))
        .strategy(std::mem::take(&mut plan.ranks.strategy))
        .build(plan.step_kind.step(model), plan.device.clone())?;
    if let Some(loaded) = resume_from {
        trainer.resume_from(loaded)?;
    }
    let ran = trainer
        .fit(&data.train, data.val.as_ref())
        .and_then(|_| data.test.as_ref().map(|t| trainer.test(t)).transpose());
    match ran {
        // A signal's stop: rank 0 writes the job's checkpoint and run folder
        // and exits with the signal's code. This rank ends quietly: `mpirun`
        // tears the job down (SIGKILL to rank 0 a second later) as soon as
        // one rank fails, which could cut rank 0's writing short.
        Ok(_) | Err(redline_train::Error::Interrupted { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Rank 0's trainer: the run folder's observers (records, progress,
/// `--metrics`), the plan's loop, optimizer and strategy, `checkpoints`,
/// and the checkpoint to resume from.
pub(super) fn trainer(
    args: &TrainArgs,
    plan: &mut Plan,
    run: &Run,
    (loop_cfg, checkpoints): (TrainConfig, Option<CheckpointConfig>),
    (model, resume_from): (Box<dyn Model>, Option<Loaded>),
) -> anyhow::Result<Trainer> {
    let mut builder = Trainer::builder()
        .profiler(plan.mode)
        .callback(run.callback())
        .config(loop_cfg)
        .optimizer(plan.opt_cfg.clone())
        .model_name(plan.model_cfg.name())
        .callback(Box::new(Progress::new()));
    if let Some(path) = &args.metrics {
        if let Some(bytes) = JsonlMetrics::existing(path) {
            println!(
                "  --metrics {}: the file exists ({bytes} bytes); this run's records are appended \
                 after what it holds",
                path.display()
            );
        }
        builder = builder.callback(Box::new(JsonlMetrics::create(path)?));
    }
    builder = builder
        .stop_when(Arc::clone(&plan.stop.flag))
        .strategy(std::mem::take(&mut plan.ranks.strategy));
    if let Some(c) = checkpoints {
        builder = builder.checkpoints(c);
    }
    if let Some(p) = plan.peak.take() {
        builder = builder.peak(p);
    }
    let mut trainer = builder.build(plan.step_kind.step(model), plan.device.clone())?;
    if let Some(loaded) = resume_from {
        trainer.resume_from(loaded)?;
    }
    Ok(trainer)
}

/// The fit and its test pass; a signal after the last step still ends
/// the run as interrupted (its records are complete; `--save` is left alone).
fn fit_and_test(
    trainer: &mut Trainer,
    data: &Loaders,
    plan: &Plan,
) -> redline_train::Result<(FitSummary, Option<EvalResult>)> {
    let fit = trainer.fit(&data.train, data.val.as_ref()).and_then(|f| {
        let test = match data.test.as_ref().map(|t| trainer.test(t)).transpose() {
            // The evaluation loop knows no step: the fit's last is named.
            Err(redline_train::Error::Interrupted { .. }) => {
                return Err(redline_train::Error::Interrupted {
                    step: f.steps,
                    epoch: f.epochs,
                })
            }
            other => other?,
        };
        Ok((f, test))
    });
    match fit {
        Ok((f, _)) if plan.stop.flag.load(Ordering::Relaxed) => {
            Err(redline_train::Error::Interrupted {
                step: f.steps,
                epoch: f.epochs,
            })
        }
        other => other,
    }
}

/// Fits, tests, saves, prints the results and writes how the run ended
/// into its folder. `resumable`: the run folder and its checkpoints'.
pub(super) fn run(
    args: &TrainArgs,
    plan: &Plan,
    mut trainer: Trainer,
    run: Run,
    data: &Loaders,
    resumable: Option<(PathBuf, PathBuf)>,
) -> anyhow::Result<()> {
    let fit = fit_and_test(&mut trainer, data, plan);
    // Weights no step changed are not a result: `--save` is left alone.
    let untrained = fit.as_ref().ok().and_then(|(f, _)| results::untrained(f));
    let saved = match (&fit, &args.save) {
        (Ok(_), Some(path)) if plan.short.fast_dev_run.is_none() && untrained.is_none() => {
            // The file names its run, so `redline test FILE` finds the job.
            let dir = std::path::absolute(run.dir()).unwrap_or_else(|_| run.dir().to_path_buf());
            let meta = [(crate::evaluate::RUN_KEY, &*dir.to_string_lossy())];
            Some(
                trainer
                    .save_weights_with(path, &meta)
                    .context("--save")
                    .map(|()| path),
            )
        }
        _ => None,
    };
    results::print_memory(&trainer);
    let outcome = match (fit, saved) {
        (Err(redline_train::Error::Interrupted { step, epoch }), _) => {
            let log = trainer.checkpoint_log();
            Err(anyhow::Error::new(Stopped {
                signal: plan.stop.signal.load(Ordering::Relaxed) as i32,
                step,
                epoch,
                during: None,
                // Only a folder that holds a checkpoint can be resumed (this
                // process's, or an earlier one's before a resume).
                resume: resumable
                    .filter(|(_, c)| !redline_train::checkpoint::list(c).is_empty())
                    .map(|(d, _)| d),
                checkpoint: log.stop.clone().map(|r| r.map(|_| ())),
            }))
        }
        (Err(e), _) => Err(anyhow::Error::from(e)),
        (Ok(_), Some(Err(e))) => Err(e),
        (Ok(f), _) => Ok(f),
    };
    if let Ok((fit, test)) = &outcome {
        results::print(args, (fit, test.as_ref()), &trainer, data)?;
        results::print_save(args, plan.short.fast_dev_run, untrained.as_deref());
    }
    let message = outcome.as_ref().err().map(|e| format!("{e:#}"));
    let ending = match (&outcome, &message) {
        (Ok((fit, test)), _) => Ending::Finished {
            fit,
            test: test.as_ref(),
        },
        (Err(e), Some(m)) if e.downcast_ref::<Stopped>().is_some() => Ending::Interrupted(m),
        (Err(_), m) => Ending::Failed(m.as_deref().unwrap_or_default()),
    };
    let mut run = run;
    let skipped = data.skipped();
    if skipped > 0 {
        println!("data: {skipped} undecodable images skipped (--bad-samples skip)");
    }
    if !data.streamed.is_empty() {
        run.set("bad_samples_skipped", serde_json::json!(skipped))?;
    }
    let bound = match (&outcome, data.pipeline()) {
        (Ok((fit, test)), Some(stats)) => {
            super::pipeline_bound::describe(stats, (fit, test.as_ref()))
        }
        _ => None,
    };
    if let Some(line) = outcome
        .as_ref()
        .ok()
        .and_then(|(fit, _)| crate::peak::check_cached(fit, plan.precision, plan.threads))
    {
        println!("{line}");
    }
    if let Some((record, line)) = bound {
        println!("{line}");
        run.set("data_pipeline", record)?;
    }
    let done = run.finish(&mut trainer, ending)?;
    results::report(&done);
    outcome.map(|_| ())
}
