//! The Winograd kernels' loops over blocks of [`L`] channels, compiled for
//! AVX-512 where the CPU has it ([`wide`]), and the F(2x2, 3x3) transforms
//! of tiles of lane vectors.

use std::mem::MaybeUninit;

use super::{L, XI};
use crate::conv::Geom;

/// A loop over lane blocks whose body [`wide`] compiles for AVX-512.
pub(super) trait Wide {
    /// The loop; implementations are `#[inline(always)]`, so that it is
    /// compiled inside [`wide`]'s AVX-512 function.
    fn run(self);
}

/// Runs `job`, compiled for AVX-512 where the CPU has it: the transforms'
/// 16-lane arrays then live in `zmm` registers (compiled for the baseline
/// they were SSE pairs spilled to the stack: 13% of a 14x14 forward).
pub(super) fn wide(job: impl Wide) {
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

/// Input channels `ci0..`'s transformed kernels ([`Geom::wino_weights`]):
/// `u` their `(L, XI, Cout)` values, sixteen output channels at a time.
pub(super) struct KernelTiles<'a, F> {
    pub(super) taps: &'a F,
    pub(super) cout: usize,
    pub(super) ci0: usize,
    pub(super) u: &'a mut [MaybeUninit<f32>],
}

impl<F: Fn(usize, usize) -> [f32; 9]> Wide for KernelTiles<'_, F> {
    #[inline(always)]
    fn run(self) {
        let Self { taps, cout, ci0, u } = self;
        for (i, u) in u.chunks_exact_mut(XI * cout).enumerate() {
            for c0 in (0..cout).step_by(L) {
                // The sixteen kernels' taps as lanes.
                let mut g = [[0f32; L]; 9];
                for (j, co) in (c0..c0 + L).enumerate() {
                    for (t, v) in taps(ci0 + i, co).into_iter().enumerate() {
                        g[t][j] = v;
                    }
                }
                // G g, column by column: 4 rows of 3.
                let mut gg = [[[0f32; L]; 3]; 4];
                for c in 0..3 {
                    for (r, v) in g_lanes([&g[c], &g[3 + c], &g[6 + c]])
                        .into_iter()
                        .enumerate()
                    {
                        gg[r][c] = v;
                    }
                }
                // (G g) G^T, row by row: 4 x 4.
                for (r, row) in gg.iter().enumerate() {
                    for (c, v) in g_lanes([&row[0], &row[1], &row[2]]).iter().enumerate() {
                        put(&mut u[(4 * r + c) * cout + c0..][..L], v);
                    }
                }
            }
        }
    }
}

/// One sample's input tiles transformed ([`Geom::wino_inputs`]): `xp` the
/// sample padded pixel-major, `v` its `(tiles, XI, Cin)` values.
pub(super) struct InputTiles<'a> {
    pub(super) g: &'a Geom,
    pub(super) xp: &'a [f32],
    pub(super) v: &'a mut [MaybeUninit<f32>],
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
                let out = bt_tile(&d);
                for (k, o) in out.iter().enumerate() {
                    put(&mut v[k * cin + c0..][..L], o);
                }
            }
        }
    }
}

/// One sample's outputs from its products `m` (`(tiles, XI, Cout)`) into
/// `yt`, pixel-major `(oh*ow, Cout)`.
pub(super) struct OutputTiles<'a> {
    pub(super) g: &'a Geom,
    pub(super) m: &'a [f32],
    pub(super) yt: &'a mut [f32],
}

impl Wide for OutputTiles<'_> {
    #[inline(always)]
    fn run(self) {
        let Self { g, m, yt } = self;
        let (cout, ow, tw) = (g.cout, g.ow, g.wino_tiles().1);
        for (t, m) in m.chunks_exact(XI * cout).enumerate() {
            let (oy, ox) = (2 * (t / tw), 2 * (t % tw));
            for c0 in (0..cout).step_by(L) {
                let mut mm = [[0f32; L]; XI];
                for (k, v) in mm.iter_mut().enumerate() {
                    *v = lanes(&m[k * cout + c0..]);
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
pub(super) struct GradTiles<'a> {
    pub(super) g: &'a Geom,
    pub(super) dyt: &'a [f32],
    pub(super) z: &'a mut [MaybeUninit<f32>],
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
pub(super) struct KernelGrads<'a> {
    pub(super) g: &'a Geom,
    pub(super) du: &'a [f32],
    pub(super) q: usize,
    pub(super) dw: &'a mut [f32],
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
fn put(dst: &mut [MaybeUninit<f32>], src: &[f32; L]) {
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

/// `G x` for one column of 3 lanes: `[x0, (x0 + x1 + x2) / 2, (x0 - x1 +
/// x2) / 2, x2]`.
#[inline(always)]
fn g_lanes(x: [&[f32; L]; 3]) -> [[f32; L]; 4] {
    [
        *x[0],
        half(&add(&add(x[0], x[1]), x[2])),
        half(&add(&sub(x[0], x[1]), x[2])),
        *x[2],
    ]
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

/// `B^T d B` of a 4x4 input tile of lane vectors (row-major).
#[inline(always)]
fn bt_tile(d: &[[f32; L]; XI]) -> [[f32; L]; XI] {
    // Down the columns: t[r][c] = (B^T d)[r][c].
    let mut t = [[0f32; L]; XI];
    for c in 0..4 {
        for (r, v) in bt_times([&d[c], &d[4 + c], &d[8 + c], &d[12 + c]])
            .into_iter()
            .enumerate()
        {
            t[4 * r + c] = v;
        }
    }
    // Along the rows: out[r][c] = (t B)[r][c] = (B^T t^T)^T.
    let mut out = [[0f32; L]; XI];
    for r in 0..4 {
        let row = [&t[4 * r], &t[4 * r + 1], &t[4 * r + 2], &t[4 * r + 3]];
        for (c, v) in bt_times(row).into_iter().enumerate() {
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
