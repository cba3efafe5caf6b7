//! The 1x1 (pointwise) bf16 convolutions of [`crate::conv_io16`]:
//! ResNet-50's bottleneck convolutions, about two thirds of its
//! convolutions, with bf16 activations in and out (`bf16-true`).
//!
//! They were the fp32 op between casts: the input widened into a whole f32
//! copy, each sample's f32 rows converted to bf16 pairs again as the GEMM
//! packed them, and the f32 output rounded into a bf16 copy (in the
//! backward, the output gradient widened and the input gradient rounded).
//! Here the GEMM packs its operands straight from the bf16 tensors
//! (`PackedA::pack_rows` and `PackedB::pack_rows` of bf16 rows,
//! [`crate::gemm_bf16_pack16`]), and each sample's f32 result is rounded
//! while it is in cache. The operands, products and sums are those of the
//! cast path, so are the bits (the tests of `conv_io16`).
//!
//! - Per sample (maps of 64 pixels and more), as the fp32 op runs them:
//!   `y = w * x` and `dx = w^T * dy` with the samples of a thread's chunk one
//!   after another, and `dW += dy * x^T` summed per chunk in chunk order.
//! - Small maps ([`Geom::batched`]): the batch side by side, one GEMM each,
//!   the bf16 values widened as they are laid side by side.

use candle_core::{bail, DType};
use half::bf16;
use rayon::prelude::*;

use crate::conv::{gemm_or_err, Geom};
use crate::conv_backward::add_row_sums;
use crate::gemm::Mat;
use crate::gemm_bf16::matmul_packed;
use crate::gemm_bf16_pack::{PackedA, PackedB};
use crate::half16::Act;

impl Geom {
    /// Whether the bf16 pointwise kernels run this convolution: 1x1,
    /// stride 1, no padding, on the native bf16 GEMM, nothing empty.
    pub(super) fn pointwise16(&self) -> bool {
        self.gemm == DType::BF16
            && self.pointwise()
            && self.cin > 0
            && self.cout > 0
            && self.ohw() > 0
            && crate::gemm_bf16::enabled()
    }

    /// A 1x1 unpadded convolution at stride `s > 1` (ResNet's
    /// downsampling shortcuts) as the stride-1 one over its input
    /// subsampled ([`Geom::subsample16`]): that geometry, when it takes the
    /// bf16 pointwise kernels.
    pub(super) fn strided_pointwise16(&self) -> Option<Geom> {
        let dense = Geom {
            h: self.oh,
            w: self.ow,
            stride: 1,
            ..*self
        };
        let strided = self.kh == 1 && self.kw == 1 && self.pad == 0 && self.stride > 1;
        (strided && dense.pointwise16()).then_some(dense)
    }

    /// `x (b, Cin, h, w)` at the stride's grid: `(b, Cin, oh, ow)`, value
    /// `(i, j)` of a plane being input `(i * s, j * s)` (a 1x1 strided
    /// convolution's im2col).
    pub(super) fn subsample16(&self, x: &[bf16]) -> Vec<bf16> {
        let (s, ohw) = (self.stride, self.ohw());
        let mut out = vec![bf16::ZERO; self.b * self.cin * ohw];
        if ohw > 0 {
            out.par_chunks_mut(ohw)
                .zip(x.par_chunks(self.h * self.w))
                .for_each(|(o, plane)| {
                    for (row, src) in o.chunks_mut(self.ow).zip(plane.chunks(self.w * s)) {
                        row.iter_mut()
                            .zip(src.iter().step_by(s))
                            .for_each(|(o, &v)| *o = v);
                    }
                });
        }
        out
    }

    /// The adjoint of [`Geom::subsample16`]: `dsub` written onto the
    /// stride's grid of `dx (b, Cin, h, w)`, which the caller hands in
    /// zeroed (the values off the grid are left as they are).
    pub(super) fn unsubsample16(&self, dsub: &[bf16], dx: &mut [bf16]) {
        let (s, ohw) = (self.stride, self.ohw());
        if ohw == 0 {
            return;
        }
        dx.par_chunks_mut(self.h * self.w)
            .zip(dsub.par_chunks(ohw))
            .for_each(|(plane, d)| {
                for (dst, row) in plane.chunks_mut(self.w * s).zip(d.chunks(self.ow)) {
                    dst.iter_mut()
                        .step_by(s)
                        .zip(row)
                        .for_each(|(o, &v)| *o = v);
                }
            });
    }

    /// The outputs of all samples of `x` into `out` (both bf16), `w`
    /// `(Cout, Cin)` and `b` f32 tensors of bf16 values, the bias added
    /// before the rounding.
    pub(super) fn forward_pointwise16(
        &self,
        name: &str,
        w: &[f32],
        b: &[f32],
        x: &[bf16],
        out: &mut [bf16],
    ) -> candle_core::Result<()> {
        if self.batched() {
            return self.forward_batched16(name, w, b, x, out);
        }
        let mut a = PackedA::default();
        if !a.pack(Mat::new(w, self.cout, self.cin)) {
            bail!("{name}: cannot pack the weights ({self:?})");
        }
        self.products16(name, &a, b, x, out)
    }

    /// `out_s = a * x_s + bias`, rounded, for each sample: `a` packed `(m,
    /// k)`, `x_s` `(k, oh*ow)` and `out_s` `(m, oh*ow)` bf16; the samples
    /// split across the compute threads in [`Geom::per_chunk`]'s chunks.
    /// The forward (`a = w`) and the input gradient (`a = w^T`, no bias).
    fn products16(
        &self,
        name: &str,
        a: &PackedA,
        bias: &[f32],
        x: &[bf16],
        out: &mut [bf16],
    ) -> candle_core::Result<()> {
        let (hw, k, m, per) = (self.ohw(), a.k, a.m, self.per_chunk());
        out.par_chunks_mut(per * m * hw)
            .zip(x.par_chunks(per * k * hw))
            .try_for_each(|(out, x)| {
                let (mut packed, mut scratch) = (PackedB::default(), Vec::new());
                for (o, x) in out.chunks_mut(m * hw).zip(x.chunks(k * hw)) {
                    let mut done = packed.pack_rows(k, hw, |p| &x[p * hw..][..hw]);
                    bf16::write(o, &mut scratch, |y| {
                        done = done && matmul_packed(y, a, &packed, false);
                        for (row, &bias) in y.chunks_mut(hw).zip(bias) {
                            row.iter_mut().for_each(|v| *v += bias);
                        }
                    });
                    if !done {
                        bail!("{name}: a {m} x {k} by {k} x {hw} product failed ({self:?})");
                    }
                }
                Ok(())
            })
    }

    /// [`Geom::forward_pointwise16`] on small maps: per thread chunk, the
    /// samples side by side and one GEMM, as the fp32 op's batched forward.
    fn forward_batched16(
        &self,
        name: &str,
        w: &[f32],
        b: &[f32],
        x: &[bf16],
        out: &mut [bf16],
    ) -> candle_core::Result<()> {
        let (cin, cout, per) = (self.cin, self.cout, self.per_chunk());
        out.par_chunks_mut(per * self.out_len())
            .zip(x.par_chunks(per * self.in_len()))
            .try_for_each(|(out, x)| {
                let cols = self.side_by_side_par(x, cin);
                let np = cols.len() / cin;
                let mut all = vec![0f32; cout * np];
                let (wm, cm) = (Mat::new(w, cout, cin), Mat::new(&cols, cin, np));
                gemm_or_err(self.gemm, name, &mut all, wm, cm, false)?;
                let mut scratch = Vec::new();
                for (s, ys) in out.chunks_mut(self.out_len()).enumerate() {
                    bf16::write(ys, &mut scratch, |y| {
                        self.take_sample(&all, s, y);
                        for (row, &bias) in y.chunks_mut(self.ohw()).zip(b) {
                            row.iter_mut().for_each(|v| *v += bias);
                        }
                    });
                }
                Ok(())
            })
    }

    /// `[dW | db]` of the whole batch added into `dwb` (dW `(Cout, Cin)`),
    /// and the input gradient into `dx` (bf16) when given, from the bf16
    /// input and output gradient.
    pub(super) fn backward_pointwise16(
        &self,
        name: &str,
        (x, w, dy): (&[bf16], &[f32], &[bf16]),
        dwb: &mut [f32],
        dx: Option<&mut [bf16]>,
    ) -> candle_core::Result<()> {
        if self.batched() {
            return self.backward_batched16(name, (x, w, dy), dwb, dx);
        }
        let (cin, cout, hw, per) = (self.cin, self.cout, self.ohw(), self.per_chunk());
        let wlen = cout * cin;
        // Each chunk accumulates its own [dW | db]; summed below in chunk order.
        let partials = x
            .par_chunks(per * self.in_len())
            .zip(dy.par_chunks(per * self.out_len()))
            .map(|(x, dy)| {
                let mut acc = vec![0f32; wlen + cout];
                let (mut a, mut packed) = (PackedA::default(), PackedB::default());
                for (x, dy) in x.chunks(self.in_len()).zip(dy.chunks(self.out_len())) {
                    let (dw, db) = acc.split_at_mut(wlen);
                    // dW (Cout, Cin) += dy (Cout, oh*ow) * x^T (oh*ow, Cin)
                    let done = a.pack_rows(cout, hw, |r| &dy[r * hw..][..hw])
                        && packed.pack_transposed(hw, cin, x)
                        && matmul_packed(dw, &a, &packed, true);
                    if !done {
                        bail!("{name}: the weight gradient's product failed ({self:?})");
                    }
                    add_row_sums(db, dy, hw);
                }
                Ok(acc)
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        for p in partials {
            for (d, s) in dwb.iter_mut().zip(p) {
                *d += s;
            }
        }
        let Some(dx) = dx else {
            return Ok(());
        };
        // dx (Cin, oh*ow) = w^T (Cin, Cout) * dy (Cout, oh*ow), the fp32
        // op's transposed convolution (its zero bias added too).
        let mut a = PackedA::default();
        if !a.pack(Mat::new(w, cout, cin).t()) {
            bail!("{name}: cannot pack the weights ({self:?})");
        }
        self.products16(name, &a, &vec![0f32; cin], dy, dx)
    }

    /// [`Geom::backward_pointwise16`] on small maps: the batch's inputs and
    /// output gradients side by side, dW, db and dx's columns from one GEMM
    /// each, as the fp32 op's whole-batch backward.
    fn backward_batched16(
        &self,
        name: &str,
        (x, w, dy): (&[bf16], &[f32], &[bf16]),
        dwb: &mut [f32],
        dx: Option<&mut [bf16]>,
    ) -> candle_core::Result<()> {
        let (cin, cout) = (self.cin, self.cout);
        let np = self.b * self.ohw();
        let cols = self.side_by_side_par(x, cin);
        let dy_all = self.side_by_side_par(dy, cout);
        let (dw, db) = dwb.split_at_mut(cout * cin);
        let dym = Mat::new(&dy_all, cout, np);
        // dW (Cout, Cin) = dy (Cout, n*oh*ow) * x^T (n*oh*ow, Cin)
        gemm_or_err(
            self.gemm,
            name,
            dw,
            dym,
            Mat::new(&cols, cin, np).t(),
            false,
        )?;
        db.fill(0.0);
        add_row_sums(db, &dy_all, np);
        let Some(dx) = dx else {
            return Ok(());
        };
        drop(cols);
        let mut dcols = vec![0f32; cin * np];
        gemm_or_err(
            self.gemm,
            name,
            &mut dcols,
            Mat::new(w, cout, cin).t(),
            dym,
            false,
        )?;
        dx.par_chunks_mut(self.in_len())
            .enumerate()
            .for_each(|(s, dx)| {
                let mut scratch = Vec::new();
                bf16::write(dx, &mut scratch, |d| {
                    self.take_sample(&dcols, s, d);
                    // Added onto zeros, as the fp32 op's col2im adds them
                    // (a -0.0 becomes 0.0).
                    d.iter_mut().for_each(|v| *v += 0.0);
                });
            });
        Ok(())
    }
}
