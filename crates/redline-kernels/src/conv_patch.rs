//! Patch convolutions on the CPU: windows that tile the input (stride =
//! kernel, no padding), with few output channels (a ViT-style "patchify"
//! stem, issue 52's 8x8 stride-8 row).
//!
//! There the im2col matrix is the input itself, reordered, and the GEMM
//! after it is thin (Cout rows): writing and re-reading that matrix costs
//! more than the arithmetic. These kernels read each input value once from
//! its own place instead, eight output channels a SIMD vector:
//! - forward: each output pixel's channels accumulate `x * w[k]` over the
//!   window's taps, four pixels a pass sharing each weight vector;
//! - dW: each window row's `kw` taps accumulate `x * dy[pixel]` over all
//!   pixels (the output gradient transposed once per sample to
//!   pixel-major);
//! - dx: each window row gets `w[co, row] * dy[co, pixel]` (no overlap, so
//!   no sums between windows).
//!
//! Loops are over fixed eight-lane arrays, compiled for the best
//! instruction set present (`pulp`); sums run in tap order (ci, ky, kx).

use rayon::prelude::*;

use crate::conv::Geom;
use crate::conv_backward::add_row_sums;
use crate::conv_patch512 as p512;
use crate::conv_patch_simd::{self as simd, Lanes};

/// Output channels a vector.
const L: usize = 8;
/// Output pixels a forward pass.
const PIX: usize = 4;
/// The most output channels the direct forward takes; with more, each
/// input value is broadcast once per lane block and im2col + GEMM is
/// faster. Measured on the 2-core VM, 8x8 stride-8 patches of 3 x 224 x
/// 224, batch 64 (`conv_shapes --patch8 --patch-cout N --no-dx` built
/// with every shape direct, then with none;
/// bench/results/2026-11-28-vm-patch-kernels.md): forward 2.3 / 3.5 / 4.1
/// / 5.1 / 6.9 ms direct against 4.4 / 4.9 / 5.2 / 5.2 / 6.0 through the
/// GEMM at 8 / 16 / 24 / 32 / 48 channels.
const MAX_COUT_FORWARD: usize = 24;
/// The same for dW and db: 2.7 / 4.2 / 4.7 / 5.8 / 7.8 ms direct against
/// 5.4 / 5.7 / 6.1 / 6.1 / 6.8.
const MAX_COUT_BACKWARD: usize = 32;

impl Geom {
    /// Whether the windows tile the input (stride = kernel > 1, no
    /// padding) and the products are f32.
    fn tiles(&self) -> bool {
        self.stride > 1
            && self.kh == self.stride
            && self.kw == self.stride
            && self.pad == 0
            && self.gemm == candle_core::DType::F32
    }

    /// Whether the direct forward takes this convolution: tiling windows,
    /// at most [`MAX_COUT_FORWARD`] output channels.
    pub(super) fn patch_forward(&self) -> bool {
        self.tiles() && self.cout <= MAX_COUT_FORWARD
    }

    /// Whether the direct backward takes it: at most [`MAX_COUT_BACKWARD`].
    pub(super) fn patch_backward(&self) -> bool {
        self.tiles() && self.cout <= MAX_COUT_BACKWARD
    }

    /// Whether the AVX-512 kernels of [`p512`] take these windows.
    fn patch512(&self) -> bool {
        p512::available() && p512::fits(self.kw)
    }

    /// Each window row's first input value (`ci * h * w + ky * w`) in
    /// output row 0, rows in tap order.
    fn window_rows(&self) -> Vec<usize> {
        let hw = self.h * self.w;
        (0..self.cin * self.kh)
            .map(|r| (r / self.kh) * hw + (r % self.kh) * self.w)
            .collect()
    }

    /// The AVX-512 kernels' view of one sample.
    fn rows_of<'a>(&self, offs: &'a [usize]) -> p512::Rows<'a> {
        p512::Rows {
            offs,
            step: self.stride * self.w,
            oh: self.oh,
            ow: self.ow,
            kw: self.kw,
        }
    }

    /// Lane blocks of output channels.
    fn blocks(&self) -> usize {
        self.cout.div_ceil(L)
    }

    /// `w (Cout, K)` as `(blocks, K, L)`: each tap's output channels as
    /// lanes, zero past `Cout`.
    fn lanes_of(&self, w: &[f32]) -> Vec<Lanes> {
        let k = self.k();
        let mut out = vec![[0f32; L]; self.blocks() * k];
        for (co, row) in w.chunks(k).enumerate().take(self.cout) {
            let blk = &mut out[(co / L) * k..][..k];
            for (t, &v) in blk.iter_mut().zip(row) {
                t[co % L] = v;
            }
        }
        out
    }

    /// The forward of every sample (`w` as `(Cout, Cin, kh, kw)`), into `out`.
    pub(super) fn forward_patch(&self, w: &[f32], b: &[f32], x: &[f32], out: &mut [f32]) {
        let per = self.per_chunk();
        if self.patch512() {
            let offs = self.window_rows();
            let rows = self.rows_of(&offs);
            let ws = p512::spread_weights(w, self.cout, offs.len(), self.kw);
            let b = &b[..self.cout];
            let done = out
                .par_chunks_mut(per * self.out_len())
                .zip(x.par_chunks(per * self.in_len()))
                .all(|(out, x)| {
                    out.chunks_mut(self.out_len().max(1))
                        .zip(x.chunks(self.in_len().max(1)))
                        .all(|(y, x)| p512::forward_sample(x, (&ws, b), &rows, y))
                });
            if done {
                return;
            }
        }
        let wl = self.lanes_of(w);
        out.par_chunks_mut(per * self.out_len())
            .zip(x.par_chunks(per * self.in_len()))
            .for_each(|(out, x)| {
                pulp::Arch::new().dispatch(PatchForward {
                    g: self,
                    wl: &wl,
                    b,
                    x,
                    out,
                });
            });
    }

    /// One sample's output `(Cout, oh, ow)`: a row of output pixels at a time.
    #[inline(always)]
    fn forward_patch_sample(&self, wl: &[Lanes], b: &[f32], x: &[f32], y: &mut [f32]) {
        let (k, ow, hw) = (self.k(), self.ow, self.h * self.w);
        let mut row = vec![[0f32; L]; ow];
        let mut rows = vec![0; self.cin * self.kh];
        for oy in 0..self.oh {
            for (r, at) in rows.iter_mut().enumerate() {
                let (ci, ky) = (r / self.kh, r % self.kh);
                *at = ci * hw + (oy * self.stride + ky) * self.w;
            }
            for (blk, wb) in wl.chunks(k.max(1)).enumerate() {
                let mut ox0 = 0;
                while ox0 < ow {
                    let shifted = x.get(ox0 * self.stride..).unwrap_or_default();
                    let geom = (self.stride, self.kw);
                    let left = ow - ox0;
                    let fast8 = (left >= 8).then(|| simd::pixels::<8>(wb, shifted, &rows, geom));
                    if let Some(Some(a)) = fast8 {
                        row[ox0..ox0 + 8].copy_from_slice(&a);
                        ox0 += 8;
                    } else if left >= PIX {
                        let a = simd::pixels::<PIX>(wb, shifted, &rows, geom)
                            .unwrap_or_else(|| self.pixels::<PIX>(wb, x, oy, ox0));
                        row[ox0..ox0 + PIX].copy_from_slice(&a);
                        ox0 += PIX;
                    } else {
                        row[ox0] = self.pixels::<1>(wb, x, oy, ox0)[0];
                        ox0 += 1;
                    }
                }
                // Pixel-major lanes back to channel rows, the bias last.
                for j in 0..L.min(self.cout - blk * L) {
                    let co = blk * L + j;
                    let dst = &mut y[(co * self.oh + oy) * ow..][..ow];
                    for (d, a) in dst.iter_mut().zip(&row) {
                        *d = a[j] + b[co];
                    }
                }
            }
        }
    }

    /// The lanes of output pixels `ox0..ox0 + N` of row `oy` (one block of
    /// weights `wb`, `(K, L)`): each weight vector used `N` times.
    #[inline(always)]
    fn pixels<const N: usize>(&self, wb: &[Lanes], x: &[f32], oy: usize, ox0: usize) -> [Lanes; N] {
        let (hw, s, kw) = (self.h * self.w, self.stride, self.kw);
        let mut acc = [[0f32; L]; N];
        let mut taps = wb.chunks_exact(kw);
        for ci in 0..self.cin {
            for ky in 0..self.kh {
                let base = ci * hw + (oy * s + ky) * self.w + ox0 * s;
                let src = &x[base..base + (N - 1) * s + kw];
                let Some(wr) = taps.next() else {
                    return acc;
                };
                for (kx, wk) in wr.iter().enumerate() {
                    for (p, a) in acc.iter_mut().enumerate() {
                        let v = src[p * s + kx];
                        for j in 0..L {
                            a[j] = v.mul_add(wk[j], a[j]);
                        }
                    }
                }
            }
        }
        acc
    }

    /// `[dW | db]` of the whole batch into `dwb` (overwritten; dW as `(Cout,
    /// Cin, kh, kw)`), and dx into `dx` (zeroed) when given.
    pub(super) fn backward_patch(
        &self,
        (x, w, dy): (&[f32], &[f32], &[f32]),
        dwb: &mut [f32],
        dx: Option<&mut [f32]>,
    ) {
        let (k, per) = (self.k(), self.per_chunk());
        if self.patch512() && self.weight_grad_patch512(x, dy, dwb) {
            if let Some(dx) = dx {
                self.input_grad_all(w, dy, dx);
            }
            return;
        }
        let partials: Vec<(Vec<Lanes>, Vec<f32>)> = x
            .par_chunks(per * self.in_len())
            .zip(dy.par_chunks(per * self.out_len()))
            .map(|(x, dy)| {
                let mut acc = vec![[0f32; L]; self.blocks() * k];
                let mut db = vec![0f32; self.cout];
                pulp::Arch::new().dispatch(PatchWeightGrad {
                    g: self,
                    x,
                    dy,
                    acc: &mut acc,
                });
                for dy in dy.chunks(self.out_len()) {
                    add_row_sums(&mut db, dy, self.ohw());
                }
                (acc, db)
            })
            .collect();
        self.sum_partials(&partials, dwb, |acc, dw| {
            for (co, row) in dw.chunks_mut(k.max(1)).enumerate().take(self.cout) {
                let blk = &acc[(co / L) * k..][..k];
                for (d, a) in row.iter_mut().zip(blk) {
                    *d += a[co % L];
                }
            }
        });
        if let Some(dx) = dx {
            self.input_grad_all(w, dy, dx);
        }
    }

    /// `[dW | db]` through the AVX-512 kernels (`dwb` overwritten); `false`
    /// (`dwb` untouched) when they refuse a chunk.
    fn weight_grad_patch512(&self, x: &[f32], dy: &[f32], dwb: &mut [f32]) -> bool {
        let per = self.per_chunk();
        let offs = self.window_rows();
        let rows = self.rows_of(&offs);
        let vectors = self.blocks() * offs.len() * p512::C;
        let partials: Option<Vec<(Vec<p512::Vec16>, Vec<f32>)>> = x
            .par_chunks(per * self.in_len())
            .zip(dy.par_chunks(per * self.out_len()))
            .map(|(x, dy)| {
                let mut acc = vec![[0f32; p512::LANES]; vectors];
                let (mut db, mut scratch) = (vec![0f32; self.cout], Vec::new());
                for (x, dy) in x.chunks(self.in_len()).zip(dy.chunks(self.out_len())) {
                    if !p512::weight_grad_sample((x, dy), &rows, self.cout, &mut acc, &mut scratch)
                    {
                        return None;
                    }
                    add_row_sums(&mut db, dy, self.ohw());
                }
                Some((acc, db))
            })
            .collect();
        let Some(partials) = partials else {
            return false;
        };
        self.sum_partials(&partials, dwb, |acc, dw| {
            p512::reduce_weight_grad(acc, offs.len(), self.kw, dw);
        });
        true
    }

    /// `[dW | db]` (overwritten) from the threads' partial sums: each
    /// chunk's dW added by `add_dw`, its db summed.
    fn sum_partials<A>(
        &self,
        partials: &[(A, Vec<f32>)],
        dwb: &mut [f32],
        add_dw: impl Fn(&A, &mut [f32]),
    ) {
        let (dw, db) = dwb.split_at_mut(self.cout * self.k());
        dw.fill(0.0);
        db.fill(0.0);
        for (acc, pdb) in partials {
            add_dw(acc, dw);
            for (d, s) in db.iter_mut().zip(pdb) {
                *d += s;
            }
        }
    }

    /// dx of the whole batch (zeroed on entry).
    fn input_grad_all(&self, w: &[f32], dy: &[f32], dx: &mut [f32]) {
        let per = self.per_chunk();
        dx.par_chunks_mut(per * self.in_len())
            .zip(dy.par_chunks(per * self.out_len()))
            .for_each(|(dx, dy)| {
                pulp::Arch::new().dispatch(PatchInputGrad { g: self, w, dy, dx });
            });
    }

    /// dW of a chunk's samples added into `acc` (`(blocks, K, L)`).
    #[inline(always)]
    fn weight_grad_patch(&self, x: &[f32], dy: &[f32], acc: &mut [Lanes]) {
        let (k, p, hw) = (self.k(), self.ohw(), self.h * self.w);
        let mut dyt = vec![[0f32; L]; self.blocks() * p];
        let mut rows = vec![0; self.oh];
        for (x, dy) in x.chunks(self.in_len()).zip(dy.chunks(self.out_len())) {
            // dy (Cout, oh*ow) -> (blocks, oh*ow, L).
            for (co, row) in dy.chunks(p.max(1)).enumerate().take(self.cout) {
                let blk = &mut dyt[(co / L) * p..][..p];
                for (t, &v) in blk.iter_mut().zip(row) {
                    t[co % L] = v;
                }
            }
            for (blk, dyb) in dyt.chunks(p.max(1)).enumerate() {
                let accb = &mut acc[blk * k..][..k];
                for ci in 0..self.cin {
                    for ky in 0..self.kh {
                        let t = (ci * self.kh + ky) * self.kw;
                        let taps = &mut accb[t..t + self.kw];
                        let full = self.kw / L * L;
                        for kx0 in (0..full).step_by(L) {
                            for (oy, at) in rows.iter_mut().enumerate() {
                                *at = ci * hw + (oy * self.stride + ky) * self.w + kx0;
                            }
                            let a = simd::taps8(x, dyb, &rows, (self.stride, self.ow))
                                .unwrap_or_else(|| self.window_row::<L>(x, dyb, (ci, ky, kx0)));
                            add_lanes(&mut taps[kx0..kx0 + L], &a);
                        }
                        for kx in full..self.kw {
                            let a = self.window_row::<1>(x, dyb, (ci, ky, kx));
                            add_lanes(&mut taps[kx..=kx], &a);
                        }
                    }
                }
            }
        }
    }

    /// dW of taps `(ci, ky, kx0..kx0 + N)` of one sample over all its
    /// output pixels (`dyb`: one block's `(oh*ow, L)` output gradient).
    #[inline(always)]
    fn window_row<const N: usize>(
        &self,
        x: &[f32],
        dyb: &[Lanes],
        (ci, ky, kx0): (usize, usize, usize),
    ) -> [Lanes; N] {
        let (hw, s, ow) = (self.h * self.w, self.stride, self.ow);
        let mut a = [[0f32; L]; N];
        for (oy, drow) in dyb.chunks_exact(ow.max(1)).enumerate().take(self.oh) {
            let base = ci * hw + (oy * s + ky) * self.w + kx0;
            let row = &x[base..base + (ow - 1) * s + N];
            for (ox, d) in drow.iter().enumerate() {
                let src = &row[ox * s..ox * s + N];
                for (ai, &v) in a.iter_mut().zip(src) {
                    for j in 0..L {
                        ai[j] = v.mul_add(d[j], ai[j]);
                    }
                }
            }
        }
        a
    }

    /// dx of a chunk's samples (zeroed on entry): each window's rows get
    /// `w[co, ci, ky, :] * dy[co, pixel]` over the output channels.
    #[inline(always)]
    fn input_grad_patch(&self, w: &[f32], dy: &[f32], dx: &mut [f32]) {
        let (k, hw, kk, p) = (self.k(), self.h * self.w, self.kh * self.kw, self.ohw());
        let (s, kw, ow) = (self.stride, self.kw, self.ow);
        for (dx, dy) in dx.chunks_mut(self.in_len()).zip(dy.chunks(self.out_len())) {
            // Row by row of dx, which stays in L1 across the output channels.
            for ci in 0..self.cin {
                for ky in 0..self.kh {
                    for oy in 0..self.oh {
                        let base = ci * hw + (oy * s + ky) * self.w;
                        let dst = &mut dx[base..base + (ow - 1) * s + kw];
                        let tap = ci * kk + ky * kw;
                        let full = kw / L * L;
                        for ox in 0..ow {
                            // Windows do not overlap: each segment is written once.
                            let seg = &mut dst[ox * s..ox * s + kw];
                            let d = |co: usize| dy[co * p + oy * ow + ox];
                            for kx0 in (0..full).step_by(L) {
                                let mut acc = [0f32; L];
                                for co in 0..self.cout {
                                    let (dv, at) = (d(co), co * k + tap + kx0);
                                    let wr: &[f32] = &w[at..at + L];
                                    for j in 0..L {
                                        acc[j] = wr[j].mul_add(dv, acc[j]);
                                    }
                                }
                                seg[kx0..kx0 + L].copy_from_slice(&acc);
                            }
                            for (kx, o) in seg.iter_mut().enumerate().skip(full) {
                                *o = (0..self.cout)
                                    .fold(0.0, |a, co| a + w[co * k + tap + kx] * d(co));
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `dst[i] += src[i]`, lane by lane.
#[inline(always)]
fn add_lanes(dst: &mut [Lanes], src: &[Lanes]) {
    for (d, s) in dst.iter_mut().zip(src) {
        for j in 0..L {
            d[j] += s[j];
        }
    }
}

/// [`Geom::forward_patch_sample`] over a chunk, compiled by `pulp`.
struct PatchForward<'a> {
    g: &'a Geom,
    wl: &'a [Lanes],
    b: &'a [f32],
    x: &'a [f32],
    out: &'a mut [f32],
}

impl pulp::WithSimd for PatchForward<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let g = self.g;
        for (y, x) in self
            .out
            .chunks_mut(g.out_len().max(1))
            .zip(self.x.chunks(g.in_len().max(1)))
        {
            g.forward_patch_sample(self.wl, self.b, x, y);
        }
    }
}

/// [`Geom::weight_grad_patch`], compiled by `pulp`.
struct PatchWeightGrad<'a> {
    g: &'a Geom,
    x: &'a [f32],
    dy: &'a [f32],
    acc: &'a mut [Lanes],
}

impl pulp::WithSimd for PatchWeightGrad<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        self.g.weight_grad_patch(self.x, self.dy, self.acc);
    }
}

/// [`Geom::input_grad_patch`], compiled by `pulp`.
struct PatchInputGrad<'a> {
    g: &'a Geom,
    w: &'a [f32],
    dy: &'a [f32],
    dx: &'a mut [f32],
}

impl pulp::WithSimd for PatchInputGrad<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        self.g.input_grad_patch(self.w, self.dy, self.dx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn geom(b: usize, cin: usize, hw: (usize, usize), cout: usize, k: usize) -> Geom {
        let x = Tensor::zeros((b, cin, hw.0, hw.1), candle_core::DType::F32, &Device::Cpu);
        let w = Tensor::zeros((cout, cin, k, k), candle_core::DType::F32, &Device::Cpu);
        let bias = Tensor::zeros(cout, candle_core::DType::F32, &Device::Cpu);
        let (Ok(x), Ok(w), Ok(bias)) = (x, w, bias) else {
            panic!("tensors");
        };
        match Geom::strided(&x, &w, &bias, 0, k) {
            Ok(g) => g,
            Err(e) => panic!("{e}"),
        }
    }

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
    }

    #[test]
    fn only_tiling_windows_with_few_channels_take_the_direct_kernels() {
        let g = geom(1, 3, (32, 32), 8, 8);
        assert!(g.patch_forward() && g.patch_backward());
        let g = geom(1, 3, (32, 32), MAX_COUT_FORWARD + 1, 4);
        assert!(!g.patch_forward() && g.patch_backward());
        assert!(!geom(1, 3, (32, 32), MAX_COUT_BACKWARD + 1, 4).patch_backward());
        // Stride 1 (a 1x1 kernel tiles too, but is the pointwise path).
        let g = geom(1, 3, (32, 32), 8, 1);
        assert!(!g.patch_forward() && !g.patch_backward());
    }

    /// The patch kernels (AVX-512 where present) against im2col + GEMM:
    /// widths 2-16, output rows and columns that end mid-vector, window
    /// rows not a multiple of the tile's, channels past one block, and
    /// input rows and columns no window covers holding NaN (never read).
    #[test]
    fn patch_kernels_match_im2col() {
        use crate::conv_reference::{close, vals};
        let cases = [
            (3, 3, (32, 40), 8, 8),
            (2, 2, (17, 36), 13, 4),
            (2, 1, (16, 48), 3, 16),
            (2, 3, (10, 22), 5, 2),
            (1, 3, (19, 43), 8, 8),
            (2, 3, (24, 24), 24, 8),
        ];
        for (b, cin, hw, cout, k) in cases {
            let g = geom(b, cin, hw, cout, k);
            let what = format!("b{b} cin{cin} {hw:?} cout{cout} k{k}");
            let mut x = vals(g.b * g.in_len(), 0.37);
            for (i, v) in x.iter_mut().enumerate() {
                let (y, c) = ((i / g.w) % g.h, i % g.w);
                if y >= g.oh * k || c >= g.ow * k {
                    *v = f32::NAN;
                }
            }
            let (w, bias) = (vals(g.cout * g.k(), 0.11), vals(g.cout, 0.7));
            let mut y = vec![0f32; g.b * g.out_len()];
            g.forward_patch(&w, &bias, &x, &mut y);
            let want = g.reference_forward(&w, &bias, &x).unwrap();
            close(&format!("forward {what}"), &y, &want);
            let dy = vals(g.b * g.out_len(), 0.23);
            let mut dwb = vec![f32::NAN; g.cout * g.k() + g.cout];
            g.backward_patch((&x, &w, &dy), &mut dwb, None);
            let want = g.reference_weight_grad(&x, &dy).unwrap();
            close(&format!("dW {what}"), &dwb, &want);
            // Where AVX-512 is present, its kernels (not the fallback) ran.
            let offs = g.window_rows();
            let ws = p512::spread_weights(&w, g.cout, offs.len(), g.kw);
            let mut y1 = vec![0f32; g.out_len()];
            let ran = p512::forward_sample(&x, (&ws, &bias), &g.rows_of(&offs), &mut y1);
            assert_eq!(ran, p512::available(), "{what}");
        }
    }

    /// The AVX2 inner loops give the portable loops' sums (where AVX2 and
    /// FMA are present; the portable loops are what runs elsewhere).
    #[test]
    fn simd_inner_loops_match_the_portable_ones() {
        let g = geom(1, 3, (24, 80), 8, 8);
        let x = values(g.in_len(), 0.5);
        let wl: Vec<Lanes> = values(g.k() * L, 1.5)
            .chunks_exact(L)
            .map(|c| {
                let mut l = [0f32; L];
                l.copy_from_slice(c);
                l
            })
            .collect();
        let (hw, oy) = (g.h * g.w, 2);
        let rows: Vec<usize> = (0..g.cin * g.kh)
            .map(|r| (r / g.kh) * hw + (oy * g.stride + r % g.kh) * g.w)
            .collect();
        let Some(fast) = simd::pixels::<8>(&wl, &x[8..], &rows, (g.stride, g.kw)) else {
            assert!(!simd::available(), "pixels refused in-bounds rows");
            return;
        };
        let slow = g.pixels::<8>(&wl, &x, oy, 1);
        for (f, s) in fast.iter().flatten().zip(slow.iter().flatten()) {
            assert!((f - s).abs() <= 1e-5 * s.abs().max(1.0), "{f} vs {s}");
        }
        let fast4 = simd::pixels::<4>(&wl, &x[8..], &rows, (g.stride, g.kw));
        assert_eq!(fast4.map(|a| a.to_vec()), Some(fast[..4].to_vec()));
        let dyb: Vec<Lanes> = wl[..g.ohw()].to_vec();
        let rows: Vec<usize> = (0..g.oh).map(|oy| hw + (oy * 8 + 5) * g.w).collect();
        let fast = simd::taps8(&x, &dyb, &rows, (g.stride, g.ow));
        let slow = g.window_row::<8>(&x, &dyb, (1, 5, 0));
        let Some(fast) = fast else {
            panic!("taps8 refused in-bounds rows");
        };
        for (f, s) in fast.iter().flatten().zip(slow.iter().flatten()) {
            assert!((f - s).abs() <= 1e-5 * s.abs().max(1.0), "{f} vs {s}");
        }
        // Rows past the input are refused, not read.
        assert!(simd::pixels::<4>(&wl, &x, &[x.len() - 8], (8, 8)).is_none());
        assert!(simd::pixels::<3>(&wl, &x, &rows, (8, 8)).is_none());
        assert!(simd::taps8(&x, &dyb, &[x.len() - 4], (8, 1)).is_none());
    }
}
