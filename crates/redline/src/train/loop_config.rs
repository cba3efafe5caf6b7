//! The training loop's settings from the flags ([`TrainConfig`]), checked
//! before the run folder exists so that a bad value leaves nothing behind.

use redline_train::{EarlyStop, GradClip, LossScale, LrSchedule, TrainConfig};

use crate::cli::TrainArgs;
use crate::short_runs::ShortRun;

/// The loop's settings: the flags', one epoch for a fast dev run, and the
/// plan's schedule, early stop and loss scale.
pub(super) fn build(
    args: &TrainArgs,
    short: &ShortRun,
    (schedule, early_stop, loss_scale): (LrSchedule, Option<EarlyStop>, Option<LossScale>),
) -> anyhow::Result<TrainConfig> {
    let cfg = TrainConfig {
        epochs: if short.fast_dev_run.is_some() {
            1
        } else {
            args.epochs
        },
        max_steps: args.max_steps,
        log_every: args.log_every,
        accumulate: args.accumulate,
        clip: grad_clip(args),
        log_grad_norm: args.log_grad_norm,
        divergence_threshold: (args.divergence_threshold != 0.0)
            .then_some(args.divergence_threshold),
        validate: !args.no_validate,
        empty_cache: args.empty_cache,
        cuda_graph: args.cuda_graph.parse()?,
        kernel_trace: args.kernel_trace == "on",
        fused_kernels: args.fused_kernels.parse()?,
        schedule,
        early_stop,
        loss_scale,
    };
    cfg.check()?;
    Ok(cfg)
}

/// The startup line of `--accumulate N` (N > 1): the effective batch.
pub(super) fn print_accumulation(args: &TrainArgs, batch_size: usize) {
    if args.accumulate > 1 {
        println!(
            "  accumulating {} micro-batches of {} per optimizer step (effective batch {})",
            args.accumulate,
            batch_size,
            args.accumulate.saturating_mul(batch_size)
        );
    }
}

/// `--clip-grad-norm` / `--clip-grad-value` (clap refuses both at once).
fn grad_clip(args: &TrainArgs) -> Option<GradClip> {
    match (args.clip_grad_norm, args.clip_grad_value) {
        (Some(max_norm), _) => Some(GradClip::Norm { max_norm }),
        (None, Some(limit)) => Some(GradClip::Value { limit }),
        (None, None) => None,
    }
}
