//! Times every CPU convolution path that can run a shape, forward, weight
//! gradient and input gradient: the measured table behind the rules that
//! choose among them ([`Geom::nhwc`], [`Geom::direct`], [`Geom::batched`]).
//! `examples/conv_paths.rs` prints it; `bench/results` keeps it.

use std::time::Instant;

use rayon::prelude::*;

use crate::conv::Geom;
use crate::conv_direct_simd::{DC, MR};

/// One path's time on one pass of one shape.
#[derive(Debug, Clone)]
pub struct PathTime {
    /// `forward`, `weight grad` or `input grad`.
    pub pass: &'static str,
    /// `im2col`, `direct`, `pixel-major` or `winograd`.
    pub path: &'static str,
    /// Median milliseconds.
    pub ms: f64,
    /// Whether the rules choose this path for this shape and pass.
    pub chosen: bool,
}

/// The median of `reps` timed runs of `f` after one warm-up.
fn median_ms(reps: usize, mut f: impl FnMut() -> crate::Result<()>) -> crate::Result<f64> {
    f()?;
    let mut t = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Times each path that can run `batch` inputs of `(cin, side, side)`
/// under `cout` kernels of `k x k` with `stride` and `pad` (f32), on the
/// compute threads set by [`crate::gemm::set_threads`]: the median of
/// `reps` runs each.
pub fn time_paths(
    batch: usize,
    (cin, cout): (usize, usize),
    side: usize,
    (k, stride, pad): (usize, usize, usize),
    reps: usize,
) -> crate::Result<Vec<PathTime>> {
    let g = Geom::sized(batch, (cin, cout), (side, side), (k, k, pad), stride);
    let vals = |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * f).sin()).collect() };
    let (x, w, dy) = (
        vals(g.b * g.in_len(), 0.37),
        vals(g.cout * g.k(), 0.011),
        vals(g.b * g.out_len(), 0.13),
    );
    let bias = vec![0f32; cout];
    let wp = g.permute_taps(&w, false);
    let name = "conv_paths";
    let mut rows = Vec::new();
    let mut push = |pass, path, ms, chosen| {
        rows.push(PathTime {
            pass,
            path,
            ms,
            chosen,
        })
    };

    // Forward: the rule is Geom::forward_all's.
    let mut out = vec![0f32; g.b * g.out_len()];
    let fwd = g.forward_path().name();
    let ms = median_ms(reps, || {
        Ok(g.forward_im2col(name, &wp, &bias, &x, &mut out)?)
    })?;
    push("forward", "im2col", ms, fwd == "im2col");
    if g.direct_runs(MR) {
        let ms = median_ms(reps, || {
            Ok(g.forward_direct(name, &wp, &bias, &x, &mut out)?)
        })?;
        push("forward", "direct", ms, fwd == "direct");
    }
    if g.nhwc_runs() {
        let ms = median_ms(reps, || {
            Ok(g.forward_nhwc(name, &g.nhwc_panels_stored(&w), &bias, &x, &mut out)?)
        })?;
        push("forward", "pixel-major", ms, fwd == "pixel-major");
    }
    if g.winograd_runs() {
        let ms = median_ms(reps, || {
            let u = g.wino_weights_stored(&w);
            Ok(g.forward_winograd(name, &u, &bias, &x, &mut out)?)
        })?;
        push("forward", "winograd", ms, fwd == "winograd");
    }

    // Weight gradient: Conv2dBackward::accumulate's order.
    let mut dwb = vec![0f32; g.cout * g.k() + g.cout];
    let dw = g.weight_grad_path().name();
    let ms = median_ms(reps, || {
        Ok(g.backward_whole(name, (&x, &wp, &dy), &mut dwb, None)?)
    })?;
    push("weight grad", "im2col", ms, dw == "im2col");
    if g.direct_runs(DC) {
        // Per thread chunk of samples, the partial sums added (as
        // Conv2dBackward::accumulate runs it).
        let per = g.per_chunk();
        let ms = median_ms(reps, || {
            let parts = x
                .par_chunks(per * g.in_len())
                .zip(dy.par_chunks(per * g.out_len()))
                .map(|(x, dy)| g.weight_grad_direct(name, x, dy))
                .collect::<candle_core::Result<Vec<_>>>()?;
            for p in parts {
                dwb.iter_mut().zip(p).for_each(|(d, s)| *d += s);
            }
            Ok(())
        })?;
        push("weight grad", "direct", ms, dw == "direct");
    }
    if g.nhwc_runs() {
        let ms = median_ms(reps, || Ok(g.weight_grad_nhwc(name, &x, &dy, &mut dwb)?))?;
        push("weight grad", "pixel-major", ms, dw == "pixel-major");
    }
    if g.winograd_runs() {
        let ms = median_ms(
            reps,
            || Ok(g.weight_grad_winograd(name, &x, &dy, &mut dwb)?),
        )?;
        push("weight grad", "winograd", ms, dw == "winograd");
    }

    // Input gradient: w^T * dy and col2im, or the transposed convolution's
    // forward (stride 1) by its own rule.
    let mut dx = vec![0f32; g.b * g.in_len()];
    let t = g.transposed();
    let dxp = g.input_grad_path().name();
    let ms = median_ms(reps, || {
        dx.fill(0.0);
        Ok(g.input_grad_whole(name, &wp, &dy, &mut dx)?)
    })?;
    push("input grad", "im2col", ms, dxp == "im2col");
    if let Some(t) = t {
        let zeros = vec![0f32; t.cout];
        if t.direct_runs(MR) {
            let flipped = g.flipped_taps(&w);
            let ms = median_ms(reps, || {
                Ok(t.forward_direct(name, &flipped, &zeros, &dy, &mut dx)?)
            })?;
            push("input grad", "direct", ms, dxp == "direct");
        }
        if t.nhwc_runs() {
            let ms = median_ms(reps, || {
                Ok(t.forward_nhwc(name, &g.nhwc_panels_flipped(&w), &zeros, &dy, &mut dx)?)
            })?;
            push("input grad", "pixel-major", ms, dxp == "pixel-major");
        }
        if t.winograd_runs() {
            let ms = median_ms(reps, || {
                let u = g.wino_weights_flipped(&t, &w);
                Ok(t.forward_winograd(name, &u, &zeros, &dy, &mut dx)?)
            })?;
            push("input grad", "winograd", ms, dxp == "winograd");
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// Every pass is timed on the im2col path, and the rules choose exactly
    /// one path per pass among those timed (with AVX-512): on a 7x7 map
    /// Winograd's, on a 20x20 map from 32 channels the direct one, with
    /// 5x5 kernels on a 7x7 map the pixel-major one.
    #[test]
    fn each_pass_has_one_chosen_path() {
        let cases = [
            (7, 3, 64, "winograd"),
            (20, 3, 32, "direct"),
            (7, 5, 64, "pixel-major"),
        ];
        for (side, k, cin, want) in cases {
            let rows = time_paths(2, (cin, 64), side, (k, 1, k / 2), 1).unwrap();
            for pass in ["forward", "weight grad", "input grad"] {
                let of: Vec<&PathTime> = rows.iter().filter(|r| r.pass == pass).collect();
                assert!(
                    of.iter().any(|r| r.path == "im2col"),
                    "{side}: {pass} {of:?}"
                );
                let chosen: Vec<&str> = of.iter().filter(|r| r.chosen).map(|r| r.path).collect();
                assert_eq!(chosen.len(), 1, "{side}: {pass} {of:?}");
                if crate::conv_direct_simd::available() {
                    assert_eq!(chosen[0], want, "{side}: {pass}");
                }
            }
        }
    }
}
