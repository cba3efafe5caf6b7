//! The plan of the GPU's implicit-GEMM convolution (`cuda/conv.cu`): sizes,
//! launch grids, the split of the weight gradient's long reduction, and the
//! gathers that read each GEMM operand straight from the images, written
//! here with the kernel's index arithmetic so that the CPU tests check them
//! against candle's convolution (forward, input and weight gradients).
//!
//! Stride 1, dilation 1, zero padding, one group: PyTorch's
//! `F.conv2d(x, w, padding=p)`.

use crate::error::{Error, Result};

/// Rows (M) of one block's output tile.
pub const TILE_M: usize = 64;
/// Columns (N) of one block's output tile.
pub const TILE_N: usize = 64;
/// The reduction step: k values staged in shared memory at a time.
pub const TILE_K: usize = 8;
/// Threads per block (16 x 16, 4 x 4 outputs each).
pub const THREADS: u32 = 256;
/// Threads per block of the 16-bit tensor-core kernels (`cuda/conv_mma.cu`):
/// 4 warps, each a 32 x 32 quarter of the same 64 x 64 tile, so the grids
/// and the weight gradient's splits are the f32 kernels'.
pub const MMA_THREADS: u32 = 128;
/// Target length of one split of the weight gradient's reduction.
const SPLIT_TARGET: usize = 384;
/// At most this many splits (the partial sums take `splits * Cout * Cin*kh*kw` floats).
const MAX_SPLITS: usize = 512;

/// Sizes of one convolution: `x (n, cin, h, w)`, `w (cout, cin, kh, kw)`, padding `pad`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvDims {
    /// Batch.
    pub n: usize,
    /// Input channels.
    pub cin: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Zero padding on every side.
    pub pad: usize,
}

/// A launch grid: blocks along x, y and z.
pub type Grid = (u32, u32, u32);

impl ConvDims {
    /// Checks the shapes: 4-D input and weight with the same input channels, a
    /// kernel that fits the padded input, and every GEMM size within the
    /// kernel's 32-bit indices.
    pub fn new(x: &[usize], w: &[usize], pad: usize) -> Result<Self> {
        let (&[n, cin, h, wd], &[cout, wcin, kh, kw]) = (x, w) else {
            return Err(Error::Shape(format!(
                "conv2d on the GPU: input {x:?} and weight {w:?}: expected (N, Cin, H, W) and \
                 (Cout, Cin, kh, kw)"
            )));
        };
        if cin != wcin || kh == 0 || kw == 0 || h + 2 * pad < kh || wd + 2 * pad < kw {
            return Err(Error::Shape(format!(
                "conv2d on the GPU: input {x:?}, weight {w:?}, padding {pad}: the channels must \
                 agree and the kernel fit the padded input"
            )));
        }
        let d = Self {
            n,
            cin,
            h,
            w: wd,
            cout,
            kh,
            kw,
            pad,
        };
        let largest = [
            d.n * d.h * d.w * d.cin.max(d.cout),
            d.cout * d.cin * d.kh * d.kw,
            d.n * d.oh() * d.ow() * d.cout,
        ];
        if largest.iter().any(|&v| u32::try_from(v).is_err()) {
            return Err(Error::Shape(format!(
                "conv2d on the GPU: input {x:?}, weight {w:?}: a tensor of 2^32 or more \
                 elements is beyond the kernel's indices"
            )));
        }
        Ok(d)
    }

    /// Output height.
    pub fn oh(&self) -> usize {
        self.h + 2 * self.pad + 1 - self.kh
    }

    /// Output width.
    pub fn ow(&self) -> usize {
        self.w + 2 * self.pad + 1 - self.kw
    }

    /// The forward's grid: output pixels by output channels.
    pub fn fwd_grid(&self) -> Grid {
        grid(self.n * self.oh() * self.ow(), self.cout, 1)
    }

    /// The input gradient's grid: input pixels by input channels.
    pub fn dx_grid(&self) -> Grid {
        grid(self.n * self.h * self.w, self.cin, 1)
    }

    /// The weight gradient's grid and the length of each split of its
    /// reduction over the output pixels (see [`split_k`]).
    pub fn dw_plan(&self) -> (Grid, usize) {
        let (splits, chunk) = split_k(self.n * self.oh() * self.ow());
        (grid(self.cout, self.cin * self.kh * self.kw, splits), chunk)
    }

    /// The input at `(b, ci, oy + ky - pad, ox + kx - pad)`, zero outside.
    #[allow(clippy::too_many_arguments)]
    fn input(
        &self,
        x: &[f32],
        b: usize,
        ci: usize,
        oy: usize,
        ox: usize,
        ky: usize,
        kx: usize,
    ) -> f32 {
        let (iy, ix) = (
            (oy + ky) as isize - self.pad as isize,
            (ox + kx) as isize - self.pad as isize,
        );
        if iy < 0 || iy >= self.h as isize || ix < 0 || ix >= self.w as isize {
            return 0.0;
        }
        x[((b * self.cin + ci) * self.h + iy as usize) * self.w + ix as usize]
    }

    /// Output pixel `m` as `(b, oy, ox)`.
    fn out_pixel(&self, m: usize) -> (usize, usize, usize) {
        split3(m, self.ow(), self.oh())
    }

    /// Input pixel `m` as `(b, iy, ix)`.
    fn in_pixel(&self, m: usize) -> (usize, usize, usize) {
        split3(m, self.w, self.h)
    }

    /// Kernel tap `k` as `(channel, ky, kx)`.
    fn tap(&self, k: usize) -> (usize, usize, usize) {
        split3(k, self.kw, self.kh)
    }

    /// Forward A(m, k): m = (b, oy, ox), k = (ci, ky, kx).
    pub fn fwd_a(&self, x: &[f32], m: usize, k: usize) -> f32 {
        let ((b, oy, ox), (ci, ky, kx)) = (self.out_pixel(m), self.tap(k));
        self.input(x, b, ci, oy, ox, ky, kx)
    }

    /// Forward B(k, n) = w[n, k].
    pub fn fwd_b(&self, w: &[f32], k: usize, n: usize) -> f32 {
        w[n * (self.cin * self.kh * self.kw) + k]
    }

    /// Where the forward's C(m, n) goes in `y (N, Cout, OH, OW)`.
    pub fn fwd_c(&self, m: usize, n: usize) -> usize {
        let (b, oy, ox) = self.out_pixel(m);
        ((b * self.cout + n) * self.oh() + oy) * self.ow() + ox
    }

    /// Input-gradient A(m, k): m = (b, iy, ix), k = (co, ky, kx): the output
    /// gradient at `(iy + pad - ky, ix + pad - kx)`, zero outside.
    pub fn dx_a(&self, dy: &[f32], m: usize, k: usize) -> f32 {
        let ((b, iy, ix), (co, ky, kx)) = (self.in_pixel(m), self.tap(k));
        let oy = (iy + self.pad) as isize - ky as isize;
        let ox = (ix + self.pad) as isize - kx as isize;
        if oy < 0 || oy >= self.oh() as isize || ox < 0 || ox >= self.ow() as isize {
            return 0.0;
        }
        dy[((b * self.cout + co) * self.oh() + oy as usize) * self.ow() + ox as usize]
    }

    /// Input-gradient B(k, n) = w[co, n, ky, kx].
    pub fn dx_b(&self, w: &[f32], k: usize, n: usize) -> f32 {
        let (co, ky, kx) = self.tap(k);
        w[((co * self.cin + n) * self.kh + ky) * self.kw + kx]
    }

    /// Where the input gradient's C(m, n) goes in `dx (N, Cin, H, W)`.
    pub fn dx_c(&self, m: usize, n: usize) -> usize {
        let (b, iy, ix) = self.in_pixel(m);
        ((b * self.cin + n) * self.h + iy) * self.w + ix
    }

    /// Weight-gradient A(m, k) = dy[b, m, oy, ox], k = (b, oy, ox).
    pub fn dw_a(&self, dy: &[f32], m: usize, k: usize) -> f32 {
        let (b, oy, ox) = self.out_pixel(k);
        dy[((b * self.cout + m) * self.oh() + oy) * self.ow() + ox]
    }

    /// Weight-gradient B(k, n): element n = (ci, ky, kx) of output pixel k's patch.
    pub fn dw_b(&self, x: &[f32], k: usize, n: usize) -> f32 {
        let ((b, oy, ox), (ci, ky, kx)) = (self.out_pixel(k), self.tap(n));
        self.input(x, b, ci, oy, ox, ky, kx)
    }
}

/// `i = (outer * middle + mid) * inner + in` as `(outer, mid, in)`: the
/// kernel's `split3`.
fn split3(i: usize, inner: usize, middle: usize) -> (usize, usize, usize) {
    let t = i / inner;
    (t / middle, t % middle, i % inner)
}

fn grid(rows: usize, cols: usize, z: usize) -> Grid {
    let g = |v: usize| u32::try_from(v.max(1)).unwrap_or(u32::MAX);
    (g(rows.div_ceil(TILE_M)), g(cols.div_ceil(TILE_N)), g(z))
}

/// Splits a reduction of `total` terms into `(splits, chunk)`: split `z`
/// sums `[z * chunk, min((z + 1) * chunk, total))`. Every split is
/// non-empty, `chunk` is a multiple of [`TILE_K`], and there are at most
/// 512 splits of about 384 terms.
pub fn split_k(total: usize) -> (usize, usize) {
    if total == 0 {
        return (1, TILE_K);
    }
    let want = total.div_ceil(SPLIT_TARGET).clamp(1, MAX_SPLITS);
    let chunk = total.div_ceil(want).div_ceil(TILE_K) * TILE_K;
    (total.div_ceil(chunk), chunk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor, Var};

    #[test]
    fn splits_cover_the_reduction_once() {
        for total in [
            1, 7, 8, 383, 384, 385, 9_999, 12_544, 50_176, 401_408, 10_000_000,
        ] {
            let (splits, chunk) = split_k(total);
            assert_eq!(chunk % TILE_K, 0, "{total}");
            assert!((1..=MAX_SPLITS).contains(&splits), "{total}: {splits}");
            // The last split starts inside the range and the splits reach its end.
            assert!(
                (splits - 1) * chunk < total && splits * chunk >= total,
                "{total}"
            );
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(
            ConvDims::new(&[2, 3, 8, 8], &[4, 2, 3, 3], 1).is_err(),
            "channels"
        );
        assert!(
            ConvDims::new(&[2, 3, 2, 2], &[4, 3, 5, 5], 1).is_err(),
            "kernel too big"
        );
        assert!(
            ConvDims::new(&[2, 3, 8], &[4, 3, 3, 3], 1).is_err(),
            "3-D input"
        );
        assert!(
            ConvDims::new(&[70_000, 64, 128, 128], &[4, 64, 3, 3], 1).is_err(),
            "indices"
        );
        let d = ConvDims::new(&[2, 3, 8, 9], &[4, 3, 3, 5], 1).unwrap();
        assert_eq!((d.oh(), d.ow()), (8, 7));
        assert_eq!(d.fwd_grid(), (2, 1, 1));
    }

    /// C = A B over `rows x cols` (`total` terms each), the reduction split as the kernel splits
    /// it (each split summed in k order, then the splits in order), written
    /// through `at`.
    fn gemm(
        (rows, cols, total): (usize, usize, usize),
        splits: (usize, usize),
        a: &dyn Fn(usize, usize) -> f32,
        b: &dyn Fn(usize, usize) -> f32,
        at: &dyn Fn(usize, usize) -> usize,
        len: usize,
    ) -> Vec<f32> {
        let mut out = vec![0f32; len];
        for m in 0..rows {
            for n in 0..cols {
                let mut s = 0f32;
                for z in 0..splits.0 {
                    let mut part = 0f32;
                    for k in z * splits.1..((z + 1) * splits.1).min(total) {
                        part = a(m, k).mul_add(b(k, n), part);
                    }
                    s += part;
                }
                out[at(m, n)] = s;
            }
        }
        out
    }

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed).sin() * 1.3)
            .collect()
    }

    fn max_rel(a: &[f32], b: &Tensor) -> f32 {
        let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(1e-12f32, |m, v| m.max(v.abs()));
        a.iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
            / scale
    }

    #[test]
    fn the_gathers_compute_candles_convolution_and_its_gradients() -> Result<()> {
        for (x_dims, w_dims, pad) in [
            ([2usize, 3, 7, 6], [4usize, 3, 3, 3], 1usize),
            ([3, 2, 9, 9], [5, 2, 5, 3], 2),
            ([1, 1, 6, 6], [2, 1, 3, 3], 0),
            ([2, 4, 5, 7], [3, 4, 1, 1], 0),
        ] {
            let d = ConvDims::new(&x_dims, &w_dims, pad)?;
            let xs = values(x_dims.iter().product(), 0.3);
            let ws = values(w_dims.iter().product(), 1.1);
            let x = Var::from_tensor(&Tensor::from_vec(xs.clone(), &x_dims[..], &Device::Cpu)?)?;
            let w = Var::from_tensor(&Tensor::from_vec(ws.clone(), &w_dims[..], &Device::Cpu)?)?;
            let y = x.as_tensor().conv2d(w.as_tensor(), pad, 1, 1, 1)?;
            let (oh, ow) = (d.oh(), d.ow());
            let pixels = d.n * oh * ow;
            let kk = d.cin * d.kh * d.kw;
            let ours = gemm(
                (pixels, d.cout, kk),
                (1, kk),
                &|m, k| d.fwd_a(&xs, m, k),
                &|k, n| d.fwd_b(&ws, k, n),
                &|m, n| d.fwd_c(m, n),
                y.elem_count(),
            );
            let case = format!("{x_dims:?} {w_dims:?} pad {pad}");
            assert!(max_rel(&ours, &y) < 1e-6, "{case}: y");

            // An output gradient, and candle's gradients for it.
            let gy = values(y.elem_count(), 2.3);
            let gt = Tensor::from_vec(gy.clone(), y.dims(), &Device::Cpu)?;
            let grads = (y * &gt)?.sum_all()?.backward()?;
            let (Some(want_dx), Some(want_dw)) =
                (grads.get(x.as_tensor()), grads.get(w.as_tensor()))
            else {
                panic!("{case}: candle gave no gradients");
            };
            let kdx = d.cout * d.kh * d.kw;
            let dx = gemm(
                (d.n * d.h * d.w, d.cin, kdx),
                (1, kdx),
                &|m, k| d.dx_a(&gy, m, k),
                &|k, n| d.dx_b(&ws, k, n),
                &|m, n| d.dx_c(m, n),
                xs.len(),
            );
            assert!(max_rel(&dx, want_dx) < 1e-6, "{case}: dx");
            let ((gx, gyy, gz), chunk) = d.dw_plan();
            assert_eq!((gx, gyy), (1, 1), "{case}");
            // The kernel's split, and a forced small one, give the same sums.
            for split in [(gz as usize, chunk), (pixels.div_ceil(TILE_K), TILE_K)] {
                let dw = gemm(
                    (d.cout, kk, pixels),
                    split,
                    &|m, k| d.dw_a(&gy, m, k),
                    &|k, n| d.dw_b(&xs, k, n),
                    &|m, n| m * kk + n,
                    ws.len(),
                );
                // Up to 486 terms summed in another order than candle's: 1.5e-6 seen.
                let r = max_rel(&dw, want_dw);
                assert!(r < 1e-5, "{case}: dw split {split:?}: {r:e}");
            }
        }
        Ok(())
    }
}
