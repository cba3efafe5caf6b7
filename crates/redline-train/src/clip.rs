//! Gradient clipping and the gradient norm, over the parameters' gradients
//! between backward and the update (PyTorch's `clip_grad_norm_` and
//! `clip_grad_value_`, Lightning's `gradient_clip_val` /
//! `gradient_clip_algorithm`).
//!
//! The norm stays a scalar on the device: clipping by norm scales the
//! gradients by a device tensor, so a GPU step never waits for the host.

use candle_core::Tensor;
use redline_kernels::grad::Param;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How gradients are clipped before each optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "lowercase")]
pub enum GradClip {
    /// Scale all gradients together so that their total L2 norm is at most
    /// `max_norm` (`torch.nn.utils.clip_grad_norm_`).
    Norm {
        /// The largest total norm kept.
        max_norm: f64,
    },
    /// Clamp every gradient element to `[-limit, limit]`
    /// (`torch.nn.utils.clip_grad_value_`).
    Value {
        /// The largest magnitude kept.
        limit: f64,
    },
}

impl GradClip {
    /// Refuses a limit that is not a finite number > 0.
    pub fn check(&self) -> Result<()> {
        let (flag, v) = match self {
            Self::Norm { max_norm } => ("--clip-grad-norm", *max_norm),
            Self::Value { limit } => ("--clip-grad-value", *limit),
        };
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "{flag} {v}: must be a finite number > 0"
            )))
        }
    }
}

/// The total L2 norm of all gradients, as one f32 scalar on their device;
/// `None` when no parameter has a gradient.
pub fn grad_norm<'a>(params: impl IntoIterator<Item = &'a Param>) -> Result<Option<Tensor>> {
    let mut total: Option<Tensor> = None;
    for p in params {
        if let Some(sq) = p.grad().sum_sq()? {
            total = Some(match total {
                None => sq,
                Some(t) => (t + sq)?,
            });
        }
    }
    Ok(total.map(|t| t.sqrt()).transpose()?)
}

/// Scales the gradients so that their total norm is at most `max_norm`
/// (PyTorch's arithmetic: `g *= min(1, max_norm / (norm + 1e-6))`) and
/// returns the norm before clipping.
pub fn clip_grad_norm(params: &[&Param], max_norm: f64) -> Result<Option<Tensor>> {
    let Some(norm) = grad_norm(params.iter().copied())? else {
        return Ok(None);
    };
    let coef = redline_kernels::grad::norm_clip_coef(&norm, max_norm)?;
    for p in params {
        p.grad().scale(&coef)?;
    }
    Ok(Some(norm))
}

/// Clamps every gradient element to `[-limit, limit]`.
pub fn clip_grad_value(params: &[&Param], limit: f64) -> Result<()> {
    for p in params {
        p.grad().clamp(limit)?;
    }
    Ok(())
}

/// Applies `clip` (if any) and returns the total norm before clipping when
/// it was computed: always with norm clipping, else when `want_norm`.
pub(crate) fn prepare(
    params: &[&Param],
    clip: Option<GradClip>,
    want_norm: bool,
) -> Result<Option<Tensor>> {
    let norm = match clip {
        Some(GradClip::Norm { max_norm }) => return clip_grad_norm(params, max_norm),
        _ if want_norm => grad_norm(params.iter().copied())?,
        _ => None,
    };
    if let Some(GradClip::Value { limit }) = clip {
        clip_grad_value(params, limit)?;
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    fn param(grad: &[f32]) -> Result<Param> {
        let p = Param::new(Var::zeros(grad.len(), DType::F32, &Device::Cpu)?);
        p.grad().absorb(&Tensor::new(grad, &Device::Cpu)?)?;
        Ok(p)
    }

    fn grad(p: &Param) -> Result<Vec<f32>> {
        match p.grad().to_tensor(p.as_tensor())? {
            Some(g) => Ok(g.to_vec1::<f32>()?),
            None => Ok(Vec::new()),
        }
    }

    #[test]
    fn norm_clipping_scales_all_gradients_together() -> Result<()> {
        // Total norm sqrt(9 + 16 + 144) = 13.
        let (a, b) = (param(&[3.0, 4.0])?, param(&[12.0])?);
        let norm = clip_grad_norm(&[&a, &b], 6.5)?;
        assert_eq!(norm.map(|n| n.to_scalar::<f32>()).transpose()?, Some(13.0));
        let coef = 6.5f32 / (13.0 + 1e-6);
        assert_eq!(grad(&a)?, vec![3.0 * coef, 4.0 * coef]);
        assert_eq!(grad(&b)?, vec![12.0 * coef]);
        // Under the limit nothing changes.
        clip_grad_norm(&[&a, &b], 100.0)?;
        assert_eq!(grad(&b)?, vec![12.0 * coef]);
        Ok(())
    }

    #[test]
    fn value_clipping_clamps_elements_and_norm_is_before_clipping() -> Result<()> {
        let a = param(&[3.0, -4.0, 0.5])?;
        let clip = Some(GradClip::Value { limit: 1.0 });
        let norm = prepare(&[&a], clip, true)?;
        let want = (9.0f32 + 16.0 + 0.25).sqrt();
        assert_eq!(norm.map(|n| n.to_scalar::<f32>()).transpose()?, Some(want));
        assert_eq!(grad(&a)?, vec![1.0, -1.0, 0.5]);
        assert!(
            prepare(&[&a], None, false)?.is_none(),
            "no norm unless asked"
        );
        Ok(())
    }

    #[test]
    fn parameters_without_gradients_are_skipped() -> Result<()> {
        let empty = Param::new(Var::zeros(2, DType::F32, &Device::Cpu)?);
        assert!(grad_norm([&empty])?.is_none());
        assert!(clip_grad_norm(&[&empty], 1.0)?.is_none());
        Ok(())
    }

    #[test]
    fn bad_limits_are_refused() {
        assert!(GradClip::Norm { max_norm: 0.0 }.check().is_err());
        assert!(GradClip::Value { limit: f64::NAN }.check().is_err());
        assert!(GradClip::Norm { max_norm: 1.0 }.check().is_ok());
    }
}
