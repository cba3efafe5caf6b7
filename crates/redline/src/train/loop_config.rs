//! The training loop's settings from the flags ([`TrainConfig`]), checked
//! before the run folder exists so that a bad value leaves nothing behind.

use redline_train::{GradClip, TrainConfig};

use crate::cli::TrainArgs;
use crate::plan::Plan;

/// The loop's settings: the flags', one epoch for a fast dev run, and the
/// plan's schedule, early stop and loss scale.
pub(super) fn build(args: &TrainArgs, plan: &Plan) -> anyhow::Result<TrainConfig> {
    let cfg = TrainConfig {
        epochs: if plan.short.fast_dev_run.is_some() {
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
        schedule: plan.schedule.clone(),
        early_stop: plan.early_stop.clone(),
        loss_scale: plan.loss_scale,
    };
    cfg.check()?;
    Ok(cfg)
}

/// `--clip-grad-norm` / `--clip-grad-value` (clap refuses both at once).
fn grad_clip(args: &TrainArgs) -> Option<GradClip> {
    match (args.clip_grad_norm, args.clip_grad_value) {
        (Some(max_norm), _) => Some(GradClip::Norm { max_norm }),
        (None, Some(limit)) => Some(GradClip::Value { limit }),
        (None, None) => None,
    }
}
