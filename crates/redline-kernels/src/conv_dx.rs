//! The input gradient of a stride-1 convolution as a forward convolution:
//! `dx = conv2d(dy, w')` with `w'` the weights flipped in both spatial axes
//! and their channel axes swapped (`w'[ci, co, ky, kx] = w[co, ci, kh-1-ky,
//! kw-1-kx]`), padded by `k - 1 - p`.
//!
//! Computed as `w^T * dy` followed by col2im, the product has only `Cout`
//! terms per output (64 on ResNet's first stage) and writes a `(Cin*kh*kw,
//! oh*ow)` matrix per sample that col2im then reads and scatters: on
//! ResNet-18's 56x56 stage that ran at a third of the forward's GFLOP/s.
//! As a convolution it is the forward's im2col and one GEMM of `Cout*kh*kw`
//! terms, at the forward's speed (`examples/conv_shapes.rs`).

use crate::conv::{Geom, Path};

impl Geom {
    /// The convolution whose forward is this one's input gradient, when
    /// there is one of this form: stride 1 and padding under the kernel.
    pub(super) fn transposed(&self) -> Option<Geom> {
        (self.stride == 1 && self.pad < self.kh && self.pad < self.kw && self.kh == self.kw).then(
            || Geom {
                cin: self.cout,
                cout: self.cin,
                h: self.oh,
                w: self.ow,
                pad: self.kh - 1 - self.pad,
                oh: self.h,
                ow: self.w,
                ..*self
            },
        )
    }

    /// The transposed convolution's weights `w'` in its im2col row order
    /// (`(Cin, kh, kw, Cout)` of this one's `(Cout, Cin, kh, kw)` weights).
    pub(super) fn flipped_taps(&self, w: &[f32]) -> Vec<f32> {
        let (kh, kw, cin, cout) = (self.kh, self.kw, self.cin, self.cout);
        let mut out = vec![0f32; w.len()];
        for ci in 0..cin {
            for ky in 0..kh {
                for kx in 0..kw {
                    for co in 0..cout {
                        out[((ci * kh + ky) * kw + kx) * cout + co] =
                            w[((co * cin + ci) * kh + (kh - 1 - ky)) * kw + (kw - 1 - kx)];
                    }
                }
            }
        }
        out
    }

    /// `dx` of the whole batch from `dy` through the transposed convolution
    /// `t` ([`Geom::transposed`]), `w` as stored `(Cout, Cin, kh, kw)`.
    pub(super) fn input_grad_as_conv(
        &self,
        t: &Geom,
        name: &str,
        w: &[f32],
        dy: &[f32],
        dx: &mut [f32],
    ) -> candle_core::Result<()> {
        let zeros = vec![0f32; t.cout];
        if t.forward_path() == Path::Winograd {
            return t.forward_winograd(name, &self.wino_weights_flipped(t, w), &zeros, dy, dx);
        }
        if t.forward_path() == Path::PixelMajor {
            // Its panels read flipped straight from the stored weights.
            return t.forward_nhwc(name, &self.nhwc_panels_flipped(w), &zeros, dy, dx);
        }
        t.forward_all(name, &self.flipped_taps(w), &zeros, dy, dx)
    }
}
