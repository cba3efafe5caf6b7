//! Per-batch augmentation of images on the loader thread: random crop with
//! padding and random horizontal flip, as torchvision's
//! `RandomCrop(size, padding)` and `RandomHorizontalFlip()` for CIFAR.
//!
//! [`Augmented`] wraps any image data set: its `gather` gathers the samples
//! and transforms them in the staging buffer, so the work runs on the
//! prefetch thread while the device computes, and a loader over it streams.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::dataset::{Dataset, TargetKind, TargetsMut};
use crate::error::{Error, Result};

/// Words of the random stream each sample's draws may use (two offsets and
/// a coin take at most a few; rejection sampling rarely more).
const WORDS_PER_SAMPLE: u128 = 16;

/// Which random transforms to apply to each sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Augment {
    /// Flip left-right with probability 1/2.
    pub flip: bool,
    /// Pad each side by this many pixels, then crop back to the original
    /// size at a random offset (0: no crop).
    pub crop_padding: usize,
    /// Value of the padding per channel (a grey image uses the first), in
    /// the data's (normalised) units: black is `-mean/std` after `Normalize`.
    pub fill: [f32; 3],
}

/// An image data set whose samples are transformed as they are gathered.
/// The draws for sample `i` in epoch `e` come from their own place in one
/// seeded stream, so they are the same whatever batch or order gathers it
/// (prefetching, resuming mid-epoch).
pub struct Augmented<D> {
    inner: D,
    aug: Augment,
    rng: ChaCha8Rng,
    epoch: AtomicUsize,
}

impl<D: Dataset> Augmented<D> {
    /// Wraps `inner`, whose inputs must be images `(C, H, W)`; the draws come
    /// from `seed`, the epoch and the sample's index.
    pub fn new(inner: D, aug: Augment, seed: u64) -> Result<Self> {
        if inner.input_dims().len() != 3 {
            return Err(Error::Config(format!(
                "augmentation needs images (C, H, W); the inputs are {:?}",
                inner.input_dims()
            )));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // A stream apart from the loader's shuffling streams.
        rng.set_stream(u64::MAX - 1);
        Ok(Self {
            inner,
            aug,
            rng,
            epoch: AtomicUsize::new(0),
        })
    }
}

/// Transforms one `(C, H, W)` sample in place: crop at offset `(dy, dx)` of
/// the padded image, then flip. `scratch` holds a copy of the sample.
fn transform(
    x: &mut [f32],
    scratch: &mut Vec<f32>,
    dims: [usize; 3],
    shift: (isize, isize),
    flip: bool,
    fill: [f32; 3],
) {
    let [c, h, w] = dims;
    scratch.clear();
    scratch.extend_from_slice(x);
    for ch in 0..c {
        for y in 0..h {
            for xo in 0..w {
                let xs = if flip { w - 1 - xo } else { xo };
                let (sy, sx) = (y as isize + shift.0, xs as isize + shift.1);
                let inside = (0..h as isize).contains(&sy) && (0..w as isize).contains(&sx);
                x[(ch * h + y) * w + xo] = if inside {
                    scratch[(ch * h + sy as usize) * w + sx as usize]
                } else {
                    fill[ch.min(2)]
                };
            }
        }
    }
}

impl<D: Dataset> Dataset for Augmented<D> {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn input_dims(&self) -> &[usize] {
        self.inner.input_dims()
    }

    fn target(&self) -> TargetKind {
        self.inner.target()
    }

    fn gather(&self, idx: &[u32], x: &mut [f32], y: TargetsMut<'_>) -> Result<()> {
        self.inner.gather(idx, x, y)?;
        let &[c, h, w] = self.inner.input_dims() else {
            return Ok(());
        };
        let row = c * h * w;
        let p = self.aug.crop_padding as i64;
        let mut rng = self.rng.clone();
        let (epoch, n) = (
            self.epoch.load(Ordering::Relaxed) as u128,
            self.inner.len() as u128,
        );
        let mut scratch = Vec::with_capacity(row);
        for (sample, &i) in x.chunks_exact_mut(row).zip(idx) {
            rng.set_word_pos((epoch * n + u128::from(i)) * WORDS_PER_SAMPLE);
            // Offset of the crop within the padded image, relative to the original.
            let shift = if p > 0 {
                let (dy, dx) = (rng.random_range(0..=2 * p), rng.random_range(0..=2 * p));
                ((dy - p) as isize, (dx - p) as isize)
            } else {
                (0, 0)
            };
            let flip = self.aug.flip && rng.random_bool(0.5);
            if shift != (0, 0) || flip {
                transform(sample, &mut scratch, [c, h, w], shift, flip, self.aug.fill);
            }
        }
        Ok(())
    }

    fn source(&self) -> &Path {
        self.inner.source()
    }

    fn set_epoch(&self, epoch: usize) {
        self.epoch.store(epoch, Ordering::Relaxed);
        self.inner.set_epoch(epoch);
    }

    fn shard_ids(&self) -> Option<Vec<u32>> {
        self.inner.shard_ids()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crop_shifts_in_fill_and_flip_mirrors() {
        // One channel, 2x3: 1 2 3 / 4 5 6.
        let base = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut s = Vec::new();
        let mut x = base;
        transform(&mut x, &mut s, [1, 2, 3], (0, 0), true, [0.0; 3]);
        assert_eq!(x, [3.0, 2.0, 1.0, 6.0, 5.0, 4.0]);
        let mut x = base;
        // The crop window moved one pixel right and one down: content moves up-left.
        transform(&mut x, &mut s, [1, 2, 3], (1, 1), false, [-1.0; 3]);
        assert_eq!(x, [5.0, 6.0, -1.0, -1.0, -1.0, -1.0]);
        let mut x = base;
        transform(&mut x, &mut s, [1, 2, 3], (0, -1), false, [9.0; 3]);
        assert_eq!(x, [9.0, 1.0, 2.0, 9.0, 4.0, 5.0]);
    }

    #[test]
    fn augmentation_is_seeded_and_keeps_every_value_or_fill() -> Result<()> {
        let data = crate::dataset::HostData::new(
            (0..2 * 16).map(|v| v as f32 + 1.0).collect(),
            vec![1, 4, 4],
            crate::dataset::Targets::Classes(vec![0, 1]),
            TargetKind::Classes(2),
            "imgs".into(),
        )?;
        let aug = Augment {
            flip: true,
            crop_padding: 1,
            fill: [0.0; 3],
        };
        let run = |seed| -> Result<Vec<f32>> {
            let a = Augmented::new(data.clone(), aug, seed)?;
            let (mut x, mut y) = (vec![0.0; 32], vec![0u32; 2]);
            let mut out = Vec::new();
            for epoch in 0..8 {
                a.set_epoch(epoch);
                a.gather(&[0, 1], &mut x, TargetsMut::Classes(&mut y))?;
                out.extend_from_slice(&x);
                assert_eq!(y, vec![0, 1], "targets untouched");
            }
            Ok(out)
        };
        let (a, b) = (run(1)?, run(1)?);
        assert_eq!(a, b, "same seed, same draws");
        assert_ne!(a, run(2)?);
        // Sample 0 holds 1..=16: every output value is one of them or the fill.
        assert!(a
            .chunks(16)
            .step_by(2)
            .all(|s| s.iter().all(|&v| v == 0.0 || (1.0..=16.0).contains(&v))));
        assert!(a.contains(&0.0), "some crop shifted in padding");
        Ok(())
    }

    #[test]
    fn a_samples_draws_do_not_depend_on_its_batch() -> Result<()> {
        let data = crate::dataset::HostData::new(
            (0..3 * 16).map(|v| v as f32 + 1.0).collect(),
            vec![1, 4, 4],
            crate::dataset::Targets::Classes(vec![0, 1, 2]),
            TargetKind::Classes(3),
            "imgs".into(),
        )?;
        let aug = Augment {
            flip: true,
            crop_padding: 2,
            fill: [0.0; 3],
        };
        let a = Augmented::new(data, aug, 5)?;
        let gather = |idx: &[u32]| -> Result<Vec<f32>> {
            let (mut x, mut y) = (vec![0.0; 16 * idx.len()], vec![0u32; idx.len()]);
            a.gather(idx, &mut x, TargetsMut::Classes(&mut y))?;
            Ok(x)
        };
        a.set_epoch(4);
        let all = gather(&[0, 1, 2])?;
        // Sample 2 alone, or first in another order: the same pixels.
        assert_eq!(gather(&[2])?, all[32..]);
        assert_eq!(gather(&[2, 0])?[..16], all[32..]);
        a.set_epoch(5);
        assert_ne!(gather(&[0, 1, 2])?, all, "a new epoch draws anew");
        Ok(())
    }
}
