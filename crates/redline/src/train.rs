//! `redline train`: flags -> plan -> data -> model -> run folder -> trainer
//! -> fit -> test -> report. Each stage is a function in a file named after
//! it under `train/`; this one only calls them in order.

use anyhow::bail;

use crate::cli::TrainArgs;

mod fit;
mod folder;
mod loaders;
mod loop_config;
mod model;
mod pipeline_bound;
mod precision_note;
mod results;
mod startup;

/// Runs `redline train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    if args.print_config {
        return crate::print_config::print(args);
    }
    // `--devices N` alone: this command again as N ranks under mpirun.
    if let Some(status) = crate::spawn::spawn(args.devices, &args.strategy)? {
        if !status.success() {
            bail!(
                "the {} ranks ended with {status} (their errors are above)\nHINT: when the \
                 launcher itself refused to start them, its message above says why; \
                 docs/scaling.md (\"When the launcher refuses\") has the fix for each: root, \
                 too few slots, another MPI's mpirun, srun outside an allocation",
                args.devices.unwrap_or(1)
            );
        }
        return Ok(());
    }
    let mut plan = crate::plan::prepare(args)?;
    // `auto` flags are settled by measurement on this very job.
    let tuned = crate::tune::resolve(args, &mut plan)?;
    // Measured (on the CPU) before the data's workers start.
    plan.peak = crate::peak::for_run(args, &plan)?;
    let data = loaders::build(args, &mut plan)?;
    let built = model::build(args, &plan)?;
    startup::print(args, &plan, &data, &built);
    // Checked before the run folder exists: a bad value leaves nothing behind.
    let loop_cfg = loop_config::build(args, &plan)?;
    if !plan.ranks.is_global_zero() {
        let resume_from = folder::other_rank_resume(args, &plan, &built.shapes)?;
        return fit::other_rank(plan, data, (built.model, resume_from), loop_cfg);
    }
    let mut folder = folder::open(args, &plan, &built.shapes)?;
    folder::describe(&mut folder.run, args, &plan, &data, &loop_cfg)?;
    tuned.record(&mut folder.run)?;
    // `detailed`: this thread and the monitor's record into one trace, which
    // the trainer's profiler joins and writes.
    let tracer =
        (plan.mode == redline_profile::Mode::Detailed).then(redline_core::trace::Tracer::new);
    let _traced = tracer.as_ref().map(redline_core::trace::Tracer::attach);
    if args.monitor_interval > 0.0 {
        folder.run.monitor(plan.monitor_every);
    }
    let checkpoints = folder::checkpoints(args, &plan, &folder, data.val.is_some())?;
    let resumable = checkpoints
        .as_ref()
        .map(|c| (folder.dir.clone(), c.dir.clone()));
    let folder::Folder {
        run, resume_from, ..
    } = folder;
    let trainer = fit::trainer(
        args,
        &mut plan,
        &run,
        (loop_cfg, checkpoints),
        (built.model, resume_from),
    )?;
    fit::run(args, &plan, trainer, run, &data, resumable)
}
