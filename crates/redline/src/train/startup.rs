//! The startup lines of `redline train`: the model, device and optimizer,
//! the schedule and early stop, the data and what reading it decided, and a
//! short run's limits.

use redline_core::Precision;
use redline_data::Loader;

use super::loaders::Loaders;
use super::model::Built;
use crate::cli::TrainArgs;
use crate::plan::Plan;

/// The batches an epoch of each split runs (train, val, test), as limited.
pub(super) fn batches(data: &Loaders) -> [Option<usize>; 3] {
    [
        Some(data.train.batches_per_epoch()),
        data.val.as_ref().map(Loader::batches_per_epoch),
        data.test.as_ref().map(Loader::batches_per_epoch),
    ]
}

/// Prints the startup lines.
pub(super) fn print(args: &TrainArgs, plan: &Plan, data: &Loaders, built: &Built) {
    println!(
        "redline: {} ({} params) on {} ({} compute threads), {} batch {}, lr {}, loss {}{}",
        plan.model_cfg.name(),
        built.model.params().numel(),
        plan.device,
        plan.threads,
        args.optimizer,
        data.batch_size,
        plan.lr,
        plan.step_kind,
        match plan.precision {
            Precision::Fp32 => String::new(),
            p => format!(", precision {p}"),
        }
    );
    if let Some(line) = decay_groups(plan, built) {
        println!("  {line}");
    }
    if !plan.schedule.is_constant() {
        println!("  lr schedule: {} (base lr {})", plan.schedule, plan.lr);
    }
    if let Some(es) = &plan.early_stop {
        println!("  early stop: {es}");
    }
    let (train_n, val_n, test_n) = data.counts;
    println!(
        "data: {} ({}; inputs {:?}, {}): {} train / {} val / {} test, {}",
        plan.data_dir.display(),
        data.format,
        data.inputs,
        data.target,
        train_n,
        val_n,
        test_n,
        data.train.placement(),
    );
    for note in &data.notes {
        println!("  {note}");
    }
    if let Some(line) = plan.short.describe(batches(data)) {
        println!("  {line}");
    }
    loop_config_note(args, data.batch_size);
    match &plan.peak {
        Some(Ok(p)) => println!(
            "  MFU against a peak of {} ({})",
            redline_train::mfu::rate(p.per_s),
            p.source
        ),
        Some(Err(why)) => println!("  MFU: not shown: {why}"),
        None => {}
    }
}

/// The optimizer's two groups, where the model keeps weight decay off some
/// parameters (nanoGPT's: 2-D tensors decay, biases and norms do not).
fn decay_groups(plan: &Plan, built: &Built) -> Option<String> {
    let wd = plan.opt_cfg.weight_decay();
    let mut g = [(0usize, 0usize); 2];
    for (p, decay) in built.model.params().with_decay() {
        let e = &mut g[usize::from(!decay)];
        e.0 += 1;
        e.1 += p.as_tensor().elem_count();
    }
    (wd > 0.0 && g[1].0 > 0).then(|| {
        format!(
            "weight decay {wd} on {} tensors ({} values: matrices, embeddings), none on {} \
             ({} values: biases, norms)",
            g[0].0, g[0].1, g[1].0, g[1].1
        )
    })
}

/// The startup line of `--accumulate N` (N > 1): the effective batch.
fn loop_config_note(args: &TrainArgs, batch_size: usize) {
    if args.accumulate > 1 {
        println!(
            "  accumulating {} micro-batches of {} per optimizer step (effective batch {})",
            args.accumulate,
            batch_size,
            args.accumulate.saturating_mul(batch_size)
        );
    }
}
