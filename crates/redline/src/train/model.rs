//! The model stage of `redline train`: the plan's model built on its device
//! in its precision, `--init` weights loaded, and the `(name, shape)` list a
//! checkpoint to resume from must match.

use anyhow::Context;
use redline_models::Model;

use crate::cli::TrainArgs;
use crate::plan::Plan;

/// The model and what a checkpoint must hold for it.
pub(super) struct Built {
    /// The model, its weights initialised (or `--init`'s).
    pub model: Box<dyn Model>,
    /// Its parameters' `(name, shape)`, in order.
    pub shapes: Vec<(String, Vec<usize>)>,
}

/// Builds the plan's model; a signal while it builds stops the run here.
pub(super) fn build(args: &TrainArgs, plan: &Plan) -> anyhow::Result<Built> {
    let model = plan
        .model_cfg
        .build(&plan.device, plan.precision, args.seed)?;
    if let Some(init) = &args.init {
        model.params().load_safetensors(init).context("--init")?;
    }
    let shapes = model
        .params()
        .state()
        .map(|(n, v)| (n.to_string(), v.as_tensor().dims().to_vec()))
        .collect();
    plan.stop.check("building the model")?;
    Ok(Built { model, shapes })
}
