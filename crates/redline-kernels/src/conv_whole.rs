//! The backward of a convolution on small output maps ([`Geom::batched`])
//! as whole-batch GEMMs.
//!
//! Split by samples across the threads, each thread's dW partial is a full
//! `Cout x K` matrix (ResNet-18's last stage: 512 x 4608, 9.4 MB) written
//! by a GEMM of only `n * oh * ow` terms, then summed with the others: on
//! 7x7 and 2x2 maps that traffic, not the arithmetic, set the time. Here
//! the batch's im2col columns and output gradients are laid side by side
//! once (in parallel), and dW, dx's columns and db come from one GEMM each,
//! which the GEMM splits across the threads itself.

use rayon::prelude::*;

use crate::conv::{gemm_or_err, Geom};
use crate::conv_backward::add_row_sums;
use crate::gemm::Mat;
use crate::half16::Act;

impl Geom {
    /// `(rows, n * oh*ow)`: the per-sample `(rows, oh*ow)` blocks of `v`
    /// (samples one after another) side by side, rows filled in parallel.
    /// Stored bf16, each value is widened as it is copied.
    pub(super) fn side_by_side_par<T: Act>(&self, v: &[T], rows: usize) -> Vec<f32> {
        let p = self.ohw();
        let n = v.len() / (rows * p).max(1);
        let mut out = vec![0f32; v.len()];
        if p > 0 {
            out.par_chunks_mut(n * p).enumerate().for_each(|(r, row)| {
                for (s, seg) in row.chunks_mut(p).enumerate() {
                    T::widen_into(&v[(s * rows + r) * p..][..p], seg);
                }
            });
        }
        out
    }

    /// dW (im2col row order) and db of the whole batch into `dwb`
    /// (overwritten), and dx into `dx` when given, with the weights `w` in
    /// im2col row order.
    pub(super) fn backward_whole(
        &self,
        name: &str,
        (x, w, dy): (&[f32], &[f32], &[f32]),
        dwb: &mut [f32],
        dx: Option<&mut [f32]>,
    ) -> candle_core::Result<()> {
        let (k, p) = (self.k(), self.ohw());
        let np = self.b * p;
        let cols = self.batch_cols(x);
        let dy_all = self.side_by_side_par(dy, self.cout);
        let (dw, db) = dwb.split_at_mut(self.cout * k);
        let dym = Mat::new(&dy_all, self.cout, np);
        // dW (Cout, K) = dy (Cout, n*oh*ow) * cols^T (n*oh*ow, K)
        gemm_or_err(self.gemm, name, dw, dym, Mat::new(&cols, k, np).t(), false)?;
        db.fill(0.0);
        add_row_sums(db, &dy_all, np);
        let Some(dx) = dx else {
            return Ok(());
        };
        drop(cols);
        self.input_grad_side_by_side(name, w, &dy_all, dx)
    }

    /// dx of the whole batch as `w^T * dy` and col2im, `w` in im2col row
    /// order (the input gradient of a pixel-major convolution whose
    /// transposed convolution is not one: strided).
    pub(super) fn input_grad_whole(
        &self,
        name: &str,
        w: &[f32],
        dy: &[f32],
        dx: &mut [f32],
    ) -> candle_core::Result<()> {
        let dy_all = self.side_by_side_par(dy, self.cout);
        self.input_grad_side_by_side(name, w, &dy_all, dx)
    }

    /// [`Geom::input_grad_whole`] of the output gradients laid side by side.
    fn input_grad_side_by_side(
        &self,
        name: &str,
        w: &[f32],
        dy_all: &[f32],
        dx: &mut [f32],
    ) -> candle_core::Result<()> {
        let (k, p) = (self.k(), self.ohw());
        let np = self.b * p;
        let dym = Mat::new(dy_all, self.cout, np);
        // dcols (K, n*oh*ow) = w^T (K, Cout) * dy, then col2im per sample.
        let mut dcols = vec![0f32; k * np];
        gemm_or_err(
            self.gemm,
            name,
            &mut dcols,
            Mat::new(w, self.cout, k).t(),
            dym,
            false,
        )?;
        if self.in_len() > 0 {
            // Short rows: each sample's columns read in place, through
            // one table for the batch.
            let table = self.gathers().then(|| self.gather_table());
            let n = self.b;
            dx.par_chunks_mut(self.in_len())
                .enumerate()
                .for_each(|(s, dx)| {
                    if let Some(table) = &table {
                        return self.col2im_gather(table, &dcols, (s, n), dx);
                    }
                    let mut one = vec![0f32; k * p];
                    self.take_sample(&dcols, s, &mut one);
                    self.col2im(&one, dx);
                });
        }
        Ok(())
    }
}
