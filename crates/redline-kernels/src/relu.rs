//! ReLU with PyTorch's gradient: none where the input is exactly 0.
//!
//! candle's `relu` passes the gradient there (`arg >= 0`, candle-core
//! 0.11.1 `backprop.rs`); PyTorch's `threshold_backward` and Redline's fused
//! kernels (`y > 0`) do not. The two part wherever a pre-activation is
//! exactly 0: a zero-initialised bias over a black image border, or a 16-bit
//! sum that rounds to 0 (6 pooled maxima of 12,544 in one bf16 CNN block on
//! an H200, `bench/results/h200-2026-11-26-2/`), each moving its whole
//! gradient. The forward is candle's own relu kernel on every device, so it
//! costs what `relu` costs; the backward is candle's three ops with `>` for
//! `>=`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};

use crate::error::Result;

/// `max(x, 0)`, whose gradient is the upstream gradient where `x > 0` and 0
/// elsewhere, as PyTorch's `relu`.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    if !x.track_op() {
        return Ok(x.relu()?);
    }
    Ok(x.apply_op1(TorchRelu)?)
}

struct TorchRelu;

impl CustomOp1 for TorchRelu {
    fn name(&self) -> &'static str {
        "redline-relu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok((s.unary_impl::<candle_core::op::Relu>(l)?, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        Ok((s.unary_impl::<candle_core::op::Relu>(l)?, l.shape().clone()))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let positive = arg.gt(0f64)?.to_dtype(grad.dtype())?;
        Ok(Some(grad.mul(&positive)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// The gradient of `sum(y * g)` with respect to `x`, in f32.
    fn grad_of(y: &Tensor, g: &Tensor, x: &Var) -> Result<Option<Vec<f32>>> {
        let grads = (y * g)?.sum_all()?.backward()?;
        let Some(dx) = grads.get(x.as_tensor()) else {
            return Ok(None);
        };
        Ok(Some(dx.to_dtype(DType::F32)?.to_vec1::<f32>()?))
    }

    #[test]
    fn zero_takes_no_gradient_as_in_pytorch() -> Result<()> {
        // torch.relu(x).backward(g): x.grad = [0, 0, 3, 0, 5] for
        // x = [-1, 0, 2, -0.0, 4], g = [1, 2, 3, 4, 5].
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let x = Var::from_tensor(
                &Tensor::new(&[-1f32, 0.0, 2.0, -0.0, 4.0], &Device::Cpu)?.to_dtype(dtype)?,
            )?;
            let g = Tensor::new(&[1f32, 2.0, 3.0, 4.0, 5.0], &Device::Cpu)?.to_dtype(dtype)?;
            let y = relu(x.as_tensor())?;
            let out = y.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            assert_eq!(out, [0.0, 0.0, 2.0, 0.0, 4.0], "{dtype:?}");
            let dx = grad_of(&y, &g, &x)?;
            assert_eq!(dx, Some(vec![0.0, 0.0, 3.0, 0.0, 5.0]), "{dtype:?}");
            // candle's own relu passes the gradient at 0: the difference.
            let candle = grad_of(&x.as_tensor().relu()?, &g, &x)?;
            assert_eq!(candle, Some(vec![0.0, 2.0, 3.0, 4.0, 5.0]), "{dtype:?}");
        }
        Ok(())
    }

    #[test]
    fn untracked_input_is_candles_relu() -> Result<()> {
        let x = Tensor::new(&[[-1f32, 0.5], [2.0, -3.0]], &Device::Cpu)?;
        let y = relu(&x)?;
        assert!(!y.track_op());
        assert_eq!(y.to_vec2::<f32>()?, [[0.0, 0.5], [2.0, 0.0]]);
        // A strided view is taken as it is laid out.
        let t = relu(&Var::from_tensor(&x)?.as_tensor().t()?)?;
        assert_eq!(t.to_vec2::<f32>()?, [[0.0, 2.0], [0.5, 0.0]]);
        Ok(())
    }
}
