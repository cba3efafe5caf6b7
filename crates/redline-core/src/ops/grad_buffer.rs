//! Persistent gradient buffers: the fused backward kernels write a parameter's
//! gradient straight into a buffer its optimizer owns, instead of handing it to
//! candle's `GradStore`.
//!
//! candle's backward accumulates every gradient as `zeros_like(param) + g`:
//! per parameter per step, a fresh zero tensor, a fresh sum and (above 64K
//! elements) a pass split over its thread pool, whose workers then spin on
//! the core the prefetch thread needs (`bench/NOTES.md`). With a buffer
//! attached, the fused linear and conv2d backward GEMMs write (first backward
//! of a step) or accumulate (gradient accumulation) into it, return no
//! gradient for the parameter to candle, and the optimizer reads the buffer.
//!
//! Buffers are found by the parameter's tensor id through a registry of weak
//! references: the optimizer holds the only strong one, so dropping it
//! returns every later backward to candle's `GradStore`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use candle_core::{Tensor, TensorId};

use super::slices::fused_cpu;

/// The gradient buffers of a layer's weight and bias.
pub(crate) type ParamBuffers = (Arc<GradBuffer>, Arc<GradBuffer>);

/// The buffers of a layer's weight `w` and bias `b`, when both are attached.
pub(crate) fn layer_buffers(w: &Tensor, b: &Tensor) -> Option<ParamBuffers> {
    GradBuffer::of(w).zip(GradBuffer::of(b))
}

/// A parameter's gradient, accumulated over the backward passes since the
/// optimizer last took it.
#[derive(Debug)]
pub struct GradBuffer {
    state: Mutex<Buf>,
}

#[derive(Debug, Default)]
struct Buf {
    data: Vec<f32>,
    /// Whether `data` holds a gradient written since the last take.
    filled: bool,
}

type Registry = Mutex<HashMap<TensorId, Weak<GradBuffer>>>;

fn registry() -> MutexGuard<'static, HashMap<TensorId, Weak<GradBuffer>>> {
    static LIVE: OnceLock<Registry> = OnceLock::new();
    LIVE.get_or_init(Registry::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl GradBuffer {
    /// Attaches a buffer to `param` and returns its owner, or `None` where the
    /// fused kernels do not cover the parameter (not an f32 CPU tensor). From
    /// then on, while the returned `Arc` lives, fused backward passes write
    /// this parameter's gradient here and candle's `GradStore` has none for it.
    pub fn attach(param: &Tensor) -> Option<Arc<Self>> {
        if !fused_cpu(param) {
            return None;
        }
        let buf = Arc::new(Self {
            state: Mutex::new(Buf::default()),
        });
        let mut live = registry();
        live.retain(|_, w| w.strong_count() > 0);
        live.insert(param.id(), Arc::downgrade(&buf));
        Some(buf)
    }

    /// The live buffer attached to `param`, if any.
    pub(crate) fn of(param: &Tensor) -> Option<Arc<Self>> {
        registry().get(&param.id()).and_then(Weak::upgrade)
    }

    fn lock(&self) -> MutexGuard<'_, Buf> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f(dst, accumulate)` on a `len`-element buffer: `accumulate` is
    /// false on the first write since the last take (`dst` then holds stale
    /// values that `f` must overwrite), true on later ones (add to `dst`).
    pub(crate) fn write<R>(&self, len: usize, f: impl FnOnce(&mut [f32], bool) -> R) -> R {
        let mut buf = self.lock();
        if buf.data.len() != len {
            buf.data = vec![0.0; len];
            buf.filled = false;
        }
        let accumulate = buf.filled;
        buf.filled = true;
        f(&mut buf.data, accumulate)
    }

    /// Adds `src` (or writes it, on the first write of a step).
    pub(crate) fn add(&self, src: &[f32]) {
        self.write(src.len(), |dst, accumulate| {
            if accumulate {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
            } else {
                dst.copy_from_slice(src);
            }
        });
    }

    /// Runs `f` on the gradient accumulated since the last take and empties
    /// the buffer; `None` (and `f` not run) when no backward wrote to it.
    pub fn take_with<R>(&self, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
        let mut buf = self.lock();
        if !buf.filled {
            return None;
        }
        buf.filled = false;
        Some(f(&buf.data))
    }

    /// A copy of the gradient accumulated so far, without taking it.
    pub fn gradient(&self) -> Option<Vec<f32>> {
        let buf = self.lock();
        buf.filled.then(|| buf.data.clone())
    }

    /// Drops the accumulated gradient (`zero_grad`).
    pub fn clear(&self) {
        self.lock().filled = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn first_write_overwrites_later_ones_accumulate_take_empties() -> crate::Result<()> {
        let p = Tensor::zeros(3, DType::F32, &Device::Cpu)?;
        let Some(buf) = GradBuffer::attach(&p) else {
            panic!("an f32 CPU tensor gets a buffer")
        };
        assert!(GradBuffer::of(&p).is_some_and(|b| Arc::ptr_eq(&b, &buf)));
        assert_eq!(buf.take_with(<[f32]>::to_vec), None);
        buf.add(&[1.0, 2.0, 3.0]);
        buf.add(&[1.0, 1.0, 1.0]);
        assert_eq!(buf.gradient(), Some(vec![2.0, 3.0, 4.0]));
        assert_eq!(buf.take_with(<[f32]>::to_vec), Some(vec![2.0, 3.0, 4.0]));
        assert_eq!(buf.take_with(<[f32]>::to_vec), None);
        // The stale values of the last step are overwritten, not added to.
        buf.add(&[5.0, 5.0, 5.0]);
        assert_eq!(buf.gradient(), Some(vec![5.0; 3]));
        buf.clear();
        assert_eq!(buf.gradient(), None);
        Ok(())
    }

    #[test]
    fn dropping_the_owner_detaches_the_buffer() -> crate::Result<()> {
        let p = Tensor::zeros(2, DType::F32, &Device::Cpu)?;
        let buf = GradBuffer::attach(&p);
        assert!(GradBuffer::of(&p).is_some());
        drop(buf);
        assert!(GradBuffer::of(&p).is_none());
        Ok(())
    }

    fn data(dims: &[usize], seed: f32) -> crate::Result<Tensor> {
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

    type Layer = fn(&Tensor, &Tensor, &Tensor) -> crate::Result<Tensor>;

    /// Two backward passes through `layer` with buffers attached accumulate
    /// exactly what candle's `GradStore` reports for each pass, summed; the
    /// input gradient still flows through candle.
    fn accumulates_like_grad_store(layer: Layer, x: &[usize], w: &[usize]) -> crate::Result<()> {
        use candle_core::Var;
        let x = Var::from_tensor(&data(x, 0.0)?)?;
        let w = Var::from_tensor(&data(w, 1.0)?)?;
        let b = Var::from_tensor(&data(&w.dims()[..1], 2.0)?)?;
        let y_shape = layer(x.as_tensor(), w.as_tensor(), b.as_tensor())?
            .dims()
            .to_vec();
        let ups = [data(&y_shape, 3.0)?, data(&y_shape, 4.0)?];
        let pass = |up: &Tensor| -> crate::Result<candle_core::backprop::GradStore> {
            let y = layer(x.as_tensor(), w.as_tensor(), b.as_tensor())?;
            Ok((y * up)?.sum_all()?.backward()?)
        };
        let flat = |t: Option<&Tensor>| -> crate::Result<Vec<f32>> {
            match t {
                Some(t) => Ok(t.flatten_all()?.to_vec1::<f32>()?),
                None => panic!("gradient missing from the GradStore"),
            }
        };
        let mut want_w = vec![0f32; w.elem_count()];
        let mut want_b = vec![0f32; b.elem_count()];
        let mut want_dx = Vec::new();
        for up in &ups {
            let g = pass(up)?;
            want_w
                .iter_mut()
                .zip(flat(g.get(&w))?)
                .for_each(|(a, s)| *a += s);
            want_b
                .iter_mut()
                .zip(flat(g.get(&b))?)
                .for_each(|(a, s)| *a += s);
            want_dx.push(flat(g.get(&x))?);
        }
        let (Some(wb), Some(bb)) = (GradBuffer::attach(&w), GradBuffer::attach(&b)) else {
            panic!("f32 CPU parameters get buffers")
        };
        for (up, want_dx) in ups.iter().zip(&want_dx) {
            let g = pass(up)?;
            assert!(g.get(&w).is_none() && g.get(&b).is_none());
            assert!(close(&flat(g.get(&x))?, want_dx), "dx");
        }
        let got_w = wb.take_with(<[f32]>::to_vec);
        let got_b = bb.take_with(<[f32]>::to_vec);
        assert!(got_w.is_some_and(|g| close(&g, &want_w)), "dW");
        assert!(got_b.is_some_and(|g| close(&g, &want_b)), "db");
        assert!(wb.gradient().is_none());
        Ok(())
    }

    #[test]
    fn linear_and_conv_gradients_accumulate_in_buffers() -> crate::Result<()> {
        let lin: Layer = |x, w, b| super::super::linear(x, w, b, true);
        accumulates_like_grad_store(lin, &[5, 7], &[3, 7])?;
        let conv: Layer = |x, w, b| super::super::conv2d(x, w, b, 1);
        accumulates_like_grad_store(conv, &[2, 3, 6, 6], &[4, 3, 3, 3])
    }

    #[test]
    fn only_f32_cpu_parameters_get_one() -> crate::Result<()> {
        let p = Tensor::zeros(2, DType::F64, &Device::Cpu)?;
        assert!(GradBuffer::attach(&p).is_none());
        Ok(())
    }
}
