//! Parameters and their gradients (PyTorch's `param.grad`), owned and passed
//! explicitly: no registry, nothing looked up by tensor id.
//!
//! A [`Param`] is a candle [`Var`] plus the [`GradBuffer`] that every backward
//! pass accumulates its gradient into until the optimizer takes it. Gradients
//! arrive two ways:
//! * the fused CPU kernels of the layers that hold the `Param`
//!   ([`ops::linear_param`](crate::ops::linear_param) and the conv twins) are
//!   handed its buffer when the forward op is built and write dW and db there
//!   from their backward (first write of a step) or add to it (accumulation),
//!   so candle's `GradStore` never holds those gradients;
//! * every other op's gradient comes back in candle's `GradStore`;
//!   [`Param::absorb`] moves it into the same buffer.
//!
//! Either way, between backward and the update the gradient is in one place,
//! where clipping, norms and accumulation see it. candle's own accumulation
//! (`zeros_like(param) + g` per parameter per step, split over its thread pool
//! above 64K elements, whose workers then spin on the core the prefetch thread
//! needs: `bench/NOTES.md`) is skipped for the fused layers.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use candle_core::{DType, Tensor, Var};

use crate::error::Result;
use crate::slices::fused_cpu;

/// A parameter's gradient, accumulated over the backward passes since the
/// optimizer (or [`GradBuffer::clear`]) last emptied it.
#[derive(Debug, Default)]
pub struct GradBuffer {
    state: Mutex<Buf>,
}

#[derive(Debug, Default)]
struct Buf {
    /// Host storage the fused kernels write; kept between steps so that no
    /// step allocates.
    host: Vec<f32>,
    held: Held,
}

/// What the buffer holds now.
#[derive(Debug, Default)]
enum Held {
    /// No gradient since the last take.
    #[default]
    Empty,
    /// The gradient is `host`.
    Host,
    /// The gradient is a (detached) tensor from candle's `GradStore`, on the
    /// parameter's device.
    Tensor(Tensor),
}

/// A view of a held gradient.
#[derive(Debug, Clone, Copy)]
pub enum GradRef<'a> {
    /// Written by the fused CPU kernels: f32, the parameter's shape flattened.
    Host(&'a [f32]),
    /// From candle's `GradStore`: the parameter's shape, device and dtype.
    Tensor(&'a Tensor),
}

impl GradBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Buf> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f(dst, accumulate)` on the `len`-element host buffer:
    /// `accumulate` is false on the first write since the last take (`dst`
    /// then holds stale values that `f` must overwrite), true on later ones
    /// (add to `dst`). A gradient held as a CPU tensor is copied in first.
    pub(crate) fn write<R>(&self, len: usize, f: impl FnOnce(&mut [f32], bool) -> R) -> R {
        let mut buf = self.lock();
        let buf = &mut *buf;
        if buf.host.len() != len {
            buf.host = vec![0.0; len];
            if matches!(buf.held, Held::Host) {
                buf.held = Held::Empty;
            }
        }
        // A parameter used by a fused layer and a generic op in one step (tied
        // weights): fold the generic gradient into the host buffer.
        if let Held::Tensor(t) = &buf.held {
            match t.flatten_all().and_then(|t| t.to_vec1::<f32>()) {
                Ok(v) if v.len() == len => {
                    buf.host.copy_from_slice(&v);
                    buf.held = Held::Host;
                }
                // Not host f32 data of this size: never the case for a
                // parameter a fused kernel covers; start over rather than mix.
                _ => buf.held = Held::Empty,
            }
        }
        let accumulate = matches!(buf.held, Held::Host);
        buf.held = Held::Host;
        f(&mut buf.host, accumulate)
    }

    /// Adds `src` to the host buffer (or writes it, on the first write).
    pub(crate) fn add(&self, src: &[f32]) {
        self.write(src.len(), |dst, accumulate| {
            if accumulate {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
            } else {
                dst.copy_from_slice(src);
            }
        });
    }

    /// Adds a gradient from candle's `GradStore` (detached here).
    pub fn absorb(&self, g: &Tensor) -> Result<()> {
        let g = g.detach();
        let mut buf = self.lock();
        let held = std::mem::take(&mut buf.held);
        buf.held = match held {
            Held::Empty => Held::Tensor(g),
            Held::Tensor(t) => Held::Tensor((t + g)?),
            Held::Host => {
                let v = g.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                if v.len() != buf.host.len() {
                    return Err(candle_core::Error::Msg(format!(
                        "gradient of {} elements added to a buffer of {}",
                        v.len(),
                        buf.host.len()
                    ))
                    .into());
                }
                buf.host.iter_mut().zip(&v).for_each(|(d, s)| *d += s);
                Held::Host
            }
        };
        Ok(())
    }

    /// Bytes of the gradient held now (0 when empty).
    pub fn bytes(&self) -> u64 {
        let buf = self.lock();
        match &buf.held {
            Held::Empty => 0,
            Held::Host => (buf.host.len() * 4) as u64,
            Held::Tensor(t) => (t.elem_count() * t.dtype().size_in_bytes()) as u64,
        }
    }

    /// Whether no gradient arrived since the last take.
    pub fn is_empty(&self) -> bool {
        matches!(self.lock().held, Held::Empty)
    }

    /// Runs `f` on the held gradient, if any (the buffer keeps it).
    pub fn with<R>(&self, f: impl FnOnce(GradRef<'_>) -> R) -> Option<R> {
        let buf = self.lock();
        match &buf.held {
            Held::Empty => None,
            Held::Host => Some(f(GradRef::Host(&buf.host))),
            Held::Tensor(t) => Some(f(GradRef::Tensor(t))),
        }
    }

    /// Runs `f` on the held gradient, if any, and empties the buffer.
    pub fn take_with<R>(&self, f: impl FnOnce(GradRef<'_>) -> R) -> Option<R> {
        let mut buf = self.lock();
        let buf = &mut *buf;
        match std::mem::take(&mut buf.held) {
            Held::Empty => None,
            Held::Host => Some(f(GradRef::Host(&buf.host))),
            Held::Tensor(t) => Some(f(GradRef::Tensor(&t))),
        }
    }

    /// A copy of the gradient as a tensor of `param`'s shape and device
    /// (`None` when empty): for inspection, not for the hot loop.
    pub fn to_tensor(&self, param: &Tensor) -> Result<Option<Tensor>> {
        self.with(|g| -> Result<Tensor> {
            Ok(match g {
                GradRef::Host(v) => Tensor::from_slice(v, param.shape(), param.device())?,
                GradRef::Tensor(t) => t.clone(),
            })
        })
        .transpose()
    }

    /// The sum of the squared gradient as an f32 scalar on the gradient's
    /// device (no host read for device gradients); `None` when empty.
    pub fn sum_sq(&self) -> Result<Option<Tensor>> {
        self.with(|g| -> Result<Tensor> {
            Ok(match g {
                GradRef::Host(v) => {
                    // f64 sums: the norm of a million f32 squares in f32 would
                    // lose digits PyTorch's pairwise sum keeps.
                    let s: f64 = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum();
                    Tensor::new(s as f32, &candle_core::Device::Cpu)?
                }
                GradRef::Tensor(t) => t.to_dtype(DType::F32)?.sqr()?.sum_all()?,
            })
        })
        .transpose()
    }

    /// Multiplies the gradient by `coef`, an f32 scalar on the gradient's
    /// device (`clip_grad_norm_`'s `g.mul_(clip_coef_clamped)`).
    pub fn scale(&self, coef: &Tensor) -> Result<()> {
        let mut buf = self.lock();
        let buf = &mut *buf;
        match &mut buf.held {
            Held::Empty => {}
            Held::Host => {
                let c = coef.to_dtype(DType::F32)?.to_scalar::<f32>()?;
                // x * 1.0 == x: the usual case (under the limit) costs no pass.
                if c != 1.0 {
                    buf.host.iter_mut().for_each(|x| *x *= c);
                }
            }
            Held::Tensor(t) => *t = t.broadcast_mul(&coef.to_dtype(t.dtype())?)?,
        }
        Ok(())
    }

    /// Multiplies the gradient by `inv_scale` (an f32 scalar on the
    /// gradient's device) and says whether it held an inf or NaN, as an f32
    /// scalar there (1 or 0; PyTorch's
    /// `_amp_foreach_non_finite_check_and_unscale_`); `None` when empty.
    /// Device gradients are checked by device ops, nothing read back; the
    /// host buffer (a CPU parameter) is checked as it is scaled.
    pub fn unscale(&self, inv_scale: &Tensor) -> Result<Option<Tensor>> {
        let mut buf = self.lock();
        let buf = &mut *buf;
        Ok(match &mut buf.held {
            Held::Empty => None,
            Held::Host => {
                // A CPU scalar: reading it waits for no device.
                let c = inv_scale.to_dtype(DType::F32)?.to_scalar::<f32>()?;
                let mut bad = false;
                for x in buf.host.iter_mut() {
                    bad |= !x.is_finite();
                    *x *= c;
                }
                Some(Tensor::new(
                    f32::from(u8::from(bad)),
                    &candle_core::Device::Cpu,
                )?)
            }
            Held::Tensor(t) => {
                // x * 0 is 0 for every finite x and NaN for inf or NaN, so the
                // sum is NaN exactly when one element is not finite (a plain
                // sum could overflow on finite values).
                let s = t.to_dtype(DType::F32)?.affine(0.0, 0.0)?.sum_all()?;
                let bad = s.ne(&s)?.to_dtype(DType::F32)?;
                *t = t.broadcast_mul(&inv_scale.to_dtype(t.dtype())?)?;
                Some(bad)
            }
        })
    }

    /// Clamps every element to `[-limit, limit]` (`clip_grad_value_`).
    pub fn clamp(&self, limit: f64) -> Result<()> {
        let mut buf = self.lock();
        let buf = &mut *buf;
        match &mut buf.held {
            Held::Empty => {}
            Held::Host => {
                let l = limit as f32;
                buf.host.iter_mut().for_each(|x| *x = x.clamp(-l, l));
            }
            Held::Tensor(t) => *t = clamp_keeping_nans(t, limit)?,
        }
        Ok(())
    }

    /// Replaces the gradient with `src`, `param`'s elements flattened (the
    /// all-reduced gradient of data-parallel training): into the host buffer
    /// where the gradient is held there, as a tensor of the held one's shape,
    /// device and dtype otherwise; an empty buffer gets it on the host for a
    /// CPU parameter, as a tensor on `param`'s device for others.
    pub fn overwrite(&self, src: &[f32], param: &Tensor) -> Result<()> {
        if src.len() != param.elem_count() {
            return Err(candle_core::Error::Msg(format!(
                "a gradient of {} elements for a parameter of {}",
                src.len(),
                param.elem_count()
            ))
            .into());
        }
        let mut buf = self.lock();
        let buf = &mut *buf;
        match &mut buf.held {
            Held::Tensor(t) => {
                *t = Tensor::from_slice(src, t.shape(), t.device())?.to_dtype(t.dtype())?;
            }
            Held::Empty if !param.device().is_cpu() => {
                buf.held = Held::Tensor(
                    Tensor::from_slice(src, param.shape(), param.device())?
                        .to_dtype(param.dtype())?,
                );
            }
            Held::Host | Held::Empty => {
                buf.host.clear();
                buf.host.extend_from_slice(src);
                buf.held = Held::Host;
            }
        }
        Ok(())
    }

    /// Drops the accumulated gradient (`zero_grad`).
    pub fn clear(&self) {
        self.lock().held = Held::Empty;
    }
}

/// `t` clamped to `[-limit, limit]` with its NaNs kept, as PyTorch's
/// `clamp` on every device: candle's CUDA clamp is `fminf(fmaxf(x, -limit),
/// limit)`, which turns a NaN into `-limit` (its CPU clamp keeps it), so a
/// NaN gradient would leave `clip_grad_value_` as a finite one on a GPU.
pub fn clamp_keeping_nans(t: &Tensor, limit: f64) -> Result<Tensor> {
    let nan = t.ne(t)?;
    Ok(nan.where_cond(t, &t.clamp(-limit, limit)?)?)
}

/// `clip_grad_norm_`'s factor `min(1, max_norm / (norm + 1e-6))` for the
/// f32 scalar `norm`, on its device: NaN for a NaN norm, which makes every
/// gradient NaN, as PyTorch's `clamp(max=1)` does on every device (candle's
/// CUDA minimum is `fminf`, which would give 1 and leave the finite
/// gradients as they were).
pub fn norm_clip_coef(norm: &Tensor, max_norm: f64) -> Result<Tensor> {
    let max = Tensor::new(max_norm as f32, norm.device())?;
    let q = max.div(&norm.affine(1.0, 1e-6)?)?;
    let nan = q.ne(&q)?;
    Ok(nan.where_cond(&q, &q.minimum(1f32)?)?)
}

/// A trainable parameter: the variable and its gradient. Clones share both,
/// so the layer that uses it, the model's parameter list and the optimizer
/// all see one gradient.
#[derive(Debug, Clone)]
pub struct Param {
    var: Var,
    grad: Arc<GradBuffer>,
}

impl Param {
    /// A parameter with an empty gradient.
    pub fn new(var: Var) -> Self {
        Self {
            var,
            grad: Arc::new(GradBuffer::new()),
        }
    }

    /// The variable.
    pub fn var(&self) -> &Var {
        &self.var
    }

    /// The current value.
    pub fn as_tensor(&self) -> &Tensor {
        self.var.as_tensor()
    }

    /// The gradient accumulated since the last take.
    pub fn grad(&self) -> &GradBuffer {
        &self.grad
    }

    /// The gradient buffer the fused kernels write, when they cover this
    /// parameter (an f32 CPU tensor).
    pub(crate) fn fused_buffer(&self) -> Option<Arc<GradBuffer>> {
        fused_cpu(self.as_tensor()).then(|| Arc::clone(&self.grad))
    }

    /// Moves this parameter's gradient out of a `GradStore` into its buffer
    /// (a no-op when the store has none: the fused kernels already wrote it,
    /// or the loss does not depend on it).
    pub fn absorb(&self, grads: &mut candle_core::backprop::GradStore) -> Result<()> {
        if let Some(g) = grads.remove(self.as_tensor()) {
            self.grad.absorb(&g)?;
        }
        Ok(())
    }
}

/// The gradient buffers of a layer's weight and bias, when the fused kernels
/// cover both.
pub(crate) type ParamBuffers = (Arc<GradBuffer>, Arc<GradBuffer>);

/// A fused backward's output for [`crate::slices::unpack_grads`]: with
/// `buffers`, dW and db go into the parameters' gradient buffers and only dx
/// comes back; otherwise the flat `[dW | db | dx]`.
pub(crate) fn grads_out(
    buffers: Option<&ParamBuffers>,
    dw: Vec<f32>,
    db: Vec<f32>,
    dx: Vec<f32>,
) -> (candle_core::CpuStorage, candle_core::Shape) {
    let out = match buffers {
        Some((wb, bb)) => {
            wb.add(&dw);
            bb.add(&db);
            dx
        }
        None => [dw, db, dx].concat(),
    };
    let len = out.len();
    (
        candle_core::CpuStorage::F32(out),
        candle_core::Shape::from(len),
    )
}

/// The buffers of `w` and `b` for the fused kernels.
pub(crate) fn layer_buffers(w: &Param, b: &Param) -> Option<ParamBuffers> {
    w.fused_buffer().zip(b.fused_buffer())
}

/// The buffers of 16-bit CPU parameters `w` and `b` (`bf16-true`), for the
/// 16-bit kernels: they hand each its gradient as a tensor of its dtype
/// ([`GradBuffer::absorb`]), past candle's `GradStore` and its
/// `zeros + g` per parameter (half a bf16-true MLP step, measured).
pub(crate) fn half_buffers(w: &Param, b: &Param) -> Option<ParamBuffers> {
    let half = |p: &Param| {
        let t = p.as_tensor();
        (t.device().is_cpu() && matches!(t.dtype(), DType::BF16 | DType::F16))
            .then(|| Arc::clone(&p.grad))
    };
    half(w).zip(half(b))
}

/// What the layers' tests compare: a layer's output and gradients under an
/// The gradients of `sum(y * up)` (taken in f32), what a layer's tests
/// differentiate: the upstream gradient of `y` is `up`.
#[cfg(test)]
pub(crate) fn weighted_grads(
    y: &Tensor,
    up: &Tensor,
) -> candle_core::Result<candle_core::backprop::GradStore> {
    (y * up)?.to_dtype(DType::F32)?.sum_all()?.backward()
}

/// upstream gradient `up`, as f32 values `[y, dx, dW, db]`, with dW and db
/// from the parameters' buffers.
#[cfg(test)]
pub(crate) fn outputs_and_grads(
    y: &Tensor,
    up: &Tensor,
    x: &Var,
    w: &Param,
    b: &Param,
) -> Result<[Vec<f32>; 4]> {
    let g = weighted_grads(y, up)?;
    let flat = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
    let missing = |what: &str| {
        crate::error::Error::Candle(candle_core::Error::Msg(format!("{what}: no gradient")))
    };
    let dx = g.get(x.as_tensor()).ok_or_else(|| missing("dx"))?;
    let dw = w
        .grad()
        .to_tensor(w.as_tensor())?
        .ok_or_else(|| missing("dW"))?;
    let db = b
        .grad()
        .to_tensor(b.as_tensor())?
        .ok_or_else(|| missing("db"))?;
    Ok([flat(y)?, flat(dx)?, flat(&dw)?, flat(&db)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn host(buf: &GradBuffer) -> Option<Vec<f32>> {
        buf.with(|g| match g {
            GradRef::Host(v) => v.to_vec(),
            GradRef::Tensor(_) => panic!("expected a host gradient"),
        })
    }

    #[test]
    fn first_write_overwrites_later_ones_accumulate_take_empties() {
        let buf = GradBuffer::new();
        assert!(buf.is_empty() && buf.take_with(|_| ()).is_none());
        buf.add(&[1.0, 2.0, 3.0]);
        buf.add(&[1.0, 1.0, 1.0]);
        assert_eq!(host(&buf), Some(vec![2.0, 3.0, 4.0]));
        assert!(buf.take_with(|_| ()).is_some());
        assert!(buf.is_empty());
        // The stale values of the last step are overwritten, not added to.
        buf.add(&[5.0, 5.0, 5.0]);
        assert_eq!(host(&buf), Some(vec![5.0; 3]));
        buf.clear();
        assert_eq!(host(&buf), None);
    }

    #[test]
    fn store_gradients_accumulate_and_mix_with_host_writes() -> Result<()> {
        let buf = GradBuffer::new();
        let t = |v: &[f32]| Tensor::new(v, &Device::Cpu);
        buf.absorb(&t(&[1.0, 2.0])?)?;
        buf.absorb(&t(&[0.5, 0.5])?)?;
        let p = Tensor::zeros(2, DType::F32, &Device::Cpu)?;
        let got = buf.to_tensor(&p)?.map(|g| g.to_vec1::<f32>()).transpose()?;
        assert_eq!(got, Some(vec![1.5, 2.5]));
        // A fused write after a store gradient adds to it ...
        buf.add(&[1.0, 1.0]);
        assert_eq!(host(&buf), Some(vec![2.5, 3.5]));
        // ... and a store gradient after a fused write too.
        buf.absorb(&t(&[1.0, -1.0])?)?;
        assert_eq!(host(&buf), Some(vec![3.5, 2.5]));
        assert!(buf.absorb(&t(&[1.0])?).is_err(), "size mismatch");
        Ok(())
    }

    #[test]
    fn overwrite_keeps_each_kind_where_it_is() -> Result<()> {
        let p = Tensor::zeros((2, 1), DType::F32, &Device::Cpu)?;
        let host_buf = GradBuffer::new();
        host_buf.add(&[3.0, -4.0]);
        host_buf.overwrite(&[1.0, 2.0], &p)?;
        assert_eq!(host(&host_buf), Some(vec![1.0, 2.0]));
        let dev_buf = GradBuffer::new();
        dev_buf.absorb(&Tensor::new(&[[6.0f32], [8.0]], &Device::Cpu)?)?;
        dev_buf.overwrite(&[5.0, 7.0], &p)?;
        let kept = dev_buf.with(|g| match g {
            GradRef::Tensor(t) => t.dims().to_vec(),
            GradRef::Host(_) => vec![],
        });
        assert_eq!(
            kept,
            Some(vec![2, 1]),
            "still a tensor of the gradient's shape"
        );
        let empty = GradBuffer::new();
        empty.overwrite(&[0.5, 0.25], &p)?;
        assert_eq!(host(&empty), Some(vec![0.5, 0.25]));
        assert!(empty.overwrite(&[1.0], &p).is_err(), "size mismatch");
        Ok(())
    }

    #[test]
    fn norms_scale_and_clamp_see_both_kinds() -> Result<()> {
        let host_buf = GradBuffer::new();
        host_buf.add(&[3.0, -4.0]);
        let dev_buf = GradBuffer::new();
        dev_buf.absorb(&Tensor::new(&[6.0f32, 8.0], &Device::Cpu)?)?;
        let sq = |b: &GradBuffer| -> Result<f32> {
            Ok(b.sum_sq()?.map_or(Ok(-1.0), |t| t.to_scalar::<f32>())?)
        };
        assert_eq!((sq(&host_buf)?, sq(&dev_buf)?), (25.0, 100.0));
        let half = Tensor::new(0.5f32, &Device::Cpu)?;
        host_buf.scale(&half)?;
        dev_buf.scale(&half)?;
        assert_eq!((sq(&host_buf)?, sq(&dev_buf)?), (6.25, 25.0));
        host_buf.clamp(1.0)?;
        dev_buf.clamp(1.0)?;
        assert_eq!(host(&host_buf), Some(vec![1.0, -1.0]));
        assert_eq!(sq(&dev_buf)?, 2.0);
        assert!(GradBuffer::new().sum_sq()?.is_none());
        Ok(())
    }

    /// PyTorch 2.15's `clip_grad_norm_(max_norm=1.0)` and `clamp` on
    /// gradients holding a NaN or an inf:
    /// ```python
    /// a.grad = torch.tensor([1.0, nan, 2.0]); b.grad = torch.tensor([3.0, 4.0])
    /// clip_grad_norm_([a, b], 1.0)  # nan; a.grad [nan, nan, nan], b.grad [nan, nan]
    /// a.grad = torch.tensor([1.0, inf, 2.0])
    /// clip_grad_norm_([a, b], 1.0)  # inf; a.grad [0, nan, 0], b.grad [0, 0]
    /// torch.tensor([nan, -5.0, 0.5, inf]).clamp(-1, 1)  # [nan, -1, 0.5, 1]
    /// ```
    #[test]
    fn clipping_keeps_nans_as_pytorch_does() -> Result<()> {
        let dev = Device::Cpu;
        let coef = |norm: f32| -> Result<f32> {
            Ok(norm_clip_coef(&Tensor::new(norm, &dev)?, 1.0)?.to_scalar::<f32>()?)
        };
        assert!(coef(f32::NAN)?.is_nan());
        assert_eq!(coef(f32::INFINITY)?, 0.0);
        assert_eq!(coef(0.5)?, 1.0);
        assert_eq!(coef(3.0)?, (1.0 / (3.0 + 1e-6f64)) as f32);
        let buf = GradBuffer::new();
        buf.absorb(&Tensor::new(&[f32::NAN, -5.0, 0.5, f32::INFINITY], &dev)?)?;
        buf.clamp(1.0)?;
        let got = buf.with(|g| match g {
            GradRef::Tensor(t) => t.to_vec1::<f32>(),
            GradRef::Host(h) => Ok(h.to_vec()),
        });
        let got = got.transpose()?.unwrap_or_default();
        assert!(got[0].is_nan());
        assert_eq!(got[1..], [-1.0, 0.5, 1.0]);
        Ok(())
    }

    #[test]
    fn only_f32_cpu_parameters_get_a_fused_buffer() -> Result<()> {
        let f64p = Param::new(Var::zeros(2, DType::F64, &Device::Cpu)?);
        assert!(f64p.fused_buffer().is_none());
        let f32p = Param::new(Var::zeros(2, DType::F32, &Device::Cpu)?);
        let clone = f32p.clone();
        let buf = f32p.fused_buffer();
        assert!(buf.is_some_and(|b| std::ptr::eq(&*b, clone.grad())));
        Ok(())
    }

    fn data(dims: &[usize], seed: f32) -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
        Ok(Tensor::from_vec(v, dims, &Device::Cpu)?)
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(a, b)| (a - b).abs() <= 1e-5 * (1.0 + b.abs()))
    }

    type Plain = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;
    type Owned = fn(&Tensor, &Param, &Param) -> Result<Tensor>;

    /// Two backward passes through the `Param` form of a layer accumulate in
    /// the parameters' buffers exactly what candle's `GradStore` reports for
    /// the plain form, summed; the input gradient still flows through candle.
    fn accumulates_like_grad_store(
        (plain, owned): (Plain, Owned),
        x: &[usize],
        w: &[usize],
    ) -> Result<()> {
        let x = Var::from_tensor(&data(x, 0.0)?)?;
        let w = Param::new(Var::from_tensor(&data(w, 1.0)?)?);
        let b = Param::new(Var::from_tensor(&data(&w.as_tensor().dims()[..1], 2.0)?)?);
        let (wt, bt) = (w.as_tensor(), b.as_tensor());
        let y_shape = plain(x.as_tensor(), wt, bt)?.dims().to_vec();
        let ups = [data(&y_shape, 3.0)?, data(&y_shape, 4.0)?];
        let flat = |t: Option<&Tensor>| -> Result<Vec<f32>> {
            match t {
                Some(t) => Ok(t.flatten_all()?.to_vec1::<f32>()?),
                None => panic!("gradient missing from the GradStore"),
            }
        };
        let mut want_w = vec![0f32; wt.elem_count()];
        let mut want_b = vec![0f32; bt.elem_count()];
        let mut want_dx = Vec::new();
        for up in &ups {
            let g = (plain(x.as_tensor(), wt, bt)? * up)?
                .sum_all()?
                .backward()?;
            want_w
                .iter_mut()
                .zip(flat(g.get(wt))?)
                .for_each(|(a, s)| *a += s);
            want_b
                .iter_mut()
                .zip(flat(g.get(bt))?)
                .for_each(|(a, s)| *a += s);
            want_dx.push(flat(g.get(&x))?);
        }
        for (up, want_dx) in ups.iter().zip(&want_dx) {
            let g = (owned(x.as_tensor(), &w, &b)? * up)?
                .sum_all()?
                .backward()?;
            assert!(g.get(wt).is_none() && g.get(bt).is_none());
            assert!(close(&flat(g.get(&x))?, want_dx), "dx");
        }
        assert!(host(w.grad()).is_some_and(|g| close(&g, &want_w)), "dW");
        assert!(host(b.grad()).is_some_and(|g| close(&g, &want_b)), "db");
        Ok(())
    }

    #[test]
    fn linear_and_conv_gradients_accumulate_in_buffers() -> Result<()> {
        use crate as ops;
        let lin: (Plain, Owned) = (
            |x, w, b| ops::linear(x, w, b, true),
            |x, w, b| ops::linear_param(x, w, b, true),
        );
        accumulates_like_grad_store(lin, &[5, 7], &[3, 7])?;
        let conv: (Plain, Owned) = (
            |x, w, b| ops::conv2d(x, w, b, 1),
            |x, w, b| ops::conv2d_param(x, w, b, 1),
        );
        accumulates_like_grad_store(conv, &[2, 3, 6, 6], &[4, 3, 3, 3])?;
        let block: (Plain, Owned) = (
            |x, w, b| ops::conv2d_pool_relu(x, w, b, 1, 2),
            |x, w, b| ops::conv2d_pool_relu_param(x, w, b, 1, 2),
        );
        accumulates_like_grad_store(block, &[2, 3, 6, 6], &[4, 3, 3, 3])
    }

    #[test]
    fn absorb_moves_a_store_gradient_into_the_buffer() -> Result<()> {
        let p = Param::new(Var::new(&[1.0f64, 2.0], &Device::Cpu)?);
        let mut grads = p.as_tensor().sqr()?.sum_all()?.backward()?;
        p.absorb(&mut grads)?;
        assert!(grads.get(p.as_tensor()).is_none(), "moved, not copied");
        let g = p.grad().to_tensor(p.as_tensor())?;
        assert_eq!(
            g.map(|g| g.to_vec1::<f64>()).transpose()?,
            Some(vec![2.0, 4.0])
        );
        Ok(())
    }

    /// Unscaling multiplies host and tensor gradients alike and flags an inf
    /// or NaN in either, and only then (a large finite value is no overflow).
    #[test]
    fn unscale_scales_and_flags_non_finite_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let inv = Tensor::new(0.25f32, &dev)?;
        let flag = |t: Option<Tensor>| -> Result<f32> {
            Ok(t.map(|t| t.to_scalar::<f32>()).transpose()?.unwrap_or(-1.0))
        };
        let host_buf = GradBuffer::new();
        host_buf.add(&[4.0, -8.0, 3.0e38]);
        assert_eq!(flag(host_buf.unscale(&inv)?)?, 0.0);
        assert_eq!(host(&host_buf), Some(vec![1.0, -2.0, 0.75e38]));
        host_buf.add(&[0.0, f32::INFINITY, 0.0]);
        assert_eq!(flag(host_buf.unscale(&inv)?)?, 1.0);

        for bad in [f32::NAN, f32::NEG_INFINITY] {
            let t = GradBuffer::new();
            t.absorb(&Tensor::new(&[2.0f32, 3.0e38, 3.0e38], &dev)?)?;
            assert_eq!(flag(t.unscale(&inv)?)?, 0.0, "finite values");
            let g = t.to_tensor(&Tensor::zeros(3, DType::F32, &dev)?)?;
            assert_eq!(
                g.map(|g| g.to_vec1::<f32>()).transpose()?,
                Some(vec![0.5, 0.75e38, 0.75e38])
            );
            t.absorb(&Tensor::new(&[0.0f32, bad, 0.0], &dev)?)?;
            assert_eq!(flag(t.unscale(&inv)?)?, 1.0, "{bad}");
        }
        assert!(GradBuffer::new().unscale(&inv)?.is_none());
        Ok(())
    }
}
