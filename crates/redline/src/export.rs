//! `redline export RUN_DIR --hf DIR`: a run's GPT written as a Hugging Face
//! GPT-2 folder (`config.json`, `model.safetensors` with transformers'
//! names and `Conv1D` layout, and a `tokenizer.json` when the run had one),
//! which `GPT2LMHeadModel.from_pretrained(DIR)` loads. Nothing is
//! overwritten.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use redline_models::gpt::hf;

use crate::evaluate::run_job;

/// Flags of `redline export`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The run folder (`last`: the newest run), or a .safetensors file of one.
    #[arg(value_name = "RUN_DIR|WEIGHTS")]
    pub run_dir: PathBuf,
    /// Write a Hugging Face GPT-2 folder here (a new or empty folder).
    #[arg(long, value_name = "DIR")]
    pub hf: PathBuf,
    /// Which weights: `last`, `best`, a checkpoint folder or a .safetensors file.
    #[arg(long, default_value = "last", value_name = "best|last|PATH")]
    pub checkpoint: String,
}

/// Runs `redline export`.
pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let job = run_job(
        "redline export",
        &args.run_dir,
        None,
        &args.checkpoint,
        Some("cpu"),
    )?;
    let model = job.gpt(
        &redline_core::Device::cpu(),
        job.plan.precision,
        &format!(
            "redline export --hf writes GPT-2 folders (the run's weights are already PyTorch \
             state_dict names in safetensors: {})",
            job.file.display()
        ),
    )?;
    let cfg = model.config();
    let tokenizer = job.tokenizer();
    let target = args.hf.join(hf::TOKENIZER);
    if tokenizer.is_some() && target.exists() {
        bail!(
            "--hf {}: already holds a {}; an export never overwrites a file\nHINT: give a new \
             folder",
            args.hf.display(),
            hf::TOKENIZER
        );
    }
    let mut written = model
        .save_hf(&args.hf)
        .with_context(|| format!("--hf {}", args.hf.display()))?;
    if let Some(t) = tokenizer {
        let bytes = std::fs::read(&t).with_context(|| format!("reading {}", t.display()))?;
        redline_core::files::write_atomic(&target, &bytes)
            .with_context(|| format!("writing {}", target.display()))?;
        written.push(target);
    }
    let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    println!(
        "exported {} ({} layers, {} heads, {} wide, block {}, vocabulary {}) from {}: {}",
        job.dir.display(),
        cfg.n_layer,
        cfg.n_head,
        cfg.n_embd,
        cfg.block_size,
        cfg.vocab_size,
        job.file.display(),
        names.join(", ")
    );
    if written.len() == 2 {
        println!(
            "  no tokenizer.json: the run's ids are {}",
            match job.plan.data_dir.is_file() {
                true => "UTF-8 bytes (id = byte value)",
                false => "its token files' (give the tokenizer that made them alongside)",
            }
        );
    }
    Ok(())
}
