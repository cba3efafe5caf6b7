//! 2-D convolution on the GPU as implicit GEMMs (`cuda/conv.cu`): the
//! forward is one launch, the backward one for the input gradient (only when
//! the input needs one) and one or two for the weight gradient (a split
//! reduction and, with more than one split, the in-order sum of the splits).
//! Planned, and its index arithmetic tested on the CPU, by
//! [`crate::conv_igemm`]. It replaces candle's im2col copy, GEMM and output
//! transposition, and its backward's conv-transpose and transposed conv.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchArgs, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDevice;
use candle_core::{bail, CudaStorage, CustomOp2, Layout, Shape, Tensor};

use super::function;
use crate::conv_igemm::{ConvDims, Grid, THREADS};

fn msg(e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("conv2d on the GPU: {e}"))
}

/// `conv2d(x, w, padding = pad)`, stride 1, no bias, of CUDA f32 tensors
/// `x (N, Cin, H, W)` and `w (Cout, Cin, kh, kw)`, with its backward.
pub(crate) fn conv2d(x: &Tensor, w: &Tensor, pad: usize) -> crate::Result<Tensor> {
    let d = ConvDims::new(x.dims(), w.dims(), pad)?;
    Ok(x.contiguous()?.apply_op2(&w.contiguous()?, Conv(d))?)
}

/// The kernels' trailing size arguments: n, cin, h, w, cout, kh, kw, pad.
fn sizes(d: &ConvDims) -> candle_core::Result<[u32; 8]> {
    let mut out = [0u32; 8];
    for (o, v) in out
        .iter_mut()
        .zip([d.n, d.cin, d.h, d.w, d.cout, d.kh, d.kw, d.pad])
    {
        *o = u32::try_from(v).map_err(msg)?;
    }
    Ok(out)
}

fn push<'a>(b: &mut LaunchArgs<'a>, sizes: &'a [u32; 8]) {
    for s in sizes {
        b.arg(s);
    }
}

fn config((x, y, z): Grid) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x, y, z),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The contiguous f32 range of an operand whose shape must be `want`.
fn operand(l: &Layout, want: &[usize], what: &str) -> candle_core::Result<(usize, usize)> {
    if l.dims() != want {
        bail!(
            "conv2d on the GPU: {what} is {:?}, expected {want:?}",
            l.dims()
        )
    }
    match l.contiguous_offsets() {
        Some(r) => Ok(r),
        None => bail!("conv2d on the GPU: {what} must be contiguous"),
    }
}

/// Launches `kernel` with two operands, an output of `len` f32 and the sizes
/// (and `extra` after them).
#[allow(clippy::too_many_arguments)]
fn launch(
    dev: &CudaDevice,
    kernel: &str,
    (s1, r1): (&CudaStorage, (usize, usize)),
    (s2, r2): (&CudaStorage, (usize, usize)),
    out: &mut candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
    d: &ConvDims,
    extra: Option<u32>,
    grid: Grid,
) -> candle_core::Result<()> {
    let a = s1.as_cuda_slice::<f32>()?.slice(r1.0..r1.1);
    let b = s2.as_cuda_slice::<f32>()?.slice(r2.0..r2.1);
    let size_args = sizes(d)?;
    let func = function(dev, kernel).map_err(msg)?;
    let stream = dev.cuda_stream();
    let mut builder = stream.launch_builder(&func);
    builder.arg(&a).arg(&b).arg(out);
    push(&mut builder, &size_args);
    if let Some(e) = extra.as_ref() {
        builder.arg(e);
    }
    // SAFETY: `kernel`'s arguments in order; the operands were checked
    // against `d`'s shapes and `out` holds what the kernel writes.
    unsafe { builder.launch(config(grid)) }.map_err(msg)?;
    Ok(())
}

/// The forward: `(x, w) -> y (N, Cout, OH, OW)`.
struct Conv(ConvDims);

impl CustomOp2 for Conv {
    fn name(&self) -> &'static str {
        "redline-conv2d"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        bail!("redline-conv2d runs on CUDA devices only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let d = self.0;
        let x = operand(l1, &[d.n, d.cin, d.h, d.w], "the input")?;
        let w = operand(l2, &[d.cout, d.cin, d.kh, d.kw], "the weight")?;
        let dev = s1.device().clone();
        let shape = Shape::from((d.n, d.cout, d.oh(), d.ow()));
        // SAFETY: the kernel writes every output element.
        let mut y = unsafe { dev.alloc::<f32>(shape.elem_count()) }?;
        launch(
            &dev,
            "redline_conv_fwd_f32",
            (s1, x),
            (s2, w),
            &mut y,
            &d,
            None,
            d.fwd_grid(),
        )?;
        Ok((CudaStorage::wrap_cuda_slice(y, dev), shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = grad.contiguous()?;
        // The data batch needs no gradient: its GEMM is skipped.
        let dx = if x.track_op() {
            Some(dy.apply_op2_no_bwd(w, &ConvDx(self.0))?)
        } else {
            None
        };
        let dw = dy.apply_op2_no_bwd(x, &ConvDw(self.0))?;
        Ok((dx, Some(dw)))
    }
}

/// The input gradient: `(dy, w) -> dx (N, Cin, H, W)`.
struct ConvDx(ConvDims);

impl CustomOp2 for ConvDx {
    fn name(&self) -> &'static str {
        "redline-conv2d-dx"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        bail!("redline-conv2d-dx runs on CUDA devices only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let d = self.0;
        let dy = operand(l1, &[d.n, d.cout, d.oh(), d.ow()], "the output gradient")?;
        let w = operand(l2, &[d.cout, d.cin, d.kh, d.kw], "the weight")?;
        let dev = s1.device().clone();
        let shape = Shape::from((d.n, d.cin, d.h, d.w));
        // SAFETY: the kernel writes every element of dx.
        let mut dx = unsafe { dev.alloc::<f32>(shape.elem_count()) }?;
        launch(
            &dev,
            "redline_conv_dx_f32",
            (s1, dy),
            (s2, w),
            &mut dx,
            &d,
            None,
            d.dx_grid(),
        )?;
        Ok((CudaStorage::wrap_cuda_slice(dx, dev), shape))
    }
}

/// The weight gradient: `(dy, x) -> dw (Cout, Cin, kh, kw)`.
struct ConvDw(ConvDims);

impl CustomOp2 for ConvDw {
    fn name(&self) -> &'static str {
        "redline-conv2d-dw"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        bail!("redline-conv2d-dw runs on CUDA devices only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let d = self.0;
        let dy = operand(l1, &[d.n, d.cout, d.oh(), d.ow()], "the output gradient")?;
        let x = operand(l2, &[d.n, d.cin, d.h, d.w], "the input")?;
        let dev = s1.device().clone();
        let shape = Shape::from((d.cout, d.cin, d.kh, d.kw));
        let count = shape.elem_count();
        let (grid, chunk) = d.dw_plan();
        let splits = grid.2 as usize;
        let chunk = u32::try_from(chunk).map_err(msg)?;
        // SAFETY: split z writes all of its count values; the sum writes dw.
        let mut dw = unsafe { dev.alloc::<f32>(count) }?;
        if splits == 1 {
            // One split is the whole sum: written straight into dw.
            launch(
                &dev,
                "redline_conv_dw_f32",
                (s1, dy),
                (s2, x),
                &mut dw,
                &d,
                Some(chunk),
                grid,
            )?;
            return Ok((CudaStorage::wrap_cuda_slice(dw, dev), shape));
        }
        // SAFETY: as above.
        let mut partial = unsafe { dev.alloc::<f32>(splits * count) }?;
        launch(
            &dev,
            "redline_conv_dw_f32",
            (s1, dy),
            (s2, x),
            &mut partial,
            &d,
            Some(chunk),
            grid,
        )?;
        let func = function(&dev, "redline_sum_splits_f32").map_err(msg)?;
        let stream = dev.cuda_stream();
        let (splits32, count32) = (
            u32::try_from(splits).map_err(msg)?,
            u32::try_from(count).map_err(msg)?,
        );
        let mut b = stream.launch_builder(&func);
        b.arg(&partial).arg(&mut dw).arg(&splits32).arg(&count32);
        let blocks = count.div_ceil(THREADS as usize).clamp(1, 65_535) as u32;
        // SAFETY: `partial` holds splits * count values, `dw` count.
        unsafe { b.launch(config((blocks, 1, 1))) }.map_err(msg)?;
        Ok((CudaStorage::wrap_cuda_slice(dw, dev), shape))
    }
}
