//! Grouped and depthwise convolutions (`nn.Conv2d(..., groups=G)`: ResNeXt,
//! MobileNet) on the fused CPU kernel.
//!
//! Group `g` convolves input channels `g*Cin/G ..` with output channels
//! `g*Cout/G ..` alone. Each group's channels are gathered once into a
//! contiguous batch and run through the plain convolution's forward and
//! fused backward (every path of it: per-sample or whole-batch GEMMs,
//! strided phases, 1x1 without im2col), and the results scattered back;
//! depthwise ones (one input channel a group) run directly on the planes
//! ([`crate::conv_depthwise`]).
//! Other devices and dtypes take candle's grouped convolution.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use redline_core::trace;

use crate::conv::Geom;
use crate::conv_backward::plain_grads;
use crate::conv_depthwise::Depthwise;
use crate::error::{Error, Result};
use crate::grad::{grads_out, layer_buffers, Param, ParamBuffers};
use crate::slices::{f32s, fused_cpu, unpack_grads};

/// `F.conv2d(x, w, b, stride, padding, groups=groups)`: `x (B, Cin, H, W)`,
/// `w (Cout, Cin/groups, k, k)`, `b (Cout)`. One group is
/// [`crate::conv2d_strided_param`]; CPU f32 tensors take the fused kernel
/// per group (dW and db into the parameters' buffers), anything else
/// candle's grouped convolution.
pub fn conv2d_grouped_param(
    x: &Tensor,
    w: &Param,
    b: &Param,
    padding: usize,
    stride: usize,
    groups: usize,
) -> Result<Tensor> {
    if groups == 1 {
        return crate::conv2d_strided_param(x, w, b, padding, stride);
    }
    let (wt, bt) = (w.as_tensor(), b.as_tensor());
    check_groups(x, wt, groups)?;
    grouped(x, wt, bt, (padding, stride, groups), layer_buffers(w, b))
}

/// [`conv2d_grouped_param`] on plain tensors: CPU f32 ones take the fused
/// kernel per group, dW and db coming back in candle's `GradStore` (what a
/// 16-bit grouped convolution runs on its rounded operands); anything else
/// candle's grouped convolution.
pub fn conv2d_grouped(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    padding: usize,
    stride: usize,
    groups: usize,
) -> Result<Tensor> {
    if groups == 1 {
        return crate::conv2d_strided(x, w, b, padding, stride);
    }
    check_groups(x, w, groups)?;
    grouped(x, w, b, (padding, stride, groups), None)
}

/// The grouped convolution of checked shapes, fused on CPU f32 tensors.
fn grouped(
    x: &Tensor,
    wt: &Tensor,
    bt: &Tensor,
    (padding, stride, groups): (usize, usize, usize),
    buffers: Option<ParamBuffers>,
) -> Result<Tensor> {
    let (cout, cin_g, _, _) = wt.dims4()?;
    if !(fused_cpu(x) && fused_cpu(wt) && fused_cpu(bt)) {
        let y = x.conv2d(wt, padding, stride, 1, groups)?;
        return Ok(y.broadcast_add(&bt.reshape((1, cout, 1, 1))?)?);
    }
    // The geometry of one group, checked against the whole tensors' sizes.
    let xg = x.narrow(1, 0, cin_g)?;
    let wg = wt.narrow(0, 0, cout / groups)?;
    let bg = bt.narrow(0, 0, cout / groups)?;
    let sub = Geom::strided(&xg, &wg, &bg, padding, stride)?;
    let op = GroupedConv {
        sub,
        groups,
        input_grad: x.track_op(),
        layer: trace::current_layer(),
        buffers,
    };
    Ok(x.contiguous()?
        .apply_op3(&wt.contiguous()?, &bt.contiguous()?, op)?)
}

/// The input's and the output's channels divide by `groups`, and the
/// weight is `(Cout, Cin/groups, k, k)`.
fn check_groups(x: &Tensor, wt: &Tensor, groups: usize) -> Result<()> {
    let (_, cin, _, _) = x.dims4()?;
    let (cout, cin_g, k, kw) = wt.dims4()?;
    if groups == 0 || cin % groups != 0 || cout % groups != 0 || cin_g * groups != cin || k != kw {
        return Err(Error::Shape(format!(
            "conv2d: {groups} groups over input {:?} and weight {:?}: the input's and the \
             output's channels must divide by the groups, and the weight must be (Cout, \
             Cin/groups, k, k)",
            x.dims(),
            wt.dims()
        )));
    }
    Ok(())
}

/// Group `g`'s channels of every sample of `v` (samples of `per` channels
/// of `plane` values), gathered contiguously.
fn gather(v: &[f32], (per, plane): (usize, usize), (g, n): (usize, usize)) -> Vec<f32> {
    let mut out = Vec::with_capacity(v.len() / (per / n).max(1));
    for sample in v.chunks(per * plane) {
        out.extend_from_slice(&sample[g * n * plane..][..n * plane]);
    }
    out
}

/// The inverse of [`gather`]: group `g`'s channels written back.
fn scatter(part: &[f32], v: &mut [f32], (per, plane): (usize, usize), (g, n): (usize, usize)) {
    for (sample, p) in v.chunks_mut(per * plane).zip(part.chunks(n * plane)) {
        sample[g * n * plane..][..n * plane].copy_from_slice(p);
    }
}

/// The forward op: `(x, w, b) -> y`, all contiguous f32 on the CPU.
struct GroupedConv {
    /// One group's convolution over the whole batch.
    sub: Geom,
    groups: usize,
    input_grad: bool,
    layer: Option<Arc<str>>,
    buffers: Option<ParamBuffers>,
}

impl CustomOp3 for GroupedConv {
    fn name(&self) -> &'static str {
        "redline-conv2d-grouped"
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
        trace::count("conv2d.forward");
        let (g, n, name) = (self.sub, self.groups, self.name());
        let (x, w, b) = (
            f32s(s1, l1, name)?,
            f32s(s2, l2, name)?,
            f32s(s3, l3, name)?,
        );
        let (hw, ohw, wlen) = (g.h * g.w, g.ohw(), g.cout * g.k());
        g.check(
            name,
            &[
                ("input", x.len(), g.b * n * g.in_len()),
                ("weight", w.len(), n * wlen),
                ("bias", b.len(), n * g.cout),
            ],
        )?;
        let mut out = vec![0f32; g.b * n * g.out_len()];
        if let Some(d) = Depthwise::of(g, n) {
            d.forward(x, w, b, &mut out);
            let shape = Shape::from((g.b, n * g.cout, g.oh, g.ow));
            return Ok((CpuStorage::F32(out), shape));
        }
        let mut part = vec![0f32; g.b * g.out_len()];
        for grp in 0..n {
            let xg = gather(x, (n * g.cin, hw), (grp, g.cin));
            let wg = g.permute_taps(&w[grp * wlen..][..wlen], false);
            g.forward_all(name, &wg, &b[grp * g.cout..][..g.cout], &xg, &mut part)?;
            scatter(&part, &mut out, (n * g.cout, ohw), (grp, g.cout));
        }
        let shape = Shape::from((g.b, n * g.cout, g.oh, g.ow));
        Ok((CpuStorage::F32(out), shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = trace::backward(self.layer.as_ref(), "conv2d");
        trace::count("conv2d.backward");
        let op = GroupedConvBackward {
            sub: self.sub,
            groups: self.groups,
            input_grad: self.input_grad,
            buffers: self.buffers.clone(),
        };
        let flat = x.apply_op3_no_bwd(w, &grad.contiguous()?, &op)?;
        unpack_grads(
            &flat,
            w.shape(),
            x.shape(),
            self.input_grad,
            self.buffers.is_some(),
        )
    }
}

/// The backward kernel: `(x, w, dy) -> [dW | db | dx]`, or dx alone when
/// the parameters' buffers took dW and db.
struct GroupedConvBackward {
    sub: Geom,
    groups: usize,
    input_grad: bool,
    buffers: Option<ParamBuffers>,
}

impl CustomOp3 for GroupedConvBackward {
    fn name(&self) -> &'static str {
        "redline-conv2d-grouped-backward"
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
        let (g, n, name) = (self.sub, self.groups, self.name());
        let (x, w, dy) = (
            f32s(s1, l1, name)?,
            f32s(s2, l2, name)?,
            f32s(s3, l3, name)?,
        );
        let (hw, ohw, wlen) = (g.h * g.w, g.ohw(), g.cout * g.k());
        g.check(
            name,
            &[
                ("input", x.len(), g.b * n * g.in_len()),
                ("weight", w.len(), n * wlen),
                ("output grad", dy.len(), g.b * n * g.out_len()),
            ],
        )?;
        let (mut dw, mut db) = (vec![0f32; n * wlen], vec![0f32; n * g.cout]);
        let mut dx = vec![0f32; if self.input_grad { x.len() } else { 0 }];
        if let Some(d) = Depthwise::of(g, n) {
            d.weight_grad(x, dy, &mut dw, &mut db);
            if self.input_grad {
                d.input_grad(w, dy, &mut dx);
            }
            return Ok(grads_out(self.buffers.as_ref(), dw, db, dx));
        }
        for grp in 0..n {
            let xg = gather(x, (n * g.cin, hw), (grp, g.cin));
            let dyg = gather(dy, (n * g.cout, ohw), (grp, g.cout));
            let (dwb, dxg) = plain_grads(g, self.input_grad, &xg, &w[grp * wlen..][..wlen], &dyg)?;
            dw[grp * wlen..][..wlen].copy_from_slice(&dwb[..wlen]);
            db[grp * g.cout..][..g.cout].copy_from_slice(&dwb[wlen..]);
            if self.input_grad {
                scatter(&dxg, &mut dx, (n * g.cin, hw), (grp, g.cin));
            }
        }
        Ok(grads_out(self.buffers.as_ref(), dw, db, dx))
    }
}
