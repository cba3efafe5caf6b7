//! BatchNorm2d in training mode, `y = (x - mean) / sqrt(var + eps) * w + b`
//! with the batch's per-channel mean and biased variance, as one fused CPU
//! kernel forward and one backward (f32).
//!
//! Built from candle's ops it is about ten broadcast ops forward, each a
//! pass over the activation and a tensor, and their autograd backward; on
//! ResNet-18 that was more than the convolutions' backward (bench/results,
//! issue 52). Fused: the forward reads `x` three times (mean, variance,
//! normalise) and writes `y` once; the backward reads `x` and `dy` twice
//! (the channel sums, then `dx`) and writes `dx`, with dW and db into the
//! parameters' gradient buffers. The arithmetic is PyTorch's CPU kernel's:
//! two-pass statistics, and
//! `dx = w * invstd * (dy - mean(dy) - (x - mean) * invstd^2 * mean(dy * (x - mean)))`.
//! Other devices and dtypes take the same formula from candle's ops. On
//! maps of 64 values and fewer (8x8 down to 1x1) both passes go by blocks
//! of channels (`blocked.rs`), not channel by channel.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;
use redline_core::trace;

use crate::add_relu::passes;
use crate::grad::{grads_out, half_buffers, layer_buffers, Param, ParamBuffers};
use crate::half16::widen;
use crate::slices::{by_channel, f32s, fused_cpu, half_cpu, keep, saved, unpack_grads, vectorised};
use crate::Result;

/// The output of a training-mode batch norm and the batch's statistics.
#[derive(Debug, Clone)]
pub struct BatchNormOut {
    /// The normalised, scaled and shifted input, shaped as the input.
    pub y: Tensor,
    /// Per-channel mean of the batch, `(C)`, detached.
    pub mean: Tensor,
    /// Per-channel biased variance of the batch, `(C)`, detached (the
    /// running statistics want the unbiased one: scale by `n / (n - 1)`).
    pub var: Tensor,
}

/// `F.batch_norm(x, None, None, w, b, training=True, eps=eps)` on `x (B, C,
/// H, W)` with `w`, `b` of shape `(C)`, followed by a ReLU when `relu`
/// (ResNet's `bn1` + `relu`; PyTorch's rule: NaN passes, and so does its
/// gradient): CPU f32 tensors take the fused kernel (dW and db into the
/// parameters' gradient buffers, dx only when `x` is tracked), anything
/// else [`batch_norm2d_train_generic`].
pub fn batch_norm2d_train(
    x: &Tensor,
    w: &Param,
    b: &Param,
    eps: f64,
    relu: bool,
) -> Result<BatchNormOut> {
    let (wt, bt) = (w.as_tensor(), b.as_tensor());
    if x.dtype() == DType::BF16 && x.device().is_cpu() && wt.dtype() == DType::F32 {
        // bf16-mixed: a bf16 activation under fp32 parameters, normalised
        // as if cast to f32 (exactly), without the cast's copies, and
        // stored in the input's bf16, as PyTorch's CPU autocast's batch norm
        // stores it (`native_batch_norm` of a bf16 input and fp32
        // parameters: fp32 arithmetic, a bf16 output).
        if let Some(buffers) = layer_buffers(w, b).filter(|_| fused_cpu(wt) && fused_cpu(bt)) {
            return fused(x, (wt, bt), eps, relu, Some(buffers));
        }
    }
    if x.dtype() != wt.dtype() {
        // Norms run in their parameters' dtype.
        let x = crate::cast16::to_dtype(x, wt.dtype())?;
        return batch_norm2d_train(&x, w, b, eps, relu);
    }
    if [x, wt, bt].iter().all(|t| half_cpu(t)) {
        let all_bf16 = [x, wt, bt].iter().all(|t| t.dtype() == DType::BF16);
        if let Some(buffers) = half_buffers(w, b).filter(|_| all_bf16) {
            return fused(x, (wt, bt), eps, relu, Some(buffers));
        }
        return batch_norm2d_train_16(x, wt, bt, eps, relu);
    }
    let buffers = layer_buffers(w, b);
    if !(fused_cpu(x) && fused_cpu(wt) && fused_cpu(bt)) || buffers.is_none() {
        let out = batch_norm2d_train_generic(x, wt, bt, eps)?;
        return Ok(if relu {
            BatchNormOut {
                y: out.y.relu()?,
                ..out
            }
        } else {
            out
        });
    }
    fused(x, (wt, bt), eps, relu, buffers)
}

/// [`batch_norm2d_train`] of 16-bit CPU tensors: the fused f32 kernel
/// between casts. Each value is widened exactly, the statistics and the
/// products are f32 (PyTorch's CPU batch norm on bf16 computes in float
/// too) and the output is rounded once to `x`'s dtype; dx, dW and db pass
/// back through the casts, rounded to their tensors' dtypes. candle's ops
/// in bf16 took 7x the f32 step of a ResNet-18 (bf16-true, 64 px).
fn batch_norm2d_train_16(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
    relu: bool,
) -> Result<BatchNormOut> {
    let f32 = |t: &Tensor| crate::cast16::to_dtype(t, DType::F32);
    let (xf, wf, bf) = (f32(x)?, f32(w)?, f32(b)?);
    let out = fused(&xf, (&wf, &bf), eps, relu, None)?;
    Ok(BatchNormOut {
        y: crate::cast16::to_dtype(&out.y, x.dtype())?,
        ..out
    })
}

/// The fused kernel on f32 CPU tensors, or on a bf16 input with `buffers`
/// (`bf16.rs`): dW and db into `buffers`, or back through candle's
/// autograd without them.
fn fused(
    x: &Tensor,
    (wt, bt): (&Tensor, &Tensor),
    eps: f64,
    relu: bool,
    buffers: Option<ParamBuffers>,
) -> Result<BatchNormOut> {
    run_op(x, (wt, bt), |stats| BatchNormOp {
        eps,
        relu,
        input_grad: x.track_op(),
        layer: trace::current_layer(),
        buffers,
        stats,
    })
}

/// A fused batch-norm op, made by `op` around the slot its forward leaves
/// the statistics in, run on `x (B, C, H, W)`, `w (C)` and `b (C)` (the
/// shapes checked first): y and the batch's statistics.
fn run_op<O: CustomOp3 + Send + Sync + 'static>(
    x: &Tensor,
    (wt, bt): (&Tensor, &Tensor),
    op: impl FnOnce(Arc<Mutex<Option<Stats>>>) -> O,
) -> Result<BatchNormOut> {
    let (_, c, _, _) = x.dims4()?;
    if wt.dims() != [c] || bt.dims() != [c] {
        return Err(crate::Error::Shape(format!(
            "batch_norm2d: input {:?} has {c} channels but the weight is {:?} and the bias {:?}",
            x.dims(),
            wt.dims(),
            bt.dims()
        )));
    }
    let stats = Arc::new(Mutex::new(None));
    let op = op(Arc::clone(&stats));
    let y = x
        .contiguous()?
        .apply_op3(&wt.contiguous()?, &bt.contiguous()?, op)?;
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

/// [`batch_norm2d_train`] from candle's ops: any device and dtype.
pub fn batch_norm2d_train_generic(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
) -> Result<BatchNormOut> {
    let (_, c, _, _) = x.dims4()?;
    let shape = (1, c, 1, 1);
    let channel_mean =
        |t: &Tensor| -> Result<Tensor> { Ok(t.mean_keepdim(3)?.mean_keepdim(2)?.mean_keepdim(0)?) };
    let mean = channel_mean(x)?;
    let var = channel_mean(&x.broadcast_sub(&mean)?.sqr()?)?;
    let normed = x
        .broadcast_sub(&mean)?
        .broadcast_div(&(&var + eps)?.sqrt()?)?;
    let y = normed
        .broadcast_mul(&w.reshape(shape)?)?
        .broadcast_add(&b.reshape(shape)?)?;
    Ok(BatchNormOut {
        y,
        mean: mean.detach().flatten_all()?,
        var: var.detach().flatten_all()?,
    })
}

/// What the forward leaves for the backward and the running statistics.
#[derive(Debug, Clone)]
struct Stats {
    mean: Vec<f32>,
    var: Vec<f32>,
    invstd: Vec<f32>,
    /// Per channel, `y = x * scale + shift` before the ReLU: the backward
    /// recomputes that value bit for bit to know where the ReLU passed.
    scale: Vec<f32>,
    shift: Vec<f32>,
}

impl Stats {
    /// The statistics from one `[mean, var, invstd, scale, shift]` row per
    /// channel.
    fn from_rows(per: &[[f32; 5]]) -> Self {
        let column = |k: usize| per.iter().map(|p| p[k]).collect::<Vec<f32>>();
        Self {
            mean: column(0),
            var: column(1),
            invstd: column(2),
            scale: column(3),
            shift: column(4),
        }
    }
}

/// Sizes of one batch norm: `b` samples of `c` planes of `hw` values.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    c: usize,
    hw: usize,
}

impl Dims {
    fn of(l: &Layout) -> candle_core::Result<Self> {
        let (b, c, h, w) = l.shape().dims4()?;
        Ok(Self { b, c, hw: h * w })
    }

    /// Refuses a backward whose input, weight, output gradient (`lens`) or
    /// saved statistics do not fit these sizes, naming `op`.
    fn check_backward(
        &self,
        op: &str,
        (x, w, dy): (usize, usize, usize),
        st: &Stats,
    ) -> candle_core::Result<()> {
        if dy != x || x != self.b * self.c * self.hw || w != self.c || st.mean.len() != self.c {
            candle_core::bail!(
                "{op}: output grad has {dy} elements for an input of {x}, weight {w} for {} channels",
                self.c
            );
        }
        Ok(())
    }

    /// Values per channel.
    #[inline(always)]
    fn n(&self) -> usize {
        self.b * self.hw
    }

    /// The `b` planes of channel `ch` in `v`.
    #[inline(always)]
    fn planes<'a, T>(&self, v: &'a [T], ch: usize) -> impl Iterator<Item = &'a [T]> + 'a {
        let (c, hw) = (self.c, self.hw);
        (0..self.b).map(move |s| &v[(s * c + ch) * hw..][..hw])
    }
}

/// `sum(f(i))` over a plane with eight running sums, so that it vectorises.
#[inline(always)]
fn lane_sum(len: usize, f: impl Fn(usize) -> f32) -> f64 {
    let mut lanes = [0f32; 8];
    let whole = len - len % 8;
    for i in (0..whole).step_by(8) {
        for (j, l) in lanes.iter_mut().enumerate() {
            *l += f(i + j);
        }
    }
    let tail: f32 = (whole..len).map(&f).sum();
    lanes.iter().map(|&v| f64::from(v)).sum::<f64>() + f64::from(tail)
}

/// Channel `ch`'s mean, biased variance and `1 / sqrt(var + eps)`: two
/// passes over its planes, f64 across planes.
#[inline(always)]
fn channel_moments(d: Dims, x: &[f32], ch: usize, eps: f64) -> (f32, f32, f32) {
    let n = d.n().max(1) as f64;
    let sum: f64 = d.planes(x, ch).map(|p| lane_sum(p.len(), |i| p[i])).sum();
    let mean = (sum / n) as f32;
    let sq: f64 = d
        .planes(x, ch)
        .map(|p| {
            lane_sum(p.len(), |i| {
                let v = p[i] - mean;
                v * v
            })
        })
        .sum();
    let var = (sq / n) as f32;
    let invstd = (1.0 / (f64::from(var) + eps).sqrt()) as f32;
    (mean, var, invstd)
}

/// The forward, channel by channel on the compute threads: the statistics
/// (two passes) and then `y = x * scale + shift` (and the ReLU) over the
/// channel's planes, so that `x` comes from memory once and its second and
/// third reads from the cache (one whole-tensor pass after another read it
/// three times from memory: the batch norms of a ResNet-18 step at 224 px
/// hold 320 MB at batch 32, ten times the last-level cache).
fn forward(
    d: Dims,
    (x, w, b): (&[f32], &[f32], &[f32]),
    eps: f64,
    relu: bool,
) -> (Vec<f32>, Stats) {
    if let Some(out) = blocked::forward(d, (x, w, b), eps, relu) {
        return out;
    }
    let (y, per) = by_channel((d.b, d.c, d.hw), |ch, out| {
        vectorised(
            #[inline(always)]
            || {
                let (mean, var, invstd) = channel_moments(d, x, ch, eps);
                let scale = invstd * w[ch];
                let shift = b[ch] - mean * scale;
                for (y, x) in out.zip(d.planes(x, ch)) {
                    normalise(y, x, (scale, shift), relu, |v| v);
                }
                [mean, var, invstd, scale, shift]
            },
        )
    });
    (y, Stats::from_rows(&per))
}

/// One plane's output: `store(x * scale + shift)`, through the ReLU when
/// `relu` (NaN passes). Shared by the f32 and bf16 forwards (`store`
/// rounds to bf16 there).
#[inline(always)]
fn normalise<T>(
    y: &mut [T],
    x: &[f32],
    (scale, shift): (f32, f32),
    relu: bool,
    store: impl Fn(f32) -> T,
) {
    if relu {
        y.iter_mut().zip(x).for_each(|(y, &x)| {
            let z = x * scale + shift;
            *y = store(if passes(z) { z } else { 0.0 });
        });
    } else {
        y.iter_mut()
            .zip(x)
            .for_each(|(y, &x)| *y = store(x * scale + shift));
    }
}

/// One channel's fused ReLU for the backward: the pre-activation
/// `x * scale + shift` recomputed as the forward computed it.
#[derive(Clone, Copy)]
struct Gate {
    relu: bool,
    scale: f32,
    shift: f32,
}

impl Gate {
    /// The gradient reaching the norm's output for a vector of inputs `x`:
    /// `dy`, or 0 where the ReLU (when on) stopped it, where `x * scale +
    /// shift <= 0` (never for NaN, which passes). In explicit vectors:
    /// written as scalar code, LLVM turns the select into masked scalar
    /// loads.
    #[inline(always)]
    fn at<S: Simd>(self, simd: S, x: S::f32s, dy: S::f32s) -> S::f32s {
        if !self.relu {
            return dy;
        }
        let zero = simd.splat_f32s(0.0);
        let z = simd.add_f32s(
            simd.mul_f32s(x, simd.splat_f32s(self.scale)),
            simd.splat_f32s(self.shift),
        );
        simd.select_f32s(simd.less_than_or_equal_f32s(z, zero), zero, dy)
    }

    /// [`Gate::at`] for one value (a plane's tail).
    #[inline(always)]
    fn at1(self, x: f32, dy: f32) -> f32 {
        if self.relu && !passes(x * self.scale + self.shift) {
            0.0
        } else {
            dy
        }
    }
}

/// One plane's `(sum(g), sum(g * (x - m)))` with `g` the gated gradient,
/// a vector of running sums each.
struct GateSums<'a> {
    gate: Gate,
    m: f32,
    x: &'a [f32],
    dy: &'a [f32],
}

impl WithSimd for GateSums<'_> {
    type Output = (f64, f64);

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> (f64, f64) {
        let Self { gate, m, x, dy } = self;
        let ((xv, xt), (dv, dt)) = (S::as_simd_f32s(x), S::as_simd_f32s(dy));
        let mv = simd.splat_f32s(m);
        let (mut a, mut b) = (simd.splat_f32s(0.0), simd.splat_f32s(0.0));
        for (&x, &dy) in xv.iter().zip(dv) {
            let g = gate.at(simd, x, dy);
            a = simd.add_f32s(a, g);
            b = simd.add_f32s(b, simd.mul_f32s(g, simd.sub_f32s(x, mv)));
        }
        let (mut ta, mut tb) = (0f32, 0f32);
        for (&x, &dy) in xt.iter().zip(dt) {
            let g = gate.at1(x, dy);
            ta += g;
            tb += g * (x - m);
        }
        let total = |v: S::f32s, t: f32| f64::from(simd.reduce_sum_f32s(v)) + f64::from(t);
        (total(a, ta), total(b, tb))
    }
}

/// One plane's dx: `(g - mean_g - (x - m) * k) * scale` with `terms = (m,
/// mean_g, k, scale)`.
struct GateDx<'a> {
    gate: Gate,
    terms: (f32, f32, f32, f32),
    x: &'a [f32],
    dy: &'a [f32],
    dx: &'a mut [f32],
}

impl WithSimd for GateDx<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Self {
            gate,
            terms: (m, mean_g, k, scale),
            x,
            dy,
            dx,
        } = self;
        let ((xv, xt), (dv, dt)) = (S::as_simd_f32s(x), S::as_simd_f32s(dy));
        let (ov, ot) = S::as_mut_simd_f32s(dx);
        let [mv, gv, kv, sv] = [m, mean_g, k, scale].map(|v| simd.splat_f32s(v));
        for ((o, &x), &dy) in ov.iter_mut().zip(xv).zip(dv) {
            let g = simd.sub_f32s(gate.at(simd, x, dy), gv);
            let t = simd.mul_f32s(simd.sub_f32s(x, mv), kv);
            *o = simd.mul_f32s(simd.sub_f32s(g, t), sv);
        }
        for ((o, &x), &dy) in ot.iter_mut().zip(xt).zip(dt) {
            *o = (gate.at1(x, dy) - mean_g - (x - m) * k) * scale;
        }
    }
}

/// The forward op: `(x, w, b) -> y`, contiguous f32 on the CPU.
struct BatchNormOp {
    eps: f64,
    /// A ReLU follows, fused.
    relu: bool,
    /// Whether `x` was tracked at forward time; if not, no dx is computed.
    input_grad: bool,
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
    /// Where dW and db go.
    buffers: Option<ParamBuffers>,
    /// The batch's statistics, left by the forward.
    stats: Arc<Mutex<Option<Stats>>>,
}

impl CustomOp3 for BatchNormOp {
    fn name(&self) -> &'static str {
        "redline-batch-norm2d"
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
        let (w, b) = (widen(s2, l2, name)?, widen(s3, l3, name)?);
        if w.len() != d.c || b.len() != d.c {
            candle_core::bail!(
                "{name}: {} channels, weight {} and bias {}",
                d.c,
                w.len(),
                b.len()
            );
        }
        let (y, st) = if matches!(s1, CpuStorage::BF16(_)) {
            bf16::forward_storage(d, (s1, l1), (&w, &b), self.eps, self.relu)?
        } else {
            let (y, st) = forward(d, (f32s(s1, l1, name)?, &w, &b), self.eps, self.relu);
            (CpuStorage::F32(y), st)
        };
        keep(&self.stats, st);
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
        let op = BatchNormBackward {
            stats: saved(&self.stats, "batch_norm2d backward")?,
            relu: self.relu,
            input_grad: self.input_grad,
            buffers: self.buffers.clone(),
        };
        // The gradient in y's dtype, the input's.
        let grad = grad.to_dtype(x.dtype())?.contiguous()?;
        let flat = x.apply_op3_no_bwd(w, &grad, &op)?;
        unpack_grads(
            &flat,
            w.shape(),
            x.shape(),
            self.input_grad,
            op.buffers.is_some(),
        )
    }
}

/// The backward kernel: `(x, w, dy) -> [dW | db | dx]` (or dx alone when
/// the parameters' buffers took dW and db).
struct BatchNormBackward {
    stats: Stats,
    /// The forward's fused ReLU: dy is zeroed where it did not pass.
    relu: bool,
    input_grad: bool,
    buffers: Option<ParamBuffers>,
}

impl CustomOp3 for BatchNormBackward {
    fn name(&self) -> &'static str {
        "redline-batch-norm2d-backward"
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
        if matches!(s1, CpuStorage::BF16(_)) {
            let Some(buffers) = &self.buffers else {
                candle_core::bail!("batch_norm2d backward: a bf16 input needs gradient buffers");
            };
            let saved = (&self.stats, self.relu, self.input_grad);
            return bf16::backward_storage(saved, buffers, (s1, l1), (s2, l2), (s3, l3));
        }
        let name = self.name();
        let d = Dims::of(l1)?;
        let (x, w, dy) = (
            f32s(s1, l1, name)?,
            f32s(s2, l2, name)?,
            f32s(s3, l3, name)?,
        );
        d.check_backward(name, (x.len(), w.len(), dy.len()), &self.stats)?;
        let st = &self.stats;
        let gated = |ch: usize| Gate {
            relu: self.relu,
            scale: st.scale[ch],
            shift: st.shift[ch],
        };
        // Per channel: db = sum(dy), and sum(dy * (x - mean)) (dW = that * invstd).
        let sums_of = |ch: usize| -> (f32, f32) {
            let (gate, m) = (gated(ch), st.mean[ch]);
            let (mut sdy, mut sdyx) = (0f64, 0f64);
            for (x, dy) in d.planes(x, ch).zip(d.planes(dy, ch)) {
                let (a, b) = pulp::Arch::new().dispatch(GateSums { gate, m, x, dy });
                (sdy, sdyx) = (sdy + a, sdyx + b);
            }
            (sdy as f32, sdyx as f32)
        };
        // dx channel by channel right after its sums, so that the second
        // read of the channel's `x` and `dy` comes from the cache.
        let n = d.n() as f32;
        let small = blocked::backward(d, (x, dy, w), (st, self.relu), self.input_grad);
        let (dx, sums) = if let Some(small) = small {
            small
        } else if self.input_grad {
            by_channel((d.b, d.c, d.hw), |ch, out| {
                let sums = sums_of(ch);
                let (m, is) = (st.mean[ch], st.invstd[ch]);
                let k = sums.1 / n * is * is;
                for (dx, (x, dy)) in out.zip(d.planes(x, ch).zip(d.planes(dy, ch))) {
                    pulp::Arch::new().dispatch(GateDx {
                        gate: gated(ch),
                        terms: (m, sums.0 / n, k, w[ch] * is),
                        x,
                        dy,
                        dx,
                    });
                }
                sums
            })
        } else {
            (Vec::new(), (0..d.c).into_par_iter().map(sums_of).collect())
        };
        let db: Vec<f32> = sums.iter().map(|s| s.0).collect();
        let dw: Vec<f32> = sums.iter().zip(&st.invstd).map(|(s, i)| s.1 * i).collect();
        Ok(grads_out(self.buffers.as_ref(), dw, db, dx))
    }
}

mod bf16;
mod blocked;
#[cfg(test)]
mod tests;
