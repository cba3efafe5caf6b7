//! CUDA graph mode: whether a fit captures its training step once as a CUDA
//! graph and replays it (`--cuda-graph`; docs/cuda-graphs.md), and why not.

use std::fmt;
use std::str::FromStr;

use redline_core::Device;
use redline_data::Loader;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::step::TrainStep;
use crate::trainer::TrainConfig;

/// Whether `--cuda-graph auto` captures. On since the graph driver passed the
/// MLP golden tests in graph mode (resident and streamed data) and ran the
/// MLP and CNN on an H100 (`bench/results/h100-2026-11-25/`,
/// docs/cuda-graphs.md). `false` would make `auto` run eagerly everywhere.
pub const AUTO_CAPTURES: bool = true;

/// Whether `--fused-kernels auto` uses Redline's fused GPU kernels
/// (`redline_kernels::cuda`). On since their tests against the generic ops
/// and the MLP golden tests passed on an H100, and the CNN's golden results
/// with them equal the generic path's to 4 digits
/// (`bench/results/h100-2026-11-25/`).
pub const AUTO_FUSES: bool = true;

/// Whether `--fused-kernels auto` also admits the fused kernels'
/// reduced-precision variants (`redline_kernels::fused_gpu::
/// reduced_precision`: the 16-bit and TF32 tensor-core convolutions, the
/// 16-bit linear layer and CNN block, the bf16 optimizer, the optimizer's
/// skip on the loss scaler's flag). On since their first GPU run, on an H200
/// (`bench/results/h200-2026-11-26/`): the tensor-core convolution, TF32 and
/// skip tests passed; the MLP's precision goldens pass the CPU bounds with
/// them (and fail them with candle's 16-bit ops); the CNN's goldens come out
/// as with candle's ops; the bf16 CNN's epoch takes 0.78 s against 1.76 s.
/// The two 16-bit layer tests that failed there failed on their references
/// (candle's fp16 sum, pooling near-ties), now replaced; they run again on
/// the next GPU. `false` sends 16-bit GPU runs to candle's ops under `auto`.
pub const AUTO_FUSES_REDUCED: bool = true;

/// Whether `--cuda-graph auto` captures a loss-scaled step (`16-mixed`):
/// the scale, its clean-step count and the skipped-step count are device
/// variables updated in place, the fused optimizer reads the overflow flag
/// on the device, and a capture that fails falls back to eager steps. On an
/// H200 (`bench/results/h200-2026-11-26-2/`, `precision/graph/`) the four
/// `16-mixed` goldens captured at step 3 (MLP 359 nodes, CNN 574) gave the
/// eager runs' losses and scales bit for bit, skipped steps included, and
/// the MLP's epoch took 0.198 s against 0.865 s eagerly. `false` sends
/// `16-mixed` to eager steps under `auto`.
pub const AUTO_CAPTURES_SCALED: bool = true;

/// Whether `--gpu-conv auto` runs the fused path's convolutions on cuDNN
/// where it loads, rather than Redline's implicit-GEMM kernels. On an H100
/// (`bench/results/h100-2026-11-26/`, cuDNN 9.19) cuDNN's tests and the CNN
/// golden through it passed, and the CNN's epoch took 0.320 s against
/// 0.606 s on Redline's kernels at batch 64 (fp32), 0.187 s against 0.308 s
/// at batch 512 and 0.355 s against 0.644 s in bf16-mixed. Where cuDNN does
/// not load (`redline_kernels::cudnn_ffi`), `auto` keeps Redline's kernels;
/// the fit's `gpu_conv` says which ran. `false` keeps Redline's kernels.
pub const AUTO_CONV_CUDNN: bool = true;

/// Whether `mode` (of `--fused-kernels`) admits the reduced-precision
/// variants of the fused GPU kernels.
pub fn reduced_kernels_on(mode: GraphMode) -> bool {
    match mode {
        GraphMode::On => true,
        GraphMode::Off => false,
        GraphMode::Auto => AUTO_FUSES_REDUCED,
    }
}

/// Whether `mode` (of `--fused-kernels`) turns the fused GPU kernels on.
pub fn fused_kernels_on(mode: GraphMode) -> bool {
    match mode {
        GraphMode::On => true,
        GraphMode::Off => false,
        GraphMode::Auto => AUTO_FUSES,
    }
}

/// Eager steps before the capture: the first runs every lazy allocation (the
/// optimizer's state, the metric sums) and fills the host-to-device cache, the
/// second proves the step repeats without either.
pub const WARMUP_STEPS: usize = 2;

/// `--cuda-graph`: capture the training step as one CUDA graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GraphMode {
    /// Capture where the step can be captured (while [`AUTO_CAPTURES`] is
    /// set), else run eagerly and say why.
    #[default]
    Auto,
    /// Capture, or refuse to start and say why not.
    On,
    /// Never capture.
    Off,
}

impl FromStr for GraphMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            other => Err(Error::Config(format!(
                "--cuda-graph {other:?}: choose auto, on or off"
            ))),
        }
    }
}

impl fmt::Display for GraphMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

/// What a fit did about CUDA graphs, for the summary.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum GraphStatus {
    /// Not captured; the reason.
    Off(String),
    /// Captured at `captured_at` (an optimizer step, 1-based) and replayed
    /// `replays` times.
    Replayed {
        /// Step whose launches were captured.
        captured_at: usize,
        /// Steps run by replaying the graph (the captured one included).
        replays: usize,
        /// The graph's nodes by kind, when the driver said.
        nodes: Option<GraphNodes>,
    },
    /// The capture was tried and failed; the fit went on eagerly.
    Failed(String),
    /// Not decided (no fit has run).
    #[default]
    Unknown,
}

/// A captured step's graph nodes, by kind (`cuGraphNodeGetType`): what a
/// replay walks. Kernels do the work; copies, memsets and the step's
/// stream-ordered allocations and frees are nodes too, each a gap between
/// kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphNodes {
    /// Every node.
    pub total: usize,
    /// Kernel launches.
    pub kernels: usize,
    /// Memory copies.
    pub copies: usize,
    /// Memsets.
    pub memsets: usize,
    /// Allocations (stream-ordered, captured as memory nodes).
    pub allocations: usize,
    /// Frees.
    pub frees: usize,
}

impl GraphNodes {
    /// Counts `total` nodes from the driver's kinds (`CUgraphNodeType`
    /// values, as numbers: a kind newer than this build counts as other).
    pub fn from_kinds(total: usize, kinds: impl IntoIterator<Item = u32>) -> Self {
        let mut n = Self {
            total,
            ..Self::default()
        };
        for kind in kinds {
            match kind {
                0 => n.kernels += 1,
                1 => n.copies += 1,
                2 => n.memsets += 1,
                10 => n.allocations += 1,
                11 => n.frees += 1,
                _ => {}
            }
        }
        n
    }
}

/// `N nodes: K kernels, C copies, A allocations, F frees` (kinds with
/// none left out; nodes of no kind listed here counted as `other`).
impl fmt::Display for GraphNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kinds = [
            (self.kernels, "kernels"),
            (self.copies, "copies"),
            (self.memsets, "memsets"),
            (self.allocations, "allocations"),
            (self.frees, "frees"),
        ];
        let named: usize = kinds.iter().map(|k| k.0).sum();
        let parts: Vec<String> = kinds
            .iter()
            .copied()
            .chain(std::iter::once((self.total.saturating_sub(named), "other")))
            .filter(|k| k.0 > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        match parts.is_empty() {
            true => write!(f, "{} nodes", self.total),
            false => write!(f, "{} nodes: {}", self.total, parts.join(", ")),
        }
    }
}

/// Written as its sentence (`summary.json`'s `cuda_graph`).
impl Serialize for GraphStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for GraphStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off(why) => write!(f, "off ({why})"),
            Self::Replayed {
                captured_at,
                replays,
                nodes,
            } => {
                let graph = nodes.map_or(",".into(), |n| format!(" as a graph of {n};"));
                write!(
                    f,
                    "on (the step captured at step {captured_at}{graph} replayed for {replays} steps)"
                )
            }
            Self::Failed(why) => write!(f, "failed, ran eagerly ({why})"),
            Self::Unknown => f.write_str("not run"),
        }
    }
}

/// Why this fit's step cannot be captured, or `Ok` when it can. Checked in
/// order: the mode, the device and the build, the data, the loop's settings,
/// then the step itself.
pub fn eligibility(
    mode: GraphMode,
    device: &Device,
    train: &Loader,
    cfg: &TrainConfig,
    step: &dyn TrainStep,
) -> std::result::Result<(), String> {
    if mode == GraphMode::Off {
        return Err("--cuda-graph off".into());
    }
    if device.is_cpu() {
        return Err("the device is the CPU; CUDA graphs need a CUDA device".into());
    }
    if !cfg!(feature = "cuda") {
        return Err("this build has no CUDA support".into());
    }
    loop_eligibility(train, cfg, step)?;
    scaled_eligibility(mode, cfg)?;
    if mode == GraphMode::Auto && !AUTO_CAPTURES {
        return Err(
            "auto capture is turned off in this build (graph::AUTO_CAPTURES); --cuda-graph on \
             captures"
                .into(),
        );
    }
    Ok(())
}

/// Whether `mode` captures this fit's loss-scaled step (`16-mixed`):
/// `--cuda-graph on` does; `auto` does when [`AUTO_CAPTURES_SCALED`].
pub(crate) fn scaled_eligibility(
    mode: GraphMode,
    cfg: &TrainConfig,
) -> std::result::Result<(), String> {
    if cfg.loss_scale.is_some() && mode == GraphMode::Auto && !AUTO_CAPTURES_SCALED {
        return Err(
            "16-mixed: auto capture of loss-scaled steps is turned off in this build \
             (graph::AUTO_CAPTURES_SCALED); --cuda-graph on captures them"
                .into(),
        );
    }
    Ok(())
}

/// The checks after the device's: the loop's settings, the epoch's length,
/// then the step's own declaration. Resident and streamed data both capture
/// (graph_run.rs says how each reaches the step).
pub(crate) fn loop_eligibility(
    train: &Loader,
    cfg: &TrainConfig,
    step: &dyn TrainStep,
) -> std::result::Result<(), String> {
    if cfg.accumulate > 1 {
        return Err(format!(
            "--accumulate {}: accumulated steps are not captured yet",
            cfg.accumulate
        ));
    }
    if let Some(s) = train.sharding() {
        return Err(format!(
            "data-parallel (rank {} of {}): the gradient all-reduce runs on the host between \
             backward and the update, outside a captured graph",
            s.rank, s.world
        ));
    }
    if let Some(n) = train.limit() {
        return Err(format!(
            "the epoch is limited to {n} batches (a short run): the captured step walks whole \
             epochs"
        ));
    }
    let full = train.len() / train.config().batch_size.max(1);
    if full <= WARMUP_STEPS {
        return Err(format!(
            "an epoch has {full} full batches; a capture needs more than {WARMUP_STEPS}"
        ));
    }
    step.capture_safe()
}

/// The decision at the start of a fit: `Ok(Err(reason))` runs eagerly;
/// `--cuda-graph on` with a reason is an error, before any step runs.
pub fn decide(
    mode: GraphMode,
    device: &Device,
    train: &Loader,
    cfg: &TrainConfig,
    step: &dyn TrainStep,
) -> Result<std::result::Result<(), String>> {
    match eligibility(mode, device, train, cfg, step) {
        Err(why) if mode == GraphMode::On => Err(Error::Config(format!(
            "--cuda-graph on: the training step cannot be captured: {why}\nHINT: --cuda-graph \
             auto runs such a fit eagerly"
        ))),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::Classifier;
    use candle_core::Tensor;
    use redline_data::{LoaderConfig, Placement, Split, TargetKind};
    use redline_models::{Model, ModelConfig, Params};

    #[test]
    fn fused_kernels_follow_their_switch() {
        assert!(fused_kernels_on(GraphMode::On));
        assert!(!fused_kernels_on(GraphMode::Off));
        assert_eq!(fused_kernels_on(GraphMode::Auto), AUTO_FUSES);
        // The variants not yet run on a GPU: `on` alone admits them.
        assert!(reduced_kernels_on(GraphMode::On));
        assert!(!reduced_kernels_on(GraphMode::Off));
        assert_eq!(reduced_kernels_on(GraphMode::Auto), AUTO_FUSES_REDUCED);
    }

    fn split(n: usize) -> Result<Split> {
        let cpu = candle_core::Device::Cpu;
        Ok(Split {
            x: Tensor::zeros((n, 1, 28, 28), candle_core::DType::F32, &cpu)?,
            y: Tensor::zeros(n, candle_core::DType::U32, &cpu)?,
            target: TargetKind::Classes(10),
            source: "graph-test".into(),
        })
    }

    fn loader(n: usize, batch: usize) -> Result<Loader> {
        let cfg = LoaderConfig {
            batch_size: batch,
            ..LoaderConfig::default()
        };
        Ok(Loader::new(split(n)?, cfg)?)
    }

    /// The zoo's MLP as a classifier on the CPU.
    fn mlp_step() -> Result<Classifier<Box<dyn Model>>> {
        let model =
            ModelConfig::by_name("mlp")?.build(&Device::cpu(), redline_core::Precision::Fp32, 0)?;
        Ok(Classifier::new(model))
    }

    #[test]
    fn modes_parse_and_print() -> Result<()> {
        for m in ["auto", "on", "off"] {
            assert_eq!(m.parse::<GraphMode>()?.to_string(), m);
        }
        assert_eq!(" ON ".parse::<GraphMode>()?, GraphMode::On);
        let e = "yes".parse::<GraphMode>().err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("choose auto, on or off")));
        assert_eq!(GraphMode::default(), GraphMode::Auto);
        Ok(())
    }

    /// On the CPU, auto runs eagerly with the reason; on refuses to start.
    #[test]
    fn the_cpu_runs_eagerly_and_says_why() -> Result<()> {
        let (dev, step) = (Device::cpu(), mlp_step()?);
        let cfg = TrainConfig::default();
        let train = loader(640, 64)?;
        let auto = decide(GraphMode::Auto, &dev, &train, &cfg, &step)?;
        assert!(auto.is_err_and(|why| why.contains("the device is the CPU")));
        let off = decide(GraphMode::Off, &dev, &train, &cfg, &step)?;
        assert_eq!(off, Err("--cuda-graph off".into()));
        let on = decide(GraphMode::On, &dev, &train, &cfg, &step).err();
        assert!(on.is_some_and(|e| {
            let e = e.to_string();
            e.contains("--cuda-graph on: the training step cannot be captured")
                && e.contains("the device is the CPU")
        }));
        Ok(())
    }

    /// What a step and a model declare: the zoo's models and steps are
    /// capturable, dropout is not, a model or step of one's own must opt in.
    #[test]
    fn steps_and_models_declare_themselves() -> Result<()> {
        let dev = Device::cpu();
        let zoo = ModelConfig::by_name("cnn")?.build(&dev, redline_core::Precision::Fp32, 0)?;
        assert_eq!(Classifier::new(zoo).capture_safe(), Ok(()));

        struct Own(Params);
        impl Model for Own {
            fn forward_t(&self, x: &Tensor, _: bool) -> redline_models::Result<Tensor> {
                Ok(x.clone())
            }
            fn params(&self) -> &Params {
                &self.0
            }
        }
        let why = Classifier::new(Own(Params::new())).capture_safe();
        assert!(why.is_err_and(|w| w.contains("Model::capture_safe")));

        let file = r#"
            [model]
            name = "dropper"
            layers = [
              { type = "linear", out = 8 },
              { type = "residual", layers = [{ type = "dropout", p = 0.25 }] },
              { type = "linear" },
            ]
        "#;
        let cfg = redline_models::SequentialConfig::from_toml(file, "dropper", &[4], 2)?;
        let model = ModelConfig::Sequential(cfg).build(&dev, redline_core::Precision::Fp32, 0)?;
        let why = Classifier::new(model).capture_safe();
        assert!(
            why.as_ref()
                .is_err_and(|w| w.contains("dropout (p = 0.25) draws its mask on the host")),
            "{why:?}"
        );
        Ok(())
    }

    /// The loop reasons, each on its own (the device check before them cannot
    /// pass on the CPU); streamed data is captured as resident data is.
    #[test]
    fn accumulation_and_short_epochs_are_not_captured_streaming_is() -> Result<()> {
        let step = mlp_step()?;
        let cfg = TrainConfig::default();
        assert_eq!(loop_eligibility(&loader(640, 64)?, &cfg, &step), Ok(()));

        let streaming = Loader::placed_host(
            split(640)?.to_host()?,
            &candle_core::Device::Cpu,
            Placement::Streaming,
            LoaderConfig::default(),
        )?;
        assert_eq!(loop_eligibility(&streaming, &cfg, &step), Ok(()));

        let acc = TrainConfig {
            accumulate: 4,
            ..TrainConfig::default()
        };
        let why = loop_eligibility(&loader(640, 64)?, &acc, &step);
        assert!(why.is_err_and(|w| w.contains("--accumulate 4")));
        // A loss-scaled step (16-mixed): captured with --cuda-graph on;
        // under auto as AUTO_CAPTURES_SCALED says.
        let scaled = TrainConfig {
            loss_scale: Some(crate::scaler::LossScale::default()),
            ..TrainConfig::default()
        };
        assert_eq!(loop_eligibility(&loader(640, 64)?, &scaled, &step), Ok(()));
        assert_eq!(scaled_eligibility(GraphMode::On, &scaled), Ok(()));
        assert_eq!(scaled_eligibility(GraphMode::Auto, &cfg), Ok(()));
        let why = scaled_eligibility(GraphMode::Auto, &scaled);
        assert_eq!(why.is_ok(), AUTO_CAPTURES_SCALED, "{why:?}");
        if let Err(w) = why {
            assert!(w.contains("16-mixed: the loss scaler") && w.contains("--cuda-graph on"));
        }

        // 130 samples in batches of 64: 2 full batches, both warm-up steps.
        let shard = redline_data::Shard {
            rank: 1,
            world: 2,
            pad: true,
        };
        let why = loop_eligibility(&loader(640, 64)?.shard(shard)?, &cfg, &step);
        assert!(why.is_err_and(|w| w.contains("data-parallel (rank 1 of 2)")));
        let why = loop_eligibility(&loader(130, 64)?, &cfg, &step);
        assert!(why.is_err_and(|w| w.contains("an epoch has 2 full batches")));
        Ok(())
    }

    #[test]
    fn a_replayed_status_names_the_graph_size_when_known() {
        let known = GraphStatus::Replayed {
            captured_at: 3,
            replays: 841,
            nodes: Some(GraphNodes {
                total: 120,
                kernels: 31,
                copies: 0,
                memsets: 2,
                allocations: 40,
                frees: 40,
            }),
        };
        assert_eq!(
            known.to_string(),
            "on (the step captured at step 3 as a graph of 120 nodes: 31 kernels, 2 memsets, \
             40 allocations, 40 frees, 7 other; replayed for 841 steps)"
        );
        let kinds_unknown = GraphNodes {
            total: 9,
            ..GraphNodes::default()
        };
        assert_eq!(kinds_unknown.to_string(), "9 nodes: 9 other");
        assert_eq!(GraphNodes::default().to_string(), "0 nodes");
        // The driver's numbers: kernel 0, memcpy 1, memset 2, empty 5,
        // event record 7, mem alloc 10, mem free 11, and one from the future.
        let counted = GraphNodes::from_kinds(9, [0, 0, 1, 2, 5, 7, 10, 11, 99]);
        assert_eq!(
            counted.to_string(),
            "9 nodes: 2 kernels, 1 copies, 1 memsets, 1 allocations, 1 frees, 3 other"
        );
        let unknown = GraphStatus::Replayed {
            captured_at: 3,
            replays: 841,
            nodes: None,
        };
        assert_eq!(
            unknown.to_string(),
            "on (the step captured at step 3, replayed for 841 steps)"
        );
    }
}
