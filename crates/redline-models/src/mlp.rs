//! Multi-layer perceptron: Flatten, then Linear-ReLU blocks, then a Linear head.
//! The default is the tutorial's 784-128-10 (`fc1.*`, `fc2.*`).

use candle_core::Tensor;
use redline_core::trace;
use redline_kernels::grad::Param;
use redline_kernels::linear_in;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::flops::{fold, Flops};
use crate::init::Initializer;
use crate::layers::LayerSpec;
use crate::params::Params;
use crate::Model;

/// Shape of an MLP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpConfig {
    /// Input features after flattening (28*28 for MNIST).
    pub in_features: usize,
    /// Widths of the hidden layers, each followed by ReLU.
    pub hidden: Vec<usize>,
    /// Output classes.
    pub classes: usize,
}

impl Default for MlpConfig {
    fn default() -> Self {
        Self {
            in_features: 784,
            hidden: vec![128],
            classes: 10,
        }
    }
}

impl MlpConfig {
    /// The model as the layer set's layers (Linear, ReLU, ..., Linear), for
    /// counting its FLOPs ([`crate::flops`]).
    pub fn layers(&self) -> Vec<LayerSpec> {
        let mut out = Vec::new();
        for &h in &self.hidden {
            out.push(LayerSpec::Linear {
                out: Some(h),
                name: None,
            });
            out.push(LayerSpec::Relu);
        }
        out.push(LayerSpec::Linear {
            out: Some(self.classes),
            name: None,
        });
        out
    }
}

/// The built network; layers are named `fc1`, `fc2`, ... as in PyTorch.
pub struct Mlp {
    /// (weight (out, in), bias (out)) per layer, shared with `params`.
    layers: Vec<(Param, Param)>,
    /// `fc1`, `fc2`, ...: span names for the detailed profiler.
    names: Vec<String>,
    params: Params,
    /// The products' dtype (fp32, or 16-bit under `--precision`).
    dtype: candle_core::DType,
    /// FLOPs per training sample.
    flops: Flops,
}

impl Mlp {
    /// Builds the layers with PyTorch's default initialisation.
    pub fn new(cfg: &MlpConfig, init: &mut Initializer) -> Result<Self> {
        if cfg.in_features == 0 || cfg.classes == 0 || cfg.hidden.contains(&0) {
            return Err(Error::Config(format!(
                "MLP widths must be non-zero: {cfg:?}"
            )));
        }
        let widths: Vec<usize> = std::iter::once(cfg.in_features)
            .chain(cfg.hidden.iter().copied())
            .chain(std::iter::once(cfg.classes))
            .collect();
        let mut params = Params::new();
        let mut layers = Vec::new();
        for (i, w) in widths.windows(2).enumerate() {
            let (fan_in, fan_out) = (w[0], w[1]);
            let (weight, bias) = init.layer(&[fan_out, fan_in], fan_out, fan_in)?;
            layers.push((
                params.push(format!("fc{}.weight", i + 1), weight)?,
                params.push(format!("fc{}.bias", i + 1), bias)?,
            ));
        }
        let names = (1..=layers.len()).map(|i| format!("fc{i}")).collect();
        Ok(Self {
            layers,
            names,
            params,
            dtype: init.compute_dtype(),
            flops: fold(&cfg.layers(), &[cfg.in_features], cfg.classes, false)?.0,
        })
    }
}

impl Model for Mlp {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        // No layer here behaves differently in training.
        // (B, C, H, W) -> (B, C*H*W)
        let mut h = x.flatten_from(1)?;
        let last = self.layers.len().saturating_sub(1);
        for (i, ((w, b), name)) in self.layers.iter().zip(&self.names).enumerate() {
            let _span = trace::layer(name);
            // (B, in) -> (B, out), bias and ReLU fused into the GEMM's output pass
            h = linear_in(&h, w, b, i < last, self.dtype)?;
        }
        Ok(h)
    }

    fn params(&self) -> &Params {
        &self.params
    }

    fn flops(&self) -> Option<Flops> {
        Some(self.flops)
    }

    fn capture_safe(&self) -> std::result::Result<(), String> {
        // Fused (or generic) device ops only; nothing random, nothing read back.
        Ok(())
    }
}
