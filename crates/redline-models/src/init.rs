//! PyTorch's default initialisation, from a seeded stream, created on the device.
//!
//! `nn.Linear` and `nn.Conv2d` use `kaiming_uniform_(a=sqrt(5))` for weights,
//! which works out to U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for
//! biases. The values are drawn on the host from ChaCha8 (reproducible across
//! platforms and thread counts) and uploaded once.

use candle_core::{Tensor, Var};
use rand::distr::{Distribution, Uniform};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

/// Draws initial parameter values.
pub struct Initializer {
    rng: ChaCha8Rng,
    device: candle_core::Device,
    dtype: candle_core::DType,
    /// The dtype layers compute their products in (the precision's).
    compute: candle_core::DType,
    /// Bytes parameters may still take (host memory free when it was made).
    left: Option<u64>,
}

impl Initializer {
    /// A stream seeded by `seed`, creating parameters on `device` in the precision's dtype.
    pub fn new(
        seed: u64,
        device: &redline_core::Device,
        precision: redline_core::Precision,
    ) -> Self {
        // Drawn on the host, then placed: the host's free memory bounds the model
        // (and the device's, where the allocator says).
        let device_free = redline_core::memory::stats(device)
            .ok()
            .flatten()
            .map(|m| m.device_free);
        let left = match (redline_core::system::host_memory_free(), device_free) {
            (Some(h), Some(d)) => Some(h.min(d)),
            (h, d) => h.or(d),
        };
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            device: device.candle().clone(),
            dtype: precision.param_dtype(),
            compute: precision.compute_dtype(),
            left,
        }
    }

    /// The dtype the layers built from this initializer compute in
    /// (`Precision::compute_dtype`): fp32, or bf16/fp16 under autocast.
    pub fn compute_dtype(&self) -> candle_core::DType {
        self.compute
    }

    /// Elements of `shape`, refused (before anything is allocated) when
    /// training it would not fit the memory left: a width or class count
    /// typed with too many digits gets an error, not an abort.
    fn reserve(&mut self, shape: &[usize]) -> Result<usize> {
        // Training holds each parameter four times in f32: the weight, its
        // gradient and Adam's two moments.
        const BYTES: u64 = 16;
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let bytes = n.and_then(|n| (n as u64).checked_mul(BYTES));
        match (n, bytes, self.left) {
            (Some(n), Some(b), Some(left)) if b <= left => {
                self.left = Some(left - b);
                Ok(n)
            }
            (Some(n), Some(_), None) => Ok(n),
            (_, b, left) => {
                let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
                Err(Error::Config(format!(
                    "a parameter of shape {shape:?} needs {} to train (weight, gradient and \
                     Adam's two moments); {} of memory is free\n\
                     HINT: smaller --hidden widths, fewer --classes, or smaller widths in the \
                     model file",
                    b.map_or("more than 2^64 bytes".into(), gib),
                    gib(left.unwrap_or(0))
                )))
            }
        }
    }

    /// A parameter of `shape` drawn from U(-bound, bound).
    pub fn uniform(&mut self, shape: &[usize], bound: f32) -> Result<Var> {
        let n = self.reserve(shape)?;
        let dist = Uniform::new(-bound, bound).map_err(|e| Error::Config(format!("init: {e}")))?;
        let v: Vec<f32> = (0..n).map(|_| dist.sample(&mut self.rng)).collect();
        let t = Tensor::from_vec(v, shape, &self.device)?.to_dtype(self.dtype)?;
        Ok(Var::from_tensor(&t)?)
    }

    /// The device parameters are created on.
    pub fn device(&self) -> &candle_core::Device {
        &self.device
    }

    /// A parameter of `shape` filled with `value` (LayerNorm's ones and zeros).
    pub fn constant(&mut self, shape: &[usize], value: f32) -> Result<Var> {
        self.reserve(shape)?;
        let t = Tensor::full(value, shape, &self.device)?.to_dtype(self.dtype)?;
        Ok(Var::from_tensor(&t)?)
    }

    /// A parameter of `shape` drawn from N(0, 1) (`nn.Embedding`'s default),
    /// by the Box-Muller transform of two uniform draws.
    pub fn normal(&mut self, shape: &[usize]) -> Result<Var> {
        let n = self.reserve(shape)?;
        let unit =
            Uniform::new(f64::EPSILON, 1.0).map_err(|e| Error::Config(format!("init: {e}")))?;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                let (u1, u2) = (unit.sample(&mut self.rng), unit.sample(&mut self.rng));
                ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect();
        let t = Tensor::from_vec(v, shape, &self.device)?.to_dtype(self.dtype)?;
        Ok(Var::from_tensor(&t)?)
    }

    /// A parameter of `shape` drawn from N(0, std^2) (Kaiming's normal init).
    pub fn normal_std(&mut self, shape: &[usize], std: f64) -> Result<Var> {
        let unit = self.normal(shape)?;
        let t = unit.as_tensor().to_dtype(candle_core::DType::F32)?;
        let t = t.affine(std, 0.0)?.to_dtype(self.dtype)?;
        Ok(Var::from_tensor(&t)?)
    }

    /// A seed for a layer's own random stream (dropout masks), drawn from
    /// this one so that the model's seed fixes it.
    pub fn fork_seed(&mut self) -> u64 {
        use rand::RngCore;
        self.rng.next_u64()
    }

    /// PyTorch's default (weight, bias) for a layer with `fan_in` inputs per output.
    pub fn layer(
        &mut self,
        weight_shape: &[usize],
        bias_len: usize,
        fan_in: usize,
    ) -> Result<(Var, Var)> {
        let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
        Ok((
            self.uniform(weight_shape, bound)?,
            self.uniform(&[bias_len], bound)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redline_core::{Device, Precision};

    #[test]
    fn bounds_and_seeding() -> Result<()> {
        let dev = Device::cpu();
        let mut a = Initializer::new(3, &dev, Precision::Fp32);
        let mut b = Initializer::new(3, &dev, Precision::Fp32);
        let (wa, _) = a.layer(&[128, 784], 128, 784)?;
        let (wb, _) = b.layer(&[128, 784], 128, 784)?;
        let va = wa.as_tensor().flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(va, wb.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        let bound = 1.0 / 28.0;
        assert!(va.iter().all(|x| x.abs() <= bound));
        // Uniform on [-b, b]: variance b^2/3.
        let var = va.iter().map(|x| x * x).sum::<f32>() / va.len() as f32;
        assert!((var - bound * bound / 3.0).abs() < 0.02 * bound * bound);
        Ok(())
    }

    #[test]
    fn a_parameter_larger_than_free_memory_is_refused_before_allocation() -> Result<()> {
        let mut init = Initializer::new(0, &Device::cpu(), Precision::Fp32);
        assert!(
            init.left.is_some(),
            "this machine's free memory is readable"
        );
        // 10^11 weights: 400 GB (the `--hidden 100000000000` of a hostile user).
        let msg = init
            .uniform(&[100_000_000_000, 1], 0.1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("needs 1490.1 GiB to train") && msg.contains("--hidden"),
            "{msg}"
        );
        // A shape whose element count overflows.
        let msg = init
            .constant(&[usize::MAX, 2], 0.0)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("more than 2^64 bytes"), "{msg}");
        // Small ones still fit.
        assert_eq!(init.normal(&[4, 4])?.as_tensor().dims(), &[4, 4]);
        Ok(())
    }
}
