//! `nn.Dropout` as one fused kernel each way, alone or added to a residual
//! stream (a transformer block's `h + dropout(a)`).
//!
//! The mask is a function of a seed and the element's position ([`keeps`]),
//! as the fused attention's is: the forward writes `x * mask` (plus `h`)
//! in one pass on the compute threads and stores nothing; the backward
//! makes the same mask again from the seed. Before this, a mask was drawn
//! element by element from a ChaCha stream on one thread, uploaded as an
//! fp32 tensor, multiplied and then added by separate ops, forward and
//! backward: on nanoGPT's shakespeare-char model on the CPU that was 13
//! passes of 5 ms a step.
//!
//! The fused kernel runs on f32 CPU tensors. Elsewhere (16-bit, GPUs) the
//! same mask is made on the host ([`mask`]) and applied with candle's ops,
//! so every device drops the same elements for the same seed.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::error::Result;
use crate::slices::{f32s, fused_cpu};
use redline_core::trace;

/// Elements per thread task (even, so that a chunk starts a hash's pair).
const CHUNK: usize = 1 << 15;

/// One dropout draw: each element is kept with chance `1 - p` and scaled
/// by `1 / (1 - p)`; which ones is a function of `seed` and the place:
/// [`keeps`] for a tensor's elements, [`crate::attention::keeps`] for
/// attention probabilities.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropDraw {
    /// The chance of dropping, in `[0, 1)`.
    pub p: f32,
    /// The mask's seed (a fresh one each call).
    pub seed: u64,
}

impl DropDraw {
    /// The 32-bit draw at or above which an element is kept: `p * 2^32`.
    fn threshold(self) -> u64 {
        (f64::from(self.p) * 4_294_967_296.0).round() as u64
    }

    /// What a kept element is multiplied by.
    fn scale(self) -> f32 {
        1.0 / (1.0 - self.p)
    }
}

/// splitmix64 of `seed` and pair `j`: the 64 uniform bits of elements `2j`
/// (low half) and `2j + 1` (high half).
#[inline(always)]
fn pair_bits(seed: u64, j: u64) -> u64 {
    let mut z = seed ^ j.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether `drop` keeps element `i` (of the tensor's elements in
/// row-major order).
pub fn keeps(drop: DropDraw, i: usize) -> bool {
    let z = pair_bits(drop.seed, (i / 2) as u64);
    let bits = if i.is_multiple_of(2) {
        z & 0xFFFF_FFFF
    } else {
        z >> 32
    };
    bits >= drop.threshold()
}

/// The multipliers (`1 / (1 - p)` or 0) of elements `first..first +
/// out.len()`, `first` even.
fn fill_mask(drop: DropDraw, first: usize, out: &mut [f32]) {
    let (thr, scale) = (drop.threshold(), drop.scale());
    let j0 = (first / 2) as u64;
    let tail = j0 + (out.len() / 2) as u64;
    // Inside pulp's dispatch, splitmix64's 64-bit multiplies take
    // AVX-512DQ's lanes (compiled for the baseline, they stayed scalar).
    crate::slices::vectorised(
        #[inline(always)]
        || {
            let pick = |bits: u64| if bits >= thr { scale } else { 0.0 };
            let mut pairs = out.chunks_exact_mut(2);
            for (j, pair) in (j0..).zip(&mut pairs) {
                let z = pair_bits(drop.seed, j);
                pair[0] = pick(z & 0xFFFF_FFFF);
                pair[1] = pick(z >> 32);
            }
            if let [last] = pairs.into_remainder() {
                *last = pick(pair_bits(drop.seed, tail) & 0xFFFF_FFFF);
            }
        },
    );
}

/// `drop`'s multipliers for `n` elements, f32, on the host: what every
/// path applies.
pub fn mask_values(drop: DropDraw, n: usize) -> Vec<f32> {
    let mut m = vec![0f32; n];
    m.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, out)| fill_mask(drop, c * CHUNK, out));
    m
}

/// `drop`'s multipliers in `x`'s shape, dtype and device.
pub fn mask(drop: DropDraw, x: &Tensor) -> Result<Tensor> {
    let m = mask_values(drop, x.elem_count());
    Ok(Tensor::from_vec(m, x.shape(), x.device())?.to_dtype(x.dtype())?)
}

/// `x` with dropout `drop` applied (`nn.Dropout` in training).
pub fn dropout(x: &Tensor, drop: DropDraw) -> Result<Tensor> {
    if fused_cpu(x) {
        // Counted here: the op's kernel also applies the backward's mask.
        trace::count("dropout.forward");
        return Ok(x.contiguous()?.apply_op1(DropoutOp { drop })?);
    }
    Ok((x * mask(drop, x)?)?)
}

/// `h + dropout(x)`, one pass each way on the CPU: a residual connection
/// after a dropped branch. `h` and `x` must have one shape and dtype.
pub fn dropout_add(h: &Tensor, x: &Tensor, drop: DropDraw) -> Result<Tensor> {
    if h.shape() != x.shape() {
        return Err(candle_core::Error::ShapeMismatchBinaryOp {
            lhs: h.shape().clone(),
            rhs: x.shape().clone(),
            op: "dropout_add",
        }
        .bt()
        .into());
    }
    if fused_cpu(h) && fused_cpu(x) {
        trace::count("dropout.forward");
        return Ok(h
            .contiguous()?
            .apply_op2(&x.contiguous()?, DropoutAdd { drop })?);
    }
    Ok((h + (x * mask(drop, x)?)?)?)
}

/// `y = base + x * mask` over the chunks (`base` `None`: no residual).
fn apply(drop: DropDraw, x: &[f32], base: Option<&[f32]>) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(c, (y, x))| {
            fill_mask(drop, c * CHUNK, y);
            match base {
                Some(h) => {
                    let h = &h[c * CHUNK..c * CHUNK + y.len()];
                    for ((y, x), h) in y.iter_mut().zip(x).zip(h) {
                        *y = h + x * *y;
                    }
                }
                None => {
                    for (y, x) in y.iter_mut().zip(x) {
                        *y *= x;
                    }
                }
            }
        });
    y
}

/// `x * mask`, with `x` the forward's input or the backward's gradient.
struct DropoutOp {
    drop: DropDraw,
}

impl CustomOp1 for DropoutOp {
    fn name(&self) -> &'static str {
        "redline-dropout"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32s(s, l, self.name())?;
        Ok((
            CpuStorage::F32(apply(self.drop, x, None)),
            l.shape().clone(),
        ))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        trace::count("dropout.backward");
        let g = grad.contiguous()?;
        Ok(Some(g.apply_op1_no_bwd(&DropoutOp { drop: self.drop })?))
    }
}

/// `h + x * mask`; its gradients are `grad` and `grad * mask`.
struct DropoutAdd {
    drop: DropDraw,
}

impl CustomOp2 for DropoutAdd {
    fn name(&self) -> &'static str {
        "redline-dropout-add"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (h, x) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        if h.len() != x.len() {
            bail!("{}: {} and {} elements", self.name(), h.len(), x.len())
        }
        Ok((
            CpuStorage::F32(apply(self.drop, x, Some(h))),
            l1.shape().clone(),
        ))
    }

    fn bwd(
        &self,
        _h: &Tensor,
        _x: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        trace::count("dropout.backward");
        let g = grad.contiguous()?;
        let dx = g.apply_op1_no_bwd(&DropoutOp { drop: self.drop })?;
        Ok((Some(g), Some(dx)))
    }
}

#[cfg(test)]
mod tests;
