//! A small CNN: [Conv2d(3x3, pad 1)-ReLU-MaxPool2] blocks, Flatten, Linear-ReLU, Linear.
//! The default is conv 1->32->64, fc 3136->128->10 (`conv1.* conv2.* fc1.* fc2.*`).

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use redline_core::trace;
use redline_kernels::grad::Param;
use redline_kernels::{conv2d_in, linear_in};

use crate::error::{Error, Result};
use crate::flops::{fold, Flops};
use crate::init::Initializer;
use crate::layers::LayerSpec;
use crate::params::Params;
use crate::Model;

/// Shape of a CNN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CnnConfig {
    /// Input channels (1 for greyscale).
    pub in_channels: usize,
    /// Input height and width (square images).
    pub image_size: usize,
    /// Output channels of each conv block; each block halves the spatial size.
    pub channels: Vec<usize>,
    /// Width of the hidden fully connected layer.
    pub hidden: usize,
    /// Output classes.
    pub classes: usize,
}

impl Default for CnnConfig {
    fn default() -> Self {
        Self {
            in_channels: 1,
            image_size: 28,
            channels: vec![32, 64],
            hidden: 128,
            classes: 10,
        }
    }
}

impl CnnConfig {
    /// The model as the layer set's layers ([Conv2d 3x3, ReLU, MaxPool2d 2]
    /// blocks, Flatten, Linear, ReLU, Linear), for counting its FLOPs
    /// ([`crate::flops`]).
    pub fn layers(&self) -> Vec<LayerSpec> {
        let mut out = Vec::new();
        for &c in &self.channels {
            out.push(LayerSpec::Conv2d {
                out: c,
                kernel: 3,
                padding: 1,
                stride: 1,
                groups: 1,
                bias: true,
                init: Default::default(),
                name: None,
            });
            out.push(LayerSpec::Relu);
            out.push(LayerSpec::Maxpool2d {
                kernel: 2,
                stride: None,
                padding: 0,
            });
        }
        out.push(LayerSpec::Flatten);
        out.push(LayerSpec::Linear {
            out: Some(self.hidden),
            name: None,
        });
        out.push(LayerSpec::Relu);
        out.push(LayerSpec::Linear {
            out: Some(self.classes),
            name: None,
        });
        out
    }
}

/// The built network.
pub struct Cnn {
    /// (weight (Cout, Cin, 3, 3), bias (Cout)) of each conv block.
    convs: Vec<(Param, Param)>,
    /// `conv1`, `conv2`, ...: span names for the detailed profiler.
    conv_names: Vec<String>,
    /// (weight, bias) of the two fully connected layers.
    fc1: (Param, Param),
    fc2: (Param, Param),
    params: Params,
    /// The products' dtype (fp32, or 16-bit under `--precision`).
    dtype: candle_core::DType,
    /// FLOPs per training sample.
    flops: Flops,
}

impl Cnn {
    /// Builds the layers with PyTorch's default initialisation.
    pub fn new(cfg: &CnnConfig, init: &mut Initializer) -> Result<Self> {
        let side = cfg.image_size >> cfg.channels.len();
        if side == 0 || cfg.channels.contains(&0) || cfg.hidden == 0 || cfg.classes == 0 {
            return Err(Error::Config(format!(
                "CNN shape does not work: {cfg:?} (each conv block halves the image side)"
            )));
        }
        let mut params = Params::new();
        let mut convs = Vec::new();
        let mut c_in = cfg.in_channels;
        for (i, &c_out) in cfg.channels.iter().enumerate() {
            let (w, b) = init.layer(&[c_out, c_in, 3, 3], c_out, c_in * 9)?;
            convs.push((
                params.push(format!("conv{}.weight", i + 1), w)?,
                params.push(format!("conv{}.bias", i + 1), b)?,
            ));
            c_in = c_out;
        }
        let flat = c_in * side * side;
        let (w1, b1) = init.layer(&[cfg.hidden, flat], cfg.hidden, flat)?;
        let (w2, b2) = init.layer(&[cfg.classes, cfg.hidden], cfg.classes, cfg.hidden)?;
        let fc1 = (params.push("fc1.weight", w1)?, params.push("fc1.bias", b1)?);
        let fc2 = (params.push("fc2.weight", w2)?, params.push("fc2.bias", b2)?);
        let conv_names = (1..=convs.len()).map(|i| format!("conv{i}")).collect();
        Ok(Self {
            convs,
            conv_names,
            fc1,
            fc2,
            params,
            dtype: init.compute_dtype(),
            flops: fold(
                &cfg.layers(),
                &[cfg.in_channels, cfg.image_size, cfg.image_size],
                cfg.classes,
                false,
            )?
            .0,
        })
    }
}

impl Model for Cnn {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        // No layer here behaves differently in training.
        let mut h = x.clone();
        for ((w, b), name) in self.convs.iter().zip(&self.conv_names) {
            let _span = trace::layer(name);
            // (B, Cin, S, S) -> (B, Cout, S, S) -> (B, Cout, S/2, S/2)
            // ReLU is monotone, so relu(pool(x)) == pool(relu(x)) exactly, with the
            // same gradient (windows without a positive value pass none either way):
            // one fused op, the conv output never materialised as a tensor.
            h = conv2d_in(&h, w, b, 1, Some(2), self.dtype)?;
        }
        // (B, C, s, s) -> (B, C*s*s) -> (B, hidden) -> (B, classes)
        let h = {
            let _span = trace::layer("fc1");
            linear_in(
                &h.flatten_from(1)?,
                &self.fc1.0,
                &self.fc1.1,
                true,
                self.dtype,
            )?
        };
        let _span = trace::layer("fc2");
        Ok(linear_in(&h, &self.fc2.0, &self.fc2.1, false, self.dtype)?)
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
