//! The fused batch norm of a bf16 input: the f32 kernel's arithmetic, with
//! each channel's bf16 planes widened into per-thread scratch as the
//! channel is taken (so in cache). The output is bf16, rounded as it is
//! written; the parameters are bf16 under `bf16-true` and f32 under
//! `bf16-mixed` (the norm of the input cast to f32, its output rounded to
//! bf16: PyTorch's CPU autocast's).
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

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Shape};
use half::bf16;
use rayon::prelude::*;

use super::{channel_moments, normalise, Dims, Gate, GateDx, GateSums, Stats};
use crate::grad::ParamBuffers;
use crate::half16::{bf16_store, bf16_widen, tensor, widen};
use crate::slices::{by_channel_of, vectorised};

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

/// The planes of channel `ch` of `src` widened into `dst` one after another.
#[inline(always)]
fn widen_channel(d: Dims, src: &[bf16], ch: usize, dst: &mut [f32]) {
    for (dst, src) in dst.chunks_mut(d.hw.max(1)).zip(d.planes(src, ch)) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, &s)| *d = bf16_widen(s));
    }
}

/// The forward: per channel, its planes widened, the statistics (two
/// passes over the scratch), then `y = x * scale + shift` (and the ReLU)
/// rounded into the bf16 output.
fn forward(
    d: Dims,
    x: &[bf16],
    (w, b): (&[f32], &[f32]),
    eps: f64,
    relu: bool,
) -> (Vec<bf16>, Stats) {
    if let Some(out) = super::blocked::forward(d, (x, w, b), eps, relu) {
        return out;
    }
    let n = d.n();
    let (y, per) = by_channel_of::<bf16, _>((d.b, d.c, d.hw), |ch, out| {
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
                        normalise(y, x, (scale, shift), relu, bf16_store);
                    }
                    [mean, var, invstd, scale, shift]
                },
            )
        })
    });
    (y, Stats::from_rows(&per))
}

/// [`super::BatchNormOp`]'s forward of a bf16 input `x (s1)` under a
/// weight and bias `w` and `b` (bf16 or f32 parameters, widened and
/// checked): y in bf16, and the batch's statistics.
pub(super) fn forward_storage(
    d: Dims,
    (s1, l1): (&CpuStorage, &Layout),
    (w, b): (&[f32], &[f32]),
    eps: f64,
    relu: bool,
) -> candle_core::Result<(CpuStorage, Stats)> {
    let x = crate::slices::bf16s(s1, l1, "redline-batch-norm2d (bf16)")?;
    let (y, st) = forward(d, x, (w, b), eps, relu);
    Ok((CpuStorage::BF16(y), st))
}

/// [`super::BatchNormBackward`]'s kernel for a bf16 input `x (s1)`: dx in
/// bf16 (empty when `x` needs no gradient), from dy (`s3`) in bf16; dW and db into `buffers` (f32 values for f32 parameters, bf16
/// tensors for bf16 ones).
pub(super) fn backward_storage(
    (stats, relu, input_grad): (&Stats, bool, bool),
    buffers: &ParamBuffers,
    (s1, l1): (&CpuStorage, &Layout),
    (s2, l2): (&CpuStorage, &Layout),
    (s3, l3): (&CpuStorage, &Layout),
) -> candle_core::Result<(CpuStorage, Shape)> {
    let name = "redline-batch-norm2d-backward (bf16)";
    let x = crate::slices::bf16s(s1, l1, name)?;
    let dy = crate::slices::bf16s(s3, l3, name)?;
    let w = widen(s2, l2, name)?;
    let k = Backward16 {
        stats,
        relu,
        input_grad,
        buffers,
    };
    k.run(Dims::of(l1)?, x, &w, dy, s2.dtype())
}

/// The backward's saved state, borrowed.
struct Backward16<'a> {
    stats: &'a Stats,
    relu: bool,
    input_grad: bool,
    buffers: &'a ParamBuffers,
}

impl Backward16<'_> {
    /// Channel `ch`'s `(sum(g), sum(g * (x - mean)))` over its widened
    /// planes `xs` and `gs`, `g` the gated gradient.
    fn sums(&self, d: Dims, ch: usize, xs: &[f32], gs: &[f32]) -> (f32, f32) {
        let st = self.stats;
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

impl Backward16<'_> {
    /// dx, with dW and db into the buffers in `param`'s dtype.
    fn run(
        &self,
        d: Dims,
        x: &[bf16],
        w: &[f32],
        dy: &[bf16],
        param: DType,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let name = "redline-batch-norm2d-backward (bf16)";
        let st = self.stats;
        d.check_backward(name, (x.len(), w.len(), dy.len()), st)?;
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
        let small = super::blocked::backward(d, (x, dy, w), (st, self.relu), self.input_grad);
        let (dx, sums) = if let Some(small) = small {
            small
        } else if self.input_grad {
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
