//! `redline sample RUN_DIR|HF_DIR --prompt TEXT --tokens N`: text from a
//! trained GPT, drawn token by token with a key/value cache (nanoGPT's
//! `sample.py`, transformers' `generate`). A run folder is read through its
//! own plan (its `config.toml`), as `redline test` reads it; a Hugging Face
//! GPT-2 folder (`config.json` + `model.safetensors`) is read directly.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use redline_data::tokens::{Codec, Streamer};
use redline_models::gpt::hf;
use redline_models::init::Initializer;
use redline_models::{Gpt, GptConfig, Sampling};

use crate::evaluate::run_job;

/// Flags of `redline sample`.
#[derive(Debug, Clone, Args)]
pub struct SampleArgs {
    /// A run folder of a GPT (`last`: the newest run), a .safetensors file of one, or a
    /// Hugging Face GPT-2 folder (config.json + model.safetensors, tokenizer.json).
    #[arg(value_name = "RUN_DIR|HF_DIR")]
    pub source: PathBuf,
    /// The text to continue.
    #[arg(long, default_value = "\n", value_name = "TEXT")]
    pub prompt: String,
    /// The prompt as token ids instead (space- or comma-separated), for data with no tokenizer.
    #[arg(long, value_name = "IDS", conflicts_with = "prompt")]
    pub prompt_ids: Option<String>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 200, value_name = "N")]
    pub tokens: usize,
    /// Logits are divided by it before the draw; 0 takes the most likely token (greedy).
    #[arg(
        long,
        default_value_t = 0.8,
        value_name = "T",
        allow_negative_numbers = true
    )]
    pub temperature: f64,
    /// Draw only from the K most likely tokens [default: 200, as nanoGPT's sample.py].
    #[arg(long, default_value_t = 200, value_name = "K")]
    pub top_k: usize,
    /// Seed of the draws.
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Print the generated token ids on one line instead of text.
    #[arg(long)]
    pub ids: bool,
    /// A Hugging Face tokenizer.json [default: the folder's, or UTF-8 bytes for a run on text].
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Which weights of a run: `last`, `best`, a checkpoint folder or a .safetensors file.
    #[arg(long, default_value = "last", value_name = "best|last|PATH")]
    pub checkpoint: String,
    /// The device: auto (the first GPU, else the CPU), cpu or cuda:N.
    #[arg(long, default_value = "auto", value_name = "DEVICE")]
    pub device: String,
    /// Compute threads [default: the cores not busy with other work].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

/// A GPT ready to sample, and how its text is tokenised (when known).
struct Source {
    model: Gpt,
    codec: Option<Codec>,
    /// For messages: where the model came from.
    from: String,
}

/// Runs `redline sample`.
pub fn run(args: &SampleArgs) -> anyhow::Result<()> {
    if args.tokens == 0 {
        bail!("--tokens 0: nothing to generate\nHINT: give at least 1");
    }
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: Some(args.top_k),
        seed: args.seed,
    };
    if !args.temperature.is_finite() || args.temperature < 0.0 {
        bail!(
            "--temperature {}: give 0 (greedy) or a positive number (1 draws from the model's \
             distribution, lower is more conservative)",
            args.temperature
        );
    }
    if args.top_k == 0 {
        bail!("--top-k 0 leaves no token to draw\nHINT: give at least 1 (1 is greedy)");
    }
    if let Some(n) = args.threads {
        redline_core::threads::check(n).map_err(anyhow::Error::msg)?;
    }
    redline_core::threads::configure(args.threads);
    let device = redline_core::Device::resolve(args.device.parse()?)?;
    let src = match hf::is_folder(&args.source) {
        true => from_hf(&args.source, &device)?,
        false => from_run(args, &device)?,
    };
    let codec = match &args.tokenizer {
        Some(t) => Some(Codec::tokenizer(t)?),
        None => src.codec,
    };
    let block = src.model.config().block_size;
    let prompt = prompt_ids(args, codec.as_ref(), &src.from)?;
    if prompt.len() > block {
        eprintln!(
            "note: the prompt's {} tokens are cropped to its last {block} (the model's \
             block_size), as nanoGPT crops them",
            prompt.len()
        );
    }
    let mut out = std::io::stdout().lock();
    let show_text = !args.ids && codec.is_some();
    let mut streamer = codec.as_ref().filter(|_| show_text).map(Streamer::new);
    if let (Some(c), None) = (&codec, &args.prompt_ids) {
        if show_text {
            write!(out, "{}", c.decode(&prompt)?)?;
        }
    }
    let start = std::time::Instant::now();
    let ids = src.model.generate(&prompt, args.tokens, &sampling, |id| {
        if let Some(s) = streamer.as_mut() {
            let text = s
                .push(id)
                .map_err(|e| redline_models::Error::Config(e.to_string()))?;
            let _ = write!(out, "{text}").and_then(|()| out.flush());
        }
        Ok(())
    })?;
    let took = start.elapsed().as_secs_f64();
    match streamer {
        Some(s) => writeln!(out, "{}", s.finish()?)?,
        None => {
            let line: Vec<String> = ids.iter().map(u32::to_string).collect();
            writeln!(out, "{}", line.join(" "))?;
        }
    }
    eprintln!(
        "generated {} tokens in {took:.3} s ({:.1} tokens/s; a prompt of {} tokens) on {}",
        ids.len(),
        ids.len() as f64 / took.max(1e-9),
        prompt.len().min(block),
        device
    );
    Ok(())
}

/// The prompt's ids: `--prompt-ids`, or `--prompt` through the tokenizer.
fn prompt_ids(args: &SampleArgs, codec: Option<&Codec>, from: &str) -> anyhow::Result<Vec<u32>> {
    let ids = match (&args.prompt_ids, codec) {
        (Some(text), _) => text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<u32>()
                    .with_context(|| format!("--prompt-ids: {s:?} is not a token id"))
            })
            .collect::<anyhow::Result<Vec<u32>>>()?,
        (None, Some(c)) => c.encode(&args.prompt)?,
        (None, None) => bail!(
            "{from}: its tokens come from token files with no tokenizer, so --prompt cannot be \
             turned into ids\nHINT: give --tokenizer tokenizer.json (the one that made the \
             files), or --prompt-ids with ids and --ids"
        ),
    };
    if ids.is_empty() {
        bail!("the prompt is empty: generation continues at least one token\nHINT: give --prompt TEXT");
    }
    Ok(ids)
}

/// A Hugging Face GPT-2 folder: its model, and its tokenizer.json if any.
fn from_hf(dir: &Path, device: &redline_core::Device) -> anyhow::Result<Source> {
    let cfg = GptConfig::from_hf(dir)?;
    let mut init = Initializer::new(0, device, redline_core::Precision::Fp32);
    let model = Gpt::new(&cfg, &mut init)?;
    model.load_hf(dir)?;
    let tok = dir.join(hf::TOKENIZER);
    let codec = match tok.is_file() {
        true => Some(Codec::tokenizer(&tok)?),
        false => None,
    };
    Ok(Source {
        model,
        codec,
        from: dir.display().to_string(),
    })
}

/// A run folder of a GPT, through its plan; text data's tokens are bytes,
/// and a run that started from a Hugging Face folder (`--init`) takes its
/// tokenizer.json.
fn from_run(args: &SampleArgs, device: &redline_core::Device) -> anyhow::Result<Source> {
    let job = crate::dist::stdout_to_stderr(|| {
        run_job(
            "redline sample",
            &args.source,
            None,
            &args.checkpoint,
            Some(&device.spec().to_string()),
        )
    })?;
    let model = job.gpt(
        device,
        redline_core::Precision::Fp32,
        "redline sample draws text from a GPT (--model gpt-char, gpt2, or a model file with \
         kind = \"gpt\")",
    )?;
    let data = &job.plan.data_dir;
    let init_tok = job.tokenizer();
    let codec = match init_tok {
        Some(t) => Some(Codec::tokenizer(&t)?),
        None if data.is_file() => Some(Codec::Bytes),
        None => None,
    };
    Ok(Source {
        model,
        codec,
        from: format!("{} (data {})", job.dir.display(), data.display()),
    })
}
