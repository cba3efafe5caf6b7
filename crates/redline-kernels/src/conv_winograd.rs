//! 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) on CPUs: each 2x2
//! block of outputs from a 4x4 tile of inputs with 16 products per channel
//! pair instead of 36, so 2.25x fewer multiply-adds than any direct kernel
//! (on a 7x7 map, rounded up to 8x8, 1.72x).
//!
//! With `B`, `G`, `A` Lavin and Gray's matrices, a tile's output is
//! `A^T [(G g G^T) . (B^T d B)] A`: the weights `g` and the input tiles `d`
//! are transformed into 16 positions each, and at every position the sum
//! over input channels is one GEMM of `(tiles, Cin) x (Cin, Cout)`. The
//! three passes each run on all cores: the input transform by samples, the
//! 16 GEMMs by position (each on one thread, so that no sum depends on the
//! thread count), the output transform by samples.
//!
//! The weight gradient is the same identity read backwards: `dU = sum over
//! tiles of (B^T d B) . (A dY A^T)`, 16 GEMMs of `(Cin, tiles) x (tiles,
//! Cout)`, then `dW = G^T dU G`. The input gradient is the transposed
//! convolution's forward ([`Geom::transposed`]).
//!
//! F(2x2, 3x3)'s matrices hold only 0, +-1 and 1/2: its rounding is within
//! a few ulps of a direct sum's (the tests hold it to the im2col
//! reference's tolerance).

use candle_core::{bail, DType};
use rayon::prelude::*;

use crate::conv::Geom;
use crate::conv_backward::add_row_sums;
use crate::gemm::{matmul_views, View};
use crate::slices::zeros_par;
use crate::transpose16::{channels_to_pixels, pixels_to_channels};

/// Positions of a transformed tile (4 x 4).
const XI: usize = 16;

/// Channels a transform handles at once (one AVX-512 vector).
const L: usize = 16;

/// Output pixels per channel from which the Winograd kernels run: on 4x4
/// maps and larger. On 2x2 maps (a single tile, 4 of its 16 products
/// kept) the whole-batch GEMMs are twice as fast (`examples/conv_paths.rs`,
/// kept in `bench/results`).
const MIN_PIXELS: usize = 16;

/// Output pixels per channel under which they run: at ResNet-18's 28x28
/// stage they only tie with the direct kernels, at 56x56 (64 channels)
/// they lose by 40-80%.
const MAX_PIXELS: usize = 400;

/// Input and output channels from which they run: under 64 the GEMMs are
/// too thin to pay for the transforms.
const MIN_CHANNELS: usize = 64;

impl Geom {
    /// Whether the Winograd kernels can run this convolution at all: f32
    /// products, a 3x3 kernel, stride 1, padding of at most 2, channels in
    /// multiples of [`L`].
    pub(super) fn winograd_runs(&self) -> bool {
        self.gemm == DType::F32
            && (self.kh, self.kw, self.stride) == (3, 3, 1)
            && self.pad <= 2
            && self.cin.is_multiple_of(L)
            && self.cout.is_multiple_of(L)
    }

    /// Whether the Winograd kernels run this convolution's forward and
    /// weight gradient (and its input gradient, where the transposed
    /// convolution is one): the measured table (`examples/conv_paths.rs`).
    pub(super) fn winograd(&self) -> bool {
        self.winograd_runs()
            && (MIN_PIXELS..MAX_PIXELS).contains(&self.ohw())
            && self.cin.min(self.cout) >= MIN_CHANNELS
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

    /// The weights transformed: `U = G g G^T` of each channel pair, laid
    /// `(Cin, XI, Cout)` (so that position `xi`'s `(Cin, Cout)` matrix is
    /// a view with rows `XI * Cout` apart); `taps(ci, co)` gives the pair's
    /// 3x3 kernel, row-major.
    pub(super) fn wino_weights(&self, taps: impl Fn(usize, usize) -> [f32; 9] + Sync) -> Vec<f32> {
        let cout = self.cout;
        let mut u = vec![0f32; self.cin * XI * cout];
        // Sixteen input channels a unit of work (the kernels they read,
        // stored or flipped, stay in the L2 cache across them), each
        // written as sixteen rows in order.
        u.par_chunks_mut(L * XI * cout)
            .enumerate()
            .for_each(|(q, u)| {
                for (i, u) in u.chunks_exact_mut(XI * cout).enumerate() {
                    for co in 0..cout {
                        let g = taps(q * L + i, co);
                        // G g: 4 rows of 3.
                        let mut gg = [[0f32; 3]; 4];
                        for (c, col) in (0..3).map(|c| [g[c], g[3 + c], g[6 + c]]).enumerate() {
                            for (r, v) in g_times(col).into_iter().enumerate() {
                                gg[r][c] = v;
                            }
                        }
                        // (G g) G^T: 4 x 4.
                        for (r, row) in gg.iter().enumerate() {
                            for (c, v) in g_times(*row).into_iter().enumerate() {
                                u[(4 * r + c) * cout + co] = v;
                            }
                        }
                    }
                }
            });
        u
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

    /// Every sample's tiles of `x` (`(B, Cin, H, W)`) transformed, `B^T d
    /// B`, laid `(tiles, XI, Cin)` with the batch's tiles in order.
    fn wino_inputs(&self, x: &[f32]) -> Vec<f32> {
        let (cin, (hq, wq)) = (self.cin, self.wino_padded());
        let (w, pad) = (self.w, self.pad);
        let per = self.wino_per_sample() * XI * cin;
        let n = self.b * per;
        let mut v = Vec::with_capacity(n);
        v.spare_capacity_mut()[..n]
            .par_chunks_mut(per.max(1))
            .zip(x.par_chunks(self.in_len().max(1)))
            .for_each_init(
                || vec![0f32; hq * wq * cin],
                |xp, (v, x)| {
                    // The border stays zero: every sample writes the same interior.
                    channels_to_pixels(x, (cin, self.h * w), xp, |p| {
                        ((p / w + pad) * wq + p % w + pad) * cin
                    });
                    wide(InputTiles { g: self, xp, v });
                },
            );
        // SAFETY: the capacity holds `n` elements, and every tile of every
        // sample wrote all `XI * cin` of its values (`put` per lane block,
        // `cin` a multiple of L: `winograd_runs`).
        unsafe { v.set_len(n) };
        v
    }

    /// The 16 GEMMs: position `xi`'s `(tiles, Cin)` inputs times its
    /// `(Cin, Cout)` weights, into `(XI, tiles, Cout)`, one position per
    /// unit of work.
    fn wino_products(&self, name: &str, v: &[f32], u: &[f32]) -> candle_core::Result<Vec<f32>> {
        let (cin, cout) = (self.cin, self.cout);
        let tiles = self.b * self.wino_per_sample();
        let mut m = zeros_par(XI * tiles * cout);
        m.par_chunks_mut((tiles * cout).max(1))
            .enumerate()
            .try_for_each(|(xi, m)| {
                let a = View {
                    data: &v[xi * cin..],
                    rows: tiles,
                    cols: cin,
                    rs: XI * cin,
                    cs: 1,
                };
                let b = View {
                    data: &u[xi * cout..],
                    rows: cin,
                    cols: cout,
                    rs: XI * cout,
                    cs: 1,
                };
                if !matmul_views((m, cout), a, b, false) {
                    bail!("{name}: Winograd GEMM shapes disagree ({self:?})");
                }
                Ok(())
            })?;
        Ok(m)
    }

    /// The outputs of all samples of `x` into `out` (`(B, Cout, oh, ow)`),
    /// `u` the transformed weights ([`Geom::wino_weights`]), the bias `b`
    /// added last.
    pub(super) fn forward_winograd(
        &self,
        name: &str,
        u: &[f32],
        b: &[f32],
        x: &[f32],
        out: &mut [f32],
    ) -> candle_core::Result<()> {
        let (cin, cout) = (self.cin, self.cout);
        self.check(
            name,
            &[
                ("input", x.len(), self.b * self.in_len()),
                ("Winograd weights", u.len(), cin * XI * cout),
                ("bias", b.len(), cout),
                ("output", out.len(), self.b * self.out_len()),
            ],
        )?;
        let v = self.wino_inputs(x);
        let m = self.wino_products(name, &v, u)?;
        drop(v);
        out.par_chunks_mut(self.out_len().max(1))
            .enumerate()
            .for_each_init(
                || vec![0f32; self.ohw() * cout],
                |yt, (s, out)| {
                    wide(OutputTiles {
                        g: self,
                        m: &m,
                        s,
                        yt,
                    });
                    pixels_to_channels(yt, (cout, b), (cout, self.ohw()), out);
                },
            );
        Ok(())
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

/// A loop over lane blocks whose body [`wide`] compiles for AVX-512.
trait Wide {
    /// The loop; implementations are `#[inline(always)]`, so that it is
    /// compiled inside [`wide`]'s AVX-512 function.
    fn run(self);
}

/// Runs `job`, compiled for AVX-512 where the CPU has it: the transforms'
/// 16-lane arrays then live in `zmm` registers (compiled for the baseline
/// they were SSE pairs spilled to the stack: 13% of a 14x14 forward).
fn wide(job: impl Wide) {
    #[cfg(target_arch = "x86_64")]
    if crate::conv_direct_simd::available() {
        /// `job.run()` in a function compiled with AVX-512.
        #[target_feature(enable = "avx512f")]
        unsafe fn with(job: impl Wide) {
            job.run()
        }
        // SAFETY: the CPU has AVX-512F (checked just above).
        return unsafe { with(job) };
    }
    job.run()
}

/// One sample's input tiles transformed ([`Geom::wino_inputs`]): `xp` the
/// sample padded pixel-major, `v` its `(tiles, XI, Cin)` values.
struct InputTiles<'a> {
    g: &'a Geom,
    xp: &'a [f32],
    v: &'a mut [std::mem::MaybeUninit<f32>],
}

impl Wide for InputTiles<'_> {
    #[inline(always)]
    fn run(self) {
        let Self { g, xp, v } = self;
        let (cin, wq, tw) = (g.cin, g.wino_padded().1, g.wino_tiles().1);
        for (t, v) in v.chunks_exact_mut(XI * cin).enumerate() {
            let base = (2 * (t / tw) * wq + 2 * (t % tw)) * cin;
            for c0 in (0..cin).step_by(L) {
                let mut d = [[0f32; L]; XI];
                for (k, d) in d.iter_mut().enumerate() {
                    *d = lanes(&xp[base + ((k / 4) * wq + k % 4) * cin + c0..]);
                }
                let out = tile_4x4(&d, bt_times);
                for (k, o) in out.iter().enumerate() {
                    put(&mut v[k * cin + c0..][..L], o);
                }
            }
        }
    }
}

/// Sample `s`'s outputs from the products `m` (`(XI, tiles, Cout)`) into
/// `yt`, pixel-major `(oh*ow, Cout)`.
struct OutputTiles<'a> {
    g: &'a Geom,
    m: &'a [f32],
    s: usize,
    yt: &'a mut [f32],
}

impl Wide for OutputTiles<'_> {
    #[inline(always)]
    fn run(self) {
        let Self { g, m, s, yt } = self;
        let (cout, ow, tw, per) = (g.cout, g.ow, g.wino_tiles().1, g.wino_per_sample());
        let plane = g.b * per * cout;
        for tl in 0..per {
            let t = s * per + tl;
            let (oy, ox) = (2 * (tl / tw), 2 * (tl % tw));
            for c0 in (0..cout).step_by(L) {
                let mut mm = [[0f32; L]; XI];
                for (k, v) in mm.iter_mut().enumerate() {
                    *v = lanes(&m[k * plane + t * cout + c0..]);
                }
                for (k, y) in tile_2x2(&mm).iter().enumerate() {
                    let (py, px) = (oy + k / 2, ox + k % 2);
                    if py < g.oh && px < ow {
                        yt[(py * ow + px) * cout + c0..][..L].copy_from_slice(y);
                    }
                }
            }
        }
    }
}

/// One sample's output-gradient tiles transformed
/// ([`Geom::wino_output_grads`]): `dyt` its gradient pixel-major, `z` its
/// `(tiles, XI, Cout)` values.
struct GradTiles<'a> {
    g: &'a Geom,
    dyt: &'a [f32],
    z: &'a mut [std::mem::MaybeUninit<f32>],
}

impl Wide for GradTiles<'_> {
    #[inline(always)]
    fn run(self) {
        let Self { g, dyt, z } = self;
        let (cout, ow, tw) = (g.cout, g.ow, g.wino_tiles().1);
        for (t, z) in z.chunks_exact_mut(XI * cout).enumerate() {
            let (oy, ox) = (2 * (t / tw), 2 * (t % tw));
            for c0 in (0..cout).step_by(L) {
                let mut d = [[0f32; L]; 4];
                for (k, d) in d.iter_mut().enumerate() {
                    let (py, px) = (oy + k / 2, ox + k % 2);
                    if py < g.oh && px < ow {
                        *d = lanes(&dyt[(py * ow + px) * cout + c0..]);
                    }
                }
                for (k, o) in grad_tile(&d).iter().enumerate() {
                    put(&mut z[k * cout + c0..][..L], o);
                }
            }
        }
    }
}

/// Output channels `q * L..(q + 1) * L`'s kernel gradients `G^T dU G`
/// from `du` (`(XI, Cin, Cout)`) into `dw`, their `(L, Cin, 3, 3)` rows.
struct KernelGrads<'a> {
    g: &'a Geom,
    du: &'a [f32],
    q: usize,
    dw: &'a mut [f32],
}

impl Wide for KernelGrads<'_> {
    #[inline(always)]
    fn run(self) {
        let Self { g, du, q, dw } = self;
        let (cin, cout) = (g.cin, g.cout);
        for ci in 0..cin {
            let mut d = [[0f32; L]; XI];
            for (k, d) in d.iter_mut().enumerate() {
                *d = lanes(&du[(k * cin + ci) * cout + q * L..]);
            }
            let taps = grad_taps(&d);
            for (j, dwj) in dw.chunks_exact_mut(cin * 9).enumerate() {
                for (t, tap) in taps.iter().enumerate() {
                    dwj[ci * 9 + t] = tap[j];
                }
            }
        }
    }
}

/// `dst[i] = src[i]` into memory not yet initialised.
#[inline(always)]
fn put(dst: &mut [std::mem::MaybeUninit<f32>], src: &[f32; L]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(s);
    }
}

/// The first [`L`] values of `s`.
#[inline(always)]
fn lanes(s: &[f32]) -> [f32; L] {
    let mut v = [0f32; L];
    v.copy_from_slice(&s[..L]);
    v
}

/// `G x` for one column of 3: `[x0, (x0+x1+x2)/2, (x0-x1+x2)/2, x2]`.
fn g_times([x0, x1, x2]: [f32; 3]) -> [f32; 4] {
    [x0, 0.5 * (x0 + x1 + x2), 0.5 * (x0 - x1 + x2), x2]
}

/// `a + b`, lane by lane.
#[inline(always)]
fn add(a: &[f32; L], b: &[f32; L]) -> [f32; L] {
    let mut r = *a;
    for (r, b) in r.iter_mut().zip(b) {
        *r += b;
    }
    r
}

/// `-a`, lane by lane.
#[inline(always)]
fn neg(a: &[f32; L]) -> [f32; L] {
    let mut r = *a;
    for r in r.iter_mut() {
        *r = -*r;
    }
    r
}

/// `a / 2`, lane by lane.
#[inline(always)]
fn half(a: &[f32; L]) -> [f32; L] {
    let mut r = *a;
    for r in r.iter_mut() {
        *r *= 0.5;
    }
    r
}

/// `a - b`, lane by lane.
#[inline(always)]
fn sub(a: &[f32; L], b: &[f32; L]) -> [f32; L] {
    let mut r = *a;
    for (r, b) in r.iter_mut().zip(b) {
        *r -= b;
    }
    r
}

/// `B^T x` for one column of 4 lanes: `[x0 - x2, x1 + x2, x2 - x1, x1 -
/// x3]`.
#[inline(always)]
fn bt_times(x: [&[f32; L]; 4]) -> [[f32; L]; 4] {
    [
        sub(x[0], x[2]),
        add(x[1], x[2]),
        sub(x[2], x[1]),
        sub(x[1], x[3]),
    ]
}

/// `M^T d M` of a 4x4 tile of lane vectors (row-major), `col(x)` being `M^T
/// x` of one column of 4.
#[inline(always)]
fn tile_4x4(d: &[[f32; L]; XI], col: impl Fn([&[f32; L]; 4]) -> [[f32; L]; 4]) -> [[f32; L]; XI] {
    // Down the columns: t[r][c] = (M^T d)[r][c].
    let mut t = [[0f32; L]; XI];
    for c in 0..4 {
        for (r, v) in col([&d[c], &d[4 + c], &d[8 + c], &d[12 + c]])
            .into_iter()
            .enumerate()
        {
            t[4 * r + c] = v;
        }
    }
    // Along the rows: out[r][c] = (t M)[r][c] = (M^T t^T)^T.
    let mut out = [[0f32; L]; XI];
    for r in 0..4 {
        let row = [&t[4 * r], &t[4 * r + 1], &t[4 * r + 2], &t[4 * r + 3]];
        for (c, v) in col(row).into_iter().enumerate() {
            out[4 * r + c] = v;
        }
    }
    out
}

/// `A^T m A` of a 4x4 tile of lane vectors: the 2x2 outputs, row-major.
#[inline(always)]
fn tile_2x2(m: &[[f32; L]; XI]) -> [[f32; L]; 4] {
    // A^T x = [x0 + x1 + x2, x1 - x2 - x3].
    let at = |x: [&[f32; L]; 4]| -> [[f32; L]; 2] {
        [add(&add(x[0], x[1]), x[2]), sub(&sub(x[1], x[2]), x[3])]
    };
    let mut s = [[0f32; L]; 8];
    for c in 0..4 {
        let [a, b] = at([&m[c], &m[4 + c], &m[8 + c], &m[12 + c]]);
        s[c] = a;
        s[4 + c] = b;
    }
    let [y00, y01] = at([&s[0], &s[1], &s[2], &s[3]]);
    let [y10, y11] = at([&s[4], &s[5], &s[6], &s[7]]);
    [y00, y01, y10, y11]
}

/// `A g A^T` of a 2x2 output-gradient tile (row-major lane vectors): the
/// 4x4 tile, row-major.
#[inline(always)]
fn grad_tile(g: &[[f32; L]; 4]) -> [[f32; L]; XI] {
    // A x = [x0, x0 + x1, x0 - x1, -x1].
    let a = |x0: &[f32; L], x1: &[f32; L]| -> [[f32; L]; 4] {
        [*x0, add(x0, x1), sub(x0, x1), neg(x1)]
    };
    // Down the columns: 4 rows of 2.
    let c0 = a(&g[0], &g[2]);
    let c1 = a(&g[1], &g[3]);
    let mut out = [[0f32; L]; XI];
    for r in 0..4 {
        for (c, v) in a(&c0[r], &c1[r]).into_iter().enumerate() {
            out[4 * r + c] = v;
        }
    }
    out
}

/// `G^T d G` of a 4x4 tile of lane vectors (row-major): the 3x3 kernel's
/// gradient, row-major.
#[inline(always)]
fn grad_taps(d: &[[f32; L]; XI]) -> [[f32; L]; 9] {
    // G^T x = [x0 + (x1 + x2)/2, (x1 - x2)/2, (x1 + x2)/2 + x3].
    let gt = |x: [&[f32; L]; 4]| -> [[f32; L]; 3] {
        [
            add(x[0], &half(&add(x[1], x[2]))),
            half(&sub(x[1], x[2])),
            add(&half(&add(x[1], x[2])), x[3]),
        ]
    };
    let mut s = [[0f32; L]; 12];
    for c in 0..4 {
        for (r, v) in gt([&d[c], &d[4 + c], &d[8 + c], &d[12 + c]])
            .into_iter()
            .enumerate()
        {
            s[4 * r + c] = v;
        }
    }
    let mut out = [[0f32; L]; 9];
    for r in 0..3 {
        for (c, v) in gt([&s[4 * r], &s[4 * r + 1], &s[4 * r + 2], &s[4 * r + 3]])
            .into_iter()
            .enumerate()
        {
            out[3 * r + c] = v;
        }
    }
    out
}

#[cfg(test)]
mod tests;
