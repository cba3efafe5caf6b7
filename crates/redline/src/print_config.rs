//! `--print-config`: the resolved flags of a job as TOML, as LightningCLI's
//! `--print_config`: what a run folder's `config.toml` holds, so that
//! `redline train --config FILE` runs the same job (same seed, data and
//! flags: the same weights, bit for bit).

use std::path::absolute;

use anyhow::Context;

use crate::cli::TrainArgs;

/// The flags as a config file: paths absolute (the default data resolved),
/// a model file by its absolute path, and values settled by measurement
/// (`auto`) left as `auto`.
pub fn resolved(args: &TrainArgs) -> anyhow::Result<String> {
    let mut flags = args.clone();
    let data = match &args.data {
        Some(d) => d.clone(),
        None => crate::plan::default_data_dir()?.0,
    };
    flags.data = Some(absolute(&data).with_context(|| format!("--data {}", data.display()))?);
    if let Some(init) = &args.init {
        flags.init = Some(absolute(init)?);
    }
    if let Some(t) = &args.tokenizer {
        flags.tokenizer = Some(absolute(t)?);
    }
    if args.model.ends_with(".toml") {
        flags.model = absolute(&args.model)?.display().to_string();
    }
    let text = toml::to_string(&flags).context("serialising the config")?;
    Ok(format!(
        "# redline train --config FILE runs this job (same seed, data and flags); flags given \
         beside --config override these\n{text}"
    ))
}

/// Prints [`resolved`] to stdout.
pub fn print(args: &TrainArgs) -> anyhow::Result<()> {
    print!("{}", resolved(args)?);
    Ok(())
}
