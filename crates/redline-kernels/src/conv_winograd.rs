//! 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) on CPUs: each 2x2
//! block of outputs from a 4x4 tile of inputs with 16 products per channel
//! pair instead of 36, so 2.25x fewer multiply-adds than any direct kernel
//! (on a 7x7 map, rounded up to 8x8, 1.72x).
//!
//! With `B`, `G`, `A` Lavin and Gray's matrices, a tile's output is
//! `A^T [(G g G^T) . (B^T d B)] A`: the weights `g` and the input tiles `d`
//! are transformed into 16 positions each, and at every position the sum
//! over input channels is a product of `(tiles, Cin)` by `(Cin, Cout)`.
//! The forward takes a group of samples at a time in its thread's scratch:
//! their tiles transformed, the 16 products by the pixel-major kernel's
//! register tiles ([`crate::conv_nhwc_simd::tile`]) against panels of
//! transformed weights, the outputs transformed back.
//!
//! The weight gradient is the same identity read backwards: `dU = sum over
//! tiles of (B^T d B) . (A dY A^T)`, 16 GEMMs of `(Cin, tiles) x (tiles,
//! Cout)` over the whole batch, one position to a thread (so that no sum
//! depends on the thread count), then `dW = G^T dU G`. The input gradient
//! is the transposed convolution's forward ([`Geom::transposed`]).
//!
//! F(2x2, 3x3)'s matrices hold only 0, +-1 and 1/2: its rounding is within
//! a few ulps of a direct sum's (the tests hold it to the im2col
//! reference's tolerance).

use candle_core::{bail, DType};
use rayon::prelude::*;

use crate::conv::Geom;
use crate::conv_backward::add_row_sums;
use crate::conv_nhwc_simd::{self as simd, CO, PX};
use crate::gemm::{matmul_views, View};
use crate::slices::zeros_par;
use crate::transpose16::{channels_to_pixels, pixels_to_channels};

use tiles::{wide, GradTiles, InputTiles, KernelGrads, KernelTiles, OutputTiles};

/// `v` viewed as memory to overwrite, for the transforms that also fill
/// fresh buffers.
///
/// # Safety
/// The caller writes only initialised values through the view (`v` is
/// read as `f32` afterwards).
unsafe fn init_as_uninit(v: &mut [f32]) -> &mut [std::mem::MaybeUninit<f32>] {
    // SAFETY: MaybeUninit<f32> has f32's layout; the caller keeps every
    // element initialised.
    unsafe { &mut *(v as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) }
}

/// Positions of a transformed tile (4 x 4).
const XI: usize = 16;

/// Channels a transform handles at once (one AVX-512 vector).
const L: usize = 16;

/// Output pixels per channel from which the Winograd kernels run: on 4x4
/// maps and larger. On 2x2 maps (a single tile, 4 of its 16 products
/// kept) the whole-batch GEMMs are twice as fast (`examples/conv_paths.rs`,
/// kept in `bench/results`).
const MIN_PIXELS: usize = 16;

/// Output pixels per channel under which the forward and the input
/// gradient run: on ResNet-18's 56x56 maps (64 channels) they are 15-20%
/// faster than the direct kernels; larger maps are untried.
const MAX_PIXELS: usize = 4096;

/// Output pixels per channel under which the weight gradient runs: on
/// 28x28 maps 20-25% faster than the direct kernels, on 56x56 ones
/// (64 channels) 5-15% slower.
const MAX_GRAD_PIXELS: usize = 1024;

/// Tiles a unit of the forward's work takes at least (its samples'
/// transformed inputs and products stay in the L2 and L3 caches, and each
/// panel of weights is read from L2 by 16 of the product kernel's tiles).
const UNIT_TILES: usize = 96;

/// Input and output channels from which they run: under 64 the GEMMs are
/// too thin to pay for the transforms.
const MIN_CHANNELS: usize = 64;

impl Geom {
    /// Whether the Winograd kernels can run this convolution at all:
    /// AVX-512 (the forward's products are the pixel-major kernel's
    /// tiles), f32 products, a 3x3 kernel, stride 1, padding of at most 2,
    /// output channels in multiples of [`CO`], input ones of [`L`].
    pub(super) fn winograd_runs(&self) -> bool {
        simd::available()
            && self.gemm == DType::F32
            && (self.kh, self.kw, self.stride) == (3, 3, 1)
            && self.pad <= 2
            && self.cin.is_multiple_of(L)
            && self.cout.is_multiple_of(CO)
    }

    /// Whether the Winograd kernels run this convolution's forward (and
    /// so the input gradient of the convolution it transposes): the
    /// measured table (`examples/conv_paths.rs`).
    pub(super) fn winograd(&self) -> bool {
        self.winograd_runs()
            && (MIN_PIXELS..MAX_PIXELS).contains(&self.ohw())
            && self.cin.min(self.cout) >= MIN_CHANNELS
    }

    /// Whether they run its weight gradient: [`Geom::winograd`] on maps
    /// under [`MAX_GRAD_PIXELS`].
    pub(super) fn winograd_weight_grad(&self) -> bool {
        self.winograd() && self.ohw() < MAX_GRAD_PIXELS
    }

    /// Tiles down and across (output rows and columns over 2, rounded up).
    fn wino_tiles(&self) -> (usize, usize) {
        (self.oh.div_ceil(2), self.ow.div_ceil(2))
    }

    /// Tiles of one sample.
    fn wino_per_sample(&self) -> usize {
        let (th, tw) = self.wino_tiles();
        th * tw
    }

    /// `(rows, cols)` of a sample padded for the tiles: the padding on
    /// every side, and zeros past the last tile's far edge.
    fn wino_padded(&self) -> (usize, usize) {
        let (th, tw) = self.wino_tiles();
        (2 * th + 2, 2 * tw + 2)
    }

    /// The weights transformed, `U = G g G^T` of each channel pair, as the
    /// forward's panels: position `xi`'s panel `q` holds `(Cin, CO)`
    /// values, output channels `q * CO..(q + 1) * CO` fastest, at
    /// `((xi * Cout / CO + q) * Cin) * CO`; `taps(ci, co)` gives the pair's
    /// 3x3 kernel, row-major.
    pub(super) fn wino_weights(&self, taps: impl Fn(usize, usize) -> [f32; 9] + Sync) -> Vec<f32> {
        let (cin, cout) = (self.cin, self.cout);
        let n = cin * XI * cout;
        let mut u = Vec::with_capacity(n);
        // Sixteen input channels a unit of work (the kernels they read,
        // stored or flipped, stay in the L2 cache across them), laid
        // `(Cin, XI, Cout)`, each written as sixteen rows in order.
        u.spare_capacity_mut()[..n]
            .par_chunks_mut(L * XI * cout)
            .enumerate()
            .for_each(|(q, u)| {
                wide(KernelTiles {
                    taps: &taps,
                    cout,
                    ci0: q * L,
                    u,
                })
            });
        // SAFETY: the capacity holds `n` elements, and each of the `cin /
        // L` units wrote all `L * XI * cout` of its values (`cin` and
        // `cout` multiples of L: `winograd_runs`).
        unsafe { u.set_len(n) };
        // Then into panels, one a unit of work.
        let mut panels = Vec::with_capacity(n);
        panels.spare_capacity_mut()[..n]
            .par_chunks_mut(cin * CO)
            .enumerate()
            .for_each(|(p, panel)| {
                let (xi, q) = (p / (cout / CO), p % (cout / CO));
                for (ci, row) in panel.chunks_exact_mut(CO).enumerate() {
                    let src = &u[(ci * XI + xi) * cout + q * CO..][..CO];
                    for (d, &v) in row.iter_mut().zip(src) {
                        d.write(v);
                    }
                }
            });
        // SAFETY: the `XI * cout / CO` panels of `cin * CO` values each
        // (`cout` a multiple of CO: `winograd_runs`) were all written.
        unsafe { panels.set_len(n) };
        panels
    }

    /// [`Geom::wino_weights`] of weights stored `(Cout, Cin, 3, 3)`.
    pub(super) fn wino_weights_stored(&self, w: &[f32]) -> Vec<f32> {
        let cin = self.cin;
        self.wino_weights(|ci, co| std::array::from_fn(|t| w[(co * cin + ci) * 9 + t]))
    }

    /// The transformed weights of the transposed convolution `t`
    /// ([`Geom::transposed`]) from this one's stored `(Cout, Cin, 3, 3)`
    /// weights: `t`'s kernel `(ci, co)` is `w[ci, co]` flipped both ways.
    pub(super) fn wino_weights_flipped(&self, t: &Geom, w: &[f32]) -> Vec<f32> {
        let cin = self.cin;
        t.wino_weights(|ci, co| std::array::from_fn(|t| w[(ci * cin + co) * 9 + 8 - t]))
    }

    /// Copies one `(Cin, H, W)` sample into the interior of its
    /// `(hq, wq, Cin)` buffer ([`Geom::wino_padded`]); the border stays as
    /// it is (zero: every sample writes the same interior).
    fn wino_pad(&self, x: &[f32], xp: &mut [f32]) {
        let (cin, w, pad, wq) = (self.cin, self.w, self.pad, self.wino_padded().1);
        channels_to_pixels(x, (cin, self.h * w), xp, |p| {
            ((p / w + pad) * wq + p % w + pad) * cin
        });
    }

    /// Every sample's tiles of `x` (`(B, Cin, H, W)`) transformed, `B^T d
    /// B`, laid `(tiles, XI, Cin)` with the batch's tiles in order.
    fn wino_inputs(&self, x: &[f32]) -> Vec<f32> {
        let (cin, (hq, wq)) = (self.cin, self.wino_padded());
        let per = self.wino_per_sample() * XI * cin;
        let n = self.b * per;
        let mut v = Vec::with_capacity(n);
        v.spare_capacity_mut()[..n]
            .par_chunks_mut(per.max(1))
            .zip(x.par_chunks(self.in_len().max(1)))
            .for_each_init(
                || vec![0f32; hq * wq * cin],
                |xp, (v, x)| {
                    self.wino_pad(x, xp);
                    wide(InputTiles { g: self, xp, v });
                },
            );
        // SAFETY: the capacity holds `n` elements, and every tile of every
        // sample wrote all `XI * cin` of its values (`put` per lane block,
        // `cin` a multiple of L: `winograd_runs`).
        unsafe { v.set_len(n) };
        v
    }

    /// Samples a unit of the forward's work takes: enough for
    /// [`UNIT_TILES`] tiles, at most a thread's share of the batch.
    fn wino_group(&self) -> usize {
        UNIT_TILES
            .div_ceil(self.wino_per_sample())
            .clamp(1, self.per_chunk())
    }

    /// The outputs of all samples of `x` into `out` (`(B, Cout, oh, ow)`),
    /// `u` the transformed weights' panels ([`Geom::wino_weights`]), the
    /// bias `b` added last. A unit of work takes [`Geom::wino_group`]
    /// samples: their tiles transformed (`(tiles, XI, Cin)`), then at each
    /// position and for each panel the pixel-major kernel's tiles of
    /// [`PX`] tiles x [`CO`] channels (`(tiles, XI, Cout)`), then each
    /// sample's outputs, all in the thread's scratch.
    pub(super) fn forward_winograd(
        &self,
        name: &str,
        u: &[f32],
        b: &[f32],
        x: &[f32],
        out: &mut [f32],
    ) -> candle_core::Result<()> {
        let (cin, cout, per) = (self.cin, self.cout, self.wino_per_sample());
        self.check(
            name,
            &[
                ("input", x.len(), self.b * self.in_len()),
                ("Winograd weights", u.len(), cin * XI * cout),
                ("bias", b.len(), cout),
                ("output", out.len(), self.b * self.out_len()),
            ],
        )?;
        let (hq, wq) = self.wino_padded();
        let group = self.wino_group();
        let offs: Vec<usize> = (0..cin).collect();
        // Tiles XI * Cin apart (a gap of a cache line after each, to keep
        // the product kernel's rows off one L1 set, was 10-30% slower).
        let ts = XI * cin;
        let panels = cout / CO;
        out.par_chunks_mut((group * self.out_len()).max(1))
            .zip(x.par_chunks((group * self.in_len()).max(1)))
            .try_for_each_init(
                || {
                    let tiles = group * per;
                    (
                        vec![0f32; hq * wq * cin],
                        vec![0f32; tiles * ts],
                        vec![0f32; tiles * XI * cout],
                        vec![0f32; self.ohw() * cout],
                    )
                },
                |(xp, v, m, yt), (out, x)| {
                    let n = x.len() / self.in_len().max(1);
                    let tiles = n * per;
                    for (x, v) in x.chunks(self.in_len()).zip(v.chunks_mut(per * ts)) {
                        self.wino_pad(x, xp);
                        // SAFETY: InputTiles writes only transformed values.
                        let v = unsafe { init_as_uninit(v) };
                        wide(InputTiles { g: self, xp, v });
                    }
                    for xi in 0..XI {
                        for q in 0..panels {
                            let panel = &u[(xi * panels + q) * cin * CO..][..cin * CO];
                            for t0 in (0..tiles).step_by(PX) {
                                let k = PX.min(tiles - t0);
                                let at: [usize; PX] =
                                    std::array::from_fn(|j| (t0 + j.min(k - 1)) * ts + xi * cin);
                                let y = &mut m[(t0 * XI + xi) * cout + q * CO..];
                                let ops = (offs.as_slice(), cin - 1);
                                if !simd::tile(panel, ops, (v, &at), (y, XI * cout), (k, false)) {
                                    bail!("{name}: a Winograd product tile left its buffers ({self:?})");
                                }
                            }
                        }
                    }
                    for (s, out) in out.chunks_mut(self.out_len()).enumerate() {
                        let m = &m[s * per * XI * cout..][..per * XI * cout];
                        wide(OutputTiles { g: self, m, yt });
                        pixels_to_channels(yt, (cout, b), (cout, self.ohw()), out);
                    }
                    Ok(())
                },
            )
    }

    /// `[dW | db]` of the whole batch into `dwb` (overwritten), dW stored
    /// `(Cout, Cin, 3, 3)`: the input tiles and the output gradient's
    /// tiles transformed, 16 GEMMs `dU = V^T Z` (one position per unit of
    /// work, each over every tile of the batch), then `dW = G^T dU G`; db
    /// the output gradient's row sums, sample by sample.
    pub(super) fn weight_grad_winograd(
        &self,
        name: &str,
        x: &[f32],
        dy: &[f32],
        dwb: &mut [f32],
    ) -> candle_core::Result<()> {
        let (cin, cout) = (self.cin, self.cout);
        self.check(
            name,
            &[
                ("input", x.len(), self.b * self.in_len()),
                ("output gradient", dy.len(), self.b * self.out_len()),
                ("[dW | db]", dwb.len(), cout * self.k() + cout),
            ],
        )?;
        let v = self.wino_inputs(x);
        let z = self.wino_output_grads(dy);
        let tiles = self.b * self.wino_per_sample();
        let mut du = zeros_par(XI * cin * cout);
        du.par_chunks_mut((cin * cout).max(1))
            .enumerate()
            .try_for_each(|(xi, du)| {
                let a = View {
                    data: &v[xi * cin..],
                    rows: cin,
                    cols: tiles,
                    rs: 1,
                    cs: XI * cin,
                };
                let b = View {
                    data: &z[xi * cout..],
                    rows: tiles,
                    cols: cout,
                    rs: XI * cout,
                    cs: 1,
                };
                if !matmul_views((du, cout), a, b, false) {
                    bail!("{name}: Winograd weight-gradient GEMM shapes disagree ({self:?})");
                }
                Ok(())
            })?;
        drop((v, z));
        let (dw, db) = dwb.split_at_mut(cout * self.k());
        // dW = G^T dU G, sixteen output channels a unit of work: each reads
        // one cache line of dU per (position, input channel).
        dw.par_chunks_mut(L * cin * 9)
            .enumerate()
            .for_each(|(q, dw)| {
                wide(KernelGrads {
                    g: self,
                    du: &du,
                    q,
                    dw,
                });
            });
        db.fill(0.0);
        for dy in dy.chunks(self.out_len().max(1)) {
            add_row_sums(db, dy, self.ohw());
        }
        Ok(())
    }

    /// Every sample's output-gradient tiles transformed, `A dY A^T` (the
    /// outputs past the map's edge zero), laid `(tiles, XI, Cout)`.
    fn wino_output_grads(&self, dy: &[f32]) -> Vec<f32> {
        let cout = self.cout;
        let per = self.wino_per_sample() * XI * cout;
        let n = self.b * per;
        let mut z = Vec::with_capacity(n);
        z.spare_capacity_mut()[..n]
            .par_chunks_mut(per.max(1))
            .zip(dy.par_chunks(self.out_len().max(1)))
            .for_each_init(
                || vec![0f32; self.ohw() * cout],
                |dyt, (z, dy)| {
                    self.pixel_major(dy, dyt);
                    wide(GradTiles { g: self, dyt, z });
                },
            );
        // SAFETY: the capacity holds `n` elements, and every tile of every
        // sample wrote all `XI * cout` of its values.
        unsafe { z.set_len(n) };
        z
    }
}

mod tiles;

#[cfg(test)]
mod tests;
