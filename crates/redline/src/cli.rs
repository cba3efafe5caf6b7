//! Command-line arguments (clap derive) and the small `devices` command.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Redline: deep-learning training that keeps the accelerator busy.
#[derive(Debug, Parser)]
#[command(name = "redline", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a model (default: the tutorial MLP on the shipped Fashion-MNIST).
    Train(Box<TrainArgs>),
    /// List the devices this machine and build can use.
    Devices(DevicesArgs),
}

/// Flags of `redline train`.
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    /// Model from the zoo: mlp (784-128-10) or cnn.
    #[arg(long, default_value = "mlp")]
    pub model: String,
    /// MNIST-format folder (train-/t10k- images and labels, .gz or raw) [default: the shipped Fashion-MNIST].
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Number of classes the labels must lie in.
    #[arg(long, default_value_t = 10)]
    pub classes: usize,
    /// Device: auto (best present), cpu, or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Epochs to train.
    #[arg(long, default_value_t = 5)]
    pub epochs: usize,
    /// Stop after this many optimizer steps.
    #[arg(long, value_name = "N")]
    pub max_steps: Option<usize>,
    /// Samples per training batch.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Samples per validation batch.
    #[arg(long, default_value_t = 1000)]
    pub eval_batch_size: usize,
    /// Optimizer: adam, adamw or sgd (PyTorch defaults).
    #[arg(long, default_value = "adam")]
    pub optimizer: String,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Momentum (sgd).
    #[arg(long, default_value_t = 0.0)]
    pub momentum: f64,
    /// Nesterov momentum (sgd; needs --momentum > 0).
    #[arg(long)]
    pub nesterov: bool,
    /// Weight decay [default: 0 for adam/sgd, 0.01 for adamw].
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Adam/AdamW beta1.
    #[arg(long, default_value_t = 0.9)]
    pub beta1: f64,
    /// Adam/AdamW beta2.
    #[arg(long, default_value_t = 0.999)]
    pub beta2: f64,
    /// Adam/AdamW epsilon.
    #[arg(long, default_value_t = 1e-8)]
    pub eps: f64,
    /// Seed for initialisation and shuffling; same seed, machine and threads give the same run bit for bit.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep file order instead of a fresh permutation each epoch.
    #[arg(long)]
    pub no_shuffle: bool,
    /// Batches assembled ahead on a background thread (0: inline).
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Normalisation mean, after scaling pixels to [0, 1].
    #[arg(long, default_value_t = 0.5)]
    pub mean: f32,
    /// Normalisation standard deviation.
    #[arg(long, default_value_t = 0.5)]
    pub std: f32,
    /// Read the loss back every N steps (the loop itself never waits on the device).
    #[arg(long, default_value_t = 50)]
    pub log_every: usize,
    /// Skip validation on the test split after each epoch.
    #[arg(long)]
    pub no_validate: bool,
    /// Start from these weights (safetensors with PyTorch names).
    #[arg(long, value_name = "FILE")]
    pub init: Option<PathBuf>,
    /// Save the trained weights here (safetensors with PyTorch names).
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Compute threads [default: the cores not busy with other work, measured at start].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Write metrics as JSON lines here.
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
}

/// Flags of `redline devices`.
#[derive(Debug, Clone, Args)]
pub struct DevicesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `redline devices`: lists what `--device` can name.
pub fn devices(args: &DevicesArgs) -> anyhow::Result<()> {
    let devs = redline_core::system::devices();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if args.json {
        let v: Vec<_> = devs
            .iter()
            .map(|d| {
                serde_json::json!({"id": d.id, "name": d.name, "cores": d.cores,
                "usable_cores": d.usable_cores, "memory_total": d.memory_total, "memory_free": d.memory_free})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<8} {:<40} {:>6} {:>7} {:>12} {:>12}",
        "DEVICE", "NAME", "CORES", "USABLE", "MEM TOTAL", "MEM FREE"
    );
    for d in &devs {
        println!(
            "{:<8} {:<40} {:>6} {:>7} {:>8.1} GiB {:>8.1} GiB",
            d.id,
            d.name,
            d.cores,
            d.usable_cores,
            gib(d.memory_total),
            gib(d.memory_free)
        );
    }
    if !redline_core::system::cuda_compiled() {
        println!("GPUs: none usable: this build has no CUDA support (CPU build).");
    }
    Ok(())
}
