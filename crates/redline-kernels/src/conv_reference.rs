//! Test support for the convolution kernels: deterministic values, the
//! im2col + GEMM references that the direct and pixel-major kernels are
//! checked against, and a closeness check scaled to the reference.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use candle_core::DType;

use crate::conv::{gemm_or_err, Geom};
use crate::conv_backward::add_row_sums;
use crate::gemm::Mat;

/// `n` deterministic values in [-1, 1].
pub(crate) fn vals(n: usize, f: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + 0.5) * f).sin()).collect()
}

/// An input, im2col-ordered weights and a bias for `g`'s forward.
pub(crate) fn forward_operands(g: &Geom) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (
        vals(g.b * g.in_len(), 0.37),
        vals(g.cout * g.k(), 0.11),
        vals(g.cout, 0.7),
    )
}

/// Panics naming `what` and the first index where `got` is not within
/// 2e-5 of `want`, relative to the largest of `want` (or 1).
pub(crate) fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 2e-5 * scale, "{what}[{i}]: {g} vs {w}");
    }
}

impl Geom {
    /// Every sample's output through im2col and one GEMM per sample, `w`
    /// in im2col row order, the bias added.
    pub(crate) fn reference_forward(
        &self,
        w: &[f32],
        b: &[f32],
        x: &[f32],
    ) -> candle_core::Result<Vec<f32>> {
        let mut want = vec![0f32; self.b * self.out_len()];
        let mut cols = vec![0f32; self.k() * self.ohw()];
        for (y, x) in want.chunks_mut(self.out_len()).zip(x.chunks(self.in_len())) {
            self.forward_sample("reference", w, b, x, &mut cols, y)?;
        }
        Ok(want)
    }

    /// Every sample's input gradient as `w^T * dy` followed by col2im, `w`
    /// in im2col row order.
    pub(crate) fn reference_input_grad(
        &self,
        w: &[f32],
        dy: &[f32],
    ) -> candle_core::Result<Vec<f32>> {
        let (k, n) = (self.k(), self.ohw());
        let mut want = vec![0f32; self.b * self.in_len()];
        let mut dcols = vec![0f32; k * n];
        for (dx, dy) in want
            .chunks_mut(self.in_len())
            .zip(dy.chunks(self.out_len()))
        {
            let (wt, dym) = (Mat::new(w, self.cout, k).t(), Mat::new(dy, self.cout, n));
            gemm_or_err(DType::F32, "reference", &mut dcols, wt, dym, false)?;
            self.col2im(&dcols, dx);
        }
        Ok(want)
    }

    /// `[dW | db]` summed over the samples: `dy * cols^T` (dW in im2col row
    /// order) and the row sums of dy.
    pub(crate) fn reference_weight_grad(
        &self,
        x: &[f32],
        dy: &[f32],
    ) -> candle_core::Result<Vec<f32>> {
        let (k, n) = (self.k(), self.ohw());
        let mut want = vec![0f32; self.cout * k + self.cout];
        let mut cols = vec![0f32; k * n];
        for (x, dy) in x.chunks(self.in_len()).zip(dy.chunks(self.out_len())) {
            self.im2col(x, &mut cols);
            let (dw, db) = want.split_at_mut(self.cout * k);
            let dym = Mat::new(dy, self.cout, n);
            gemm_or_err(
                DType::F32,
                "reference",
                dw,
                dym,
                Mat::new(&cols, k, n).t(),
                true,
            )?;
            add_row_sums(db, dy, n);
        }
        Ok(want)
    }
}
