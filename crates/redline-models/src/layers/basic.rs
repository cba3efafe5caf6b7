//! The layers without normalisation: Linear, Conv2d (alone or fused with ReLU
//! and max pooling), pools, Flatten, ReLU, GELU and Dropout.

use std::sync::{Mutex, PoisonError};

use candle_core::{DType, Tensor};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redline_kernels::grad::Param;
use redline_kernels::{conv2d_in, linear_in, max_pool2d_window};

use super::Layer;
use crate::error::{Error, Result};

/// `nn.Linear` on `(B, ..., in)`, with the following ReLU fused in when `relu`.
pub(super) struct Linear {
    pub(super) w: Param,
    pub(super) b: Param,
    pub(super) relu: bool,
    /// The product's dtype (fp32, or 16-bit under `--precision`).
    pub(super) dtype: candle_core::DType,
}

impl Layer for Linear {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        // (B, ..., in) -> (B, ..., out): bias and ReLU in the GEMM's output
        // pass, the leading dimensions taken as rows (as `nn.Linear`).
        linear_rows(x, (&self.w, &self.b), self.relu, self.dtype)
    }
}

/// `linear_in` over the last dimension of `x (B, T, in)`: `(B, T, out)`.
pub(crate) fn linear_rows(
    x: &Tensor,
    (w, b): (&Param, &Param),
    relu: bool,
    dtype: candle_core::DType,
) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let Some((&fan_in, lead)) = dims.split_last() else {
        return Ok(linear_in(x, w, b, relu, dtype)?);
    };
    if lead.len() <= 1 {
        return Ok(linear_in(x, w, b, relu, dtype)?);
    }
    let rows: usize = lead.iter().product();
    let y = linear_in(&x.reshape((rows, fan_in))?, w, b, relu, dtype)?;
    let mut shape = lead.to_vec();
    shape.push(y.dim(1)?);
    Ok(y.reshape(shape)?)
}

/// `nn.Conv2d`: stride 1 with a bias takes the fused kernel (with a following
/// ReLU and max pool fused in when `pool_relu` is the pool's window); other
/// strides take candle's convolution.
pub(super) struct Conv2d {
    pub(super) w: Param,
    /// The bias, or (`bias = false`) a zero bias that is not a parameter: the
    /// fused kernel takes one, and its gradient is dropped.
    pub(super) b: Param,
    pub(super) has_bias: bool,
    pub(super) padding: usize,
    pub(super) stride: usize,
    /// Channel groups (1: a plain convolution).
    pub(super) groups: usize,
    pub(super) pool_relu: Option<usize>,
    /// The product's dtype (fp32, or 16-bit under `--precision`).
    pub(super) dtype: candle_core::DType,
}

impl Layer for Conv2d {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        if !self.has_bias {
            // Nothing reads this buffer: keep it from growing across steps.
            self.b.grad().clear();
        }
        let plain = self.stride == 1 && self.groups == 1;
        if !plain && self.dtype == DType::F32 {
            // im2col + GEMM with the fused backward on the CPU (fp32), per
            // group when grouped; candle's convolution elsewhere.
            return Ok(redline_kernels::conv2d_grouped_param(
                x,
                &self.w,
                &self.b,
                self.padding,
                self.stride,
                self.groups,
            )?);
        }
        if !plain {
            // candle's CPU convolution has no bf16 (its im2col matmul): on
            // the CPU a 16-bit one is the fp32 convolution of the rounded
            // operands, bias added, rounded once (a 16-bit product with fp32
            // accumulation, as autocast's and as `conv2d_in`'s casts).
            let on16 = self.dtype != DType::F32 && x.device().is_cpu();
            let work = if on16 { DType::F32 } else { self.dtype };
            let cast = |t: &Tensor| -> Result<Tensor> {
                if work == DType::F32 {
                    return Ok(redline_kernels::cast16::round_to(t, self.dtype)?);
                }
                Ok(t.to_dtype(self.dtype)?.to_dtype(work)?)
            };
            let w = cast(self.w.as_tensor())?;
            if on16 && self.groups == 1 {
                // The fused fp32 kernels (candle's convolution took 5x the
                // time of ResNet-18's fp32 stem, bf16-true at 64 px).
                let b = cast(self.b.as_tensor())?;
                // bf16: im2col and the native bf16 GEMM where the CPU has it.
                let gemm = redline_kernels::gemm_bf16::route(self.dtype);
                let geometry = (self.padding, self.stride);
                if gemm == DType::BF16 {
                    // A 1x1 one (ResNet's downsampling) reads and writes the
                    // bf16 activations itself, no casts around it.
                    if let Some(y) = redline_kernels::conv2d_bf16(x, &w, &b, geometry)? {
                        return Ok(y);
                    }
                }
                let y = redline_kernels::conv2d_strided_in(&cast(x)?, &w, &b, geometry, gemm)?;
                return Ok(redline_kernels::cast16::to_dtype(&y, self.dtype)?);
            }
            if on16 {
                // Grouped and depthwise (MobileNet): the fused fp32 kernel
                // per group on the rounded operands, as fp32 runs them
                // (candle's grouped convolution is per-group im2col with a
                // generic backward).
                let b = cast(self.b.as_tensor())?;
                let (p, s, g) = (self.padding, self.stride, self.groups);
                let y = redline_kernels::conv2d_grouped(&cast(x)?, &w, &b, p, s, g)?;
                return Ok(redline_kernels::cast16::to_dtype(&y, self.dtype)?);
            }
            let y = cast(x)?.conv2d(&w, self.padding, self.stride, 1, self.groups)?;
            let y = if self.has_bias {
                let c = self.b.as_tensor().dim(0)?;
                y.broadcast_add(&cast(self.b.as_tensor())?.reshape((1, c, 1, 1))?)?
            } else {
                y
            };
            return Ok(y.to_dtype(self.dtype)?);
        }
        // relu(pool(conv)) == pool(relu(conv)): one op, the conv output never
        // materialised (in fp32, where the fused kernel runs).
        Ok(conv2d_in(
            x,
            &self.w,
            &self.b,
            self.padding,
            self.pool_relu,
            self.dtype,
        )?)
    }
}

/// `nn.MaxPool2d(kernel, stride, padding)` (floor mode; the first maximum
/// takes the gradient).
pub(super) struct MaxPool {
    /// Window side.
    pub(super) kernel: usize,
    /// Step between windows.
    pub(super) stride: usize,
    /// `-inf` padding on each side.
    pub(super) padding: usize,
}

impl Layer for MaxPool {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        Ok(max_pool2d_window(
            x,
            self.kernel,
            self.stride,
            self.padding,
        )?)
    }
}

/// `nn.AvgPool2d(kernel, stride, padding, count_include_pad)` (floor mode).
pub(super) struct AvgPool(pub(super) redline_kernels::AvgWindow);

impl Layer for AvgPool {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        Ok(redline_kernels::avg_pool2d(x, self.0)?)
    }
}

/// `nn.AdaptiveAvgPool2d(1)`: `(B, C, H, W) -> (B, C, 1, 1)`, of the
/// ReLU'd input when `relu` (a ReLU before it fused in).
pub(super) struct GlobalAvgPool {
    pub(super) relu: bool,
}

impl Layer for GlobalAvgPool {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        Ok(redline_kernels::global_avg_pool2d(x, self.relu)?)
    }
}

/// `nn.Flatten()`: `(B, ...) -> (B, prod(...))`.
pub(super) struct Flatten;

impl Layer for Flatten {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        Ok(x.flatten_from(1)?)
    }
}

/// `nn.ReLU()`, with PyTorch's gradient: none where the input is exactly 0
/// (the vendored candle-core's, `vendor/candle-core/REDLINE.md`).
pub(super) struct Relu;

impl Layer for Relu {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        Ok(x.relu()?)
    }
}

/// `nn.GELU()` (the exact, erf form: PyTorch's default).
pub(super) struct Gelu(pub(super) super::GeluForm);

impl Layer for Gelu {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        Ok(match self.0 {
            super::GeluForm::None => x.gelu_erf()?,
            // The fused kernel on the CPU (f32); candle's `gelu` (the tanh
            // form) elsewhere.
            super::GeluForm::Tanh => redline_kernels::gelu_tanh(x)?,
        })
    }
}

/// `nn.Dropout(p)`: in training, zeroes each element with probability `p`
/// and scales the rest by `1 / (1 - p)`; the identity in eval mode. Masks come
/// from a seeded stream, so a run with the same seed drops the same units.
pub(crate) struct Dropout {
    p: f64,
    rng: Mutex<ChaCha8Rng>,
}

impl Dropout {
    pub(crate) fn new(p: f64, seed: u64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::Config(format!("dropout p = {p}: must be in [0, 1)")));
        }
        Ok(Self {
            p,
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
        })
    }
}

impl Dropout {
    /// This call's mask: a fresh seed, one draw from the layer's stream
    /// (the fused attention's mask and [`redline_kernels::dropout`]'s are
    /// functions of it); `None` where nothing is dropped (evaluation, or
    /// `p` 0).
    pub(crate) fn draw(&self, train: bool) -> Option<redline_kernels::DropDraw> {
        (train && self.p > 0.0).then(|| redline_kernels::DropDraw {
            p: self.p as f32,
            seed: self
                .rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .next_u64(),
        })
    }

    /// `h + self(x)`: a residual connection after a dropped branch, one
    /// fused pass each way on the CPU.
    pub(crate) fn add_to(&self, h: &Tensor, x: &Tensor, train: bool) -> Result<Tensor> {
        match self.draw(train) {
            Some(d) => Ok(redline_kernels::dropout_add(h, x, d)?),
            None => Ok((h + x)?),
        }
    }
}

impl Layer for Dropout {
    fn rng_state(&self, out: &mut Vec<u128>) {
        out.push(
            self.rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_word_pos(),
        );
    }

    fn load_rng_state(&self, from: &mut dyn Iterator<Item = u128>) -> Result<()> {
        let pos = from.next().ok_or_else(|| {
            Error::Config("random stream positions: fewer than the model's dropout layers".into())
        })?;
        self.rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_word_pos(pos);
        Ok(())
    }

    fn capture_safe(&self) -> std::result::Result<(), String> {
        if self.p == 0.0 {
            return Ok(());
        }
        // A replay would repeat the captured mask.
        Err(format!(
            "dropout (p = {}) draws its mask on the host at every step",
            self.p
        ))
    }

    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        match self.draw(train) {
            Some(d) => Ok(redline_kernels::dropout(x, d)?),
            None => Ok(x.clone()),
        }
    }
}

/// `x` as class or token ids: the data loader hands floats.
pub(super) fn as_ids(x: &Tensor) -> Result<Tensor> {
    Ok(x.to_dtype(DType::U32)?)
}
