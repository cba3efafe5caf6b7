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

use crate::conv::{gemm_or_err, Geom};
use crate::gemm::Mat;

impl Geom {
    /// Padded input width (also the wide output's row length).
    pub(super) fn wp(&self) -> usize {
        self.w + 2 * self.pad
    }

    /// Columns of the wide output: `oh` rows of [`Geom::wp`].
    pub(super) fn ohw_wide(&self) -> usize {
        self.oh * self.wp()
    }

    /// Elements of one padded channel: the padded image plus `kw - 1` slack,
    /// which the last taps' junk columns read.
    fn plane_padded(&self) -> usize {
        (self.h + 2 * self.pad) * self.wp() + self.kw - 1
    }

    /// Elements of one padded sample; the buffer must start zeroed (the
    /// border is never written, only the interior).
    pub(super) fn padded_len(&self) -> usize {
        self.cin * self.plane_padded()
    }

    /// Copies one `(Cin, H, W)` sample into the interior of `xp`.
    pub(super) fn pad_into(&self, x: &[f32], xp: &mut [f32]) {
        let (wp, pp) = (self.wp(), self.plane_padded());
        for (plane, dst) in x.chunks(self.h * self.w).zip(xp.chunks_mut(pp)) {
            for (iy, row) in plane.chunks(self.w).enumerate() {
                dst[(iy + self.pad) * wp + self.pad..][..self.w].copy_from_slice(row);
            }
        }
    }

    /// Copies the interior of the padded gradient `dxp` into `dx (Cin, H, W)`.
    pub(super) fn unpad_into(&self, dxp: &[f32], dx: &mut [f32]) {
        let (wp, pp) = (self.wp(), self.plane_padded());
        for (plane, src) in dx.chunks_mut(self.h * self.w).zip(dxp.chunks(pp)) {
            for (iy, row) in plane.chunks_mut(self.w).enumerate() {
                row.copy_from_slice(&src[(iy + self.pad) * wp + self.pad..][..self.w]);
            }
        }
    }

    /// Start of im2col row `r`'s slice in the padded sample.
    fn tap_offset(&self, r: usize) -> usize {
        let (ci, ky, kx) = self.tap(r);
        ci * self.plane_padded() + ky * self.wp() + kx
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

    /// One padded sample's wide output `y (Cout, oh*wp)`, with the weights in
    /// im2col row order and `cols` as scratch; the bias added last, as in
    /// [`Geom::forward_sample`], so valid columns round the same.
    pub(super) fn forward_sample_wide(
        &self,
        name: &str,
        w: &[f32],
        b: &[f32],
        xp: &[f32],
        cols: &mut [f32],
        y: &mut [f32],
    ) -> candle_core::Result<()> {
        self.im2col_wide(xp, cols);
        let n = self.ohw_wide();
        let (wm, cm) = (
            Mat::new(w, self.cout, self.k()),
            Mat::new(cols, self.k(), n),
        );
        gemm_or_err(self.gemm, name, y, wm, cm, false)?;
        for (row, &bias) in y.chunks_mut(n).zip(b) {
            row.iter_mut().for_each(|v| *v += bias);
        }
        Ok(())
    }
}
