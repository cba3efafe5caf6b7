//! The CNN block's bias, max pooling and ReLU on the GPU (`cuda/pool.cu`),
//! after the implicit-GEMM convolution: one launch forward, two backward (the
//! convolution's and the bias's gradients, then the bias's splits added in order),
//! in f32 or a 16-bit type (the conv output's and bias's one dtype).

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, DevicePtrMut, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, CudaStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor};

use super::function;

/// Threads per block of the element-wise kernels and of the bias reduction.
const THREADS: u32 = 256;

/// `(N, C, H, W)` of the conv output, the window, the pooled size.
#[derive(Debug, Clone, Copy)]
struct Dims {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    k: u32,
    ph: u32,
    pw: u32,
}

impl Dims {
    fn new(conv: &Layout, k: usize) -> candle_core::Result<Self> {
        let (n, c, h, w) = conv.shape().dims4()?;
        if !(1..16).contains(&k) || h < k || w < k {
            bail!("bias+pool+relu on the GPU: a {k}x{k} window over a {h}x{w} plane")
        }
        if c > 65_535 {
            bail!("bias+pool+relu on the GPU: {c} channels (the backward's grid takes 65535)")
        }
        if (h / k)
            .checked_mul(w / k)
            .is_none_or(|p| p > u32::MAX as usize)
        {
            bail!("bias+pool+relu on the GPU: a {h}x{w} plane is too large")
        }
        let u = |v: usize| u32::try_from(v).or_else(|_| bail!("bias+pool+relu: {v} is too large"));
        Ok(Self {
            n: u(n)?,
            c: u(c)?,
            h: u(h)?,
            w: u(w)?,
            k: u(k)?,
            ph: u(h / k)?,
            pw: u(w / k)?,
        })
    }

    /// The kernels' trailing size arguments: n, c, h, w, k, ph, pw.
    fn push_all<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.n)
            .arg(&self.c)
            .arg(&self.h)
            .arg(&self.w)
            .arg(&self.k)
            .arg(&self.ph)
            .arg(&self.pw);
    }

    fn pooled(&self) -> usize {
        self.n as usize * self.c as usize * self.ph as usize * self.pw as usize
    }

    fn conv(&self) -> usize {
        self.n as usize * self.c as usize * self.h as usize * self.w as usize
    }
}

fn grid(elements: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            elements.div_ceil(THREADS as usize).clamp(1, 65_535) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn msg(e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("bias+pool+relu on the GPU: {e}"))
}

/// The kernels' name suffix for values of `dtype`.
fn suffix(dtype: DType) -> candle_core::Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        DType::F16 => Ok("f16"),
        other => bail!("bias+pool+relu on the GPU: f32, bf16 or f16, not {other:?}"),
    }
}

/// `relu(max_pool2d(conv + bias, k))` of a CUDA conv output `(N, C, H, W)`
/// and bias `(C)` of one dtype (f32, bf16 or f16; in 16 bits the sum is
/// rounded to the type before pooling), with the backward of both.
pub(crate) fn bias_pool_relu(conv: &Tensor, bias: &Tensor, k: usize) -> crate::Result<Tensor> {
    let op = BiasPoolRelu {
        k,
        argmax: Mutex::new(None),
    };
    Ok(conv.contiguous()?.apply_op2(&bias.contiguous()?, op)?)
}

struct BiasPoolRelu {
    k: usize,
    /// Per pooled value, the winner's `ky * k + kx` or 255 (set by the forward).
    argmax: Mutex<Option<Arc<CudaSlice<u8>>>>,
}

impl BiasPoolRelu {
    /// The forward over a conv output and bias of element type `T`
    /// (contiguous ranges `c` and `b` of their storage).
    fn forward<T: CudaDType + DeviceRepr>(
        &self,
        s1: &CudaStorage,
        (c0, c1): (usize, usize),
        s2: &CudaStorage,
        (b0, b1): (usize, usize),
        d: &Dims,
    ) -> candle_core::Result<CudaStorage> {
        let dev = s1.device().clone();
        let conv = s1.as_cuda_slice::<T>()?.slice(c0..c1);
        let bias = s2.as_cuda_slice::<T>()?.slice(b0..b1);
        // SAFETY: both are written in full by the kernel.
        let mut y = unsafe { dev.alloc::<T>(d.pooled()) }?;
        let mut arg = unsafe { dev.alloc::<u8>(d.pooled()) }?;
        let name = format!("redline_bias_pool_relu_{}", suffix(s1.dtype())?);
        let func = function(&dev, &name).map_err(msg)?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&conv).arg(&bias).arg(&mut y).arg(&mut arg);
        d.push_all(&mut b);
        // SAFETY: the kernel's arguments in order; `conv` holds N*C*H*W
        // values of T, `bias` C, `y` and `arg` one per pooled value.
        unsafe { b.launch(grid(d.pooled())) }.map_err(msg)?;
        crate::slices::keep(&self.argmax, Arc::new(arg));
        Ok(CudaStorage::wrap_cuda_slice(y, dev))
    }
}

impl CustomOp2 for BiasPoolRelu {
    fn name(&self) -> &'static str {
        "redline-bias-pool-relu"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        bail!("redline-bias-pool-relu runs on CUDA devices only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let d = Dims::new(l1, self.k)?;
        if l2.shape().dims1()? != d.c as usize {
            bail!("bias+pool+relu: bias {:?} for {} channels", l2.shape(), d.c)
        }
        let (Some((c0, c1)), Some((b0, b1))) = (l1.contiguous_offsets(), l2.contiguous_offsets())
        else {
            bail!("bias+pool+relu: the inputs must be contiguous")
        };
        if s1.dtype() != s2.dtype() {
            bail!(
                "bias+pool+relu: the conv output is {:?} and the bias {:?}",
                s1.dtype(),
                s2.dtype()
            )
        }
        let y = match s1.dtype() {
            DType::F32 => self.forward::<f32>(s1, (c0, c1), s2, (b0, b1), &d)?,
            DType::BF16 => self.forward::<half::bf16>(s1, (c0, c1), s2, (b0, b1), &d)?,
            DType::F16 => self.forward::<half::f16>(s1, (c0, c1), s2, (b0, b1), &d)?,
            other => bail!("bias+pool+relu on the GPU: f32, bf16 or f16, not {other:?}"),
        };
        let shape = Shape::from((d.n as usize, d.c as usize, d.ph as usize, d.pw as usize));
        Ok((y, shape))
    }

    fn bwd(
        &self,
        conv: &Tensor,
        _bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let argmax = crate::slices::saved(&self.argmax, self.name())?;
        let d = Dims::new(conv.layout(), self.k)?;
        let flat = grad
            .contiguous()?
            .apply_op1_no_bwd(&BiasPoolReluBwd { argmax, d })?;
        let dconv = flat.narrow(0, 0, d.conv())?.reshape(conv.shape())?;
        let db = flat.narrow(0, d.conv(), d.c as usize)?;
        Ok((Some(dconv), Some(db)))
    }
}

/// `[d(conv) (N*C*H*W) | d(bias) (C)]` from the pooled output's gradient.
struct BiasPoolReluBwd {
    argmax: Arc<CudaSlice<u8>>,
    d: Dims,
}

impl CustomOp1 for BiasPoolReluBwd {
    fn name(&self) -> &'static str {
        "redline-bias-pool-relu-bwd"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        bail!("redline-bias-pool-relu-bwd runs on CUDA devices only")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let d = self.d;
        let Some((g0, g1)) = l.contiguous_offsets() else {
            bail!("bias+pool+relu backward: the gradient must be contiguous")
        };
        if g1 - g0 != d.pooled() || self.argmax.len() != d.pooled() {
            bail!(
                "bias+pool+relu backward: {} gradients and {} saved winners for {} pooled values",
                g1 - g0,
                self.argmax.len(),
                d.pooled()
            )
        }
        match s.dtype() {
            DType::F32 => self.backward::<f32>(s, (g0, g1)),
            DType::BF16 => self.backward::<half::bf16>(s, (g0, g1)),
            DType::F16 => self.backward::<half::f16>(s, (g0, g1)),
            other => bail!("bias+pool+relu backward on the GPU: f32, bf16 or f16, not {other:?}"),
        }
    }
}

impl BiasPoolReluBwd {
    /// `[d(conv) | d(bias)]` of element type `T` from the gradient in the
    /// contiguous range `g` of `s`.
    fn backward<T: CudaDType + DeviceRepr>(
        &self,
        s: &CudaStorage,
        (g0, g1): (usize, usize),
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let d = self.d;
        let dev = s.device().clone();
        let gy = s.as_cuda_slice::<T>()?.slice(g0..g1);
        let sfx = suffix(s.dtype())?;
        let total = d.conv() + d.c as usize;
        let splits = u32::try_from(crate::pool::block_bwd_splits(d.n as usize, d.c as usize))
            .map_err(msg)?;
        // SAFETY: d(conv) is written in full by the first kernel, d(bias) by the second.
        let mut out = unsafe { dev.alloc::<T>(total) }?;
        // SAFETY: block (s, ch) of the first kernel writes partial[s * C + ch].
        let mut partial = unsafe { dev.alloc::<f32>(splits as usize * d.c as usize) }?;
        let stream = dev.cuda_stream();
        {
            let mut dconv = out.slice_mut(0..d.conv());
            let func = function(&dev, &format!("redline_bias_pool_relu_bwd_{sfx}")).map_err(msg)?;
            let mut b = stream.launch_builder(&func);
            b.arg(&gy)
                .arg(self.argmax.as_ref())
                .arg(&mut dconv)
                .arg(&mut partial);
            d.push_all(&mut b);
            b.arg(&splits);
            let cfg = LaunchConfig {
                grid_dim: (splits, d.c, 1),
                block_dim: (crate::pool::BLOCK_BWD_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel's arguments in order, sized as checked above;
            // BLOCK_BWD_THREADS is its shared array's size.
            unsafe { b.launch(cfg) }.map_err(msg)?;
        }
        {
            let mut db = out.slice_mut(d.conv()..total);
            let (db_p, _db_g) = db.device_ptr_mut(&stream);
            super::sum_splits(&dev, sfx, &partial, db_p, (splits, d.c))?;
        }
        Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(total)))
    }
}
