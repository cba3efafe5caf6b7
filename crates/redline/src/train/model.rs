//! The model stage of `redline train`: the plan's model built on its device
//! in its precision, `--init` weights loaded, and the `(name, shape)` list a
//! checkpoint to resume from must match.

use anyhow::{bail, Context};
use redline_models::init::Initializer;
use redline_models::{Gpt, Model, ModelConfig};

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
    let model = match (&plan.model_cfg, args.init.as_deref()) {
        // A Hugging Face GPT-2 folder: its own names and layout.
        (ModelConfig::Gpt(cfg), Some(dir)) if dir.is_dir() => {
            let mut init = Initializer::new(args.seed, &plan.device, plan.precision);
            let gpt = Gpt::new(cfg, &mut init)?;
            gpt.load_hf(dir)
                .with_context(|| format!("--init {}", dir.display()))?;
            Box::new(gpt)
        }
        (cfg, init) => {
            let model = cfg.build(&plan.device, plan.precision, args.seed)?;
            match init {
                Some(dir) if dir.is_dir() => bail!(
                    "--init {}: a folder is read as a Hugging Face GPT-2 folder, for a GPT; \
                     this run's model is {}\nHINT: give a .safetensors weights file",
                    dir.display(),
                    cfg.name()
                ),
                Some(file) => model.params().load_safetensors(file).context("--init")?,
                None => {}
            }
            model
        }
    };
    let shapes = model
        .params()
        .state()
        .map(|(n, v)| (n.to_string(), v.as_tensor().dims().to_vec()))
        .collect();
    plan.stop.check("building the model")?;
    Ok(Built { model, shapes })
}
