//! A bf16 convolution whose activations stay bf16 (`bf16-mixed`,
//! `bf16-true` on a CPU with AVX-512 BF16): the input and the output
//! gradient are read as bf16, and the output and the input gradient written
//! as bf16, by the pixel-major kernels themselves ([`crate::half16::Act`]).
//!
//! Before, a bf16 convolution was the fp32 op between two casts: the input
//! widened into a whole f32 copy (kept for the backward), the f32 output
//! rounded into a bf16 one, and in the backward the output gradient widened
//! and the f32 input gradient rounded. Here each sample is widened or
//! rounded while it is in cache, as the kernels pack or unpack it; the
//! arithmetic is the same, so the values are the same to the bit.
//!
//! It takes the convolutions whose forward, weight gradient and input
//! gradient (the transposed convolution) all run on the bf16 pixel-major
//! kernels, ResNet's 3x3 stride-1 convolutions, and the unpadded 1x1 ones
//! on the bf16 GEMM ([`crate::conv_pointwise16`]), strided ones (ResNet's
//! downsampling shortcuts) as the stride-1 one over the input subsampled.
//! The weights and bias come in as f32 tensors of bf16 values (the
//! recorded casts of the parameters, through which their gradients are
//! rounded back).

use std::sync::{Arc, Mutex};

use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};
use half::bf16;

use redline_core::trace;

use crate::conv::Geom;
use crate::slices::{bf16s, f32s};
use crate::Result;

impl Geom {
    /// Whether [`conv2d_bf16`] takes this (bf16) convolution: its forward,
    /// weight gradient and transposed convolution all on the bf16
    /// pixel-major kernels, or a 1x1 one on the bf16 GEMM read from and
    /// written to bf16 ([`crate::conv_pointwise16`]).
    pub(super) fn io16(&self) -> bool {
        self.pointwise16()
            || self.strided_pointwise16().is_some()
            || (self.nhwc16()
                && self.nhwc16_backward()
                && self.transposed().is_some_and(|t| t.nhwc16()))
    }
}

/// `conv2d(x, w, b, padding, stride)` with a bf16 output, on bf16
/// products (`w` and `b`: f32 tensors of bf16 values), when the CPU has
/// AVX-512 BF16 and the shape is one the bf16-storage kernels take (a
/// stride-1 3x3 one whose channels pair up on maps of 32 pixels or more, or
/// an unpadded 1x1 one at any stride); `None` otherwise (the caller takes
/// the casts around the fp32 op).
///
/// `x` is bf16 (the activations of both bf16 precisions), or f32 (the
/// output of an fp32 layer, such as `LayerNorm`): then it is cast to a
/// bf16 copy first, a recorded cast through which its gradient comes back
/// widened. The cast path rounds it the same way (into an f32 copy) and
/// rounds its gradient too (`round_to`'s backward), so the bits are the
/// same, at half the copy's bytes and none of the f32 output's and output
/// gradient's.
pub fn conv2d_bf16(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    (padding, stride): (usize, usize),
) -> Result<Option<Tensor>> {
    let on_cpu = [x, w, b].iter().all(|t| t.device().is_cpu());
    let input = matches!(x.dtype(), DType::BF16 | DType::F32);
    if !on_cpu || !input || w.dtype() != DType::F32 || b.dtype() != DType::F32 {
        return Ok(None);
    }
    let geom = Geom {
        gemm: DType::BF16,
        ..Geom::strided(x, w, b, padding, stride)?
    };
    if !geom.io16() {
        return Ok(None);
    }
    let x = &crate::cast16::to_dtype(x, DType::BF16)?;
    let op = Conv16Op {
        geom,
        input_grad: x.track_op(),
        layer: trace::current_layer(),
    };
    Ok(Some(x.contiguous()?.apply_op3(
        &w.contiguous()?,
        &b.contiguous()?,
        op,
    )?))
}

/// The forward op: `(x bf16, w, b) -> y bf16`.
struct Conv16Op {
    geom: Geom,
    /// Whether `x` was tracked at forward time; if not, no dx is computed.
    input_grad: bool,
    /// The layer that built it, for the backward span (only while tracing).
    layer: Option<Arc<str>>,
}

impl CustomOp3 for Conv16Op {
    fn name(&self) -> &'static str {
        "redline-conv2d-bf16"
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
        let (g, name) = (self.geom, self.name());
        trace::count("conv2d.forward");
        let (x, w, b) = (
            bf16s(s1, l1, name)?,
            f32s(s2, l2, name)?,
            f32s(s3, l3, name)?,
        );
        g.check(
            name,
            &[
                ("input", x.len(), g.b * g.in_len()),
                ("weight", w.len(), g.cout * g.k()),
                ("bias", b.len(), g.cout),
            ],
        )?;
        let mut out = vec![bf16::ZERO; g.b * g.out_len()];
        if let Some(dense) = g.strided_pointwise16().filter(|_| g.b > 0) {
            dense.forward_pointwise16(name, w, b, &g.subsample16(x), &mut out)?;
        } else if g.b > 0 && g.pointwise() {
            g.forward_pointwise16(name, w, b, x, &mut out)?;
        } else if g.b > 0 {
            g.forward_nhwc16(name, &g.nhwc_panels_stored(w), b, x, &mut out)?;
        }
        Ok((
            CpuStorage::BF16(out),
            Shape::from((g.b, g.cout, g.oh, g.ow)),
        ))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = trace::backward(self.layer.as_ref(), "conv2d");
        trace::count("conv2d.backward");
        let back = Conv16Backward {
            geom: self.geom,
            input_grad: self.input_grad,
            dwb: Mutex::new(None),
        };
        let grad = grad.to_dtype(DType::BF16)?.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &grad, &back)?;
        let held = back.dwb.lock().map(|mut d| d.take());
        let Ok(Some(dwb)) = held else {
            bail!("{}: the backward left no weight gradient", back.name())
        };
        let (dw, db) = dwb.split_at(w.elem_count());
        let dw = Tensor::from_slice(dw, w.shape(), w.device())?;
        let db = Tensor::from_slice(db, b.shape(), b.device())?;
        Ok((self.input_grad.then_some(dx), Some(dw), Some(db)))
    }
}

/// The backward op: `(x bf16, w, dy bf16) -> dx bf16` (empty when the
/// input is untracked), `[dW | db]` (f32) left in `dwb`.
struct Conv16Backward {
    geom: Geom,
    input_grad: bool,
    dwb: Mutex<Option<Vec<f32>>>,
}

impl CustomOp3 for Conv16Backward {
    fn name(&self) -> &'static str {
        "redline-conv2d-bf16-backward"
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
        let (g, name) = (self.geom, self.name());
        let (x, w, dy) = (
            bf16s(s1, l1, name)?,
            f32s(s2, l2, name)?,
            bf16s(s3, l3, name)?,
        );
        g.check(
            name,
            &[
                ("input", x.len(), g.b * g.in_len()),
                ("weight", w.len(), g.cout * g.k()),
                ("output grad", dy.len(), g.b * g.out_len()),
            ],
        )?;
        let mut dwb = vec![0f32; g.cout * g.k() + g.cout];
        let mut dx = vec![bf16::ZERO; if self.input_grad { x.len() } else { 0 }];
        if let Some(dense) = g.strided_pointwise16().filter(|_| g.b > 0) {
            // The stride-1 convolution of the subsampled input; its input
            // gradient back onto the stride's grid of the zeroed dx.
            let xs = g.subsample16(x);
            let mut dsub = vec![bf16::ZERO; if self.input_grad { xs.len() } else { 0 }];
            let dsub_out = self.input_grad.then_some(&mut dsub[..]);
            dense.backward_pointwise16(name, (&xs, w, dy), &mut dwb, dsub_out)?;
            if self.input_grad {
                g.unsubsample16(&dsub, &mut dx);
            }
        } else if g.b > 0 && g.pointwise() {
            let dx = self.input_grad.then_some(&mut dx[..]);
            g.backward_pointwise16(name, (x, w, dy), &mut dwb, dx)?;
        } else if g.b > 0 {
            g.weight_grad_nhwc16(name, x, dy, &mut dwb)?;
            if self.input_grad {
                let Some(t) = g.transposed() else {
                    bail!("{name}: no transposed convolution for {g:?}")
                };
                let zeros = vec![0f32; t.cout];
                t.forward_nhwc16(name, &g.nhwc_panels_flipped(w), &zeros, dy, &mut dx)?;
            }
        }
        crate::slices::keep(&self.dwb, dwb);
        let shape = if self.input_grad {
            l1.shape().clone()
        } else {
            Shape::from(0)
        };
        Ok((CpuStorage::BF16(dx), shape))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use candle_core::{Device, Var};

    use super::*;
    use crate::cast16::{round_to, to_dtype};
    use crate::conv::conv2d_strided_in;

    fn data(dims: &[usize], seed: f32, scale: f32) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| (i as f32 * 0.37 + seed).sin() * scale)
            .collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        crate::half16::bits(t).unwrap()
    }

    /// The bf16-in, bf16-out convolution gives the bits of the casts
    /// around the fp32 op that it replaces: y, dx, dW and db, on an odd
    /// batch, with and without the input tracked.
    #[test]
    fn equals_the_casts_around_the_fp32_op_to_the_bit() -> Result<()> {
        if !crate::gemm_bf16::enabled() {
            eprintln!("no AVX-512 BF16 here: the bf16 convolution is not run");
            return Ok(());
        }
        // (batch, cin, cout, side, kernel, input tracked): 3x3 on the
        // pixel-major kernels; 1x1 per sample (64 pixels and more: even and
        // odd pixel counts, 16-column blocks and their tails) and side by
        // side (49 and 16 pixels), odd channel counts.
        // 1x1 at stride 2 (ResNet's downsampling): 64-pixel outputs per
        // sample, 49 and 25 side by side, an odd input side.
        for (b, cin, cout, side, (kernel, stride), tracked) in [
            (3, 64, 64, 8, (3, 1), true),
            (2, 128, 64, 7, (3, 1), true),
            (1, 64, 128, 9, (3, 1), false),
            (3, 64, 256, 16, (1, 1), true),
            (3, 256, 64, 9, (1, 1), true),
            (2, 33, 40, 8, (1, 1), true),
            (1, 48, 32, 8, (1, 1), false),
            (3, 96, 64, 7, (1, 1), true),
            (2, 64, 24, 4, (1, 1), true),
            (3, 64, 128, 16, (1, 2), true),
            (2, 96, 64, 14, (1, 2), true),
            (2, 33, 40, 9, (1, 2), true),
            (1, 48, 32, 10, (1, 2), false),
        ] {
            // bf16 inputs (bf16-true) and f32 ones (bf16-mixed: cast first).
            for input in [DType::BF16, DType::F32] {
                let pad = kernel / 2;
                let what = format!(
                    "b{b} {cin}->{cout} {side}x{side} {kernel}x{kernel} /{stride} {input:?}"
                );
                let x = data(&[b, cin, side, side], 0.0, 1.0).to_dtype(input)?;
                let x = Var::from_tensor(&x)?;
                let w = Var::from_tensor(&data(&[cout, cin, kernel, kernel], 1.0, 0.05))?;
                let bias = Var::from_tensor(&data(&[cout], 2.0, 0.5))?;
                let xin = if tracked {
                    x.as_tensor().clone()
                } else {
                    x.as_tensor().detach()
                };
                let (wr, br) = (round_to(&w, DType::BF16)?, round_to(&bias, DType::BF16)?);
                let Some(got) = conv2d_bf16(&xin, &wr, &br, (pad, stride))? else {
                    panic!("{what}: not taken")
                };
                let xr = round_to(&xin, DType::BF16)?;
                let want32 = conv2d_strided_in(&xr, &wr, &br, (pad, stride), DType::BF16)?;
                let want = to_dtype(&want32, DType::BF16)?;
                assert_eq!(got.dtype(), DType::BF16, "{what}");
                assert_eq!(bits(&got), bits(&want), "{what}: y");
                let up = data(got.dims(), 3.0, 1.0);
                let gg = (got.to_dtype(DType::F32)? * &up)?.sum_all()?.backward()?;
                let gw = (want.to_dtype(DType::F32)? * &up)?.sum_all()?.backward()?;
                for (name, v) in [("dW", w.as_tensor()), ("db", bias.as_tensor())] {
                    let (Some(a), Some(e)) = (gg.get(v), gw.get(v)) else {
                        panic!("{what}: {name} missing")
                    };
                    assert_eq!(bits(a), bits(e), "{what}: {name}");
                }
                match (gg.get(x.as_tensor()), gw.get(x.as_tensor())) {
                    (Some(a), Some(e)) => {
                        assert!(tracked, "{what}: dx of an untracked input");
                        assert_eq!(a.dtype(), input, "{what}: dx");
                        assert_eq!(a.dims(), x.as_tensor().dims(), "{what}: dx");
                        assert_eq!(bits(a), bits(e), "{what}: dx");
                    }
                    (None, None) => assert!(!tracked, "{what}: dx missing"),
                    _ => panic!("{what}: dx in one path only"),
                }
            }
        }
        Ok(())
    }

    /// Shapes off the bf16 pixel-major kernels and inputs neither f32 nor
    /// bf16 are left to the caller.
    #[test]
    fn other_convolutions_are_left_to_the_caller() -> Result<()> {
        let w = data(&[64, 64, 3, 3], 1.0, 0.05);
        let b = data(&[64], 2.0, 0.5);
        let x32 = data(&[2, 64, 8, 8], 0.0, 1.0);
        let x64 = x32.to_dtype(DType::F64)?;
        assert!(conv2d_bf16(&x64, &w, &b, (1, 1))?.is_none(), "f64 input");
        let small = data(&[2, 64, 4, 4], 0.0, 1.0).to_dtype(DType::BF16)?;
        assert!(
            conv2d_bf16(&small, &w, &b, (1, 1))?.is_none(),
            "16-pixel maps"
        );
        let w48 = data(&[48, 64, 3, 3], 1.0, 0.05);
        let x16 = x32.to_dtype(DType::BF16)?;
        assert!(conv2d_bf16(&x16, &w48, &data(&[48], 2.0, 0.5), (1, 1))?.is_none());
        // A strided 3x3 (no transposed convolution on these kernels) and a
        // padded strided 1x1.
        assert!(conv2d_bf16(&x16, &w, &b, (1, 2))?.is_none(), "3x3 /2");
        let w1 = data(&[64, 64, 1, 1], 1.0, 0.05);
        assert!(
            conv2d_bf16(&x16, &w1, &b, (1, 2))?.is_none(),
            "padded 1x1 /2"
        );
        assert!(conv2d_bf16(&x16, &w1, &b, (0, 2))?.is_some(), "1x1 /2");
        Ok(())
    }
}
