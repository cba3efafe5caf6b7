//! 2-D convolution on the GPU as implicit GEMMs (`cuda/conv.cu`): the
//! forward is one launch, the backward one for the input gradient (only when
//! the input needs one) and one or two for the weight gradient (a split
//! reduction and, with more than one split, the in-order sum of the splits).
//! Planned, and its index arithmetic tested on the CPU, by
//! [`crate::conv_igemm`]. It replaces candle's im2col copy, GEMM and output
//! transposition, and its backward's conv-transpose and transposed conv.
//!
//! bf16 and fp16 operands (`--precision bf16-mixed | 16-mixed | bf16-true`)
//! take the tensor-core kernels of `cuda/conv_mma.cu`: the same grids,
//! products summed in f32, each output rounded to the 16-bit type once; the
//! weight gradient's splits always write f32 partial sums, which the split
//! sum adds in order and rounds. f32 operands take that file's TF32 kernels
//! under `--matmul-precision high`.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, DevicePtrMut, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::{bail, CudaStorage, CustomOp2, DType, Layout, Shape, Tensor, WithDType};

use super::function;
use crate::conv_igemm::{ConvDims, Grid, MMA_THREADS, THREADS};

fn msg(e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("conv2d on the GPU: {e}"))
}

/// Whether this convolution runs on cuDNN (`fused_gpu::conv_backend`):
/// under `CudnnWhereItLoads`, where cuDNN loads in this process (the load is
/// tried once, at the first convolution, before any capture).
fn use_cudnn() -> bool {
    match crate::fused_gpu::conv_backend() {
        crate::fused_gpu::ConvBackend::Redline => false,
        crate::fused_gpu::ConvBackend::Cudnn => true,
        crate::fused_gpu::ConvBackend::CudnnWhereItLoads => super::cudnn::version().is_ok(),
    }
}

/// Kernel `name`, with what a build for a GPU before sm_80 lacks said.
fn load_kernel(dev: &CudaDevice, name: &str) -> candle_core::Result<CudaFunction> {
    function(dev, name).map_err(|e| {
        if name.ends_with("16") || name.ends_with("tf32") {
            msg(format!(
                "{e}: the 16-bit and TF32 convolution kernels use tensor-core instructions of compute \
                 capability 8.0 and newer, and this build's kernels were compiled for an older \
                 GPU (CUDA_COMPUTE_CAP)\nHINT: rebuild with CUDA_COMPUTE_CAP=80 or higher on \
                 such a GPU, or run with --fused-kernels off (candle's convolution) or \
                 --matmul-precision highest (the f32 kernels)"
            ))
        } else {
            msg(e)
        }
    })
}

/// The kernels' name suffix and block size for operands of `dtype`: f32
/// takes the TF32 tensor-core kernels where `--matmul-precision high`
/// allows TF32 products ([`redline_core::matmul_precision`]), as cuBLASLt's
/// linear layer and PyTorch's default cuDNN convolutions do, and the
/// reduced-precision variants are admitted ([`crate::fused_gpu`]).
fn kernels_for(dtype: DType) -> candle_core::Result<(&'static str, u32)> {
    match dtype {
        DType::F32
            if redline_core::matmul_precision().tf32() && crate::fused_gpu::reduced_precision() =>
        {
            Ok(("tf32", MMA_THREADS))
        }
        DType::F32 => Ok(("f32", THREADS)),
        DType::BF16 => Ok(("bf16", MMA_THREADS)),
        DType::F16 => Ok(("f16", MMA_THREADS)),
        other => bail!("conv2d on the GPU: the fused kernels take f32, bf16 or f16, not {other:?}"),
    }
}

/// `conv2d(x, w, padding = pad)`, stride 1, no bias, of CUDA tensors
/// `x (N, Cin, H, W)` and `w (Cout, Cin, kh, kw)` of one dtype (f32, bf16 or
/// f16), with its backward; the result has their dtype.
pub(crate) fn conv2d(x: &Tensor, w: &Tensor, pad: usize) -> crate::Result<Tensor> {
    let d = ConvDims::new(x.dims(), w.dims(), pad)?;
    Ok(x.contiguous()?.apply_op2(
        &w.contiguous()?,
        Conv {
            d,
            pass: Pass::Forward,
        },
    )?)
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

fn config((x, y, z): Grid, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x, y, z),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The contiguous range of an operand whose shape must be `want`.
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

/// Launches `kernel` (`threads` per block) with two operands of element
/// type `T`, an output and the sizes (and `extra` after them).
#[allow(clippy::too_many_arguments)]
fn launch<T: CudaDType + DeviceRepr, O: DeviceRepr>(
    dev: &CudaDevice,
    (kernel, threads): (&str, u32),
    (s1, r1): (&CudaStorage, (usize, usize)),
    (s2, r2): (&CudaStorage, (usize, usize)),
    out: &mut CudaSlice<O>,
    d: &ConvDims,
    extra: Option<u32>,
    grid: Grid,
) -> candle_core::Result<()> {
    let a = s1.as_cuda_slice::<T>()?.slice(r1.0..r1.1);
    let b = s2.as_cuda_slice::<T>()?.slice(r2.0..r2.1);
    let size_args = sizes(d)?;
    let func = load_kernel(dev, kernel)?;
    let stream = dev.cuda_stream();
    let mut builder = stream.launch_builder(&func);
    builder.arg(&a).arg(&b).arg(out);
    push(&mut builder, &size_args);
    if let Some(e) = extra.as_ref() {
        builder.arg(e);
    }
    // SAFETY: `kernel`'s arguments in order; the operands were checked
    // against `d`'s shapes and `out` holds what the kernel writes.
    unsafe { builder.launch(config(grid, threads)) }.map_err(msg)?;
    Ok(())
}

/// Which GEMM of the convolution an op runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Pass {
    /// `(x, w) -> y (N, Cout, OH, OW)`, with a backward.
    Forward,
    /// `(dy, w) -> dx (N, Cin, H, W)`.
    InputGrad,
    /// `(dy, x) -> dw (Cout, Cin, kh, kw)`.
    WeightGrad,
}

/// An operand's shape and what it is, for errors.
type Operand = ([usize; 4], &'static str);

/// One pass of the convolution of sizes `d`.
struct Conv {
    d: ConvDims,
    pass: Pass,
}

impl Conv {
    /// The two operands' shapes and names, and the result's shape.
    fn shapes(&self) -> (Operand, Operand, [usize; 4]) {
        let d = self.d;
        let x = ([d.n, d.cin, d.h, d.w], "the input");
        let w = ([d.cout, d.cin, d.kh, d.kw], "the weight");
        let y = ([d.n, d.cout, d.oh(), d.ow()], "the output gradient");
        match self.pass {
            Pass::Forward => (x, w, y.0),
            Pass::InputGrad => (y, w, x.0),
            Pass::WeightGrad => (y, x, w.0),
        }
    }

    /// This pass over operands of element type `T` (f32, bf16 or f16),
    /// into a new buffer of `count` values of `T`.
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        &self,
        a: (&CudaStorage, (usize, usize)),
        b: (&CudaStorage, (usize, usize)),
        count: usize,
    ) -> candle_core::Result<CudaStorage> {
        let d = self.d;
        let dev = a.0.device().clone();
        let cudnn = use_cudnn();
        crate::fused_gpu::note_conv_ran(cudnn);
        if cudnn {
            // cuDNN (beta 0) writes every element of its output.
            // SAFETY: as below.
            let mut out = unsafe { dev.alloc::<T>(count) }?;
            let tf32 =
                redline_core::matmul_precision().tf32() && crate::fused_gpu::reduced_precision();
            super::cudnn::run::<T>(&dev, (self.pass, d, tf32), a, b, &mut out)?;
            return Ok(CudaStorage::wrap_cuda_slice(out, dev));
        }
        let (suffix, threads) = kernels_for(a.0.dtype())?;
        // SAFETY: every pass writes each element of its output (below).
        let mut out = unsafe { dev.alloc::<T>(count) }?;
        let (pass, grid) = match self.pass {
            Pass::Forward => ("fwd", d.fwd_grid()),
            Pass::InputGrad => ("dx", d.dx_grid()),
            Pass::WeightGrad => {
                weight_grad::<T>(&dev, (suffix, threads), a, b, &mut out, &d, count)?;
                return Ok(CudaStorage::wrap_cuda_slice(out, dev));
            }
        };
        let kernel = format!("redline_conv_{pass}_{suffix}");
        launch::<T, T>(&dev, (&kernel, threads), a, b, &mut out, &d, None, grid)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    }
}

impl CustomOp2 for Conv {
    fn name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "redline-conv2d",
            Pass::InputGrad => "redline-conv2d-dx",
            Pass::WeightGrad => "redline-conv2d-dw",
        }
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        bail!("{} runs on CUDA devices only", self.name())
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let ((a_dims, a_name), (b_dims, b_name), out_dims) = self.shapes();
        let a = (s1, operand(l1, &a_dims, a_name)?);
        let b = (s2, operand(l2, &b_dims, b_name)?);
        if s1.dtype() != s2.dtype() {
            bail!(
                "conv2d on the GPU: {a_name} is {:?} and {b_name} {:?}; one dtype is needed",
                s1.dtype(),
                s2.dtype()
            )
        }
        let shape = Shape::from(out_dims.to_vec());
        let out = match s1.dtype() {
            DType::F32 => self.run::<f32>(a, b, shape.elem_count())?,
            DType::BF16 => self.run::<half::bf16>(a, b, shape.elem_count())?,
            DType::F16 => self.run::<half::f16>(a, b, shape.elem_count())?,
            other => {
                kernels_for(other)?;
                bail!("conv2d on the GPU: no kernel for {other:?}")
            }
        };
        Ok((out, shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        if self.pass != Pass::Forward {
            bail!("{}: a gradient pass has no backward", self.name())
        }
        let dy = grad.contiguous()?;
        let pass = |pass| Conv { d: self.d, pass };
        // The data batch needs no gradient: its GEMM is skipped.
        let dx = if x.track_op() {
            Some(dy.apply_op2_no_bwd(w, &pass(Pass::InputGrad))?)
        } else {
            None
        };
        let dw = dy.apply_op2_no_bwd(x, &pass(Pass::WeightGrad))?;
        Ok((dx, Some(dw)))
    }
}

/// The weight gradient of `dy` (`a`) and `x` (`b`) into `dw` (`count`
/// values of `T`): one launch when the reduction is one f32 split, else the
/// splits' f32 partial sums and their in-order sum (rounded to `T`'s 16
/// bits by the 16-bit kernels, which always take this route).
fn weight_grad<T: CudaDType + DeviceRepr + WithDType>(
    dev: &CudaDevice,
    (suffix, threads): (&str, u32),
    a: (&CudaStorage, (usize, usize)),
    b: (&CudaStorage, (usize, usize)),
    dw: &mut CudaSlice<T>,
    d: &ConvDims,
    count: usize,
) -> candle_core::Result<()> {
    let (grid, chunk) = d.dw_plan();
    let chunk = Some(u32::try_from(chunk).map_err(msg)?);
    let splits = grid.2;
    let kernel = format!("redline_conv_dw_{suffix}");
    if splits == 1 && T::DTYPE == DType::F32 {
        // One f32 split is the whole sum: written straight into dw.
        return launch::<T, T>(dev, (&kernel, threads), a, b, dw, d, chunk, grid);
    }
    // SAFETY: split z writes all count values of partial[z].
    let mut partial = unsafe { dev.alloc::<f32>(splits as usize * count) }?;
    launch::<T, f32>(dev, (&kernel, threads), a, b, &mut partial, d, chunk, grid)?;
    // TF32's partial sums are f32's.
    let sum = if suffix == "tf32" { "f32" } else { suffix };
    let stream = dev.cuda_stream();
    let count32 = u32::try_from(count).map_err(msg)?;
    let (dw_p, _dw_g) = dw.device_ptr_mut(&stream);
    super::sum_splits(dev, sum, &partial, dw_p, (splits, count32))
}
