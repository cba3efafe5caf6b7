//! Redline models: plain configs and constructors, no training logic.
//!
//! * [`params`]: the named parameter store (PyTorch `state_dict()` names) and safetensors I/O.
//! * [`init`]: PyTorch's default initialisation for Linear and Conv2d.
//! * [`mlp`], [`cnn`]: the zoo's model families; [`ModelConfig`] picks one.
//! * [`flops`]: FLOPs per sample counted from the layers ([`Model::flops`]).
//! * [`layers`]: a layer set and models described as a list of layers
//!   ([`SequentialConfig`], e.g. from a TOML file: `--model FILE.toml`).

pub mod cnn;
mod error;
pub mod flops;
pub mod gpt;
pub mod init;
pub mod layers;
pub mod mlp;
pub mod params;
pub mod resnet;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

pub use cnn::{Cnn, CnnConfig};
pub use error::{Error, Result};
pub use flops::Flops;
pub use gpt::{Gpt, GptConfig, Sampling};
pub use layers::{ConvInit, GeluForm, Layer, LayerSpec, Sequential, SequentialConfig};
pub use mlp::{Mlp, MlpConfig};
pub use params::Params;

/// The zoo's ResNet as a model file (`--model resnet`).
const RESNET: &str = include_str!("resnet.toml");

/// A network the trainer can fit: a forward pass over named parameters.
pub trait Model: Send + Sync {
    /// The output for a batch of inputs, e.g. logits `(B, classes)` for images
    /// `(B, C, H, W)`. `train` selects training behaviour where a layer has one
    /// (dropout drops, batch norm uses and updates batch statistics), as
    /// candle's `ModuleT::forward_t` and PyTorch's `module.train()`.
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor>;
    /// The inference forward pass: `forward_t(x, false)`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_t(x, false)
    }
    /// The trainable parameters, in PyTorch `state_dict()` order.
    fn params(&self) -> &Params;
    /// FLOPs per training sample (forward and backward), counted from the
    /// layers as [`flops`] describes; they make a run's MFU. `None`, the
    /// default, means unknown: a model of your own reports no guessed
    /// number, and its runs show no MFU until it implements this.
    fn flops(&self) -> Option<Flops> {
        None
    }
    /// Whether a training step through this model can be captured once as a
    /// CUDA graph and replayed with the same result: its forward pass uses
    /// device ops only, with no host-drawn random numbers, no value read
    /// back, and state kept in place. `Err` says why not. A model of your own
    /// is not assumed safe: return `Ok(())` to opt in.
    fn capture_safe(&self) -> std::result::Result<(), String> {
        Err("a model of your own: implement Model::capture_safe to declare it capturable".into())
    }
    /// The positions of the model's random streams (dropout masks), which a
    /// checkpoint saves so that a resumed run draws the masks the run never
    /// stopped would; empty for a model without randomness.
    fn rng_state(&self) -> Vec<u128> {
        Vec::new()
    }
    /// Puts back positions [`Model::rng_state`] gave.
    fn load_rng_state(&self, state: &[u128]) -> Result<()> {
        match state.len() {
            0 => Ok(()),
            n => Err(Error::Config(format!(
                "random stream positions: the state holds {n}, this model has none"
            ))),
        }
    }
}

impl<M: Model + ?Sized> Model for Box<M> {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        (**self).forward_t(x, train)
    }
    fn capture_safe(&self) -> std::result::Result<(), String> {
        (**self).capture_safe()
    }
    fn params(&self) -> &Params {
        (**self).params()
    }
    fn flops(&self) -> Option<Flops> {
        (**self).flops()
    }
    fn rng_state(&self) -> Vec<u128> {
        (**self).rng_state()
    }
    fn load_rng_state(&self, state: &[u128]) -> Result<()> {
        (**self).load_rng_state(state)
    }
}

/// Which model to build, with its shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelConfig {
    /// A multi-layer perceptron.
    Mlp(MlpConfig),
    /// A small convolutional network.
    Cnn(CnnConfig),
    /// A list of layers (a model file).
    Sequential(SequentialConfig),
    /// A GPT (nanoGPT's structure and names).
    Gpt(GptConfig),
}

impl ModelConfig {
    /// The zoo's model by name: `mlp` (784-128-10) or `cnn` (both for
    /// Fashion-MNIST until shaped by [`ModelConfig::for_data`]), or `resnet`
    /// (a ResNet-8 for 3x32x32 CIFAR-10 images, 10 classes).
    pub fn by_name(name: &str) -> Result<Self> {
        let name = name.trim().to_ascii_lowercase();
        if let Some(cfg) = resnet::config(&name) {
            return Ok(Self::Sequential(cfg?));
        }
        match name.as_str() {
            "resnet" => Ok(Self::Sequential(SequentialConfig::from_toml(
                RESNET,
                "resnet",
                &[3, 32, 32],
                10,
            )?)),
            "mlp" => Ok(Self::Mlp(MlpConfig::default())),
            "cnn" => Ok(Self::Cnn(CnnConfig::default())),
            "gpt-char" => Ok(Self::Gpt(GptConfig::char_level())),
            "gpt2" => Ok(Self::Gpt(GptConfig::gpt2())),
            other => Err(Error::Config(format!(
                "--model {other:?}: unknown model; available: mlp, cnn, resnet (a ResNet-8 for \
                 CIFAR), resnet18, resnet34, resnet50, resnet101, resnet152 (torchvision's), \
                 gpt-char (nanoGPT's shakespeare-char GPT), gpt2 (124M), or a model file \
                 (FILE.toml, docs/models.md)"
            ))),
        }
    }

    /// The GPT of a `kind = "gpt"` model file `name` (`None` for other
    /// names and files of layers).
    fn gpt_file(name: &str) -> Result<Option<GptConfig>> {
        if !name.ends_with(".toml") {
            return Ok(None);
        }
        let path = std::path::Path::new(name);
        let text = redline_core::files::read_input_text(path, layers::MAX_MODEL_FILE).map_err(
            |source| Error::Io {
                path: path.to_path_buf(),
                source,
            },
        )?;
        GptConfig::from_file_text(&text)
            .map_err(|e| Error::Config(format!("--model {}: {e}", path.display())))
    }

    /// The window length a language model `name` takes (its `block_size`):
    /// token data is cut into windows of it. `None` for models that are not
    /// GPTs.
    pub fn token_block(name: &str) -> Result<Option<usize>> {
        if let Some(c) = Self::gpt_file(name)? {
            return Ok(Some(c.block_size));
        }
        if name.ends_with(".toml") {
            return Ok(None);
        }
        Ok(match Self::by_name(name) {
            Ok(Self::Gpt(c)) => Some(c.block_size),
            _ => None,
        })
    }

    /// The zoo's model `name` shaped for the data: inputs of `input_dims` per
    /// sample (`[C, H, W]` images for the CNN, anything for the MLP, which
    /// flattens), `outputs` values out, and optional hidden widths.
    /// A model file's last layer must give `outputs` values (checked here).
    pub fn for_data(
        name: &str,
        input_dims: &[usize],
        outputs: usize,
        hidden: Option<&[usize]>,
    ) -> Result<Self> {
        let cfg = Self::for_inputs(name, input_dims, outputs, hidden)?;
        if let Self::Sequential(c) = &cfg {
            c.check_head()?;
        }
        Ok(cfg)
    }

    /// [`ModelConfig::for_data`] without the check of a model file's head
    /// against `outputs`: for sizing the model from the inputs alone, before
    /// the targets (and so the outputs) are read.
    pub fn for_inputs(
        name: &str,
        input_dims: &[usize],
        outputs: usize,
        hidden: Option<&[usize]>,
    ) -> Result<Self> {
        if name.ends_with(".toml") {
            if let Some(h) = hidden {
                return Err(Error::Config(format!(
                    "--hidden {h:?} shapes the zoo's models; a model file ({name}) sets its own widths"
                )));
            }
        }
        // A model file is a GPT (`kind = "gpt"`) or a list of layers; a
        // name is the zoo's.
        let mut cfg = match Self::gpt_file(name)? {
            Some(c) => Self::Gpt(c),
            None if name.ends_with(".toml") => {
                let path = std::path::Path::new(name);
                return Ok(Self::Sequential(SequentialConfig::from_file(
                    path, input_dims, outputs,
                )?));
            }
            None => Self::by_name(name)?,
        };
        match &mut cfg {
            Self::Mlp(c) => {
                c.in_features = input_dims.iter().product();
                c.classes = outputs;
                if let Some(h) = hidden {
                    c.hidden = h.to_vec();
                }
            }
            Self::Cnn(c) => {
                let [ch, h, w] = input_dims[..] else {
                    return Err(Error::Config(format!(
                        "--model cnn takes images (C, H, W); the data's inputs are {input_dims:?}
                         HINT: use --model mlp for tables and vectors"
                    )));
                };
                if h != w {
                    return Err(Error::Config(format!(
                        "--model cnn takes square images; the data's are {h}x{w}"
                    )));
                }
                (c.in_channels, c.image_size, c.classes) = (ch, h, outputs);
                match hidden {
                    None => {}
                    Some([one]) => c.hidden = *one,
                    Some(more) => {
                        return Err(Error::Config(format!(
                            "--hidden {more:?}: the CNN has one hidden fully connected layer; give one width"
                        )))
                    }
                }
            }
            Self::Gpt(c) => {
                if hidden.is_some() {
                    return Err(Error::Config(format!(
                        "--hidden shapes the mlp and cnn; --model {name} sets n_embd instead"
                    )));
                }
                if input_dims != [c.block_size] {
                    return Err(Error::Config(format!(
                        "--model {name} takes windows of {} token ids; the data's inputs are \
                         {input_dims:?}",
                        c.block_size
                    )));
                }
                c.vocab_size = outputs;
                c.check()?;
            }
            Self::Sequential(c) => {
                if hidden.is_some() {
                    return Err(Error::Config(format!(
                        "--hidden shapes the mlp and cnn; --model {name} has fixed widths"
                    )));
                }
                (c.input_dims, c.outputs) = (input_dims.to_vec(), outputs);
                c.shapes()?;
            }
        }
        Ok(cfg)
    }

    /// FLOPs per sample of the model this config builds ([`flops`]).
    pub fn flops(&self) -> Result<Flops> {
        match self {
            Self::Mlp(c) => Ok(flops::fold(&c.layers(), &[c.in_features], c.classes, false)?.0),
            Self::Cnn(c) => {
                let input = [c.in_channels, c.image_size, c.image_size];
                Ok(flops::fold(&c.layers(), &input, c.classes, false)?.0)
            }
            Self::Sequential(c) => c.flops(),
            Self::Gpt(c) => c.flops(),
        }
    }

    /// Short name for logs and run directories.
    pub fn name(&self) -> &str {
        match self {
            Self::Mlp(_) => "mlp",
            Self::Cnn(_) => "cnn",
            Self::Sequential(c) => &c.name,
            Self::Gpt(_) => "gpt",
        }
    }

    /// Builds the model with PyTorch's default initialisation drawn from `seed`.
    pub fn build(
        &self,
        device: &redline_core::Device,
        precision: redline_core::Precision,
        seed: u64,
    ) -> Result<Box<dyn Model>> {
        let mut init = init::Initializer::new(seed, device, precision);
        Ok(match self {
            Self::Mlp(c) => Box::new(Mlp::new(c, &mut init)?),
            Self::Cnn(c) => Box::new(Cnn::new(c, &mut init)?),
            Self::Sequential(c) => Box::new(c.build(&mut init)?),
            Self::Gpt(c) => Box::new(Gpt::new(c, &mut init)?),
        })
    }
}
