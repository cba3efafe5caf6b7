//! The batch norm on small maps (at most [`MAX_HW`] values a plane: ResNet's
//! 8x8 down to 1x1 maps), by blocks of channels rather than channel by
//! channel, for f32 and bf16 storage alike.
//!
//! Channel by channel, each of a channel's `b` planes is its own short loop
//! in every pass (widen, two statistics passes, normalise; two backward
//! passes): on a 2x2 map a loop of 4 values, whose set-up and per-plane
//! reduction cost more than its arithmetic. ResNet-50's batch norms at 64 px
//! (bf16-true, batch 16) ran at 1 to 6 GB/s, 1.5 to 3.6x PyTorch's times.
//!
//! Here a block of channels is, in each sample, one contiguous segment of
//! `channels * hw` values. Each pass is one loop over a sample's segment
//! against per-value lanes: sums kept per (channel, position) and added
//! across the samples, and the channel's constants (mean, scale, shift, the
//! backward's terms) repeated over its positions. Channel `j`'s sum is its
//! lanes' f32 sums over the samples (in sample order), added in f64 in
//! position order: how the block is cut does not change a bit, and the
//! f32 and bf16 kernels share the code, so a bf16 input gives the f32
//! kernel's values on the widened input.

use std::cell::Cell;
use std::ops::Range;

use half::bf16;

use super::{Dims, Stats};
use crate::add_relu::passes;
use crate::half16::Act;
use crate::slices::{by_channel_blocks_of, vectorised, Planes};

/// The largest plane (`h * w`) normalised by blocks; larger ones go channel
/// by channel, where a plane's loop is long enough to carry its set-up (at
/// 16x16 the blocks were no faster: a block's segments lie a sample's
/// `c * hw` values apart, 128 KB for 256 bf16 channels, and alias in the
/// caches).
pub(super) const MAX_HW: usize = 64;

/// Values in a block's segment of one sample (lanes per pass): six lane
/// arrays of this many f32 stay in the first-level cache.
const LANES: usize = 512;

/// The values the blocked kernels read and write: f32, or bf16 widened on
/// the way in (once a block) and rounded on the way out.
pub(super) trait Elem: Act + Default {
    /// A block's segments of `v` (a whole tensor) as f32: `v` itself, or
    /// the segments widened one after another into `scratch`.
    fn view<'a>(
        d: Dims,
        v: &'a [Self],
        chans: &Range<usize>,
        scratch: &'a mut Vec<f32>,
    ) -> View<'a>;
}

impl Elem for f32 {
    fn view<'a>(d: Dims, v: &'a [f32], chans: &Range<usize>, _: &'a mut Vec<f32>) -> View<'a> {
        View {
            values: v,
            first: chans.start * d.hw,
            stride: d.c * d.hw,
            len: chans.len() * d.hw,
        }
    }
}

impl Elem for bf16 {
    fn view<'a>(
        d: Dims,
        v: &'a [bf16],
        chans: &Range<usize>,
        scratch: &'a mut Vec<f32>,
    ) -> View<'a> {
        let len = chans.len() * d.hw;
        // Every value is overwritten: only a length change writes zeros.
        scratch.resize(d.b * len, 0.0);
        for (s, dst) in scratch.chunks_mut(len.max(1)).enumerate() {
            bf16::widen_into(d.segment(v, s, chans), dst);
        }
        View {
            values: scratch,
            first: 0,
            stride: len,
            len,
        }
    }
}

/// A block's per-sample segments as f32 values: sample `s`'s at `first +
/// s * stride`, `len` long.
pub(super) struct View<'a> {
    values: &'a [f32],
    first: usize,
    stride: usize,
    len: usize,
}

impl View<'_> {
    /// Sample `s`'s segment.
    #[inline(always)]
    fn seg(&self, s: usize) -> &[f32] {
        &self.values[self.first + s * self.stride..][..self.len]
    }
}

/// Channels per block for `d`, or `None` when its planes go channel by
/// channel: about [`LANES`] values a segment, and enough blocks for every
/// compute thread (the bits do not depend on it).
fn block_channels(d: Dims) -> Option<usize> {
    if d.hw == 0 || d.hw > MAX_HW {
        return None;
    }
    let by_cache = (LANES / d.hw).max(1);
    let by_threads = d.c.div_ceil(4 * rayon::current_num_threads()).max(1);
    Some(by_cache.min(by_threads))
}

thread_local! {
    /// A compute thread's lane arrays, and its widened segments of the
    /// input and the output gradient (bf16).
    static SCRATCH: Cell<[Vec<f32>; 3]> = Cell::default();
}

/// `f` with `k` lane arrays of `len` values each (stale contents) and
/// two scratch vectors for [`Elem::view`].
fn with_lanes<R>(k: usize, len: usize, f: impl FnOnce(&mut [f32], &mut [Vec<f32>; 2]) -> R) -> R {
    let [mut lanes, a, b] = SCRATCH.take();
    if lanes.len() < k * len {
        lanes.resize(k * len, 0.0);
    }
    let mut rest = [a, b];
    let r = f(&mut lanes[..k * len], &mut rest);
    let [a, b] = rest;
    SCRATCH.set([lanes, a, b]);
    r
}

impl Dims {
    /// Sample `s`'s values of channels `chans` in `v`: one segment.
    #[inline(always)]
    fn segment<'a, T>(&self, v: &'a [T], s: usize, chans: &Range<usize>) -> &'a [T] {
        &v[(s * self.c + chans.start) * self.hw..][..chans.len() * self.hw]
    }
}

/// Each channel's lanes (`hw` of them) added in f64, in position order.
#[inline(always)]
fn channel_sums(lanes: &[f32], hw: usize) -> impl Iterator<Item = f64> + '_ {
    lanes
        .chunks(hw)
        .map(|c| c.iter().map(|&v| f64::from(v)).sum::<f64>())
}

/// `lanes` with value `i` of every channel `j` (its `hw` positions) set
/// to `v(j)`.
#[inline(always)]
fn repeat(lanes: &mut [f32], hw: usize, v: impl Fn(usize) -> f32) {
    for (j, l) in lanes.chunks_mut(hw).enumerate() {
        l.fill(v(j));
    }
}

/// The forward of a block of channels: its statistics rows `[mean, var,
/// invstd, scale, shift]` and its output segments written into `out`, a
/// ReLU after when `RELU`. The loops index equal-length slices: they
/// vectorise so, where zips of four and more did not.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn forward_block<T: Elem, const RELU: bool>(
    d: Dims,
    (x, w, b): (&[T], &[f32], &[f32]),
    eps: f64,
    chans: &Range<usize>,
    out: &mut Planes<'_, T>,
) -> Vec<[f32; 5]> {
    let (hw, len) = (d.hw, chans.len() * d.hw);
    let n = d.n().max(1) as f64;
    with_lanes(3, len, |lanes, [xs, _]| {
        let xs = T::view(d, x, chans, xs);
        let (acc, rest) = lanes.split_at_mut(len);
        let (a, sh) = rest.split_at_mut(len);
        acc.fill(0.0);
        for s in 0..d.b {
            let seg = xs.seg(s);
            for i in 0..len {
                acc[i] += seg[i];
            }
        }
        let mean: Vec<f32> = channel_sums(acc, hw).map(|v| (v / n) as f32).collect();
        repeat(a, hw, |j| mean[j]);
        acc.fill(0.0);
        for s in 0..d.b {
            let seg = xs.seg(s);
            for i in 0..len {
                let t = seg[i] - a[i];
                acc[i] += t * t;
            }
        }
        let rows: Vec<[f32; 5]> = channel_sums(acc, hw)
            .zip(&mean)
            .zip(chans.clone())
            .map(|((sq, &mean), ch)| {
                let var = (sq / n) as f32;
                let invstd = (1.0 / (f64::from(var) + eps).sqrt()) as f32;
                let scale = invstd * w[ch];
                [mean, var, invstd, scale, b[ch] - mean * scale]
            })
            .collect();
        repeat(a, hw, |j| rows[j][3]);
        repeat(sh, hw, |j| rows[j][4]);
        for (s, y) in (0..d.b).zip(out) {
            let (seg, y) = (xs.seg(s), &mut y[..len]);
            for i in 0..len {
                let z = seg[i] * a[i] + sh[i];
                y[i] = T::narrow(if RELU && !passes(z) { 0.0 } else { z });
            }
        }
        rows
    })
}

/// The fused forward by blocks when `d`'s maps are at most [`MAX_HW`]
/// values: y in `x`'s storage, and the statistics; `None` for larger maps
/// (channel by channel, the caller's).
pub(super) fn forward<T: Elem>(
    d: Dims,
    (x, w, b): (&[T], &[f32], &[f32]),
    eps: f64,
    relu: bool,
) -> Option<(Vec<T>, Stats)> {
    let per = block_channels(d)?;
    Some(forward_blocks(d, (x, w, b), eps, relu, per))
}

/// The fused forward, `per` channels a block.
fn forward_blocks<T: Elem>(
    d: Dims,
    (x, w, b): (&[T], &[f32], &[f32]),
    eps: f64,
    relu: bool,
    per: usize,
) -> (Vec<T>, Stats) {
    let (y, rows) = by_channel_blocks_of::<T, _>((d.b, d.c, d.hw), per, |chans, out| {
        if relu {
            vectorised(
                #[inline(always)]
                || forward_block::<T, true>(d, (x, w, b), eps, &chans, out),
            )
        } else {
            vectorised(
                #[inline(always)]
                || forward_block::<T, false>(d, (x, w, b), eps, &chans, out),
            )
        }
    });
    let rows: Vec<[f32; 5]> = rows.into_iter().flatten().collect();
    (y, Stats::from_rows(&rows))
}

/// The backward by blocks when `d`'s maps are at most [`MAX_HW`] values,
/// from `x`, `dy`, the weight `w` and the forward's statistics and ReLU: dx
/// in `x`'s storage (empty unless `input_grad`) and each channel's
/// `(sum(g), sum(g * (x - mean)))`; `None` for larger maps.
pub(super) fn backward<T: Elem>(
    d: Dims,
    (x, dy, w): (&[T], &[T], &[f32]),
    (stats, relu): (&Stats, bool),
    input_grad: bool,
) -> Option<Grads<T>> {
    let per = block_channels(d)?;
    let k = Backward {
        x,
        dy,
        w,
        stats,
        relu,
    };
    Some(k.run(d, input_grad, per))
}

/// dx (in the input's storage) and each channel's `(sum(g), sum(g * (x -
/// mean)))`.
type Grads<T> = (Vec<T>, Vec<(f32, f32)>);

/// What the blocked backward reads: the input, the output gradient, the
/// weight and the forward's statistics and ReLU.
struct Backward<'a, T> {
    x: &'a [T],
    dy: &'a [T],
    w: &'a [f32],
    stats: &'a Stats,
    relu: bool,
}

impl<T: Elem> Backward<'_, T> {
    /// A block's `(sum(g), sum(g * (x - mean)))` per channel, and its dx
    /// segments into `out` when given: `(g - mean(g) - (x - mean) * k) *
    /// w * invstd`, `k = sum(g * (x - mean)) / n * invstd^2`. `g` is the
    /// gradient reaching the norm's output: `dy`, or 0 where the ReLU
    /// (when `RELU`) stopped it (`x * scale + shift <= 0`; NaN passes).
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    fn block<const RELU: bool>(
        &self,
        d: Dims,
        chans: &Range<usize>,
        out: Option<&mut Planes<'_, T>>,
    ) -> Vec<(f32, f32)> {
        let (hw, len, st) = (d.hw, chans.len() * d.hw, self.stats);
        let at = |v: &[f32], j: usize| v[chans.start + j];
        with_lanes(6, len, |lanes, [xv, gv]| {
            let (xv, gv) = (
                T::view(d, self.x, chans, xv),
                T::view(d, self.dy, chans, gv),
            );
            let (sa, rest) = lanes.split_at_mut(len);
            let (sb, rest) = rest.split_at_mut(len);
            let (m, rest) = rest.split_at_mut(len);
            let (sc, rest) = rest.split_at_mut(len);
            let (sh, k) = rest.split_at_mut(len);
            repeat(m, hw, |j| at(&st.mean, j));
            repeat(sc, hw, |j| at(&st.scale, j));
            repeat(sh, hw, |j| at(&st.shift, j));
            sa.fill(0.0);
            sb.fill(0.0);
            // `dy` masked by its bits, not chosen by a branch: so the loop
            // vectorises (a select on a value loaded from memory became
            // masked loads: the f32 backward with the ReLU ran 2-3x slower).
            let gated = |x: f32, dy: f32, i: usize| {
                let keep = if RELU {
                    u32::from(passes(x * sc[i] + sh[i])).wrapping_neg()
                } else {
                    u32::MAX
                };
                f32::from_bits(dy.to_bits() & keep)
            };
            for s in 0..d.b {
                let (xs, gs) = (xv.seg(s), gv.seg(s));
                for i in 0..len {
                    let x = xs[i];
                    let g = gated(x, gs[i], i);
                    sa[i] += g;
                    sb[i] += g * (x - m[i]);
                }
            }
            let sums: Vec<(f32, f32)> = channel_sums(sa, hw)
                .zip(channel_sums(sb, hw))
                .map(|(a, b)| (a as f32, b as f32))
                .collect();
            let Some(out) = out else {
                return sums;
            };
            let count = d.n() as f32;
            // sa: mean(g); sb: k; k: w * invstd.
            repeat(sa, hw, |j| sums[j].0 / count);
            repeat(sb, hw, |j| {
                let is = at(&st.invstd, j);
                sums[j].1 / count * is * is
            });
            repeat(k, hw, |j| self.w[chans.start + j] * at(&st.invstd, j));
            for (s, dx) in (0..d.b).zip(out) {
                let (xs, gs) = (xv.seg(s), gv.seg(s));
                let dx = &mut dx[..len];
                for i in 0..len {
                    let x = xs[i];
                    let g = gated(x, gs[i], i);
                    dx[i] = T::narrow((g - sa[i] - (x - m[i]) * sb[i]) * k[i]);
                }
            }
            sums
        })
    }

    /// [`Backward::block`] compiled for the widest vectors, its ReLU chosen.
    #[inline(always)]
    fn block_of(
        &self,
        d: Dims,
        chans: &Range<usize>,
        out: Option<&mut Planes<'_, T>>,
    ) -> Vec<(f32, f32)> {
        if self.relu {
            vectorised(
                #[inline(always)]
                || self.block::<true>(d, chans, out),
            )
        } else {
            vectorised(
                #[inline(always)]
                || self.block::<false>(d, chans, out),
            )
        }
    }

    /// dx in `x`'s storage (empty unless `input_grad`) and each channel's
    /// `(sum(g), sum(g * (x - mean)))`, `per` channels a block.
    fn run(&self, d: Dims, input_grad: bool, per: usize) -> Grads<T>
    where
        Self: Sync,
    {
        use rayon::prelude::*;
        if input_grad {
            let (dx, sums) = by_channel_blocks_of::<T, _>((d.b, d.c, d.hw), per, |chans, out| {
                self.block_of(d, &chans, Some(out))
            });
            return (dx, sums.into_iter().flatten().collect());
        }
        let blocks: Vec<Vec<(f32, f32)>> = (0..d.c.div_ceil(per))
            .into_par_iter()
            .map(|k| {
                let chans = k * per..((k + 1) * per).min(d.c);
                self.block_of(d, &chans, None)
            })
            .collect();
        (Vec::new(), blocks.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.731 + seed).sin() * 2.0 + 0.3)
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// However the channels are cut into blocks (one a block, three, all
    /// of them, a short last block), every channel's statistics, y, dx and
    /// sums are the same bits, with and without the ReLU.
    #[test]
    fn the_cut_into_blocks_changes_no_bit() {
        for (b, c, hw) in [(3, 10, 4), (2, 7, 49), (1, 5, 1)] {
            let d = Dims { b, c, hw };
            let x = values(b * c * hw, 0.0);
            let dy = values(b * c * hw, 5.0);
            let (w, bias) = (values(c, 1.0), values(c, 2.0));
            for relu in [false, true] {
                let run = |per: usize| {
                    let (y, st) = forward_blocks(d, (&x[..], &w[..], &bias[..]), 1e-5, relu, per);
                    let k = Backward {
                        x: &x[..],
                        dy: &dy[..],
                        w: &w[..],
                        stats: &st,
                        relu,
                    };
                    let (dx, sums) = k.run(d, true, per);
                    let (none, sums_only) = k.run(d, false, per);
                    assert!(none.is_empty());
                    assert_eq!(sums, sums_only, "per {per}: the sums without dx");
                    let flat: Vec<f32> = sums.iter().flat_map(|s| [s.0, s.1]).collect();
                    [y, st.mean, st.var, st.invstd, st.scale, st.shift, dx, flat]
                };
                let one = run(1);
                let zeros = one[0].iter().filter(|v| **v == 0.0).count();
                assert_eq!(relu, zeros > 0, "{d:?} relu {relu}: {zeros} zeros");
                for per in [3, c, c + 4] {
                    for (k, (a, e)) in run(per).iter().zip(&one).enumerate() {
                        assert_eq!(bits(a), bits(e), "{d:?} relu {relu}: per {per}, part {k}");
                    }
                }
            }
        }
    }
}
