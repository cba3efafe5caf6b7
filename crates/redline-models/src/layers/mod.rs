//! A layer set and models described as a list of layers (PyTorch's
//! `nn.Sequential`), e.g. from a TOML file:
//!
//! ```toml
//! [model]
//! name = "small-cnn"
//! layers = [
//!   { type = "conv2d", out = 16, kernel = 3, padding = 1 },
//!   { type = "relu" },
//!   { type = "maxpool2d", kernel = 2 },
//!   { type = "flatten" },
//!   { type = "linear", out = 64 },
//!   { type = "relu" },
//!   { type = "dropout", p = 0.2 },
//!   { type = "linear" },   # no `out`: the data's outputs
//! ]
//! ```
//!
//! Shapes are inferred from the data's per-sample input shape, so a layer
//! names only what it adds (`out`, `kernel`). Parameters are named as
//! `nn.Sequential` names them (`0.weight`, `4.bias`; a residual block's body
//! is `<i>.body.<j>` and its shortcut `<i>.shortcut.<j>`; batch norm's running
//! statistics are buffers beside its weight), so `state_dict()` files move
//! both ways.
//!
//! Where a layer has a fused CPU kernel it is used, and neighbours are fused:
//! Linear then ReLU is one op, Conv2d then ReLU and MaxPool2d (either order)
//! is one op, as in the zoo's models, and so are BatchNorm2d then ReLU and a
//! residual block then ReLU (ResNet's `bn1` + `relu`, and each block's end).

pub(crate) mod attention;
pub(crate) mod basic;
pub(crate) mod norm;

use std::path::Path;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::init::Initializer;
use crate::params::Params;
use crate::Model;

/// A layer of a [`Sequential`] model: its forward pass over `(B, ...)`.
pub trait Layer: Send + Sync {
    /// The output for a batch; `train` selects training behaviour (dropout).
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor>;
    /// Whether a training step through this layer can be captured once as a
    /// CUDA graph and replayed with the same result (see
    /// [`Model::capture_safe`]); `Err` says why not.
    fn capture_safe(&self) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Appends the positions of this layer's random streams (dropout's) to `out`.
    fn rng_state(&self, _out: &mut Vec<u128>) {}
    /// Takes back, in order, the positions [`Layer::rng_state`] gave.
    fn load_rng_state(&self, _from: &mut dyn Iterator<Item = u128>) -> Result<()> {
        Ok(())
    }
}

fn default_eps() -> f64 {
    1e-5
}

fn default_momentum() -> f64 {
    0.1
}

fn one() -> usize {
    1
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Which GELU: PyTorch's `approximate` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GeluForm {
    /// `x Φ(x)` with the error function (PyTorch's default).
    #[default]
    None,
    /// GPT-2's `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
    Tanh,
}

impl GeluForm {
    fn is_erf(&self) -> bool {
        *self == Self::None
    }
}

/// How a convolution's weight is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvInit {
    /// PyTorch's `nn.Conv2d` default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    #[default]
    Default,
    /// `kaiming_normal_(mode="fan_out", nonlinearity="relu")`, as
    /// torchvision's ResNets draw their convolutions: N(0, 2 / (out * kh * kw)).
    KaimingNormalFanOut,
}

impl ConvInit {
    fn is_default(&self) -> bool {
        *self == Self::Default
    }
}

/// One layer as written in a model file (`type = "..."` plus its settings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum LayerSpec {
    /// `nn.Linear(in, out)` on `(B, ..., in)` (the last dimension); without
    /// `out`, the data's outputs.
    Linear {
        /// Output features [default: the data's outputs].
        #[serde(default)]
        out: Option<usize>,
        /// The parameters' name in the state dict [default: the layer's
        /// position]: torchvision's `conv1`, `layer1.0.bn2`, `fc`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// `nn.Conv2d(in, out, kernel, stride, padding, bias=bias)` on `(B, C, H, W)`.
    Conv2d {
        /// Output channels.
        out: usize,
        /// Square kernel side.
        kernel: usize,
        /// Zero padding on each side.
        #[serde(default)]
        padding: usize,
        /// Step between windows (1 takes the fused kernel).
        #[serde(default = "one")]
        stride: usize,
        /// Channel groups (PyTorch's `groups`): the input's and the output's
        /// channels split into this many groups convolved apart; the input's
        /// channel count is depthwise (MobileNet).
        #[serde(default = "one", skip_serializing_if = "is_one")]
        groups: usize,
        /// Whether the layer has a bias (ResNets drop it before batch norm).
        #[serde(default = "yes")]
        bias: bool,
        /// How the weight is drawn [default: PyTorch's `nn.Conv2d` default].
        #[serde(default, skip_serializing_if = "ConvInit::is_default")]
        init: ConvInit,
        /// The parameters' name in the state dict [default: the layer's
        /// position]: torchvision's `conv1`, `layer1.0.bn2`, `fc`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// `nn.BatchNorm2d(C, eps, momentum)` on `(B, C, H, W)`, with running
    /// statistics (buffers `running_mean`, `running_var`, `num_batches_tracked`).
    Batchnorm2d {
        /// Added to the variance.
        #[serde(default = "default_eps")]
        eps: f64,
        /// Weight of the batch in the running statistics.
        #[serde(default = "default_momentum")]
        momentum: f64,
        /// The parameters' name in the state dict [default: the layer's
        /// position]: torchvision's `conv1`, `layer1.0.bn2`, `fc`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// `nn.MaxPool2d(kernel, stride, padding)` (floor mode).
    Maxpool2d {
        /// Window side.
        kernel: usize,
        /// Step between windows [default: the window side].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<usize>,
        /// `-inf` padding on each side (at most half the window, as PyTorch).
        #[serde(default, skip_serializing_if = "is_zero")]
        padding: usize,
    },
    /// `nn.AvgPool2d(kernel, stride, padding, count_include_pad)` (floor mode).
    Avgpool2d {
        /// Window side.
        kernel: usize,
        /// Step between windows [default: the window side].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<usize>,
        /// Zero padding on each side (at most half the window, as PyTorch).
        #[serde(default, skip_serializing_if = "is_zero")]
        padding: usize,
        /// Whether the padding's zeros count in each window's divisor
        /// [default: true, PyTorch's].
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        count_include_pad: bool,
    },
    /// `nn.AdaptiveAvgPool2d(1)`: the mean of each channel, `(C, 1, 1)`.
    Adaptiveavgpool2d,
    /// `nn.Flatten()`.
    Flatten,
    /// `nn.ReLU()`.
    Relu,
    /// `nn.GELU(approximate)`: the erf form, or GPT-2's tanh form
    /// (`approximate = "tanh"`, Hugging Face's `gelu_new`).
    Gelu {
        /// `none` (erf, the default) or `tanh`.
        #[serde(default, skip_serializing_if = "GeluForm::is_erf")]
        approximate: GeluForm,
    },
    /// A learned position table added to a sequence `(T, C)`: row `t` of a
    /// `(max, C)` parameter to position `t`, as GPT's `wpe` (parameter
    /// `NAME.weight`, N(0, 0.02) as nanoGPT draws it).
    Positions {
        /// The longest sequence (the table's rows).
        max: usize,
        /// The parameter's name in the state dict [default: the layer's position].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// `nn.Dropout(p)`.
    Dropout {
        /// Probability of zeroing an element in training.
        p: f64,
    },
    /// `nn.LayerNorm(last_dim, eps)` over the last dimension.
    Layernorm {
        /// Added to the variance.
        #[serde(default = "default_eps")]
        eps: f64,
    },
    /// `nn.Embedding(num, dim)`: whole-number ids `(B, L)` -> `(B, L, dim)`.
    Embedding {
        /// Vocabulary size (ids are `0..num`).
        num: usize,
        /// Vector width.
        dim: usize,
    },
    /// Causal multi-head self-attention on `(T, C)` per sample, as nanoGPT's
    /// `CausalSelfAttention`: `c_attn` (C -> 3C), the heads attending to
    /// the positions up to their own, `c_proj` (C -> C).
    Attention {
        /// Heads (C must divide by them).
        heads: usize,
        /// The parameters' name in the state dict [default: the layer's
        /// position]: `NAME.c_attn.weight`, `NAME.c_proj.bias`, ...
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// `shortcut(x) + body(x)`: the shortcut is the identity unless given
    /// (a projection when the body changes the shape).
    Residual {
        /// The body's layers.
        layers: Vec<LayerSpec>,
        /// The shortcut's layers [default: none, the identity].
        #[serde(default)]
        shortcut: Vec<LayerSpec>,
        /// The block's name in the state dict [default: its position]: the
        /// body's parameters are `NAME.<layer>`, the shortcut's
        /// `NAME.downsample.<i>` (torchvision's `layer1.0.downsample.0`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
}

impl LayerSpec {
    /// The name given in the file (`name = "conv1"`), if any.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Linear { name, .. }
            | Self::Conv2d { name, .. }
            | Self::Batchnorm2d { name, .. }
            | Self::Attention { name, .. }
            | Self::Positions { name, .. }
            | Self::Residual { name, .. } => name.as_deref(),
            _ => None,
        }
    }

    /// The name a spec's `type` has in a file.
    fn kind(&self) -> &'static str {
        match self {
            Self::Linear { .. } => "linear",
            Self::Conv2d { .. } => "conv2d",
            Self::Batchnorm2d { .. } => "batchnorm2d",
            Self::Maxpool2d { .. } => "maxpool2d",
            Self::Avgpool2d { .. } => "avgpool2d",
            Self::Adaptiveavgpool2d => "adaptiveavgpool2d",
            Self::Flatten => "flatten",
            Self::Relu => "relu",
            Self::Gelu { .. } => "gelu",
            Self::Positions { .. } => "positions",
            Self::Dropout { .. } => "dropout",
            Self::Layernorm { .. } => "layernorm",
            Self::Embedding { .. } => "embedding",
            Self::Attention { .. } => "attention",
            Self::Residual { .. } => "residual",
        }
    }
}

/// A model as a list of layers, shaped for the data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequentialConfig {
    /// Name for logs and run folders.
    pub name: String,
    /// Per-sample input shape (`[C, H, W]`, `[features]`, `[tokens]`).
    pub input_dims: Vec<usize>,
    /// Values out per sample (classes, or the regression target's width).
    pub outputs: usize,
    /// The layers, in order.
    pub layers: Vec<LayerSpec>,
}

/// What a model file holds: `[model]` with a `name` and `layers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    model: FileModel,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileModel {
    #[serde(default)]
    name: Option<String>,
    layers: Vec<LayerSpec>,
}

/// The largest model file read (`--model FILE.toml`).
pub const MAX_MODEL_FILE: u64 = 1 << 20;

impl SequentialConfig {
    /// Reads the `[model]` table of a TOML file, shaped for the data.
    pub fn from_file(path: &Path, input_dims: &[usize], outputs: usize) -> Result<Self> {
        // A model file is a page of layers: 1 MiB is far more than any needs,
        // and a device or FIFO named as one is refused, not read forever.
        let text =
            redline_core::files::read_input_text(path, MAX_MODEL_FILE).map_err(|source| {
                Error::Io {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
        Self::from_toml(&text, stem, input_dims, outputs)
            .map_err(|e| Error::Config(format!("--model {}: {e}", path.display())))
    }

    /// Reads a model file's text (`[model]` with `layers`; `name` defaults to
    /// `default_name`), shaped for the data and checked.
    pub fn from_toml(
        text: &str,
        default_name: &str,
        input_dims: &[usize],
        outputs: usize,
    ) -> Result<Self> {
        let file: ModelFile = toml::from_str(text).map_err(|e| {
            Error::Config(format!(
                "not a model file: {e}HINT: a model file has a [model] table with \
                 `layers = [{{ type = \"linear\", out = 64 }}, {{ type = \"relu\" }}, ...]`; \
                 docs/models.md lists the layer types"
            ))
        })?;
        let cfg = Self {
            name: file.model.name.unwrap_or_else(|| default_name.to_string()),
            input_dims: input_dims.to_vec(),
            outputs,
            layers: file.model.layers,
        };
        // Shapes are checked now, before any data is trained on.
        cfg.shapes()?;
        Ok(cfg)
    }

    /// The per-sample shape after each layer (an error names the first layer
    /// that does not fit).
    pub fn shapes(&self) -> Result<Vec<Vec<usize>>> {
        if self.layers.is_empty() {
            return Err(Error::Config("the model has no layers".into()));
        }
        let mut shape = self.input_dims.clone();
        let mut out = Vec::new();
        for (i, spec) in self.layers.iter().enumerate() {
            shape = out_shape(spec, &shape, self.outputs)
                .map_err(|e| Error::Config(format!("layer {i} ({}): {e}", spec.kind())))?;
            out.push(shape.clone());
        }
        Ok(out)
    }

    /// Refuses a model whose last layer's width is not the data's outputs:
    /// the loss compares the two, so it is said now, with both numbers.
    pub fn check_head(&self) -> Result<()> {
        let shape = self.shapes()?.pop().unwrap_or_default();
        if shape != [self.outputs] {
            return Err(Error::Config(format!(
                "the model ends in {shape:?} per sample but the data needs {} outputs (its \
                 classes or target values)\nHINT: end with {{ type = \"linear\" }} without \
                 `out`: it takes the data's width",
                self.outputs
            )));
        }
        Ok(())
    }

    /// FLOPs per sample, a fold over the layers ([`crate::flops`]).
    pub fn flops(&self) -> Result<crate::Flops> {
        self.shapes()?;
        Ok(crate::flops::fold(&self.layers, &self.input_dims, self.outputs, false)?.0)
    }

    /// Builds the model, drawing PyTorch's default initialisation from `init`.
    pub fn build(&self, init: &mut Initializer) -> Result<Sequential> {
        let flops = self.flops()?;
        let mut params = Params::new();
        let body = build_layers(
            &self.layers,
            &self.input_dims,
            self.outputs,
            "",
            init,
            &mut params,
        )?;
        Ok(Sequential {
            body,
            params,
            flops,
        })
    }
}

/// The largest size (width, channels, kernel, padding, stride, vocabulary) a
/// model file may give: far beyond any real layer, and small enough that no
/// shape arithmetic on it overflows.
const MAX_SIZE: usize = 1 << 24;

/// The sizes `spec` sets, by name.
fn sizes(spec: &LayerSpec) -> Vec<(&'static str, usize)> {
    match spec {
        LayerSpec::Linear { out, .. } => out.iter().map(|&o| ("out", o)).collect(),
        LayerSpec::Conv2d {
            out,
            kernel,
            padding,
            stride,
            groups,
            ..
        } => vec![
            ("out", *out),
            ("kernel", *kernel),
            ("padding", *padding),
            ("stride", *stride),
            ("groups", *groups),
        ],
        LayerSpec::Maxpool2d {
            kernel,
            stride,
            padding,
        } => vec![
            ("kernel", *kernel),
            ("stride", stride.unwrap_or(*kernel)),
            ("padding", *padding),
        ],
        LayerSpec::Avgpool2d {
            kernel,
            stride,
            padding,
            ..
        } => vec![
            ("kernel", *kernel),
            ("stride", stride.unwrap_or(*kernel)),
            ("padding", *padding),
        ],
        LayerSpec::Embedding { num, dim } => vec![("num", *num), ("dim", *dim)],
        LayerSpec::Attention { heads, .. } => vec![("heads", *heads)],
        LayerSpec::Positions { max, .. } => vec![("max", *max)],
        _ => Vec::new(),
    }
}

/// An `avgpool2d` spec's window (`None` for other layers).
fn avg_window(spec: &LayerSpec) -> Option<redline_kernels::AvgWindow> {
    match spec {
        LayerSpec::Avgpool2d {
            kernel,
            stride,
            padding,
            count_include_pad,
        } => Some(redline_kernels::AvgWindow {
            kernel: *kernel,
            stride: stride.unwrap_or(*kernel),
            padding: *padding,
            count_include_pad: *count_include_pad,
        }),
        _ => None,
    }
}

/// The per-sample shape after `spec` given `input`.
pub(crate) fn out_shape(spec: &LayerSpec, input: &[usize], outputs: usize) -> Result<Vec<usize>> {
    let bad = |m: String| Err(Error::Config(m));
    let image = |what: &str| -> Result<(usize, usize, usize)> {
        match input {
            [c, h, w] => Ok((*c, *h, *w)),
            _ => Err(Error::Config(format!(
                "{what} takes images (C, H, W); its input is {input:?}"
            ))),
        }
    };
    if let Some(name) = spec.name().filter(|n| {
        n.is_empty()
            || n.len() > 64
            || n.starts_with('.')
            || n.ends_with('.')
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    }) {
        return bad(format!(
            "name = {:?}: a state dict name is 1 to 64 letters, digits, `_` and inner `.`s",
            redline_core::text::clip(name, redline_core::text::MAX_SHOWN)
        ));
    }
    if let Some((name, v)) = sizes(spec).into_iter().find(|&(_, v)| v > MAX_SIZE) {
        return bad(format!(
            "{name} = {v}: sizes in a model file are at most {MAX_SIZE}"
        ));
    }
    Ok(match spec {
        LayerSpec::Linear { out: Some(0), .. } => {
            return bad("out = 0: a linear layer needs at least one output".into())
        }
        // Vectors, or sequences (T, C) over their last dimension; on an
        // image it is a forgotten flatten far more often than intended.
        LayerSpec::Linear { out, .. } => match input {
            [_] => vec![out.unwrap_or(outputs)],
            [t, _] => vec![*t, out.unwrap_or(outputs)],
            _ => {
                return bad(format!(
                    "linear takes vectors (features) or sequences (T, C); its input is \
                     {input:?}\nHINT: put {{ type = \"flatten\" }} before it"
                ))
            }
        },
        LayerSpec::Attention { heads, .. } => match input {
            [_, c] if *heads > 0 && c % heads == 0 => input.to_vec(),
            [_, c] => {
                return bad(format!(
                    "heads {heads} must be at least 1 and divide the width {c}"
                ))
            }
            _ => {
                return bad(format!(
                    "attention takes sequences (T, C); its input is {input:?}\nHINT: an \
                     embedding of token ids gives (T, C)"
                ))
            }
        },
        LayerSpec::Conv2d {
            out,
            kernel,
            padding,
            stride,
            groups,
            ..
        } => {
            let (c, h, w) = image("conv2d")?;
            if *groups == 0 || c % groups != 0 || out % groups != 0 {
                return bad(format!(
                    "groups {groups} must divide the input's {c} channels and out {out}\nHINT: \
                     depthwise is groups = {c} (the input's channels) with out a multiple of it"
                ));
            }
            if *out == 0
                || *kernel == 0
                || *stride == 0
                || kernel > &(h + 2 * padding)
                || kernel > &(w + 2 * padding)
            {
                return bad(format!(
                    "out {out}, kernel {kernel}, padding {padding}, stride {stride} do not fit a {h}x{w} input"
                ));
            }
            let side = |n: usize| (n + 2 * padding - kernel) / stride + 1;
            vec![*out, side(h), side(w)]
        }
        LayerSpec::Batchnorm2d { eps, momentum, .. } => {
            image("batchnorm2d")?;
            if !(eps.is_finite() && *eps > 0.0 && (0.0..=1.0).contains(momentum)) {
                return bad(format!(
                    "eps {eps}, momentum {momentum}: need eps > 0 and momentum in [0, 1]"
                ));
            }
            input.to_vec()
        }
        LayerSpec::Maxpool2d {
            kernel,
            stride,
            padding,
        } => {
            let (c, h, w) = image(spec.kind())?;
            let s = stride.unwrap_or(*kernel);
            if *kernel == 0 || s == 0 || *kernel > h + 2 * padding || *kernel > w + 2 * padding {
                return bad(format!(
                    "kernel {kernel}, stride {s}, padding {padding} do not fit a {h}x{w} input"
                ));
            }
            if *padding > kernel / 2 {
                return bad(format!(
                    "padding {padding} is more than half the window {kernel} (PyTorch refuses it \
                     too: a window could hold only padding)"
                ));
            }
            let side = |n: usize| (n + 2 * padding - kernel) / s + 1;
            vec![c, side(h), side(w)]
        }
        LayerSpec::Avgpool2d {
            kernel: k,
            stride,
            padding: p,
            count_include_pad,
        } => {
            let (c, h, w) = image(spec.kind())?;
            let win = redline_kernels::AvgWindow {
                kernel: *k,
                stride: stride.unwrap_or(*k),
                padding: *p,
                count_include_pad: *count_include_pad,
            };
            if *p > k / 2 {
                return bad(format!(
                    "padding {p} is more than half the window {k} (PyTorch refuses it too: a \
                     window could hold only padding)"
                ));
            }
            match (win.out(h), win.out(w)) {
                (Some(oh), Some(ow)) => vec![c, oh, ow],
                _ => {
                    return bad(format!(
                        "kernel {k}, stride {}, padding {p} do not fit a {h}x{w} input",
                        win.stride
                    ))
                }
            }
        }
        LayerSpec::Adaptiveavgpool2d => {
            let (c, _, _) = image("adaptiveavgpool2d")?;
            vec![c, 1, 1]
        }
        LayerSpec::Flatten => match input.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
            Some(n) => vec![n],
            None => {
                return bad(format!(
                    "its input {input:?} has more values than memory can hold"
                ))
            }
        },
        LayerSpec::Relu | LayerSpec::Gelu { .. } => input.to_vec(),
        LayerSpec::Positions { max, .. } => match input {
            [t, _] if t <= max => input.to_vec(),
            [t, _] => {
                return bad(format!(
                    "sequences of {t} positions, but the table holds max = {max}"
                ))
            }
            _ => {
                return bad(format!(
                    "positions take sequences (T, C); its input is {input:?}"
                ))
            }
        },
        LayerSpec::Dropout { p } => {
            if !(0.0..1.0).contains(p) {
                return bad(format!("p = {p}: must be in [0, 1)"));
            }
            input.to_vec()
        }
        LayerSpec::Layernorm { eps } => {
            if input.is_empty() || !(eps.is_finite() && *eps > 0.0) {
                return bad(format!(
                    "input {input:?}, eps {eps}: needs a last dimension and eps > 0"
                ));
            }
            input.to_vec()
        }
        LayerSpec::Embedding { num, dim } => {
            if *num == 0 || *dim == 0 || input.len() != 1 {
                return bad(format!(
                    "num {num}, dim {dim} on input {input:?}: needs num, dim > 0 and ids (L,)"
                ));
            }
            vec![input[0], *dim]
        }
        LayerSpec::Residual {
            layers, shortcut, ..
        } => {
            let through = |what: &str, specs: &[LayerSpec]| -> Result<Vec<usize>> {
                let mut shape = input.to_vec();
                for (j, inner) in specs.iter().enumerate() {
                    shape = out_shape(inner, &shape, outputs).map_err(|e| {
                        Error::Config(format!("{what} layer {j} ({}): {e}", inner.kind()))
                    })?;
                }
                Ok(shape)
            };
            let (body, short) = (through("body", layers)?, through("shortcut", shortcut)?);
            if body != short {
                return bad(format!(
                    "the body turns {input:?} into {body:?} but the shortcut gives {short:?}; \
                     shortcut(x) + body(x) needs the same shape\nHINT: give a shortcut that \
                     projects, e.g. a 1x1 conv2d with the body's stride"
                ));
            }
            body
        }
    })
}

/// Builds `specs` with parameters named `<prefix><i>.weight`, fusing
/// neighbours where a fused kernel covers them.
fn build_layers(
    specs: &[LayerSpec],
    input: &[usize],
    outputs: usize,
    prefix: &str,
    init: &mut Initializer,
    params: &mut Params,
) -> Result<norm::Chain> {
    let mut out: norm::Chain = Vec::new();
    let mut shape = input.to_vec();
    let mut i = 0;
    while i < specs.len() {
        let spec = &specs[i];
        let name = format!("{prefix}{}", spec.name().unwrap_or(&i.to_string()));
        let next = |k: usize| specs.get(i + k);
        let mut used = 1;
        let layer: Box<dyn Layer> = match spec {
            LayerSpec::Linear { out: o, .. } => {
                let (fan_in, fan_out) = (shape.last().copied().unwrap_or(0), o.unwrap_or(outputs));
                let (w, b) = init.layer(&[fan_out, fan_in], fan_out, fan_in)?;
                let relu = matches!(next(1), Some(LayerSpec::Relu));
                used += usize::from(relu);
                Box::new(basic::Linear {
                    w: params.push(format!("{name}.weight"), w)?,
                    b: params.push(format!("{name}.bias"), b)?,
                    relu,
                    dtype: init.compute_dtype(),
                })
            }
            LayerSpec::Conv2d {
                out: o,
                kernel,
                padding,
                stride,
                groups,
                bias,
                init: how,
                ..
            } => {
                let cin = shape[0] / groups.max(&1);
                let dims = [*o, cin, *kernel, *kernel];
                let (w, b) = init.layer(&dims, *o, cin * kernel * kernel)?;
                let w = match how {
                    ConvInit::Default => w,
                    ConvInit::KaimingNormalFanOut => {
                        let fan_out = (o * kernel * kernel).max(1) as f64;
                        init.normal_std(&dims, (2.0 / fan_out).sqrt())?
                    }
                };
                // A pool whose window is its stride, without padding.
                let plain_pool = |l: Option<&LayerSpec>| match l {
                    Some(LayerSpec::Maxpool2d {
                        kernel: k,
                        stride: None,
                        padding: 0,
                    }) => Some(*k),
                    Some(LayerSpec::Maxpool2d {
                        kernel: k,
                        stride: Some(s),
                        padding: 0,
                    }) if s == k => Some(*k),
                    _ => None,
                };
                let pool_relu = match (*stride, next(1), next(2)) {
                    (1, Some(LayerSpec::Relu), pool) | (1, pool, Some(LayerSpec::Relu)) => {
                        plain_pool(pool)
                    }
                    _ => None,
                };
                let pool_relu = pool_relu.filter(|_| *groups == 1);
                used += if pool_relu.is_some() { 2 } else { 0 };
                let w = params.push(format!("{name}.weight"), w)?;
                let b = if *bias {
                    params.push(format!("{name}.bias"), b)?
                } else {
                    let zero = b.as_tensor().zeros_like()?;
                    redline_kernels::grad::Param::new(candle_core::Var::from_tensor(&zero)?)
                };
                Box::new(basic::Conv2d {
                    w,
                    b,
                    has_bias: *bias,
                    padding: *padding,
                    stride: *stride,
                    groups: *groups,
                    pool_relu,
                    dtype: init.compute_dtype(),
                })
            }
            LayerSpec::Batchnorm2d { eps, momentum, .. } => {
                let relu = matches!(next(1), Some(LayerSpec::Relu));
                used += usize::from(relu);
                let c = shape[0];
                let dev = init.device().clone();
                let (w, b) = (init.constant(&[c], 1.0)?, init.constant(&[c], 0.0)?);
                // The running statistics in the parameters' dtype, as
                // `module.to(dtype)` converts buffers (bf16 under bf16-true).
                let dt = w.as_tensor().dtype();
                Box::new(norm::BatchNorm2d {
                    w: params.push(format!("{name}.weight"), w)?,
                    b: params.push(format!("{name}.bias"), b)?,
                    running_mean: params.push_buffer(
                        format!("{name}.running_mean"),
                        norm::buffer(&dev, Some(c), 0.0, dt)?,
                    )?,
                    running_var: params.push_buffer(
                        format!("{name}.running_var"),
                        norm::buffer(&dev, Some(c), 1.0, dt)?,
                    )?,
                    tracked: params.push_buffer(
                        format!("{name}.num_batches_tracked"),
                        norm::buffer(&dev, None, 0.0, dt)?,
                    )?,
                    eps: *eps,
                    momentum: *momentum,
                    relu,
                })
            }
            LayerSpec::Maxpool2d {
                kernel,
                stride,
                padding,
            } => Box::new(basic::MaxPool {
                kernel: *kernel,
                stride: stride.unwrap_or(*kernel),
                padding: *padding,
            }),
            LayerSpec::Avgpool2d { .. } => match avg_window(spec) {
                Some(win) => Box::new(basic::AvgPool(win)),
                None => return Err(Error::Config("avgpool2d: no window".into())),
            },
            LayerSpec::Adaptiveavgpool2d => Box::new(basic::GlobalAvgPool { relu: false }),
            LayerSpec::Flatten => Box::new(basic::Flatten),
            // A ReLU into global average pooling: one fused op, the ReLU's
            // output never materialised.
            LayerSpec::Relu if matches!(next(1), Some(LayerSpec::Adaptiveavgpool2d)) => {
                used += 1;
                Box::new(basic::GlobalAvgPool { relu: true })
            }
            LayerSpec::Relu => Box::new(basic::Relu),
            LayerSpec::Gelu { approximate } => Box::new(basic::Gelu(*approximate)),
            LayerSpec::Positions { max, .. } => {
                let c = shape.last().copied().unwrap_or(0);
                let w = init.normal_std(&[*max, c], 0.02)?;
                Box::new(norm::Positions {
                    w: params.push(format!("{name}.weight"), w)?,
                })
            }
            LayerSpec::Dropout { p } => Box::new(basic::Dropout::new(*p, init.fork_seed())?),
            LayerSpec::Layernorm { eps } => {
                let d = shape.last().copied().unwrap_or(0);
                let w = init.constant(&[d], 1.0)?;
                let b = init.constant(&[d], 0.0)?;
                Box::new(norm::LayerNorm {
                    w: params.push(format!("{name}.weight"), w)?,
                    b: params.push(format!("{name}.bias"), b)?,
                    eps: *eps,
                })
            }
            LayerSpec::Embedding { num, dim } => {
                let w = init.normal(&[*num, *dim])?;
                Box::new(norm::Embedding {
                    w: params.push(format!("{name}.weight"), w)?,
                })
            }
            LayerSpec::Attention { heads, .. } => {
                let c = shape.last().copied().unwrap_or(0);
                let mut linear = |part: &str, fan_out: usize| -> Result<(_, _)> {
                    let (w, b) = init.layer(&[fan_out, c], fan_out, c)?;
                    Ok((
                        params.push(format!("{name}.{part}.weight"), w)?,
                        params.push(format!("{name}.{part}.bias"), b)?,
                    ))
                };
                Box::new(attention::Attention {
                    c_attn: linear("c_attn", 3 * c)?,
                    c_proj: linear("c_proj", c)?,
                    heads: *heads,
                    dtype: init.compute_dtype(),
                    dropout: None,
                })
            }
            LayerSpec::Residual {
                layers,
                shortcut,
                name: named,
            } => {
                // torchvision's block names when the block is named.
                let (body_prefix, short_prefix) = match named {
                    Some(_) => (format!("{name}."), format!("{name}.downsample.")),
                    None => (format!("{name}.body."), format!("{name}.shortcut.")),
                };
                let body = build_layers(layers, &shape, outputs, &body_prefix, init, params)?;
                let shortcut =
                    build_layers(shortcut, &shape, outputs, &short_prefix, init, params)?;
                let relu = matches!(next(1), Some(LayerSpec::Relu));
                used += usize::from(relu);
                Box::new(norm::Residual {
                    body,
                    shortcut,
                    relu,
                })
            }
        };
        for s in &specs[i..i + used] {
            shape = out_shape(s, &shape, outputs)?;
        }
        let kinds: Vec<&str> = specs[i..i + used].iter().map(LayerSpec::kind).collect();
        out.push((format!("{name}.{}", kinds.join("+")), layer));
        i += used;
    }
    Ok(out)
}

/// A model built from a [`SequentialConfig`].
pub struct Sequential {
    /// (span name, layer): `3.linear+relu` for a fused pair.
    body: norm::Chain,
    params: Params,
    flops: crate::Flops,
}

impl Model for Sequential {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        norm::run_chain(&self.body, x, train)
    }

    fn capture_safe(&self) -> std::result::Result<(), String> {
        norm::chain_capture_safe(&self.body)
    }

    fn params(&self) -> &Params {
        &self.params
    }

    fn flops(&self) -> Option<crate::Flops> {
        Some(self.flops)
    }

    fn rng_state(&self) -> Vec<u128> {
        let mut out = Vec::new();
        norm::chain_rng_state(&self.body, &mut out);
        out
    }

    fn load_rng_state(&self, state: &[u128]) -> Result<()> {
        let mut it = state.iter().copied();
        norm::chain_load_rng_state(&self.body, &mut it)?;
        let want = self.rng_state().len();
        if want != state.len() {
            return Err(Error::Config(format!(
                "random stream positions: this model has {want} (dropout layers), the state \
                 holds {}",
                state.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
