//! The fused batch norm of a bf16 input: the f32 kernel's arithmetic, with
//! each channel's bf16 planes widened into per-thread scratch as the
//! channel is taken (so in cache). Under `bf16-true` the parameters and
//! the output are bf16 (the output rounded as it is written); under
//! `bf16-mixed` they are f32, as the norm ran on the input cast to f32.
//!
//! The casts around the f32 kernel it replaces each made a whole f32 copy
//! of the activation or its gradient: a pass over memory each way, forward
//! and backward, and a flat `[dW | db | dx]` copied again. ResNet-18's
//! batch norms took 272 ms of a bf16-true step at 224 px (batch 32, two
//! threads) against 139 in bf16-mixed, which normalises f32 activations.
//! The values are the cast construction's bit for bit: the widening is
//! exact, the sums run in the same order, and each output is rounded once
//! (a test checks y, dx, dW and db).

use std::cell::Cell;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};
use half::bf16;
use rayon::prelude::*;
use redline_core::trace;

use super::{channel_moments, BatchNormOut, Dims, Gate, GateDx, GateSums, Stats};
use crate::add_relu::passes;
use crate::grad::ParamBuffers;
use crate::half16::{bf16_store, bf16_widen, tensor, widen};
use crate::slices::{by_channel_of, keep, vectorised};
use crate::Result;

thread_local! {
    /// A compute thread's widened channel: its input, its output gradient,
    /// and one plane of input gradient.
    static SCRATCH: Cell<[Vec<f32>; 3]> = Cell::default();
}

/// `f` with the calling thread's scratch, grown to at least `lens`.
fn with_scratch<R>(lens: [usize; 3], f: impl FnOnce(&mut [Vec<f32>; 3]) -> R) -> R {
    let mut s = SCRATCH.take();
    for (v, &n) in s.iter_mut().zip(&lens) {
        if v.len() < n {
            v.resize(n, 0.0);
        }
    }
    let r = f(&mut s);
    SCRATCH.set(s);
    r
}

/// A storage element the kernels read and write: bf16 or f32.
trait Elem: Copy + Default + Send + Sync + 'static {
    /// The value in f32 (exact).
    fn to_f32(self) -> f32;
    /// An f32 value stored (rounded to nearest even for bf16).
    fn of_f32(v: f32) -> Self;
    /// The contiguous elements a layout addresses, or an error naming `op`.
    fn slice<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> candle_core::Result<&'a [Self]>;
}

impl Elem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_widen(self)
    }
    #[inline(always)]
    fn of_f32(v: f32) -> Self {
        bf16_store(v)
    }
    fn slice<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> candle_core::Result<&'a [Self]> {
        let CpuStorage::BF16(v) = s else {
            candle_core::bail!("{op}: expected bf16 storage, got {:?}", s.dtype())
        };
        contiguous(v, l, op)
    }
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn of_f32(v: f32) -> Self {
        v
    }
    fn slice<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> candle_core::Result<&'a [Self]> {
        crate::slices::f32s(s, l, op)
    }
}

/// The planes of channel `ch` of `src` widened into `dst` one after another.
#[inline(always)]
fn widen_channel<T: Elem>(d: Dims, src: &[T], ch: usize, dst: &mut [f32]) {
    for (dst, src) in dst.chunks_mut(d.hw.max(1)).zip(d.planes(src, ch)) {
        dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s.to_f32());
    }
}

/// The contiguous elements of `v` a layout addresses, or an error naming `op`.
fn contiguous<'a, T>(v: &'a [T], l: &Layout, op: &str) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("{op}: operand is not contiguous ({:?})", l.shape()),
    }
}

/// [`super::batch_norm2d_train`] of a bf16 CPU input with a weight and
/// bias of one dtype, bf16 or f32, whose gradients go to `buffers`: y in
/// the parameters' dtype, the statistics in f32.
pub(super) fn fused_bf16(
    x: &Tensor,
    (w, b): (&Tensor, &Tensor),
    eps: f64,
    relu: bool,
    buffers: ParamBuffers,
) -> Result<BatchNormOut> {
    let (_, c, _, _) = x.dims4()?;
    if w.dims() != [c] || b.dims() != [c] {
        return Err(crate::Error::Shape(format!(
            "batch_norm2d: input {:?} has {c} channels but the weight is {:?} and the bias {:?}",
            x.dims(),
            w.dims(),
            b.dims()
        )));
    }
    let stats = Arc::new(Mutex::new(None));
    let op = BatchNorm16 {
        eps,
        relu,
        input_grad: x.track_op(),
        layer: trace::current_layer(),
        buffers,
        stats: Arc::clone(&stats),
    };
    let y = x
        .contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, op)?;
    let kept = stats
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .ok_or_else(|| crate::Error::Shape("batch_norm2d: the kernel kept no statistics".into()))?;
    let dev = x.device();
    Ok(BatchNormOut {
        y,
        mean: Tensor::from_slice(&kept.mean, c, dev)?,
        var: Tensor::from_slice(&kept.var, c, dev)?,
    })
}

/// The forward: per channel, its planes widened, the statistics (two
/// passes over the scratch), then `y = x * scale + shift` (and the ReLU)
/// rounded into the bf16 output.
fn forward<T: Elem>(
    d: Dims,
    x: &[bf16],
    (w, b): (&[f32], &[f32]),
    eps: f64,
    relu: bool,
) -> (Vec<T>, Stats) {
    let n = d.n();
    let (y, per) = by_channel_of::<T, _>((d.b, d.c, d.hw), |ch, out| {
        with_scratch([n, 0, 0], |[xs, _, _]| {
            let xs = &mut xs[..n];
            vectorised(
                #[inline(always)]
                || {
                    widen_channel(d, x, ch, xs);
                    let one = Dims { c: 1, ..d };
                    let (mean, var, invstd) = channel_moments(one, xs, 0, eps);
                    let scale = invstd * w[ch];
                    let shift = b[ch] - mean * scale;
                    for (y, x) in out.zip(xs.chunks(d.hw.max(1))) {
                        if relu {
                            y.iter_mut().zip(x).for_each(|(y, &x)| {
                                let z = x * scale + shift;
                                *y = T::of_f32(if passes(z) { z } else { 0.0 });
                            });
                        } else {
                            y.iter_mut()
                                .zip(x)
                                .for_each(|(y, &x)| *y = T::of_f32(x * scale + shift));
                        }
                    }
                    [mean, var, invstd, scale, shift]
                },
            )
        })
    });
    let column = |k: usize| per.iter().map(|p| p[k]).collect::<Vec<f32>>();
    let st = Stats {
        mean: column(0),
        var: column(1),
        invstd: column(2),
        scale: column(3),
        shift: column(4),
    };
    (y, st)
}

/// The forward op: `(x, w, b) -> y`, contiguous on the CPU, x in bf16 and
/// the rest in the parameters' dtype.
struct BatchNorm16 {
    eps: f64,
    relu: bool,
    input_grad: bool,
    layer: Option<Arc<str>>,
    buffers: ParamBuffers,
    stats: Arc<Mutex<Option<Stats>>>,
}

impl CustomOp3 for BatchNorm16 {
    fn name(&self) -> &'static str {
        "redline-batch-norm2d-bf16"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        trace::count("batch_norm2d.forward");
        let name = self.name();
        let d = Dims::of(l1)?;
        let x = bf16::slice(s1, l1, name)?;
        let (w, b) = (widen(s2, l2, name)?, widen(s3, l3, name)?);
        if w.len() != d.c || b.len() != d.c {
            candle_core::bail!(
                "{name}: {} channels, weight {} and bias {}",
                d.c,
                w.len(),
                b.len()
            );
        }
        let y = match s2.dtype() {
            DType::F32 => {
                let (y, st) = forward::<f32>(d, x, (&w, &b), self.eps, self.relu);
                keep(&self.stats, st);
                CpuStorage::F32(y)
            }
            _ => {
                let (y, st) = forward::<bf16>(d, x, (&w, &b), self.eps, self.relu);
                keep(&self.stats, st);
                CpuStorage::BF16(y)
            }
        };
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = trace::backward(self.layer.as_ref(), "batch_norm2d");
        trace::count("batch_norm2d.backward");
        let stats = self
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(stats) = stats else {
            candle_core::bail!("batch_norm2d backward: the forward kept no statistics");
        };
        let op = Backward16 {
            stats,
            relu: self.relu,
            input_grad: self.input_grad,
            buffers: self.buffers.clone(),
        };
        let grad = grad.to_dtype(w.dtype())?.contiguous()?;
        let flat = x.apply_op3_no_bwd(w, &grad, &op)?;
        let dx = self
            .input_grad
            .then(|| flat.reshape(x.shape()))
            .transpose()?;
        Ok((dx, None, None))
    }
}

/// The backward kernel: `(x, w, dy) -> dx` in bf16 (empty when `x` needs
/// no gradient), dy in the parameters' dtype; dW and db into the
/// parameters' buffers (f32 values for f32 parameters, bf16 tensors for
/// bf16 ones).
struct Backward16 {
    stats: Stats,
    relu: bool,
    input_grad: bool,
    buffers: ParamBuffers,
}

impl Backward16 {
    /// Channel `ch`'s `(sum(g), sum(g * (x - mean)))` over its widened
    /// planes `xs` and `gs`, `g` the gated gradient.
    fn sums(&self, d: Dims, ch: usize, xs: &[f32], gs: &[f32]) -> (f32, f32) {
        let st = &self.stats;
        let gate = self.gate(ch);
        let m = st.mean[ch];
        let (mut sdy, mut sdyx) = (0f64, 0f64);
        let hw = d.hw.max(1);
        for (x, dy) in xs.chunks(hw).zip(gs.chunks(hw)) {
            let (a, b) = pulp::Arch::new().dispatch(GateSums { gate, m, x, dy });
            (sdy, sdyx) = (sdy + a, sdyx + b);
        }
        (sdy as f32, sdyx as f32)
    }

    fn gate(&self, ch: usize) -> Gate {
        Gate {
            relu: self.relu,
            scale: self.stats.scale[ch],
            shift: self.stats.shift[ch],
        }
    }
}

impl CustomOp3 for Backward16 {
    fn name(&self) -> &'static str {
        "redline-batch-norm2d-bf16-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let name = self.name();
        let x = bf16::slice(s1, l1, name)?;
        let w = widen(s2, l2, name)?;
        match s3.dtype() {
            DType::F32 => self.run(Dims::of(l1)?, x, &w, f32::slice(s3, l3, name)?, s2.dtype()),
            _ => self.run(Dims::of(l1)?, x, &w, bf16::slice(s3, l3, name)?, s2.dtype()),
        }
    }
}

impl Backward16 {
    /// dx, with dW and db into the buffers in `param`'s dtype.
    fn run<T: Elem>(
        &self,
        d: Dims,
        x: &[bf16],
        w: &[f32],
        dy: &[T],
        param: DType,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let name = "redline-batch-norm2d-bf16-backward";
        let st = &self.stats;
        if dy.len() != x.len() || w.len() != d.c || st.mean.len() != d.c {
            candle_core::bail!(
                "{name}: output grad has {} elements for an input of {}, weight {} for {} channels",
                dy.len(),
                x.len(),
                w.len(),
                d.c
            );
        }
        let (n, hw) = (d.n(), d.hw);
        let count = n as f32;
        let widened = |ch: usize, xs: &mut [f32], gs: &mut [f32]| {
            vectorised(
                #[inline(always)]
                || {
                    widen_channel(d, x, ch, xs);
                    widen_channel(d, dy, ch, gs);
                },
            );
        };
        let (dx, sums) = if self.input_grad {
            by_channel_of::<bf16, _>((d.b, d.c, hw), |ch, out| {
                with_scratch([n, n, hw], |[xs, gs, plane]| {
                    let (xs, gs, plane) = (&mut xs[..n], &mut gs[..n], &mut plane[..hw]);
                    widened(ch, xs, gs);
                    let sums = self.sums(d, ch, xs, gs);
                    let (m, is) = (st.mean[ch], st.invstd[ch]);
                    let k = sums.1 / count * is * is;
                    let planes = xs.chunks(hw.max(1)).zip(gs.chunks(hw.max(1)));
                    for (o, (x, dy)) in out.zip(planes) {
                        pulp::Arch::new().dispatch(GateDx {
                            gate: self.gate(ch),
                            terms: (m, sums.0 / count, k, w[ch] * is),
                            x,
                            dy,
                            dx: &mut *plane,
                        });
                        vectorised(
                            #[inline(always)]
                            || {
                                o.iter_mut()
                                    .zip(plane.iter())
                                    .for_each(|(o, &v)| *o = bf16_store(v));
                            },
                        );
                    }
                    sums
                })
            })
        } else {
            let sums = (0..d.c)
                .into_par_iter()
                .map(|ch| {
                    with_scratch([n, n, 0], |[xs, gs, _]| {
                        let (xs, gs) = (&mut xs[..n], &mut gs[..n]);
                        widened(ch, xs, gs);
                        self.sums(d, ch, xs, gs)
                    })
                })
                .collect();
            (Vec::new(), sums)
        };
        let db: Vec<f32> = sums.iter().map(|s| s.0).collect();
        let dw: Vec<f32> = sums.iter().zip(&st.invstd).map(|(s, i)| s.1 * i).collect();
        let (wbuf, bbuf) = &self.buffers;
        if param == DType::F32 {
            wbuf.add(&dw);
            bbuf.add(&db);
        } else {
            let (dw, db) = (tensor(dw, d.c, param)?, tensor(db, d.c, param)?);
            wbuf.absorb(&dw).map_err(candle_core::Error::wrap)?;
            bbuf.absorb(&db).map_err(candle_core::Error::wrap)?;
        }
        let len = dx.len();
        Ok((CpuStorage::BF16(dx), Shape::from(len)))
    }
}
