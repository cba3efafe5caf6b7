//! Redline kernels: tensor operations candle lacks, gets wrong, or runs
//! slowly on the CPU, and the parameters' gradients they write ([`grad`]).
//!
//! Each op has a fused CPU kernel (candle custom op over the storage slices,
//! GEMMs through the `gemm` crate) and a fallback built from generic candle
//! ops for every other device; tests hold the two against each other and the
//! model-level golden tests hold both against PyTorch.

pub mod add_relu;
pub mod attention;
pub mod autocast;
pub mod avg_pool;
pub mod batch_norm;
pub mod cast16;
pub mod conv;
mod conv_backward;
mod conv_block;
mod conv_depthwise;
mod conv_direct;
mod conv_direct_simd;
mod conv_dx;
mod conv_gather;
mod conv_grouped;
pub mod conv_igemm;
mod conv_io16;
mod conv_nhwc;
mod conv_nhwc16;
mod conv_nhwc_simd;
mod conv_patch;
mod conv_patch512;
mod conv_patch_simd;
pub mod conv_paths;
mod conv_pointwise16;
#[cfg(test)]
mod conv_reference;
mod conv_strided;
mod conv_wgrad16;
mod conv_whole;
mod conv_wide;
mod conv_winograd;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "cuda", test))]
pub mod cudnn_ffi;
pub mod dropout;
mod error;
mod fast_exp;
pub mod fused_gpu;
mod gelu;
pub mod gemm;
pub mod gemm_bf16;
mod gemm_bf16_pack;
mod gemm_bf16_pack16;
pub mod gemm_plan;
mod global_pool;
pub mod grad;
mod half16;
mod layer_norm;
mod linear;
mod linear16;
mod loss;
pub mod multi_tensor;
pub mod multi_tensor_args;
pub mod optim;
mod optim_bf16;
mod optim_chunks;
mod optim_generic;
mod optim_generic_bf16;
pub mod optim_math;
pub mod peak_probe;
pub mod pool;
mod pool2x2;
mod pool_window;
mod slices;
pub mod tally;
mod transpose16;

pub use attention::causal_attention;
pub use autocast::{conv2d_in, linear_in};
pub use avg_pool::{avg_pool2d, AvgWindow};
pub use conv::{
    conv2d, conv2d_generic, conv2d_param, conv2d_strided, conv2d_strided_in, conv2d_strided_param,
};
pub use conv_block::{conv2d_pool_relu, conv2d_pool_relu_param};
pub use conv_grouped::{conv2d_grouped, conv2d_grouped_param};
pub use conv_io16::conv2d_bf16;
pub use dropout::{dropout, dropout_add, DropDraw};
pub use error::{Error, Result};
pub use gelu::gelu_tanh;
pub use global_pool::global_avg_pool2d;
pub use layer_norm::layer_norm;
pub use linear::{linear, linear_param};
pub use loss::{cross_entropy, cross_entropy_counted};
pub use pool::{max_pool2d, max_pool2d_generic, max_pool2d_window, max_pool2d_window_generic};
