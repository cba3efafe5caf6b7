//! Causal self-attention straight from the QKV projection's output:
//! `qkv (B, T, 3C)` in, the heads' outputs joined `(B, T, C)` out, ready
//! for the output projection (nanoGPT's `c_attn` ... `c_proj`).
//!
//! Through candle's ops the heads are cut out of `qkv` (`narrow`,
//! `reshape`, `transpose`, `contiguous`: three copies) and joined again
//! after (one more), and each of those has a backward: the gradients of
//! the three `narrow`s are each a `(B, T, 3C)` tensor of zeros with one
//! part filled (`cat`), then summed. On the CPU this op gathers a head's
//! rows into a thread's scratch, runs the fused kernel's
//! [`head_forward`]/[`head_backward`] on them and scatters the result
//! into `(B, T, C)` (or `dqkv (B, T, 3C)`): the same arithmetic on the
//! same values, so the outputs and gradients equal the split path's bit
//! for bit, without its passes over memory. Samples and heads run in
//! parallel on the compute threads. Elsewhere the heads are split and
//! joined with candle's ops around [`causal_attention_dropout`].

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Storage, Tensor};
use rayon::prelude::*;

use super::{
    causal_attention_dropout, check_dropout, head_backward, head_forward, DropDraw, HeadDrop,
    Scratch,
};
use crate::error::Result;
use crate::slices::{f32s, fused_cpu, half_cpu, keep, saved};
use redline_core::trace;

/// `softmax(q k^T / sqrt(d) + causal mask) v` for the `heads` heads of
/// `qkv (B, T, 3C)` (queries, keys, values side by side, each `C` wide
/// and split into heads of `C / heads`), joined back to `(B, T, C)`.
pub fn causal_self_attention(qkv: &Tensor, heads: usize, drop: Option<DropDraw>) -> Result<Tensor> {
    let (b, t, c3) = qkv.dims3()?;
    if heads == 0 || c3 == 0 || c3 % 3 != 0 || (c3 / 3) % heads != 0 {
        return Err(crate::Error::Shape(format!(
            "self-attention: {c3} projected features are not 3 x {heads} heads of one width"
        )));
    }
    let c = c3 / 3;
    let d = c / heads;
    check_dropout(drop)?;
    let op = || SelfAttention {
        dims: Dims { b, h: heads, t, d },
        lse: std::sync::Mutex::new(None),
        drop: drop.filter(|d| d.p > 0.0),
    };
    if fused_cpu(qkv) {
        return Ok(qkv.contiguous()?.apply_op1(op())?);
    }
    if half_cpu(qkv) {
        let wide = qkv.to_dtype(DType::F32)?.contiguous()?;
        return Ok(wide.apply_op1(op())?.to_dtype(qkv.dtype())?);
    }
    let [q, k, v] = split_heads(qkv, heads)?;
    let y = causal_attention_dropout(&q, &k, &v, drop)?;
    Ok(y.transpose(1, 2)?.contiguous()?.reshape((b, t, c))?)
}

/// The queries, keys and values of `qkv (B, T, 3C)`, each `(B, heads, T,
/// C / heads)`, contiguous (candle's ops: the path off the CPU, and
/// generation's).
pub fn split_heads(qkv: &Tensor, heads: usize) -> Result<[Tensor; 3]> {
    let (b, t, c3) = qkv.dims3()?;
    let (c, d) = (c3 / 3, c3 / 3 / heads.max(1));
    let part = |i: usize| -> Result<Tensor> {
        Ok(qkv
            .narrow(2, i * c, c)?
            .reshape((b, t, heads, d))?
            .transpose(1, 2)?
            .contiguous()?)
    };
    Ok([part(0)?, part(1)?, part(2)?])
}

/// Batch, heads, positions and head width.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    h: usize,
    t: usize,
    d: usize,
}

impl Dims {
    /// The model width `C`.
    fn c(self) -> usize {
        self.h * self.d
    }

    /// Head `hi`'s part `part` (0 queries, 1 keys, 2 values) of one
    /// sample's `(T, width)` rows, gathered into `(T, d)`.
    fn gather(self, rows: &[f32], width: usize, offset: usize, out: &mut Vec<f32>) {
        out.clear();
        for r in rows.chunks_exact(width) {
            out.extend_from_slice(&r[offset..offset + self.d]);
        }
    }

    /// `(T, d)` `src` into columns `offset..offset + d` of `(T, width)` rows.
    fn scatter(self, src: &[f32], rows: &mut [f32], width: usize, offset: usize) {
        for (r, s) in rows.chunks_exact_mut(width).zip(src.chunks_exact(self.d)) {
            r[offset..offset + self.d].copy_from_slice(s);
        }
    }
}

/// A thread's gathered operands and its block scratch.
struct Work {
    sc: Scratch,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    go: Vec<f32>,
}

impl Work {
    fn new() -> Self {
        Self {
            sc: Scratch::new(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            o: Vec::new(),
            go: Vec::new(),
        }
    }

    /// Head `hi`'s queries, keys and values of one sample's `qkv` rows.
    fn gather_qkv(&mut self, dims: Dims, qkv: &[f32], hi: usize) {
        let (c, off) = (dims.c(), hi * dims.d);
        dims.gather(qkv, 3 * c, off, &mut self.q);
        dims.gather(qkv, 3 * c, c + off, &mut self.k);
        dims.gather(qkv, 3 * c, 2 * c + off, &mut self.v);
    }
}

/// The op on `qkv`; the forward leaves each row's log-sum-exp.
struct SelfAttention {
    dims: Dims,
    lse: std::sync::Mutex<Option<Vec<f32>>>,
    drop: Option<DropDraw>,
}

/// The dropout of head `hi` of sample `bi` (heads flattened `B * H`, as
/// the split path's).
fn head_drop(drop: Option<DropDraw>, dims: Dims, bi: usize, hi: usize) -> Option<HeadDrop> {
    drop.map(|drop| HeadDrop {
        drop,
        hd: bi * dims.h + hi,
    })
}

impl CustomOp1 for SelfAttention {
    fn name(&self) -> &'static str {
        "redline-causal-self-attention"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = "self-attention";
        trace::count("attention.forward");
        let qkv = f32s(s, l, op)?;
        let Dims { b, h, t, d } = self.dims;
        let c = h * d;
        if qkv.len() != b * t * 3 * c {
            bail!(
                "{op}: qkv holds {} values, not {b} x {t} x {}",
                qkv.len(),
                3 * c
            )
        }
        let mut y = vec![0f32; b * t * c];
        let mut lse = vec![0f32; b * h * t];
        y.par_chunks_mut((t * c).max(1))
            .zip(lse.par_chunks_mut((h * t).max(1)))
            .enumerate()
            .try_for_each(|(bi, (y, lse))| -> candle_core::Result<()> {
                let rows = &qkv[bi * t * 3 * c..(bi + 1) * t * 3 * c];
                let outs = lse
                    .par_chunks_mut(t.max(1))
                    .enumerate()
                    .map_init(Work::new, |w, (hi, lse)| {
                        w.gather_qkv(self.dims, rows, hi);
                        w.o.clear();
                        w.o.resize(t * d, 0.0);
                        head_forward(
                            (&w.q, &w.k, &w.v),
                            (&mut w.o, lse),
                            (t, d),
                            &mut w.sc,
                            head_drop(self.drop, self.dims, bi, hi),
                        )?;
                        // Handed out whole (no copy); the next head allocates.
                        Ok(std::mem::take(&mut w.o))
                    })
                    .collect::<candle_core::Result<Vec<_>>>()?;
                for (hi, o) in outs.iter().enumerate() {
                    self.dims.scatter(o, y, c, hi * d);
                }
                Ok(())
            })?;
        keep(&self.lse, lse);
        Ok((CpuStorage::F32(y), Shape::from((b, t, c))))
    }

    fn bwd(&self, qkv: &Tensor, y: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        trace::count("attention.backward");
        let bwd = SelfAttentionBwd {
            dims: self.dims,
            drop: self.drop,
            lse: saved(&self.lse, "self-attention backward")?,
            y: y.clone(),
        };
        Ok(Some(grad.contiguous()?.apply_op2_no_bwd(qkv, &bwd)?))
    }
}

/// `(dY, qkv) -> dqkv`, with the forward's output and log-sum-exp held.
struct SelfAttentionBwd {
    dims: Dims,
    drop: Option<DropDraw>,
    lse: Vec<f32>,
    y: Tensor,
}

impl CustomOp2 for SelfAttentionBwd {
    fn name(&self) -> &'static str {
        "redline-causal-self-attention-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let op = "self-attention backward";
        let (gy, qkv) = (f32s(s1, l1, op)?, f32s(s2, l2, op)?);
        let (ys, yl) = self.y.storage_and_layout();
        let Storage::Cpu(ys) = &*ys else {
            bail!("{op}: the saved output is not on the CPU")
        };
        let y = f32s(ys, yl, op)?;
        let Dims { b, h, t, d } = self.dims;
        let c = h * d;
        if qkv.len() != b * t * 3 * c
            || gy.len() != b * t * c
            || y.len() != gy.len()
            || self.lse.len() != b * h * t
        {
            bail!("{op}: inputs do not hold {b} x {t} rows of {h} heads of {d}")
        }
        let mut dqkv = vec![0f32; qkv.len()];
        dqkv.par_chunks_mut((t * 3 * c).max(1))
            .enumerate()
            .try_for_each(|(bi, dst)| -> candle_core::Result<()> {
                // Sample `bi`'s rows of `w` values.
                let at = |w: usize| bi * t * w..(bi + 1) * t * w;
                let (qr, yr, gr) = (&qkv[at(3 * c)], &y[at(c)], &gy[at(c)]);
                let grads = (0..h)
                    .into_par_iter()
                    .map_init(Work::new, |w, hi| {
                        w.gather_qkv(self.dims, qr, hi);
                        self.dims.gather(yr, c, hi * d, &mut w.o);
                        self.dims.gather(gr, c, hi * d, &mut w.go);
                        let mut g = vec![0f32; 3 * t * d];
                        let (dq, rest) = g.split_at_mut(t * d);
                        let (dk, dv) = rest.split_at_mut(t * d);
                        let hd = bi * h + hi;
                        head_backward(
                            (&w.q, &w.k, &w.v),
                            (&w.o, &self.lse[hd * t..(hd + 1) * t], &w.go),
                            (dq, dk, dv),
                            (t, d),
                            &mut w.sc,
                            head_drop(self.drop, self.dims, bi, hi),
                        )?;
                        Ok(g)
                    })
                    .collect::<candle_core::Result<Vec<_>>>()?;
                for (hi, g) in grads.iter().enumerate() {
                    for (part, gp) in g.chunks_exact((t * d).max(1)).enumerate() {
                        self.dims.scatter(gp, dst, 3 * c, part * c + hi * d);
                    }
                }
                Ok(())
            })?;
        Ok((CpuStorage::F32(dqkv), l2.shape().clone()))
    }
}

#[cfg(test)]
mod tests;
