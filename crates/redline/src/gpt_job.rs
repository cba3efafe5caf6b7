//! A finished run's GPT, for the commands that need the model itself, not
//! a trainer around it (`redline sample`, `redline export --hf`): built
//! from the run's plan with its weights, and the tokenizer its text went
//! through.

use std::path::PathBuf;

use anyhow::{bail, Context};
use redline_models::gpt::hf;
use redline_models::init::Initializer;
use redline_models::{Gpt, Model, ModelConfig};

use crate::evaluate::RunJob;

impl RunJob {
    /// The run's GPT on `device` in `precision`, its weights loaded;
    /// `refusal` says what the command does when the run's model is not a
    /// GPT.
    pub fn gpt(
        &self,
        device: &redline_core::Device,
        precision: redline_core::Precision,
        refusal: &str,
    ) -> anyhow::Result<Gpt> {
        let ModelConfig::Gpt(cfg) = &self.plan.model_cfg else {
            bail!(
                "{}: {refusal}; the run trained a {} model",
                self.dir.display(),
                self.plan.model_cfg.name()
            );
        };
        let model = Gpt::new(cfg, &mut Initializer::new(0, device, precision))?;
        model
            .params()
            .load_safetensors(&self.file)
            .with_context(|| self.misfit())?;
        Ok(model)
    }

    /// The tokenizer.json the run's text went through: its `--tokenizer`,
    /// or that of the Hugging Face folder it started from (`--init`).
    pub fn tokenizer(&self) -> Option<PathBuf> {
        self.args.tokenizer.clone().or_else(|| {
            self.init
                .as_deref()
                .map(|d| d.join(hf::TOKENIZER))
                .filter(|t| t.is_file())
        })
    }
}
