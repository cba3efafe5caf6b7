//! Causal scaled dot-product attention as one fused op (PyTorch's
//! `F.scaled_dot_product_attention(q, k, v, is_causal=True)`), forward and
//! backward, on `(B, H, T, D)` queries, keys and values.
//!
//! The CPU kernel never holds a `T x T` score matrix: it works in blocks of
//! 64 queries against blocks of up to 256 keys (FlashAttention's online
//! softmax across key blocks; the backward also a query block at a time,
//! keys cut at the diagonal), each block's products on the fp32 GEMM,
//! keeping a block of scores per thread and each row's log-sum-exp (`T`
//! values per head) for the backward. Its memory grows with `T`, not
//! `T^2`. Heads run in parallel on the compute threads.
//!
//! On a GPU (the `cuda` feature) the same blocked algorithm runs as
//! Redline's own kernels (`cuda/attention.cu`), on f32, bf16 or f16 inputs
//! in their own type, heads up to 64 wide; its backward sums in a fixed
//! order (no atomics), so runs repeat bit for bit.
//!
//! The softmax is always computed in fp32: 16-bit inputs (`bf16-mixed`) are
//! widened for the CPU kernel and its output narrowed back, as autocast runs
//! attention's softmax in fp32. Elsewhere (other devices, other dtypes,
//! wider heads) the op is built from candle's ops (matmul, mask, softmax in
//! fp32), which hold the score matrix.

use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Shape, Storage, Tensor};
use rayon::prelude::*;

use crate::error::Result;
use crate::gemm::Mat;
use crate::slices::{f32s, keep, saved};
use redline_core::trace;

mod packed;
pub use packed::{causal_self_attention, split_heads};

/// `softmax(q k^T / sqrt(D) + causal mask) v` for `q, k, v (B, H, T, D)`:
/// `(B, H, T, D)`. Query `i` attends to keys `0..=i`.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    causal_attention_dropout(q, k, v, None)
}

/// Dropout of attention probabilities (PyTorch's `dropout_p` of
/// `scaled_dot_product_attention` in training) is a [`DropDraw`]: each
/// probability is kept with chance `1 - p` and scaled by `1 / (1 - p)`,
/// after the softmax. The mask is a function of `seed` and the (head,
/// query, key) position ([`keeps`]), so the backward makes the same mask
/// again and nothing of size `T x T` is stored.
pub use crate::dropout::DropDraw;

/// Whether dropout `drop` keeps the probability of query `i` on key `j` in
/// head `hd` (of the flattened `B * H`) of sequences of `t`.
#[inline(always)]
pub fn keeps(drop: DropDraw, hd: usize, t: usize, i: usize, j: usize) -> bool {
    let at = ((hd as u64).wrapping_mul(t as u64) + i as u64)
        .wrapping_mul(t as u64)
        .wrapping_add(j as u64);
    // splitmix64 of the seed and the position: 24 uniform bits.
    let mut z = drop.seed ^ at.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) as f32) * (1.0 / (1u64 << 24) as f32) >= drop.p
}

/// The keep mask of `drop` for `heads` heads of `t` positions, scaled by
/// `1 / (1 - p)`: `(heads, t, t)` fp32 (the reference path's, and tests').
pub fn dropout_mask(
    drop: DropDraw,
    heads: usize,
    t: usize,
    device: &candle_core::Device,
) -> Result<Tensor> {
    let scale = 1.0 / (1.0 - drop.p);
    let v: Vec<f32> = (0..heads * t * t)
        .map(|n| match keeps(drop, n / (t * t), t, (n / t) % t, n % t) {
            true => scale,
            false => 0.0,
        })
        .collect();
    Ok(Tensor::from_vec(v, (heads, t, t), device)?)
}

/// [`causal_attention`] with dropout of the probabilities when `drop` is
/// given (training).
pub fn causal_attention_dropout(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    drop: Option<DropDraw>,
) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    if k.dims() != q.dims() || v.dims() != q.dims() {
        return Err(crate::Error::Shape(format!(
            "attention: queries {:?}, keys {:?} and values {:?} must have one shape (B, H, T, D)",
            q.dims(),
            k.dims(),
            v.dims()
        )));
    }
    let dtype = q.dtype();
    check_dropout(drop)?;
    let drop = drop.filter(|d| d.p > 0.0);
    if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
        return generic_dropout(q, k, v, drop);
    }
    let op = Attention {
        dims: (b * h, t, d),
        lse: std::sync::Mutex::new(None),
        drop,
    };
    if gpu_kernels_take(q, k, v) {
        // Redline's GPU kernels take the inputs in their own type.
        return Ok(q
            .contiguous()?
            .apply_op3(&k.contiguous()?, &v.contiguous()?, op)?);
    }
    if !q.device().is_cpu() {
        return generic_dropout(q, k, v, drop);
    }
    // The CPU kernel is fp32: 16-bit inputs widened, the output narrowed back.
    let wide = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(DType::F32)?.contiguous()?) };
    let out = wide(q)?.apply_op3(&wide(k)?, &wide(v)?, op)?;
    Ok(out.to_dtype(dtype)?)
}

/// An error unless `drop`'s chance is in `[0, 1)`.
fn check_dropout(drop: Option<DropDraw>) -> Result<()> {
    match drop {
        Some(dr) if !(0.0..1.0).contains(&dr.p) => Err(crate::Error::Shape(format!(
            "attention dropout {}: must be in [0, 1)",
            dr.p
        ))),
        _ => Ok(()),
    }
}

/// Whether Redline's GPU kernels take `(B, H, T, D)` inputs of one dtype:
/// the `cuda` build, a CUDA device, heads up to 64 wide and at most 65,535
/// of them.
fn gpu_kernels_take(q: &Tensor, k: &Tensor, v: &Tensor) -> bool {
    #[cfg(feature = "cuda")]
    {
        use crate::cuda::attention::{MAX_HEADS, MAX_HEAD_DIM};
        let Ok((b, h, t, d)) = q.dims4() else {
            return false;
        };
        q.device().is_cuda()
            && (1..=MAX_HEAD_DIM).contains(&d)
            && (1..=MAX_HEADS).contains(&(b * h))
            && t > 0
            && k.dtype() == q.dtype()
            && v.dtype() == q.dtype()
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (q, k, v);
        false
    }
}

/// The op built from candle's ops: the reference the fused kernel is held
/// to, and the path off the CPU. The scores are fp32 whatever the inputs.
pub fn generic(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    generic_dropout(q, k, v, None)
}

/// [`generic`] with the probabilities dropped by [`dropout_mask`].
pub fn generic_dropout(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    drop: Option<DropDraw>,
) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let dtype = q.dtype();
    let scale = 1.0 / (d as f64).sqrt();
    let f = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(DType::F32)?.contiguous()?) };
    let scores = (f(q)?.matmul(&f(k)?.t()?.contiguous()?)? * scale)?;
    // -inf above the diagonal: key j > query i is never seen.
    let mask: Vec<f32> = (0..t * t)
        .map(|n| {
            if n % t > n / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), q.device())?;
    let mut p = softmax_last(&scores.broadcast_add(&mask)?)?;
    if let Some(dr) = drop {
        p = (p * dropout_mask(dr, b * h, t, q.device())?.reshape((b, h, t, t))?)?;
    }
    Ok(p.matmul(&f(v)?)?.to_dtype(dtype)?)
}

/// Softmax over the last dimension, with the row's max taken out first.
fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let last = x.rank() - 1;
    let max = x.max_keepdim(last)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    Ok(e.broadcast_div(&e.sum_keepdim(last)?)?)
}

/// The fused op: `(heads, T, D)` of the flattened `(B*H, T, D)` inputs, and
/// each row's log-sum-exp, left by the forward for the backward.
struct Attention {
    dims: (usize, usize, usize),
    lse: std::sync::Mutex<Option<Lse>>,
    drop: Option<DropDraw>,
}

/// Each row's log-sum-exp, where the forward ran.
#[derive(Clone)]
enum Lse {
    Host(Vec<f32>),
    #[cfg(feature = "cuda")]
    Device(std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>>),
}

/// The dropout of one head: its mask's parameters and the head's index.
#[derive(Clone, Copy)]
struct HeadDrop {
    drop: DropDraw,
    hd: usize,
}

impl HeadDrop {
    /// The factors (0, or 1/(1-p)) that query `i`'s probabilities on keys
    /// `j0..j0 + out.len()` are multiplied by, as [`keeps`] decides them,
    /// in one vectorised pass (its 64-bit multiplies take AVX-512DQ's
    /// lanes where present).
    fn row(self, t: usize, i: usize, j0: usize, out: &mut [f32]) {
        let scale = 1.0 / (1.0 - self.drop.p);
        crate::slices::vectorised(
            #[inline(always)]
            || {
                for (c, o) in out.iter_mut().enumerate() {
                    *o = if keeps(self.drop, self.hd, t, i, j0 + c) {
                        scale
                    } else {
                        0.0
                    };
                }
            },
        );
    }
}

/// Query rows per block.
const BLOCK: usize = 64;
/// Key rows per block: a block's scores (64 x 256 fp32, 64 KiB) and its
/// products stay in L2, each product is one GEMM, and up to T = 256 a
/// query block's softmax runs once over its whole row (no rescaling).
const KEYS: usize = 256;

/// `dst (m x n) [+]= a (m x k) b (k x n)` on the fp32 GEMM; the shapes are
/// this file's own, so a refusal is a bug, said as one.
fn gemm(dst: &mut [f32], a: Mat<'_>, b: Mat<'_>, accumulate: bool) -> candle_core::Result<()> {
    if crate::gemm::matmul(dst, a, b, accumulate) {
        Ok(())
    } else {
        bail!("attention: a block product's shapes do not fit (a bug)")
    }
}

/// Scratch of one thread: a block of scores and one of their gradients,
/// each grown to what the thread's blocks take (the forward never touches
/// the gradients', runs without dropout never the dropout's).
struct Scratch {
    s: Vec<f32>,
    dp: Vec<f32>,
    /// The dropped probabilities (with dropout).
    pd: Vec<f32>,
    /// The dropout's factors of a block (with dropout).
    f: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

impl Scratch {
    fn new() -> Self {
        Self {
            s: Vec::new(),
            dp: Vec::new(),
            pd: Vec::new(),
            f: Vec::new(),
            m: vec![0.0; BLOCK],
            l: vec![0.0; BLOCK],
        }
    }
}

/// The first `n` elements of `buf`, grown to hold them.
fn room(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// One head's forward, a block of queries at a time against the key
/// blocks up to its diagonal (FlashAttention's online softmax): `o` and
/// each row's log-sum-exp `lse`; only a block of scores as scratch.
fn head_forward(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (o, lse): (&mut [f32], &mut [f32]),
    (t, d): (usize, usize),
    sc: &mut Scratch,
    drop: Option<HeadDrop>,
) -> candle_core::Result<()> {
    let scale = 1.0 / (d as f32).sqrt();
    for q0 in (0..t).step_by(BLOCK) {
        let rows = BLOCK.min(t - q0);
        let (m, l) = (&mut sc.m[..rows], &mut sc.l[..rows]);
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        let acc = &mut o[q0 * d..(q0 + rows) * d];
        acc.fill(0.0);
        let qb = Mat::new(&q[q0 * d..(q0 + rows) * d], rows, d);
        // Keys up to the block's last query.
        for k0 in (0..q0 + rows).step_by(KEYS) {
            let cols = KEYS.min(q0 + rows - k0);
            let s = room(&mut sc.s, rows * cols);
            gemm(
                s,
                qb,
                Mat::new(&k[k0 * d..(k0 + cols) * d], cols, d).t(),
                false,
            )?;
            for r in 0..rows {
                let row = &mut s[r * cols..(r + 1) * cols];
                // Keys k0 + c after query q0 + r are masked out: 0 after
                // the exponential.
                let seen = (q0 + r + 1).saturating_sub(k0).min(cols);
                let (live, masked) = row.split_at_mut(seen);
                masked.fill(0.0);
                // The largest scaled score (scaling by a positive factor
                // keeps the order, so this is the max of the scaled row).
                let max = m[r].max(crate::fast_exp::row_max(live) * scale);
                let alpha = (m[r] - max).exp();
                let sum = crate::fast_exp::exp_row(live, scale, max);
                l[r] = l[r] * alpha + sum;
                m[r] = max;
                acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= alpha);
                // The sum normalises all probabilities; only kept ones
                // (scaled) reach the output.
                if let Some(hd) = drop {
                    let f = room(&mut sc.f, seen);
                    hd.row(t, q0 + r, k0, f);
                    live.iter_mut().zip(&*f).for_each(|(x, f)| *x *= f);
                }
            }
            // acc += P V_block
            gemm(
                acc,
                Mat::new(s, rows, cols),
                Mat::new(&v[k0 * d..(k0 + cols) * d], cols, d),
                true,
            )?;
        }
        for r in 0..rows {
            let inv = 1.0 / l[r];
            acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= inv);
            lse[q0 + r] = m[r] + l[r].ln();
        }
    }
    Ok(())
}

/// One head's backward, FlashAttention's: for each block of queries, the
/// blocks of keys up to its last query; the probabilities recomputed
/// from `lse`, `dq` summed across key blocks, `dk` and `dv` across query
/// blocks. Scratch: a block of probabilities and one of their gradients.
fn head_backward(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (o, lse, go): (&[f32], &[f32], &[f32]),
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
    (t, d): (usize, usize),
    sc: &mut Scratch,
    drop: Option<HeadDrop>,
) -> candle_core::Result<()> {
    let scale = 1.0 / (d as f32).sqrt();
    dq.fill(0.0);
    dk.fill(0.0);
    dv.fill(0.0);
    // D_i = dO_i . O_i: the softmax's own term of its gradient.
    let di: Vec<f32> = (0..t)
        .map(|i| {
            let (g, oi) = (&go[i * d..(i + 1) * d], &o[i * d..(i + 1) * d]);
            g.iter().zip(oi).map(|(a, b)| a * b).sum()
        })
        .collect();
    for q0 in (0..t).step_by(BLOCK) {
        let rows = BLOCK.min(t - q0);
        let qb = Mat::new(&q[q0 * d..(q0 + rows) * d], rows, d);
        let gb = Mat::new(&go[q0 * d..(q0 + rows) * d], rows, d);
        // Key blocks up to the block's last query.
        for k0 in (0..q0 + rows).step_by(KEYS) {
            let cols = KEYS.min(q0 + rows - k0);
            let kb = Mat::new(&k[k0 * d..(k0 + cols) * d], cols, d);
            let vb = Mat::new(&v[k0 * d..(k0 + cols) * d], cols, d);
            let p = room(&mut sc.s, rows * cols);
            gemm(p, qb, kb.t(), false)?;
            for r in 0..rows {
                // Keys k0 + c up to query q0 + r are seen; the rest are 0.
                let seen = (q0 + r + 1).saturating_sub(k0).min(cols);
                let (row, masked) = p[r * cols..(r + 1) * cols].split_at_mut(seen);
                crate::fast_exp::exp_row(row, scale, lse[q0 + r]);
                masked.fill(0.0);
            }
            // dV_block += P_dropped^T dO_block
            let pd: &[f32] = match drop {
                None => p,
                Some(hd) => {
                    let (f, pd) = (room(&mut sc.f, rows * cols), room(&mut sc.pd, rows * cols));
                    for (r, f) in f.chunks_exact_mut(cols).enumerate() {
                        hd.row(t, q0 + r, k0, f);
                    }
                    pd.iter_mut()
                        .zip(&*p)
                        .zip(&*f)
                        .for_each(|((o, p), f)| *o = p * f);
                    pd
                }
            };
            gemm(
                &mut dv[k0 * d..(k0 + cols) * d],
                Mat::new(pd, rows, cols).t(),
                gb,
                true,
            )?;
            // dP = mask (dO_block V_block^T); dS = P (dP - D), scaled for
            // dQ and dK (D = dO . O holds with dropout too: O = P_dropped V)
            let ds = room(&mut sc.dp, rows * cols);
            gemm(ds, gb, vb.t(), false)?;
            for r in 0..rows {
                let base = di[q0 + r];
                let (row, prow) = (
                    &mut ds[r * cols..(r + 1) * cols],
                    &p[r * cols..(r + 1) * cols],
                );
                match drop {
                    None => {
                        for (x, pv) in row.iter_mut().zip(prow) {
                            *x = scale * pv * (*x - base);
                        }
                    }
                    Some(_) => {
                        let f = &sc.f[r * cols..(r + 1) * cols];
                        for ((x, pv), f) in row.iter_mut().zip(prow).zip(f) {
                            *x = scale * pv * (*x * f - base);
                        }
                    }
                }
            }
            let ds = Mat::new(ds, rows, cols);
            gemm(&mut dq[q0 * d..(q0 + rows) * d], ds, kb, true)?;
            gemm(&mut dk[k0 * d..(k0 + cols) * d], ds.t(), qb, true)?;
        }
    }
    Ok(())
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "redline-causal-attention"
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
        let op = "attention";
        trace::count("attention.forward");
        let (q, k, v) = (f32s(s1, l1, op)?, f32s(s2, l2, op)?, f32s(s3, l3, op)?);
        let (heads, t, d) = self.dims;
        let n = t * d;
        if q.len() != heads * n || k.len() != q.len() || v.len() != q.len() {
            bail!("{op}: inputs do not hold {heads} heads of {t} x {d}")
        }
        let mut o = vec![0f32; heads * n];
        let mut lse = vec![0f32; heads * t];
        o.par_chunks_mut(n.max(1))
            .zip(lse.par_chunks_mut(t.max(1)))
            .enumerate()
            .try_for_each_init(Scratch::new, |sc, (hd, (o, lse))| {
                let s = hd * n..(hd + 1) * n;
                let drop = self.drop.map(|drop| HeadDrop { drop, hd });
                head_forward(
                    (&q[s.clone()], &k[s.clone()], &v[s]),
                    (o, lse),
                    (t, d),
                    sc,
                    drop,
                )
            })?;
        keep(&self.lse, Lse::Host(lse));
        Ok((CpuStorage::F32(o), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        trace::count("attention.forward");
        let (o, lse) =
            crate::cuda::attention::forward((s1, l1), (s2, l2), (s3, l3), self.dims, self.drop)?;
        keep(&self.lse, Lse::Device(std::sync::Arc::new(lse)));
        Ok((o, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        trace::count("attention.backward");
        let bwd = AttentionBwd {
            dims: self.dims,
            drop: self.drop,
            lse: saved(&self.lse, "attention backward")?,
            v: v.clone(),
            o: o.clone(),
        };
        let grad = grad.contiguous()?;
        let flat = grad.apply_op3_no_bwd(q, k, &bwd)?;
        let n = q.elem_count();
        let part = |i: usize| flat.narrow(0, i * n, n)?.reshape(q.shape());
        Ok((Some(part(0)?), Some(part(1)?), Some(part(2)?)))
    }
}

/// The backward kernel: inputs `dO, q, k`, with `v`, `o` and the forward's
/// log-sum-exp held; output `[dq | dk | dv]` flat.
struct AttentionBwd {
    dims: (usize, usize, usize),
    drop: Option<DropDraw>,
    lse: Lse,
    v: Tensor,
    o: Tensor,
}

/// The f32 slice of a held CPU tensor.
fn held<'a>(storage: &'a Storage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    let Storage::Cpu(s) = storage else {
        bail!("{op}: a saved tensor is not on the CPU")
    };
    f32s(s, layout, op)
}

impl CustomOp3 for AttentionBwd {
    fn name(&self) -> &'static str {
        "redline-causal-attention-bwd"
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
        let op = "attention backward";
        let (go, q, k) = (f32s(s1, l1, op)?, f32s(s2, l2, op)?, f32s(s3, l3, op)?);
        let (vs, vl) = self.v.storage_and_layout();
        let (os, ol) = self.o.storage_and_layout();
        let (v, o) = (held(&vs, vl, op)?, held(&os, ol, op)?);
        // One arm without the `cuda` feature.
        #[allow(clippy::infallible_destructuring_match)]
        let lse = match &self.lse {
            Lse::Host(l) => l,
            #[cfg(feature = "cuda")]
            Lse::Device(_) => bail!("{op}: the forward ran on the GPU, the backward on the CPU"),
        };
        let (heads, t, d) = self.dims;
        let n = t * d;
        let total = heads * n;
        if [go.len(), q.len(), k.len(), v.len(), o.len()]
            .iter()
            .any(|&l| l != total)
            || lse.len() != heads * t
        {
            bail!("{op}: inputs do not hold {heads} heads of {t} x {d}")
        }
        let mut out = vec![0f32; 3 * total];
        let (dq, rest) = out.split_at_mut(total);
        let (dk, dv) = rest.split_at_mut(total);
        dq.par_chunks_mut(n.max(1))
            .zip(dk.par_chunks_mut(n.max(1)))
            .zip(dv.par_chunks_mut(n.max(1)))
            .enumerate()
            .try_for_each_init(Scratch::new, |sc, (hd, ((dq, dk), dv))| {
                let s = hd * n..(hd + 1) * n;
                head_backward(
                    (&q[s.clone()], &k[s.clone()], &v[s.clone()]),
                    (&o[s.clone()], &lse[hd * t..(hd + 1) * t], &go[s]),
                    (dq, dk, dv),
                    (t, d),
                    sc,
                    self.drop.map(|drop| HeadDrop { drop, hd }),
                )
            })?;
        Ok((CpuStorage::F32(out), Shape::from(3 * total)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let op = "attention backward";
        let Lse::Device(lse) = &self.lse else {
            bail!("{op}: the forward ran on the CPU, the backward on the GPU")
        };
        let (vs, vl) = self.v.storage_and_layout();
        let (os, ol) = self.o.storage_and_layout();
        let (Storage::Cuda(vs), Storage::Cuda(os)) = (&*vs, &*os) else {
            bail!("{op}: a saved tensor is not on the GPU")
        };
        let out = crate::cuda::attention::backward(
            (s1, l1),
            (s2, l2),
            (s3, l3),
            (vs, vl),
            (os, ol),
            lse,
            self.dims,
            self.drop,
        )?;
        let (heads, t, d) = self.dims;
        Ok((out, Shape::from(3 * heads * t * d)))
    }
}

#[cfg(test)]
mod tests;
