//! Tensor operations candle lacks or gets wrong.
//!
//! `max_pool2d`: candle 0.11's max-pool backward scales the gradient by
//! (number of maxima)/(k*k) instead of routing it to the maximum, so a window
//! with one maximum passes back a quarter of its gradient (2x2). This version
//! is built from differentiable primitives with PyTorch's semantics: the first
//! maximum of each window (row-major) receives the whole gradient.

use candle_core::{Tensor, D};

use crate::error::Result;

/// Max pooling with a `k x k` window and stride `k` (PyTorch's `MaxPool2d(k)`,
/// floor mode): `(B, C, H, W) -> (B, C, H/k, W/k)`.
pub fn max_pool2d(x: &Tensor, k: usize) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    let (oh, ow) = (h / k, w / k);
    let x = if oh * k != h || ow * k != w {
        x.narrow(2, 0, oh * k)?.narrow(3, 0, ow * k)?
    } else {
        x.clone()
    };
    // (B, C, oh, k, ow, k) -> (B, C, oh, ow, k*k): one row per window.
    let windows = x
        .contiguous()?
        .reshape((b, c, oh, k, ow, k))?
        .permute((0, 1, 2, 4, 3, 5))?
        .contiguous()?
        .reshape((b, c, oh, ow, k * k))?;
    // argmax returns the first maximum; the one-hot mask carries no gradient,
    // so the product routes the whole window gradient to that element.
    let first = windows.detach().argmax_keepdim(D::Minus1)?;
    let slots = Tensor::arange(0u32, (k * k) as u32, x.device())?.reshape((1, 1, 1, 1, k * k))?;
    let onehot = slots.broadcast_eq(&first)?.to_dtype(windows.dtype())?;
    Ok((windows * onehot)?.sum(D::Minus1)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn forward_matches_candle_and_gradient_goes_to_first_max() -> Result<()> {
        // Two 2x2 windows: one with a unique max, one with a tie (3, 3).
        let x = Var::new(&[[[[1f32, 5., 3., 3.], [2., 0., 1., 0.]]]], &Device::Cpu)?;
        let y = max_pool2d(x.as_tensor(), 2)?;
        assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![5., 3.]);
        let candle = x.as_tensor().max_pool2d(2)?;
        assert_eq!(candle.flatten_all()?.to_vec1::<f32>()?, vec![5., 3.]);
        let g = (y * Tensor::new(&[[[[10f32, 20.]]]], &Device::Cpu)?)?
            .sum_all()?
            .backward()?;
        let gx = g
            .get(x.as_tensor())
            .map(|t| t.flatten_all().and_then(|t| t.to_vec1::<f32>()));
        // PyTorch: [[0,10,20,0],[0,0,0,0]] (the tie goes to the first element).
        assert_eq!(
            gx.transpose()?,
            Some(vec![0., 10., 20., 0., 0., 0., 0., 0.])
        );
        Ok(())
    }

    #[test]
    fn odd_sizes_floor_like_pytorch() -> Result<()> {
        let x = Tensor::arange(0f32, 25., &Device::Cpu)?.reshape((1, 1, 5, 5))?;
        let y = max_pool2d(&x, 2)?;
        assert_eq!(y.dims(), &[1, 1, 2, 2]);
        assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![6., 8., 16., 18.]);
        Ok(())
    }
}
