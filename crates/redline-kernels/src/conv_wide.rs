//! The conv block's "wide" layout: each sample's input is copied once into a
//! zero-padded buffer, and the convolution is computed at every column of the
//! padded width `wp = W + 2p`, `oh` rows of `wp` outputs of which the last
//! `kw - 1` per row are junk the pooling skips.
//!
//! Then each im2col row (one tap of one channel) is one contiguous slice of
//! the padded input, and col2im adds each row back as one contiguous slice.
//! The plain layout copies `oh` short runs per row instead, with the borders
//! filled in between: on the zoo CNN's second conv 4032 copies of 14 floats
//! per sample, which cost more than half as much as its GEMMs. The price is
//! `kw - 1` junk columns per row in the GEMMs (+14% there); the output
//! gradient is zero on them, so they add nothing to dW, db or dx.

use candle_core::{bail, DType};

use crate::conv::{gemm_or_err, Geom};
use crate::gemm::Mat;
use crate::gemm_bf16::matmul_packed;
use crate::gemm_bf16_pack::{PackedA, PackedB};

impl Geom {
    /// Width of the wide output and of each padded plane: the padded width
    /// `W + 2p`, over the stride rounded up (the direct kernels' phase
    /// planes, [`crate::conv_direct`]; the conv block's stride is 1).
    pub(super) fn wp(&self) -> usize {
        (self.w + 2 * self.pad).div_ceil(self.stride)
    }

    /// Columns of the wide output: `oh` rows of [`Geom::wp`].
    pub(super) fn ohw_wide(&self) -> usize {
        self.oh * self.wp()
    }

    /// Elements of one padded plane: its rows of [`Geom::wp`], plus the
    /// slack that the last taps' junk columns read (`kw - 1` at stride 1).
    fn plane_padded(&self) -> usize {
        let s = self.stride;
        (self.h + 2 * self.pad).div_ceil(s) * self.wp() + (self.kw - 1) / s
    }

    /// Elements of one padded sample: `Cin * stride * stride` planes. The
    /// buffer must start zeroed (the border is never written, only the
    /// image).
    pub(super) fn padded_len(&self) -> usize {
        self.cin * self.stride * self.stride * self.plane_padded()
    }

    /// Copies one `(Cin, H, W)` sample into its padded planes: padded
    /// pixel `(r, c)` goes to plane `(r % s, c % s)` at `(r / s, c / s)`,
    /// so that a tap reads one plane at consecutive addresses for
    /// consecutive output pixels (stride 1: one plane, the padded image).
    pub(super) fn pad_into(&self, x: &[f32], xp: &mut [f32]) {
        let (s, pad, wq, plane) = (self.stride, self.pad, self.wp(), self.plane_padded());
        for (ci, img) in x.chunks(self.h * self.w).enumerate() {
            let planes = &mut xp[ci * s * s * plane..][..s * s * plane];
            for (iy, row) in img.chunks(self.w).enumerate() {
                let r = iy + pad;
                if s == 1 {
                    planes[r * wq + pad..][..self.w].copy_from_slice(row);
                    continue;
                }
                // Plane column j of phase b holds padded column j * s + b.
                for b in 0..s {
                    let j0 = pad.saturating_sub(b).div_ceil(s);
                    let Some(ix0) = (j0 * s + b).checked_sub(pad).filter(|&i| i < self.w) else {
                        continue;
                    };
                    let dst = &mut planes[((r % s) * s + b) * plane + (r / s) * wq + j0..];
                    for (d, &v) in dst.iter_mut().zip(row[ix0..].iter().step_by(s)) {
                        *d = v;
                    }
                }
            }
        }
    }

    /// Copies the interior of the padded gradient `dxp` into `dx (Cin, H, W)`
    /// (stride 1: the conv block's).
    pub(super) fn unpad_into(&self, dxp: &[f32], dx: &mut [f32]) {
        let (wp, pp) = (self.wp(), self.plane_padded());
        for (plane, src) in dx.chunks_mut(self.h * self.w).zip(dxp.chunks(pp)) {
            for (iy, row) in plane.chunks_mut(self.w).enumerate() {
                row.copy_from_slice(&src[(iy + self.pad) * wp + self.pad..][..self.w]);
            }
        }
    }

    /// Where im2col row `r`'s tap `(ci, ky, kx)` reads for wide output
    /// pixel 0: its row of the padded sample at stride 1.
    pub(super) fn tap_offset(&self, r: usize) -> usize {
        let (s, wq) = (self.stride, self.wp());
        let (ci, ky, kx) = self.tap(r);
        ((ci * s + ky % s) * s + kx % s) * self.plane_padded() + (ky / s) * wq + kx / s
    }

    /// The `(kh*kw*Cin, oh*wp)` im2col matrix of a padded sample: row `r` is
    /// the padded input from tap `r`'s offset on.
    pub(super) fn im2col_wide(&self, xp: &[f32], cols: &mut [f32]) {
        let n = self.ohw_wide();
        for (r, row) in cols.chunks_mut(n).enumerate() {
            row.copy_from_slice(&xp[self.tap_offset(r)..][..n]);
        }
    }

    /// The adjoint of [`Geom::im2col_wide`]: adds each row back onto the
    /// padded gradient `dxp`. Junk columns must be zero in `cols`: they land
    /// on the next row's first pixels.
    pub(super) fn col2im_wide(&self, cols: &[f32], dxp: &mut [f32]) {
        let n = self.ohw_wide();
        for (r, row) in cols.chunks(n).enumerate() {
            let dst = &mut dxp[self.tap_offset(r)..][..n];
            dst.iter_mut().zip(row).for_each(|(d, s)| *d += s);
        }
    }

    /// A thread's f32 im2col matrix: none when the bf16 kernel packs the
    /// rows straight from the padded sample (`packed`).
    fn im2col_buffer(&self, packed: bool) -> Vec<f32> {
        vec![
            0f32;
            if packed {
                0
            } else {
                self.k() * self.ohw_wide()
            }
        ]
    }

    /// One thread's scratch for [`Geom::forward_wide`], with the weights
    /// `w` (in im2col row order) packed once for the bf16 kernel when the
    /// products are bf16 ([`Geom::gemm`]).
    pub(super) fn wide_scratch(&self, w: &[f32]) -> WideScratch {
        let mut weights = PackedA::default();
        let packed = self.gemm == DType::BF16 && weights.pack(Mat::new(w, self.cout, self.k()));
        WideScratch {
            xp: vec![0f32; self.padded_len()],
            cols: self.im2col_buffer(packed),
            packed: packed.then(|| (weights, PackedB::default())),
        }
    }

    /// One sample `x (Cin, H, W)`'s wide output `y (Cout, oh*wp)`, with the
    /// weights in im2col row order and `s` from [`Geom::wide_scratch`] of
    /// the same weights; the bias added last, as in [`Geom::forward_sample`],
    /// so valid columns round the same. On the bf16 kernel the im2col rows
    /// are packed straight from the padded sample (no im2col copy), to the
    /// same bits.
    pub(super) fn forward_wide(
        &self,
        name: &str,
        w: &[f32],
        b: &[f32],
        x: &[f32],
        s: &mut WideScratch,
        y: &mut [f32],
    ) -> candle_core::Result<()> {
        self.pad_into(x, &mut s.xp);
        let n = self.ohw_wide();
        match &mut s.packed {
            Some((weights, cols)) => {
                let xp = &s.xp;
                let ok = cols
                    .pack_rows(self.k(), n, |r| xp.get(self.tap_offset(r)..).unwrap_or(&[]))
                    && matmul_packed(y, weights, cols, false);
                if !ok {
                    bail!(
                        "{name}: the packed bf16 GEMM refused its operands ({} x {} * {} x {n})",
                        self.cout,
                        self.k(),
                        self.k()
                    );
                }
            }
            None => {
                self.im2col_wide(&s.xp, &mut s.cols);
                let (wm, cm) = (
                    Mat::new(w, self.cout, self.k()),
                    Mat::new(&s.cols, self.k(), n),
                );
                gemm_or_err(self.gemm, name, y, wm, cm, false)?;
            }
        }
        for (row, &bias) in y.chunks_mut(n).zip(b) {
            row.iter_mut().for_each(|v| *v += bias);
        }
        Ok(())
    }
}

/// One thread's buffers for [`Geom::forward_wide`]: the padded sample (its
/// border zero), and the im2col matrix, or for the bf16 kernel the packed
/// weights and the packed im2col rows.
pub(super) struct WideScratch {
    xp: Vec<f32>,
    cols: Vec<f32>,
    packed: Option<(PackedA, PackedB)>,
}

/// One thread's buffers for the wide backward's GEMMs ([`Geom::weight_grad_wide`],
/// [`Geom::input_cols_wide`]): the im2col matrix, or for the bf16 kernel
/// the packed operands and the weight gradient's transposed sums.
pub(super) struct WideGradScratch {
    cols: Vec<f32>,
    packed: Option<Packed16>,
}

/// The bf16 kernel's operands of the wide backward.
struct Packed16 {
    /// `w^T (K, Cout)`, packed once (only with the input gradient).
    wt: PackedA,
    /// A sample's im2col rows `(K, oh*wp)`, packed from its padded input.
    cols: PackedA,
    /// The sample's output gradient as `dy^T (oh*wp, Cout)` and `dy (Cout, oh*wp)`.
    dyt: PackedB,
    dy: PackedB,
    /// `dW^T (K, Cout)` summed over the chunk's samples.
    dwt: Vec<f32>,
}

impl Geom {
    /// A thread's [`WideGradScratch`] for the weights `w` (im2col row
    /// order); `input_grad`: whether [`Geom::input_cols_wide`] will run.
    pub(super) fn wide_grad_scratch(&self, w: &[f32], input_grad: bool) -> WideGradScratch {
        let mut wt = PackedA::default();
        let packed = self.gemm == DType::BF16
            && (!input_grad || wt.pack(Mat::new(w, self.cout, self.k()).t()));
        WideGradScratch {
            cols: self.im2col_buffer(packed),
            packed: packed.then(|| Packed16 {
                wt,
                cols: PackedA::default(),
                dyt: PackedB::default(),
                dy: PackedB::default(),
                dwt: vec![0f32; self.k() * self.cout],
            }),
        }
    }

    /// `dW (Cout, K) += dy (Cout, oh*wp) * cols^T` of one padded sample `xp`
    /// (the junk columns of `dy` zero). On the bf16 kernel it is summed as
    /// `dW^T = cols * dy^T` in the scratch, the im2col rows packed straight
    /// from `xp`, and [`Geom::finish_weight_grad`] adds it to `dw`: the same
    /// bits (each sum takes the same pairs in the same order, and a bf16
    /// product is exact in f32, so the operands' sides do not matter).
    pub(super) fn weight_grad_wide(
        &self,
        name: &str,
        xp: &[f32],
        dy: &[f32],
        dw: &mut [f32],
        s: &mut WideGradScratch,
    ) -> candle_core::Result<()> {
        let (n, k) = (self.ohw_wide(), self.k());
        let Some(p) = &mut s.packed else {
            self.im2col_wide(xp, &mut s.cols);
            let (dym, cols) = (Mat::new(dy, self.cout, n), Mat::new(&s.cols, k, n));
            return gemm_or_err(self.gemm, name, dw, dym, cols.t(), true);
        };
        let ok = p
            .cols
            .pack_rows(k, n, |r| xp.get(self.tap_offset(r)..).unwrap_or(&[]))
            && p.dyt.pack(Mat::new(dy, self.cout, n).t())
            && matmul_packed(&mut p.dwt, &p.cols, &p.dyt, true);
        if !ok {
            bail!("{name}: the packed bf16 GEMM refused the weight gradient's operands");
        }
        Ok(())
    }

    /// The transposed sums of [`Geom::weight_grad_wide`] on the bf16 kernel
    /// added into `dw (Cout, K)` (nothing otherwise: they went there).
    pub(super) fn finish_weight_grad(&self, s: &WideGradScratch, dw: &mut [f32]) {
        let Some(p) = &s.packed else { return };
        let k = self.k();
        for (t, row) in p.dwt.chunks(self.cout).enumerate() {
            for (c, v) in row.iter().enumerate() {
                dw[c * k + t] += v;
            }
        }
    }

    /// The input gradient's columns of one sample, `dcols (K, oh*wp) = w^T
    /// (K, Cout) * dy (Cout, oh*wp)`, for `col2im_wide` to scatter; on the
    /// bf16 kernel with `w^T` packed once per thread.
    pub(super) fn input_cols_wide(
        &self,
        name: &str,
        w: &[f32],
        dy: &[f32],
        dcols: &mut [f32],
        s: &mut WideGradScratch,
    ) -> candle_core::Result<()> {
        let dym = Mat::new(dy, self.cout, self.ohw_wide());
        let Some(p) = &mut s.packed else {
            let wt = Mat::new(w, self.cout, self.k()).t();
            return gemm_or_err(self.gemm, name, dcols, wt, dym, false);
        };
        if !(p.dy.pack(dym) && matmul_packed(dcols, &p.wt, &p.dy, false)) {
            bail!("{name}: the packed bf16 GEMM refused the input gradient's operands");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_bf16::available;

    fn geom(cin: usize, cout: usize, h: usize, w: usize) -> Geom {
        Geom {
            b: 1,
            cin,
            h,
            w,
            cout,
            kh: 3,
            kw: 3,
            pad: 1,
            stride: 1,
            oh: h,
            ow: w,
            gemm: DType::BF16,
        }
    }

    fn vals(n: usize, f: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + 0.5) * f).sin()).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// On the bf16 kernel, the forward, the weight gradient (summed
    /// transposed, over several samples) and the input gradient's columns
    /// equal, bit for bit, the im2col products of the same bf16 GEMM: the
    /// packing from the padded input changes nothing but the copies.
    /// Shapes: Cout not a multiple of the tile, an odd K (one channel), and
    /// a wide image whose pixels span three k blocks of the weight gradient.
    #[test]
    fn packed_bf16_products_equal_the_im2col_ones() -> candle_core::Result<()> {
        for (cin, cout, h, w) in [(3, 5, 7, 7), (1, 32, 28, 28), (2, 9, 30, 40)] {
            let g = geom(cin, cout, h, w);
            let (k, n) = (g.k(), g.ohw_wide());
            let wts = vals(cout * k, 0.37);
            let bias = vals(cout, 0.5);
            let mut packed = g.wide_scratch(&wts);
            if !available() {
                assert!(packed.packed.is_none(), "packed without AVX-512 BF16");
                eprintln!("skipped: this CPU has no AVX-512 BF16");
                return Ok(());
            }
            assert!(packed.packed.is_some(), "bf16 products not packed");
            let mut plain = WideScratch {
                xp: vec![0f32; g.padded_len()],
                cols: vec![0f32; k * n],
                packed: None,
            };
            let mut gp = g.wide_grad_scratch(&wts, true);
            assert!(gp.packed.is_some());
            let mut gu = WideGradScratch {
                cols: vec![0f32; k * n],
                packed: None,
            };
            let (mut dw_p, mut dw_u) = (vec![0f32; cout * k], vec![0f32; cout * k]);
            for sample in 0..3 {
                let x = vals(g.in_len(), 0.11 + sample as f32 * 0.07);
                let (mut yp, mut yu) = (vec![0f32; cout * n], vec![0f32; cout * n]);
                g.forward_wide("t", &wts, &bias, &x, &mut packed, &mut yp)?;
                g.forward_wide("t", &wts, &bias, &x, &mut plain, &mut yu)?;
                assert_eq!(bits(&yp), bits(&yu), "forward {cin}->{cout} {h}x{w}");
                let dy = vals(cout * n, 0.23 + sample as f32 * 0.05);
                g.weight_grad_wide("t", &packed.xp, &dy, &mut dw_p, &mut gp)?;
                g.weight_grad_wide("t", &plain.xp, &dy, &mut dw_u, &mut gu)?;
                let (mut dc_p, mut dc_u) = (vec![0f32; k * n], vec![0f32; k * n]);
                g.input_cols_wide("t", &wts, &dy, &mut dc_p, &mut gp)?;
                g.input_cols_wide("t", &wts, &dy, &mut dc_u, &mut gu)?;
                assert_eq!(bits(&dc_p), bits(&dc_u), "dx columns {cin}->{cout}");
            }
            g.finish_weight_grad(&gp, &mut dw_p);
            g.finish_weight_grad(&gu, &mut dw_u);
            assert_eq!(bits(&dw_p), bits(&dw_u), "dW {cin}->{cout} {h}x{w}");
            assert!(dw_p.iter().any(|v| *v != 0.0));
        }
        Ok(())
    }

    /// fp32 products are never packed for the bf16 kernel.
    #[test]
    fn fp32_products_take_the_im2col_path() {
        let g = Geom {
            gemm: DType::F32,
            ..geom(2, 4, 5, 5)
        };
        assert!(g.wide_scratch(&vals(4 * 18, 0.3)).packed.is_none());
        assert!(g
            .wide_grad_scratch(&vals(4 * 18, 0.3), true)
            .packed
            .is_none());
    }
}
