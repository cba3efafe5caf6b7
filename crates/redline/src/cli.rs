//! Command-line arguments (clap derive) and the small `devices` command.

use std::path::PathBuf;

use std::ffi::OsString;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

use crate::auto_flag::Auto;

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
    #[command(args_override_self = true)]
    Train(Box<TrainArgs>),
    /// List the devices this machine and build can use.
    Devices(DevicesArgs),
    /// Watch GPUs (through NVML) and the host, like nvidia-smi.
    Monitor(MonitorArgs),
    /// Rebuild a run's report.html from the files in its run folder.
    Report(ReportArgs),
    /// List past runs with their headline numbers.
    Runs(RunsArgs),
    /// Find the batch size or learning rate by measurement (Lightning's finders).
    Tune(TuneArgs),
    /// Evaluate a finished run's weights on its test split, or on other data of its shape
    /// (Lightning's `trainer.test`): prints the loss and metrics, writes nothing.
    Test(TestArgs),
    /// Apply a finished run's model to data and write one row per sample (Lightning's
    /// `trainer.predict`): a classifier's class and probabilities, a regression's values.
    Predict(PredictArgs),
    /// Turn an image folder into WebDataset tar shards that `redline train --data DEST`
    /// streams: images shrunk to a largest side and re-encoded, in shuffled order.
    Pack(PackArgs),
    /// Generate text from a trained GPT or a Hugging Face GPT-2 folder (nanoGPT's sample.py),
    /// token by token with a key/value cache.
    Sample(crate::sample::SampleArgs),
    /// Write a run's GPT as a Hugging Face GPT-2 folder that transformers loads.
    Export(crate::export::ExportArgs),
}

/// Flags of `redline pack`.
#[derive(Debug, Clone, Args)]
pub struct PackArgs {
    /// The image folder (class sub-folders, optionally under train/ and val/ or test/).
    #[arg(value_name = "SRC")]
    pub src: PathBuf,
    /// The folder to create (it must not exist): DEST/train/*.tar, DEST/val/*.tar and
    /// DEST/index.json.
    #[arg(value_name = "DEST")]
    pub dest: PathBuf,
    /// Images larger than this on their longer side are shrunk to it and re-encoded as
    /// JPEG; smaller ones are copied as they are.
    #[arg(long, default_value_t = 512, value_name = "PIXELS")]
    pub max_side: u32,
    /// JPEG quality of the re-encoded images (1-100).
    #[arg(long, default_value_t = 90)]
    pub quality: u8,
    /// Close a shard once it holds this much: bytes with a unit (256MB, 1GiB).
    #[arg(long, default_value = "256MB", value_name = "SIZE")]
    pub shard_size: String,
    /// Threads that decode, shrink and encode [default: all cores].
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Seed of the shuffled order the samples are written in.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Flags of `redline predict`.
#[derive(Debug, Clone, Args)]
pub struct PredictArgs {
    /// The run folder, `last`, or a .safetensors weights file (a checkpoint's, or --save's).
    #[arg(value_name = "RUN_DIR|WEIGHTS")]
    pub run_dir: PathBuf,
    /// The data to predict on (the run's input shape): its test split, or all of it when it has
    /// none.
    #[arg(long, value_name = "PATH")]
    pub data: PathBuf,
    /// The file to write: .csv (a header, then one row per sample) or .npy (an (N, columns)
    /// float32 array); a classifier's columns are class, p0.. and target, a regression's y0..
    /// and target.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Which weights: best, last, a checkpoint folder or a .safetensors file.
    #[arg(long, default_value = "last", value_name = "best|last|PATH")]
    pub checkpoint: String,
}

/// Flags of `redline test`.
#[derive(Debug, Clone, Args)]
pub struct TestArgs {
    /// The run folder (its config.toml says the job; its checkpoints hold the weights), `last`
    /// (the newest run under runs/ with a checkpoint), or a .safetensors weights file: a
    /// checkpoint's, or --save's (which names its run folder).
    #[arg(value_name = "RUN_DIR|WEIGHTS")]
    pub run_dir: PathBuf,
    /// Other data of the run's input shape [default: the run's own test split]; its test
    /// split, or all of it when it has none.
    #[arg(long, value_name = "PATH")]
    pub data: Option<PathBuf>,
    /// Which weights: `last` (the newest checkpoint), `best` (by the run's --monitor), a
    /// checkpoint folder, or a .safetensors file (--save's).
    #[arg(long, default_value = "last", value_name = "best|last|PATH")]
    pub checkpoint: String,
    /// The device [default: the run's].
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// Append the result (weights, data, loss and metrics) as a line of the run folder's
    /// tests.jsonl; without it nothing is written.
    #[arg(long)]
    pub record: bool,
}

/// `redline tune`.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// What to find.
    #[command(subcommand)]
    pub command: TuneCommand,
}

/// The finders.
#[derive(Debug, Subcommand)]
pub enum TuneCommand {
    /// Grow the batch (powers of two, then a binary search after running out of memory)
    /// while it fits and samples/s rises by more than 5%; print and save the table.
    #[command(name = "batch-size", args_override_self = true)]
    BatchSize(Box<TuneFlags>),
    /// The learning-rate range test (exponential, Lightning's lr_find): suggest the rate of
    /// the steepest fall of the smoothed loss; the curve is saved with a chart (lr.html).
    #[command(args_override_self = true)]
    Lr(Box<TuneFlags>),
    /// Time the streamed image pipeline alone (read, decode, augment, batch; no model) at
    /// 1, 2, 4, ... decode threads up to the cores, with the peak memory of each; pick the
    /// fewest within 5% of the fastest (the --workers to train with).
    #[command(args_override_self = true)]
    Workers(Box<TuneFlags>),
}

/// Flags of `redline tune batch-size|lr`: the job's, as `train` takes them.
#[derive(Debug, Clone, Args)]
pub struct TuneFlags {
    /// The job to tune (model, data, optimizer, device, ...).
    #[command(flatten)]
    pub train: TrainArgs,
    /// Folder for the table (and chart) [default: tune/<date-time>-<what>].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The range test's first rate.
    #[arg(long, default_value_t = 1e-8)]
    pub min_lr: f64,
    /// The range test's last rate.
    #[arg(long, default_value_t = 1.0)]
    pub max_lr: f64,
    /// The range test's steps.
    #[arg(long, default_value_t = 100)]
    pub steps: usize,
}

/// Flags of `redline monitor`.
#[derive(Debug, Clone, Args)]
pub struct MonitorArgs {
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Print one snapshot and exit.
    #[arg(long)]
    pub once: bool,
    /// Print one JSON object per sample instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also append one CSV row per sample to FILE.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Stop after N samples.
    #[arg(long, value_name = "N")]
    pub count: Option<usize>,
}

/// Flags of `redline report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// The run folder (runs/<date-time>-<model>).
    pub run_dir: PathBuf,
}

/// Flags of `redline runs`.
#[derive(Debug, Clone, Args)]
pub struct RunsArgs {
    /// Folder holding the run folders.
    #[arg(default_value = "runs")]
    pub root: PathBuf,
}

/// Flags of `redline train`. Serialised (kebab-case, as the flags) into the
/// run folder's `config.toml`, which `--config` reads back.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TrainArgs {
    /// Model: mlp (784-128-10 on Fashion-MNIST) or cnn from the zoo, or a model file FILE.toml
    /// (`[model] layers = [...]`, docs/models.md); inputs and outputs follow the data.
    #[arg(long, default_value = "mlp")]
    pub model: String,
    /// Hidden layer widths, e.g. 256,128 [default: 128].
    #[arg(long, value_name = "W,W,...")]
    pub hidden: Option<String>,
    /// Data: an MNIST-format or CIFAR binary folder, a .csv/.tsv table, an .npz or
    /// .safetensors file, or a folder of .npy files [default: the shipped Fashion-MNIST].
    #[arg(long, value_name = "PATH")]
    pub data: Option<PathBuf>,
    /// Task: auto (from the targets), classification or regression.
    #[arg(long, default_value = "auto")]
    pub task: String,
    /// Loss: auto (ce for classification, mse for regression), ce, mse or l1.
    #[arg(long, default_value = "auto")]
    pub loss: String,
    /// Target column of a table: a header name or an index (negative from the end) [default: the last].
    #[arg(long, value_name = "COLUMN", allow_hyphen_values = true)]
    pub target: Option<String>,
    /// Whether a table's first row is its header: auto (names, or the column indices
    /// 0,1,2,...; said on the startup line), yes or no.
    #[arg(long, default_value = "auto")]
    pub header: String,
    /// Number of classes the labels must lie in [default: the largest label + 1].
    #[arg(long)]
    pub classes: Option<usize>,
    /// Hold out this fraction of the training split for validation (seeded, stratified by
    /// class; 0: no validation). The test split is only read by the test pass after training.
    /// [default: 0.1]
    #[arg(long, value_name = "FRACTION")]
    pub val_split: Option<f64>,
    /// Resize every image of an image folder to N x N [default: the images' own size].
    #[arg(long, value_name = "N")]
    pub image_size: Option<u32>,
    /// Augment training images: flip (random horizontal flip), crop (pad 4 and crop back at
    /// a random offset) or crop=N, comma-separated; or, for image folders and tar shards,
    /// torchvision's ImageNet recipe random-resized-crop=SIZE[,hflip] (a fresh crop of each
    /// image every epoch, so the images stream; validation resizes to SIZE/0.875 and
    /// centre-crops).
    #[arg(long, value_name = "LIST")]
    pub augment: Option<String>,
    /// Image folders and tar shards: auto (decoded into memory once when they fit
    /// --host-memory-budget, else read from disk and decoded batch by batch), on (always
    /// streamed) or off (always decoded into memory).
    #[arg(long, default_value = "auto", value_name = "auto|on|off")]
    #[serde(default = "default_auto", skip_serializing_if = "is_auto")]
    pub stream: String,
    /// Threads that read, decode and augment streamed images [default: on the CPU the cores
    /// the compute threads leave, at least 1; with a GPU all cores but one].
    #[arg(long, value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// In --stream auto, image data whose decoded size exceeds this streams: bytes with a
    /// unit (64GB, 512MiB) or a share of RAM (50%) [default: half of RAM].
    #[arg(long, value_name = "SIZE")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory_budget: Option<String>,
    /// Tar shards: shuffle as WebDataset does, shard order each epoch plus a buffer of N
    /// samples, reading each shard front to back; 0 keeps a full permutation [default:
    /// 4096 when the shards exceed the host-memory budget, else a full permutation].
    #[arg(long, value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle_buffer: Option<usize>,
    /// An image that cannot be decoded: error (stop, naming the file) or skip (take the next
    /// sample in its place; the skips are counted in the summary).
    #[arg(long, default_value = "error", value_name = "error|skip", value_parser = ["error", "skip"])]
    #[serde(default = "default_error", skip_serializing_if = "is_error")]
    pub bad_samples: String,
    /// Keep table features as they are (by default they are standardised with the
    /// training rows' mean and std).
    #[arg(long)]
    pub no_standardize: bool,
    /// Device: auto (best present), cpu, or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// How the fit spreads over processes: auto (data-parallel when a launcher started several
    /// ranks: `mpirun -n N`, `srun`), single, or ddp (DistributedDataParallel: each rank trains
    /// on its shard of every epoch, gradients averaged across ranks each step; --batch-size
    /// is per rank). dp (DataParallel) is not built: the error says why. docs/scaling.md.
    #[arg(long, default_value = "auto", value_name = "auto|single|ddp")]
    pub strategy: String,
    /// Seconds a rank waits for the others in any collective before it stops the job with an
    /// error naming the rank that did not answer (PyTorch's NCCL watchdog).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    pub dist_timeout: f64,
    /// Start N data-parallel ranks on this machine through `mpirun -n N` (OpenMPI), each
    /// running this same command with --strategy ddp; under a launcher, N must be its number
    /// of ranks.
    #[arg(long, value_name = "N")]
    pub devices: Option<usize>,
    /// Numeric precision, Lightning's names: 32-true (32), bf16-mixed (bf16: fp32 weights and
    /// update, matrix products and convolutions in bf16, losses in fp32), 16-mixed (16: the
    /// same in fp16, with a dynamic loss scaler) or bf16-true (weights, gradients, optimizer
    /// state and products in bf16; losses in fp32). docs/precision.md.
    #[arg(long, default_value = "32-true", value_name = "PRECISION")]
    #[serde(
        default = "default_precision",
        skip_serializing_if = "is_default_precision"
    )]
    pub precision: String,
    /// 16-mixed's loss scaler, PyTorch's GradScaler settings:
    /// dynamic[:init=65536][:growth=2][:backoff=0.5][:interval=2000] (the defaults).
    #[arg(long, value_name = "dynamic[:KEY=VALUE...]")]
    pub loss_scale: Option<String>,
    /// Epochs to train.
    #[arg(long, default_value_t = 5)]
    pub epochs: usize,
    /// Stop after this many optimizer steps.
    #[arg(long, value_name = "N")]
    pub max_steps: Option<usize>,
    /// Samples per training batch, or auto: the batch-size finder's choice
    /// (`redline tune batch-size`), recorded in the run folder.
    #[arg(long, default_value = "64", value_name = "N|auto")]
    pub batch_size: Auto<usize>,
    /// Samples per validation batch.
    #[arg(long, default_value_t = 1000)]
    pub eval_batch_size: usize,
    /// Optimizer: adam, adamw or sgd (PyTorch defaults).
    #[arg(long, default_value = "adam")]
    pub optimizer: String,
    /// Learning rate, or auto: the range test's suggestion (`redline tune lr`), recorded in
    /// the run folder.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value = "0.001",
        value_name = "LR|auto"
    )]
    pub lr: Auto<f64>,
    /// Momentum (sgd).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub momentum: f64,
    /// Nesterov momentum (sgd; needs --momentum > 0).
    #[arg(long)]
    pub nesterov: bool,
    /// Weight decay [default: 0 for adam/sgd, 0.01 for adamw].
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f64>,
    /// Adam/AdamW beta1.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.9)]
    pub beta1: f64,
    /// Adam/AdamW beta2.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.999)]
    pub beta2: f64,
    /// Adam/AdamW epsilon.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1e-8)]
    pub eps: f64,
    /// Micro-batches whose gradients add up before each optimizer step (Lightning's
    /// accumulate_grad_batches): N micro-batches of --batch-size step as one batch of N times it.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub accumulate: usize,
    /// Before each step, scale the gradients so that their total L2 norm is at most MAX
    /// (torch.nn.utils.clip_grad_norm_); the norm is logged as grad_norm.
    #[arg(long, value_name = "MAX", conflicts_with = "clip_grad_value")]
    pub clip_grad_norm: Option<f64>,
    /// Before each step, clamp every gradient element to [-V, V] (clip_grad_value_).
    #[arg(long, value_name = "V")]
    pub clip_grad_value: Option<f64>,
    /// Log the total gradient norm before clipping (grad_norm) at log points and epochs.
    #[arg(long)]
    pub log_grad_norm: bool,
    /// Stop (status failed, --save not written) when a logged training loss exceeds F times
    /// the first step's; 0 turns the check off. NaN and infinite losses always stop.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 1000.0,
        value_name = "F"
    )]
    pub divergence_threshold: f64,
    /// Learning-rate schedule after the base --lr: constant, step:size=N[:gamma=G],
    /// multistep:milestones=A/B, exp:gamma=G, cosine[:t_max=N], cosine-restarts:t0=N[:mult=M],
    /// onecycle[:max_lr=X]; each may add :warmup=N and :interval=step|epoch (docs/schedules.md).
    #[arg(long, default_value = "constant", value_name = "SCHEDULE")]
    pub lr_schedule: String,
    /// Stop when a logged metric stops improving, as Lightning's EarlyStopping:
    /// METRIC[:min|max][:patience=N][:min_delta=X], e.g. val_loss:min:patience=3.
    #[arg(long, value_name = "SPEC")]
    pub early_stop: Option<String>,
    /// Write a checkpoint into RUN_DIR/checkpoints every N optimizer steps [default: at
    /// each epoch end]; written atomically on a background thread.
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<usize>,
    /// Keep the newest K checkpoints (and the best by --monitor besides).
    #[arg(long, default_value_t = 2, value_name = "K")]
    pub keep_last: usize,
    /// The metric whose best epoch-end checkpoint is kept: val_loss, val_accuracy, train_loss,
    /// ... [default: val_loss when the run validates, else none]; one the run never logs is
    /// refused before training.
    #[arg(long, value_name = "METRIC")]
    pub monitor: Option<String>,
    /// Whether --monitor is better smaller or larger [default: max for accuracy, else min].
    #[arg(long, value_name = "min|max", value_parser = ["min", "max"])]
    pub mode: Option<String>,
    /// Write no checkpoints.
    #[arg(long)]
    pub no_checkpoint: bool,
    /// Check that everything runs, as Lightning's fast_dev_run: N batches (default 1) of
    /// training, validation and test, one epoch; no checkpoints and --save is not written;
    /// the run folder is marked as a dev run.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "1")]
    pub fast_dev_run: Option<usize>,
    /// Train on only the first N batches of each epoch, or a fraction of them (0.25).
    #[arg(long, value_name = "N|FRACTION")]
    pub limit_train_batches: Option<String>,
    /// Validate on only N batches, or a fraction of them (0: no validation).
    #[arg(long, value_name = "N|FRACTION")]
    pub limit_val_batches: Option<String>,
    /// Test on only N batches, or a fraction of them (0: no test pass).
    #[arg(long, value_name = "N|FRACTION")]
    pub limit_test_batches: Option<String>,
    /// Train on the same first N batches (or fraction) every epoch, unshuffled, and validate
    /// on as many: a model that cannot drive their loss down has a bug (Lightning's
    /// overfit_batches).
    #[arg(long, value_name = "N|FRACTION")]
    pub overfit_batches: Option<String>,
    /// Seed for initialisation and shuffling; same seed, machine and threads give the same run bit for bit.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep file order instead of a fresh permutation each epoch.
    #[arg(long)]
    pub no_shuffle: bool,
    /// Batches assembled ahead on a background thread (0: inline); when
    /// streaming, also the host-to-device copies kept in flight.
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Keep the dataset in device memory: auto (when it fits half the free
    /// memory), on, or off (stream batches through pinned buffers).
    #[arg(long, default_value = "auto", value_name = "POLICY")]
    pub data_on_device: String,
    /// Return the device memory pool's cached blocks after every epoch (the
    /// pool is always trimmed after training).
    #[arg(long)]
    pub empty_cache: bool,
    /// Capture the training step as one CUDA graph and replay it: auto (on a
    /// GPU, where the step can be captured; eager steps otherwise), on
    /// (refuse to start when the step cannot be captured) or off.
    #[arg(long, default_value = "auto", value_name = "MODE")]
    pub cuda_graph: String,
    /// On a GPU, record when every kernel ran (CUPTI, loaded at run time;
    /// `REDLINE_CUPTI` names its path) and report GPU busy % = kernel time /
    /// wall time: on or off.
    #[arg(long, default_value = "on", value_name = "ON|OFF", value_parser = ["on", "off"])]
    pub kernel_trace: String,
    /// The device's peak FLOP/s that MFU (model FLOPs utilisation) is read against, for the
    /// math the run does: a number (989e12) or with a unit (989T, 67 TFLOPS). Overrides
    /// Redline's table of GPUs (data-sheet figures by name and compute capability) and the
    /// CPU's measured GEMM peak; needed for a GPU the table does not know.
    #[arg(long, value_name = "FLOP/S")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_flops: Option<String>,
    /// On a GPU, use Redline's fused kernels where it has them (the optimizer
    /// update, the cross-entropy, linear layers, convolutions, the CNN
    /// block), with their 16-bit and TF32 tensor-core variants: auto or on
    /// (the same since the variants ran on an H200) or off (candle's ops).
    /// The CPU always uses its own.
    #[arg(long, default_value = "auto", value_name = "MODE", value_parser = ["auto", "on", "off"])]
    pub fused_kernels: String,
    /// On a GPU, how fp32 matrix products (matmuls, linear layers, the GEMMs
    /// of convolutions) are computed: highest (full fp32, the default) or high
    /// (TF32 tensor cores with fp32 accumulation: faster, about 1e-3 relative
    /// error), as PyTorch's `torch.set_float32_matmul_precision`. No effect
    /// on the CPU.
    #[arg(long, default_value = "highest", value_name = "PRECISION", value_parser = ["highest", "high"])]
    pub matmul_precision: String,
    /// On a GPU, where the convolutions of the fused path (--fused-kernels auto or on) run:
    /// redline (Redline's implicit-GEMM kernels), cudnn (NVIDIA's cuDNN 9, loaded at run
    /// time: it must be installed) or auto (cuDNN where it loads, else Redline's; the
    /// summary's `convolutions:` line says which ran). No effect on the CPU.
    #[arg(long, default_value = "auto", value_name = "BACKEND", value_parser = ["auto", "redline", "cudnn"])]
    #[serde(default = "default_auto", skip_serializing_if = "is_auto")]
    pub gpu_conv: String,
    /// On the CPU, the bf16 products of --precision bf16-mixed and bf16-true on Redline's
    /// AVX-512 BF16 GEMM (vdpbf16ps, fp32 accumulation): auto (where the CPU has it), on
    /// (refused where it has not) or off (the fp32 GEMM of the bf16-rounded operands).
    #[arg(long, default_value = "auto", value_name = "MODE", value_parser = ["auto", "on", "off"])]
    #[serde(default = "default_auto", skip_serializing_if = "is_auto")]
    pub cpu_bf16_gemm: String,
    /// Normalisation mean, after scaling pixels to [0, 1]: one value, or one per channel
    /// (R,G,B) for RGB image folders and tar shards [default: 0.5; ImageNet's
    /// 0.485,0.456,0.406 for RGB image folders and tar shards].
    #[arg(long, allow_negative_numbers = true, value_name = "X|R,G,B")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<Stat>,
    /// Normalisation standard deviation: one value, or R,G,B [default: 0.5; ImageNet's
    /// 0.229,0.224,0.225 for RGB image folders and tar shards].
    #[arg(long, allow_negative_numbers = true, value_name = "X|R,G,B")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std: Option<Stat>,
    /// Read the loss back every N steps (the loop itself never waits on the device).
    #[arg(long, default_value_t = 50)]
    pub log_every: usize,
    /// Skip validation after each epoch and the test pass after training.
    #[arg(long)]
    pub no_validate: bool,
    /// Tokenise a text file with this Hugging Face tokenizer.json (streamed into a cached
    /// token file) instead of reading its UTF-8 bytes; `redline sample` decodes with it.
    #[arg(long, value_name = "FILE")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    /// Start from these weights (safetensors with PyTorch names), or for a GPT a Hugging Face
    /// GPT-2 folder (config.json + model.safetensors).
    #[arg(long, value_name = "FILE")]
    pub init: Option<PathBuf>,
    /// Save the trained weights here (safetensors with PyTorch names).
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Compute threads [default: the cores not busy with other work, measured at start].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Also write metrics as JSON lines here (the run folder always has metrics.jsonl).
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
    /// Profiler: off (the time breakdown only), simple (a table of actions), detailed
    /// (also per-layer spans, kernel counts and a Chrome trace.json).
    #[arg(long, default_value = "off", value_name = "MODE")]
    pub profiler: String,
    /// Seconds between system samples (CPU, memory, GPUs) during training; 0: none.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 1.0,
        value_name = "SECONDS"
    )]
    pub monitor_interval: f64,
    /// Run folder [default: runs/<date-time>-<model>].
    #[arg(long, value_name = "DIR")]
    #[serde(skip)]
    pub run_dir: Option<PathBuf>,
    /// Start from the flags in a run's config.toml; flags given here override them.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Continue a stopped run from its newest good checkpoint, in its own folder, with its
    /// config.toml: RUN_DIR, or `last` (the newest run under runs/ with a checkpoint). Flags
    /// that change only how long it runs or what it logs (--epochs, --max-steps, ...) may be
    /// given too; any other flag must match the run's.
    #[arg(long, value_name = "RUN_DIR|last", conflicts_with_all = ["run_dir", "config"])]
    #[serde(skip)]
    pub resume: Option<PathBuf>,
    /// With --resume: continue even though the data (or --init file) changed since the run
    /// started (its inputs.json); the resumed run then differs from one never stopped.
    #[arg(long, requires = "resume")]
    #[serde(skip)]
    pub accept_changed_data: bool,
    /// Print the resolved flags as the TOML a run folder's config.toml holds (paths absolute;
    /// values settled by measurement, such as --batch-size auto, as `auto`) and exit: no data
    /// is read and no run folder made. `redline train --config FILE` runs that job again.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
}

/// The default of a mode flag added after runs were recorded without it.
fn default_auto() -> String {
    "auto".into()
}

/// A mode flag at `auto` is left out of `config.toml`, so the identity of
/// runs recorded before the flag existed (what a checkpoint must match) is
/// unchanged.
#[allow(clippy::ptr_arg)] // serde's `skip_serializing_if` passes the field's type
fn is_auto(m: &String) -> bool {
    m == "auto"
}

/// `--mean`/`--std`: one value for every channel, or one per channel. In
/// `config.toml` a number or a list of numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Stat(pub Vec<f32>);

impl std::str::FromStr for Stat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let v: Result<Vec<f32>, _> = s.split(',').map(|p| p.trim().parse::<f32>()).collect();
        match v {
            Ok(v) if v.len() == 1 || v.len() == 3 => Ok(Self(v)),
            _ => Err(format!(
                "{s:?}: give one number (every channel) or three separated by commas (R,G,B)"
            )),
        }
    }
}

impl Serialize for Stat {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => s.serialize_f32(*one),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Stat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            One(f32),
            Many(Vec<f32>),
        }
        match Either::deserialize(d)? {
            Either::One(v) => Ok(Self(vec![v])),
            Either::Many(v) if v.len() == 1 || v.len() == 3 => Ok(Self(v)),
            Either::Many(v) => Err(serde::de::Error::custom(format!(
                "{} values: give one or three",
                v.len()
            ))),
        }
    }
}

/// `--bad-samples`' default.
fn default_error() -> String {
    "error".into()
}

/// `--bad-samples error` is left out of `config.toml` (runs recorded before
/// the flag keep their identity).
#[allow(clippy::ptr_arg)] // serde's `skip_serializing_if` passes the field's type
fn is_error(m: &String) -> bool {
    m == "error"
}

/// `--precision`'s default.
fn default_precision() -> String {
    "32-true".into()
}

/// fp32 runs record no `precision` key: their identity (what a checkpoint
/// must match) is what it was before the flag existed.
#[allow(clippy::ptr_arg)] // serde's `skip_serializing_if` passes the field's type
fn is_default_precision(p: &String) -> bool {
    p.parse::<redline_core::Precision>()
        .is_ok_and(|p| p == redline_core::Precision::Fp32)
}

/// The largest `--config` file read.
const MAX_CONFIG_FILE: u64 = 1 << 20;

/// The flags a `--config` file contributed: the file and its keys.
#[derive(Debug, Clone, Default)]
pub struct ConfigFlags {
    /// The file, when `--config` was given.
    pub file: Option<PathBuf>,
    /// Its keys (flag names without `--`).
    pub keys: Vec<String>,
}

/// Expands `redline train --config FILE`: the file's flags are inserted right
/// after `train` as `--key=value` (so negative numbers stay values), and flags
/// on the command line (later, and overriding) win.
pub fn expand_config(argv: Vec<OsString>) -> anyhow::Result<(Vec<OsString>, ConfigFlags)> {
    let Some(train_at) = argv.iter().position(|a| a == "train") else {
        return Ok((argv, ConfigFlags::default()));
    };
    let mut argv = argv;
    let mut file = None;
    let mut resume = None;
    for (i, a) in argv.iter().enumerate().skip(train_at + 1) {
        let a = a.to_string_lossy();
        if a == "--config" {
            file = argv.get(i + 1).map(PathBuf::from);
        } else if let Some(v) = a.strip_prefix("--config=") {
            file = Some(PathBuf::from(v));
        } else if a == "--resume" {
            resume = argv.get(i + 1).map(|v| (i + 1, PathBuf::from(v)));
        } else if a.starts_with("--resume=") {
            resume = Some((i, PathBuf::new()));
        }
    }
    // `--resume=RUN` as `--resume RUN`, so the value has a place of its own.
    if let Some((i, p)) = resume.as_mut().filter(|(_, p)| p.as_os_str().is_empty()) {
        let v = argv[*i].to_string_lossy()["--resume=".len()..].to_string();
        argv[*i] = "--resume".into();
        argv.insert(*i + 1, v.clone().into());
        *i += 1;
        *p = PathBuf::from(v);
    }
    // `--resume RUN` reads RUN's config.toml as `--config` would (clap then
    // refuses `--config` beside it); `last` becomes the folder it names.
    if let (Some((at, run)), None) = (resume, &file) {
        let dir = crate::resume::run_folder(&run, "--resume")?;
        file = Some(dir.join("config.toml"));
        argv[at] = dir.into_os_string();
    }
    let Some(file) = file else {
        return Ok((argv, ConfigFlags::default()));
    };
    // A config is a page of flags; a device or FIFO is refused, not read forever.
    let text = redline_core::files::read_input_text(&file, MAX_CONFIG_FILE)
        .with_context(|| format!("--config {}: cannot read it", file.display()))?;
    let table: toml::Table = toml::from_str(&text).with_context(|| {
        format!(
            "--config {}: not a valid config\nHINT: use the config.toml of a run folder",
            file.display()
        )
    })?;
    let mut flags: Vec<OsString> = Vec::new();
    let mut keys = Vec::new();
    let known = train_keys();
    for (key, value) in table {
        let flag = format!("--{key}");
        // A config is the flags of one run: it names no other config or run
        // (clap would take one of two `--config`s and ignore the other).
        if matches!(key.as_str(), "config" | "resume") {
            anyhow::bail!(
                "--config {}: `{key}` cannot be set in a config file (a config does not include \
                 another file or resume a run)\nHINT: remove the `{key}` line; give --{key} on \
                 the command line instead",
                file.display()
            );
        }
        if !known.contains(&key) {
            anyhow::bail!(
                "--config {}: `{key}` is not a setting of `redline train`\nHINT: remove or \
                 rename that line; the settings are the flags of `redline train --help` without \
                 their `--`",
                file.display()
            );
        }
        match value {
            toml::Value::Boolean(true) => flags.push(flag.into()),
            toml::Value::Boolean(false) => {}
            toml::Value::String(s) => flags.push(format!("{flag}={s}").into()),
            toml::Value::Integer(i) => flags.push(format!("{flag}={i}").into()),
            toml::Value::Float(x) => flags.push(format!("{flag}={x}").into()),
            // A list of numbers (`mean = [0.485, 0.456, 0.406]`) is the flag's
            // comma-separated value.
            toml::Value::Array(items)
                if items
                    .iter()
                    .all(|v| v.as_float().or(v.as_integer().map(|i| i as f64)).is_some()) =>
            {
                let parts: Vec<String> = items.iter().map(|v| v.to_string()).collect();
                flags.push(format!("{flag}={}", parts.join(",")).into())
            }
            other => anyhow::bail!(
                "--config {}: `{key}` has a value of type {} that no flag takes",
                file.display(),
                other.type_str()
            ),
        }
        keys.push(key);
    }
    // Keys the command line gives again: their values are not the file's.
    let given: Vec<String> = argv
        .iter()
        .skip(train_at + 1)
        .filter_map(|a| {
            let a = a.to_string_lossy();
            let name = a.strip_prefix("--")?.split('=').next()?.to_string();
            Some(name)
        })
        .collect();
    keys.retain(|k| !given.contains(k));
    let mut out = argv;
    out.splice(train_at + 1..train_at + 1, flags);
    Ok((
        out,
        ConfigFlags {
            file: Some(file),
            keys,
        },
    ))
}

impl ConfigFlags {
    /// `err` with the file and key named when it is about a value that came
    /// from the config file (its message starts with that key's flag, as
    /// every refusal of a value does): `--keep-last 0` read from a file is
    /// otherwise reported as if typed.
    pub fn annotate(&self, err: anyhow::Error) -> anyhow::Error {
        let Some(file) = &self.file else { return err };
        let text = err.to_string();
        let key = self.keys.iter().find(|k| {
            let flag = format!("--{k}");
            text.strip_prefix(&flag)
                .is_some_and(|rest| rest.starts_with([' ', ':', '=']))
        });
        match key {
            Some(k) => err.context(format!(
                "in --config {}: the key `{k}` (fix it there, or pass --{k} on the command line \
                 to override it)",
                file.display()
            )),
            None => err,
        }
    }
}

/// The long flag names of `redline train` (without `--`): the keys a
/// config file may hold.
fn train_keys() -> Vec<String> {
    use clap::Args as _;
    TrainArgs::augment_args(clap::Command::new("train"))
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect()
}

/// The config key a parse error is about, when it came from `config`'s file
/// (`lr` for an invalid `--lr` value, or an unknown key).
pub fn config_key_of(err: &clap::Error, config: &ConfigFlags) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let arg = match err.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => s.clone(),
        _ => return None,
    };
    // "--lr <LR>" or "--no-such=1" -> "lr" / "no-such"
    let name = arg
        .trim_start_matches("--")
        .split([' ', '='])
        .next()
        .unwrap_or_default()
        .to_string();
    config.keys.contains(&name).then_some(name)
}

/// Flags of `redline devices`.
#[derive(Debug, Clone, Args)]
pub struct DevicesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `redline devices`: lists what `--device` can name: the CPU, and the GPUs
/// NVML sees (usable only by a CUDA build).
pub fn devices(args: &DevicesArgs) -> anyhow::Result<()> {
    let devs = redline_core::system::devices();
    let gpus = redline_monitor::Gpus::open();
    let inventory = gpus.as_ref().map(|g| g.inventory()).unwrap_or_default();
    let cuda = redline_core::GpuAvailability::probe();
    let usable = |i: u32| cuda.cuda_built && cuda.count.as_ref().is_ok_and(|&n| (i as usize) < n);
    if args.json {
        let mut v: Vec<_> = devs
            .iter()
            .map(|d| {
                serde_json::json!({"id": d.id, "kind": "cpu", "name": d.name, "cores": d.cores,
                "usable_cores": d.usable_cores, "memory_total": d.memory_total,
                "memory_free": d.memory_free, "usable": true})
            })
            .collect();
        for g in &inventory {
            v.push(
                serde_json::json!({"id": format!("cuda:{}", g.index), "kind": "gpu",
                "name": g.name, "memory_total": g.memory_total, "memory_free": g.memory_free,
                "compute_capability": g.compute_capability,
                "driver_version": gpus.as_ref().ok().and_then(|g| g.driver_version()),
                "cuda_driver_version": gpus.as_ref().ok().and_then(|g| g.cuda_driver_version()),
                "usable": usable(g.index)}),
            );
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print!("{}", devices_table(&devs, &inventory, usable));
    match &gpus {
        Ok(g) => println!(
            "NVIDIA driver {}, CUDA {} (driver API)",
            g.driver_version().unwrap_or("?"),
            g.cuda_driver_version().unwrap_or("?")
        ),
        Err(note) => println!("GPUs: {note}"),
    }
    if !cuda.cuda_built {
        println!(
            "This is a CPU build: GPUs cannot be used. HINT: {}",
            redline_core::CUDA_BUILD_HINT
        );
    } else if let Err(why) = &cuda.count {
        println!("CUDA driver: {why}");
    }
    Ok(())
}

fn devices_table(
    devs: &[redline_core::system::DeviceInfo],
    gpus: &[redline_monitor::GpuInfo],
    usable: impl Fn(u32) -> bool,
) -> String {
    use std::fmt::Write as _;
    let gib = |b: Option<u64>| {
        b.map_or("?".into(), |b| {
            format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
        })
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<8} {:<40} {:>12} {:>12} {:>11} {:>6}",
        "DEVICE", "NAME", "MEM TOTAL", "MEM FREE", "CORES/CC", "USABLE"
    );
    for d in devs {
        let _ = writeln!(
            s,
            "{:<8} {:<40} {:>12} {:>12} {:>11} {:>6}",
            d.id,
            d.name,
            gib(Some(d.memory_total)),
            gib(Some(d.memory_free)),
            format!("{}/{}", d.usable_cores, d.cores),
            "yes"
        );
    }
    for g in gpus {
        let _ = writeln!(
            s,
            "{:<8} {:<40} {:>12} {:>12} {:>11} {:>6}",
            format!("cuda:{}", g.index),
            g.name,
            gib(g.memory_total),
            gib(g.memory_free),
            g.compute_capability
                .as_deref()
                .map_or("?".into(), |c| format!("sm {c}")),
            if usable(g.index) { "yes" } else { "no" }
        );
    }
    s
}

/// `redline monitor`: GPUs through NVML and the host, refreshed like nvidia-smi.
pub fn monitor(args: &MonitorArgs) -> anyhow::Result<()> {
    if args.interval == 0.0 {
        anyhow::bail!("--interval 0: give seconds > 0, e.g. --interval 0.5");
    }
    let opts = redline_monitor::MonitorOptions {
        interval: seconds("--interval", args.interval)?,
        once: args.once,
        json: args.json,
        csv: args.csv.clone(),
        count: args.count,
    };
    Ok(redline_monitor::run(&opts)?)
}

/// `redline report RUN_DIR`: rebuilds report.html from the run folder's files.
pub fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let page = redline_report::write_report(&args.run_dir)?;
    println!("{}", page.display());
    Ok(())
}

/// `redline runs [ROOT]`: one line per run folder.
pub fn runs(args: &RunsArgs) -> anyhow::Result<()> {
    let rows = redline_report::list_runs(&args.root)?;
    print!("{}", redline_report::format_runs(&rows));
    Ok(())
}

/// The longest interval a flag takes: a day.
pub const MAX_INTERVAL_S: f64 = 86_400.0;

/// `value` seconds of flag `flag` as a duration: 0 to a day, else an error
/// that names the flag (a huge value would overflow `Duration`).
pub fn seconds(flag: &str, value: f64) -> anyhow::Result<std::time::Duration> {
    if !(value.is_finite() && (0.0..=MAX_INTERVAL_S).contains(&value)) {
        anyhow::bail!(
            "{flag} {value:?}: give seconds from 0 to {MAX_INTERVAL_S} (a day), e.g. {flag} 0.5"
        );
    }
    Ok(std::time::Duration::from_secs_f64(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before: `keep-last = 0` in a config file was refused as if typed
    /// (`--keep-last 0: ...`), naming neither the file nor the key.
    #[test]
    fn errors_about_a_files_values_name_the_file_and_key() {
        let t = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = t.path().join("c.toml");
        std::fs::write(
            &path,
            "keep-last = 0
lr = -1.0
",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let argv = |extra: &[&str]| -> Vec<OsString> {
            [
                "redline",
                "train",
                "--config",
                path.to_str().unwrap_or_default(),
            ]
            .iter()
            .chain(extra)
            .map(OsString::from)
            .collect()
        };
        let (_, flags) = expand_config(argv(&[])).unwrap_or_else(|e| panic!("{e}"));
        let e = flags.annotate(anyhow::anyhow!("--keep-last 0: keep at least 1"));
        let text = format!("{e:#}");
        assert!(
            text.contains("c.toml: the key `keep-last`") && text.contains("--keep-last 0"),
            "{text}"
        );
        let other = flags.annotate(anyhow::anyhow!("--keep-lastly 0: x"));
        assert_eq!(format!("{other:#}"), "--keep-lastly 0: x");
        // Given again on the command line: the value is not the file's.
        let (_, flags) = expand_config(argv(&["--lr", "-1"])).unwrap_or_else(|e| panic!("{e}"));
        let e = flags.annotate(anyhow::anyhow!("--lr -1: not a rate"));
        assert_eq!(format!("{e:#}"), "--lr -1: not a rate");
    }

    #[test]
    fn intervals_are_bounded_not_overflowed() {
        assert!(seconds("--interval", 1e300).is_err());
        assert!(seconds("--interval", -1.0).is_err());
        assert!(seconds("--interval", f64::NAN).is_err());
        assert_eq!(
            seconds("--interval", 0.5).ok(),
            Some(std::time::Duration::from_millis(500))
        );
    }
}
