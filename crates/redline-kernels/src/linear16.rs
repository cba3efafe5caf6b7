//! The fully connected layer in a 16-bit compute dtype on the CPU
//! (`bf16-mixed`, `16-mixed`), as one op over the fp32 master weights, or
//! over bf16 weights themselves (`bf16-true`):
//! `y16 = round16(round16(x) round16(W)^T + round16(b))` (ReLU'd when asked),
//! the product accumulated in fp32 as a 16-bit GEMM accumulates.
//!
//! Nothing but 16-bit tensors is kept for the backward: the input as it
//! came (a 16-bit activation, or the f32 batch) and the 16-bit output. The
//! rounded weights are made in scratch memory by the forward and again by
//! the backward, never held between them, so a step holds half fp32's
//! activation memory and no weight copies. The backward writes dW and db,
//! rounded to the 16-bit type as autocast's 16-bit weight gradients are
//! (fp16: inf above 65504, which the loss scaler sees), into the master
//! weights' fp32 gradient buffers, and returns dx in the input's dtype.
//! 16-bit weights (`bf16-true`) get dW and db in their buffers as tensors
//! of their dtype.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Shape, Storage, Tensor};

use crate::error::Result;
use crate::gemm::Mat;
use crate::gemm_bf16::{matmul_in, pre_rounding};
use crate::grad::ParamBuffers;
use crate::half16::{round_in_place, rounded, store, tensor, widen};
use crate::linear::{concurrent, dims, forward_f32};
use redline_core::trace;

/// `x (B, in) -> (B, out)` in `dtype` (bf16 or f16) over `w (out, in)` and
/// `b (out)`: fp32 master weights or weights of `dtype`, whose gradients go
/// to `buffers`; ReLU when `relu`.
pub(crate) fn linear16(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    relu: bool,
    (dtype, gemm): (DType, DType),
    buffers: ParamBuffers,
) -> Result<Tensor> {
    let op = Linear16 {
        relu,
        dtype,
        gemm,
        input_grad: x.track_op(),
        layer: trace::current_layer(),
        buffers,
    };
    Ok(x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, op)?)
}

struct Linear16 {
    relu: bool,
    dtype: DType,
    /// The GEMMs' product dtype ([`crate::gemm_bf16::route`]).
    gemm: DType,
    input_grad: bool,
    layer: Option<Arc<str>>,
    buffers: ParamBuffers,
}

impl CustomOp3 for Linear16 {
    fn name(&self) -> &'static str {
        "redline-linear16"
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
        let (bsz, fan_in, fan_out) = dims(l1, l2, l3)?;
        trace::count("linear.forward");
        let op = "linear (16-bit)";
        let x = rounded(s1, l1, pre_rounding(self.dtype, self.gemm), op)?;
        let w = rounded(s2, l2, pre_rounding(self.dtype, self.gemm), op)?;
        let b = rounded(s3, l3, self.dtype, op)?;
        let y = forward_f32(self.gemm, &x, &w, &b, (bsz, fan_in, fan_out), self.relu)?;
        Ok((store(y, self.dtype)?, Shape::from((bsz, fan_out))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        y: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = trace::backward(self.layer.as_ref(), "linear");
        trace::count("linear.backward");
        let op = Linear16Bwd {
            relu: self.relu.then(|| y.clone()),
            dtype: self.dtype,
            gemm: self.gemm,
            x_dtype: x.dtype(),
            input_grad: self.input_grad,
            bsz: x.dims2()?.0,
            buffers: self.buffers.clone(),
        };
        let flat = grad.contiguous()?.apply_op3_no_bwd(x, w, &op)?;
        let dx = self
            .input_grad
            .then(|| flat.reshape(x.shape()))
            .transpose()?;
        Ok((dx, None, None))
    }
}

/// Backward kernel: inputs `g (B, out)` (16-bit), `x`, `w`; output dx in
/// x's dtype (empty when the input needs no gradient); dW and db, rounded
/// to the 16-bit type, into the gradient buffers (in fp32 for fp32 master
/// weights, as tensors of their dtype for 16-bit weights).
struct Linear16Bwd {
    relu: Option<Tensor>,
    dtype: DType,
    gemm: DType,
    x_dtype: DType,
    input_grad: bool,
    bsz: usize,
    buffers: ParamBuffers,
}

/// Adds `src` (or writes it, on a step's first write) into a gradient buffer.
fn add_into(dst: &mut [f32], src: &[f32], accumulate: bool) {
    if accumulate {
        dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
    } else {
        dst.copy_from_slice(src);
    }
}

impl CustomOp3 for Linear16Bwd {
    fn name(&self) -> &'static str {
        "redline-linear16-bwd"
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
        let op = "linear backward (16-bit)";
        let (fan_out, fan_in) = l3.shape().dims2()?;
        let bsz = self.bsz;
        let mut g = widen(s1, l1, op)?.into_owned();
        let x = rounded(s2, l2, pre_rounding(self.dtype, self.gemm), op)?;
        if g.len() != bsz * fan_out || x.len() != bsz * fan_in {
            bail!("{op}: gradient/input sizes do not fit")
        }
        if let Some(y) = &self.relu {
            let (storage, layout) = y.storage_and_layout();
            let Storage::Cpu(ys) = &*storage else {
                bail!("{op}: the layer output is not on the CPU")
            };
            let y = widen(ys, layout, op)?;
            if y.len() != g.len() {
                bail!("{op}: output and gradient sizes do not fit")
            }
            g.iter_mut()
                .zip(y.iter())
                .for_each(|(g, y)| *g = if *y > 0.0 { *g } else { 0.0 });
        }
        // dW and db, and dx, are independent: on two threads at once where
        // there are two and the products are large enough to pay for it
        // ([`crate::linear::concurrent`]).
        let g = &g;
        let grads = || -> candle_core::Result<(Vec<f32>, Vec<f32>)> {
            // dW (out, in) = g^T (out, B) x (B, in), rounded as a 16-bit GEMM's output.
            let mut dw = vec![0f32; fan_out * fan_in];
            if !matmul_in(
                self.gemm,
                &mut dw,
                Mat::new(g, bsz, fan_out).t(),
                Mat::new(&x, bsz, fan_in),
                false,
            ) {
                bail!("{op}: gemm shapes do not fit")
            }
            round_in_place(&mut dw, self.dtype);
            let mut db = vec![0f32; fan_out];
            for row in g.chunks_exact(fan_out) {
                db.iter_mut().zip(row).for_each(|(acc, v)| *acc += v);
            }
            round_in_place(&mut db, self.dtype);
            Ok((dw, db))
        };
        let input = || -> candle_core::Result<Option<Vec<f32>>> {
            if !self.input_grad {
                return Ok(None);
            }
            // dx (B, in) = g (B, out) x round16(W) (out, in)
            let w = rounded(s3, l3, pre_rounding(self.dtype, self.gemm), op)?;
            let mut dx = vec![0f32; bsz * fan_in];
            if !matmul_in(
                self.gemm,
                &mut dx,
                Mat::new(g, bsz, fan_out),
                Mat::new(&w, fan_out, fan_in),
                false,
            ) {
                bail!("{op}: gemm shapes do not fit")
            }
            // An f32 input was cast to 16 bits by autocast: its gradient comes
            // back through that cast, rounded, then widened.
            round_in_place(&mut dx, self.dtype);
            Ok(Some(dx))
        };
        let (params, dx) = if self.input_grad && concurrent(bsz * fan_in * fan_out) {
            rayon::join(grads, input)
        } else {
            (grads(), input())
        };
        let ((dw, db), dx) = (params?, dx?);
        let (wbuf, bbuf) = &self.buffers;
        if s3.dtype() == DType::F32 {
            // fp32 master weights: into their host buffers.
            bbuf.write(fan_out, |dst, acc| add_into(dst, &db, acc));
            wbuf.write(dw.len(), |dst, acc| add_into(dst, &dw, acc));
        } else {
            // 16-bit weights: as tensors of their dtype.
            let dw = tensor(dw, (fan_out, fan_in), s3.dtype())?;
            wbuf.absorb(&dw).map_err(candle_core::Error::wrap)?;
            let db = tensor(db, fan_out, s3.dtype())?;
            bbuf.absorb(&db).map_err(candle_core::Error::wrap)?;
        }
        let Some(dx) = dx else {
            return Ok((store(Vec::new(), self.x_dtype)?, Shape::from(0)));
        };
        let n = dx.len();
        Ok((store(dx, self.x_dtype)?, Shape::from(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad::Param;
    use crate::half16::bits;
    use candle_core::{Device, Var};

    fn param(t: Tensor) -> Result<Param> {
        Ok(Param::new(Var::from_tensor(&t)?))
    }

    /// The op equals the cast-op construction it replaces (candle's casts
    /// around the fp32 product, every gradient passing back through the
    /// casts), bit for bit in the output, dx, dW and db, for both 16-bit
    /// types, with and without ReLU, from a 16-bit and from an f32 input.
    #[test]
    fn equals_the_casts_around_an_fp32_product() -> Result<()> {
        let dev = Device::Cpu;
        let vals = |n: usize, f: f32| -> Vec<f32> {
            (0..n).map(|i| ((i as f32 + 1.0) * f).sin() * 3.0).collect()
        };
        for dtype in [DType::BF16, DType::F16] {
            for relu in [false, true] {
                for x16 in [false, true] {
                    let x0 = Tensor::from_vec(vals(5 * 7, 0.37), (5, 7), &dev)?;
                    let x0 = if x16 { x0.to_dtype(dtype)? } else { x0 };
                    let up = Tensor::from_vec(vals(5 * 3, 0.91), (5, 3), &dev)?.to_dtype(dtype)?;
                    let w0 = Tensor::from_vec(vals(21, 0.53), (3, 7), &dev)?;
                    let b0 = Tensor::from_vec(vals(3, 1.7), 3, &dev)?;

                    // Ours: buffers get dW, db; candle gets dx.
                    let (w, b) = (param(w0.clone())?, param(b0.clone())?);
                    let xv = Var::from_tensor(&x0)?;
                    let bufs = crate::grad::layer_buffers(&w, &b).expect("fp32 CPU params");
                    let y = linear16(
                        xv.as_tensor(),
                        w.as_tensor(),
                        b.as_tensor(),
                        relu,
                        (dtype, DType::F32),
                        bufs,
                    )?;
                    assert_eq!(y.dtype(), dtype);
                    let grads = (&y * &up)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
                    let dx = grads.get(xv.as_tensor()).expect("dx").clone();
                    let dw = w.grad().to_tensor(w.as_tensor())?.expect("dW");
                    let db = b.grad().to_tensor(b.as_tensor())?.expect("db");

                    // The casts around candle's fp32 ops.
                    let (wv, bv, xv2) = (
                        Var::from_tensor(&w0)?,
                        Var::from_tensor(&b0)?,
                        Var::from_tensor(&x0)?,
                    );
                    let r = |t: &Tensor| -> Result<Tensor> {
                        Ok(t.to_dtype(dtype)?.to_dtype(DType::F32)?)
                    };
                    let y2 = r(xv2.as_tensor())?
                        .matmul(&r(wv.as_tensor())?.t()?)?
                        .broadcast_add(&r(bv.as_tensor())?)?;
                    let y2 = if relu { y2.relu()? } else { y2 };
                    let y2 = y2.to_dtype(dtype)?;
                    let g2 = (&y2 * &up)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
                    let case = format!("{dtype:?} relu {relu} x16 {x16}");
                    assert_eq!(bits(&y)?, bits(&y2)?, "y {case}");
                    let dx2 = g2.get(xv2.as_tensor()).expect("dx2");
                    assert_eq!(dx.dtype(), x0.dtype(), "{case}");
                    assert_eq!(bits(&dx)?, bits(dx2)?, "dx {case}");
                    assert_eq!(
                        bits(&dw)?,
                        bits(g2.get(wv.as_tensor()).expect("dw2"))?,
                        "dW {case}"
                    );
                    assert_eq!(
                        bits(&db)?,
                        bits(g2.get(bv.as_tensor()).expect("db2"))?,
                        "db {case}"
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod native {
    use super::*;
    use crate::grad::{layer_buffers, Param};
    use candle_core::{Device, Var};

    /// `y`, dx, dW and db of the layer with its GEMMs in `gemm`.
    fn run(gemm: DType, relu: bool) -> Result<[Vec<f32>; 4]> {
        let dev = Device::Cpu;
        let vals = |n: usize, f: f32| -> Vec<f32> {
            (0..n).map(|i| ((i as f32 + 1.0) * f).sin() * 3.0).collect()
        };
        let (b, i, o) = (19, 75, 37);
        let x = Var::from_tensor(&Tensor::from_vec(vals(b * i, 0.37), (b, i), &dev)?)?;
        let w = Param::new(Var::from_tensor(&Tensor::from_vec(
            vals(o * i, 0.53),
            (o, i),
            &dev,
        )?)?);
        let bias = Param::new(Var::from_tensor(&Tensor::from_vec(vals(o, 1.7), o, &dev)?)?);
        let up = Tensor::from_vec(vals(b * o, 0.91), (b, o), &dev)?.to_dtype(DType::BF16)?;
        let bufs = layer_buffers(&w, &bias).expect("fp32 CPU params");
        let kinds = (DType::BF16, gemm);
        let y = linear16(
            x.as_tensor(),
            w.as_tensor(),
            bias.as_tensor(),
            relu,
            kinds,
            bufs,
        )?;
        crate::grad::outputs_and_grads(&y, &up, &x, &w, &bias)
    }

    /// On the native bf16 GEMM the layer's output and gradients are the
    /// fp32 route's within one bf16 rounding (the sums run in another order,
    /// which can move a rounded value by one step), and not all equal to it
    /// by accident of a skipped product: both are far from zero.
    #[test]
    fn the_native_gemm_gives_the_fp32_routes_values() -> Result<()> {
        if !crate::gemm_bf16::available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return Ok(());
        }
        for relu in [false, true] {
            let (ours, theirs) = (run(DType::BF16, relu)?, run(DType::F32, relu)?);
            for (what, (a, e)) in ["y", "dx", "dW", "db"].iter().zip(ours.iter().zip(&theirs)) {
                let scale = e.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!(scale > 1.0, "{what}: {scale}");
                for (x, y) in a.iter().zip(e) {
                    let tol = 2f32.powi(-7) * x.abs().max(y.abs()) + 1e-6 * scale;
                    assert!((x - y).abs() <= tol, "{what} relu {relu}: {x} vs {y}");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod bf16_weights {
    use super::*;
    use crate::half16::bits;
    use candle_core::{Device, Var};

    /// Over bf16 weights (`bf16-true`: no fp32 masters), through the layer
    /// set: the op equals bf16 casts around the fp32 product, autograd hands
    /// dx back with the casts' bits, and the weights' buffers get bf16 dW
    /// and db with those bits too, past candle's GradStore.
    #[test]
    fn bf16_weights_get_bf16_gradients_in_their_buffers() -> Result<()> {
        let dev = Device::Cpu;
        let vals = |n: usize, f: f32| -> Vec<f32> {
            (0..n).map(|i| ((i as f32 + 1.0) * f).sin() * 3.0).collect()
        };
        let bf = DType::BF16;
        for relu in [false, true] {
            let x0 = Tensor::from_vec(vals(5 * 7, 0.37), (5, 7), &dev)?.to_dtype(bf)?;
            let up = Tensor::from_vec(vals(5 * 3, 0.91), (5, 3), &dev)?.to_dtype(bf)?;
            let w0 = Tensor::from_vec(vals(21, 0.53), (3, 7), &dev)?.to_dtype(bf)?;
            let b0 = Tensor::from_vec(vals(3, 1.7), 3, &dev)?.to_dtype(bf)?;
            let x = Var::from_tensor(&x0)?;
            let (wp, bp) = (
                crate::grad::Param::new(Var::from_tensor(&w0)?),
                crate::grad::Param::new(Var::from_tensor(&b0)?),
            );
            let y = crate::linear_in(x.as_tensor(), &wp, &bp, relu, bf)?;
            let g = (&y * &up)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
            assert!(g.get(wp.as_tensor()).is_none(), "dW went to the buffer");

            let (x2, w2, b2) = (
                Var::from_tensor(&x0)?,
                Var::from_tensor(&w0)?,
                Var::from_tensor(&b0)?,
            );
            let f = |t: &Tensor| t.to_dtype(DType::F32);
            let y2 = f(x2.as_tensor())?
                .matmul(&f(w2.as_tensor())?.t()?)?
                .broadcast_add(&f(b2.as_tensor())?)?;
            let y2 = if relu { y2.relu()? } else { y2 }.to_dtype(bf)?;
            let g2 = (&y2 * &up)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
            assert_eq!(bits(&y)?, bits(&y2)?, "y relu {relu}");
            let (Some(dx), Some(dx2)) = (g.get(x.as_tensor()), g2.get(x2.as_tensor())) else {
                panic!("dx: no gradient")
            };
            assert_eq!(dx.dtype(), bf, "dx");
            assert_eq!(bits(dx)?, bits(dx2)?, "dx relu {relu}");
            for (p, theirs, what) in [(&wp, w2.as_tensor(), "dW"), (&bp, b2.as_tensor(), "db")] {
                let held = p.grad().to_tensor(p.as_tensor())?;
                let (Some(a), Some(e)) = (held, g2.get(theirs)) else {
                    panic!("{what}: no buffered gradient")
                };
                assert_eq!(a.dtype(), bf, "{what}");
                assert_eq!(bits(&a)?, bits(e)?, "buffered {what} relu {relu}");
            }
        }
        Ok(())
    }
}
