//! WebDataset's sample order for tar shards: each epoch the shards in a
//! seeded random order, each shard's members in the order they are stored,
//! through a shuffle buffer of a bounded size (`webdataset.shuffle(N)`).
//! Reads then go through each shard front to back, a buffer's width apart,
//! which suits storage where random reads are slow; the order is a
//! function of the seed, the epoch and the listing alone, so a resumed run
//! draws the same order as one never stopped.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The order of samples `0..groups.len()` (split indices, in storage
/// order; `groups[i]` is sample `i`'s shard) for one epoch: shards
/// shuffled by `rng`, then a shuffle buffer of `buffer` samples (at least
/// 1). The buffer fills, then each new sample takes the place of one drawn
/// at random, which goes out; the last buffer's worth goes out in random
/// order.
pub(crate) fn order(groups: &[u32], buffer: usize, rng: &mut ChaCha8Rng) -> Vec<u32> {
    // Each shard's samples, in the order shards first appear.
    let mut shards: Vec<(u32, Vec<u32>)> = Vec::new();
    for (i, &g) in groups.iter().enumerate() {
        match shards.iter_mut().rev().find(|(s, _)| *s == g) {
            Some((_, members)) => members.push(i as u32),
            None => shards.push((g, vec![i as u32])),
        }
    }
    shards.shuffle(rng);
    let cap = buffer.max(1);
    let mut buf: Vec<u32> = Vec::with_capacity(cap);
    let mut out = Vec::with_capacity(groups.len());
    for i in shards.into_iter().flat_map(|(_, m)| m) {
        if buf.len() < cap {
            buf.push(i);
            continue;
        }
        let k = rng.random_range(0..cap);
        out.push(std::mem::replace(&mut buf[k], i));
    }
    buf.shuffle(rng);
    out.extend(buf);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use rand::SeedableRng;

    /// 6 shards of 50 samples, stored shard by shard.
    fn groups() -> Vec<u32> {
        (0..300).map(|i| i / 50).collect()
    }

    #[test]
    fn every_sample_once_shards_shuffled_and_the_buffer_bounds_the_spread() {
        let g = groups();
        let o = order(&g, 10, &mut ChaCha8Rng::seed_from_u64(3));
        let mut sorted = o.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..300).collect::<Vec<u32>>());
        // Shards come in another order than stored.
        let firsts: Vec<u32> = o.iter().step_by(50).map(|&i| g[i as usize]).collect();
        assert_ne!(firsts, [0, 1, 2, 3, 4, 5]);
        // No sample comes out before it is read into the buffer: its place
        // in the output is at least its place in the shard stream less the
        // buffer.
        let mut stream_pos = vec![0usize; 300];
        let mut pos = 0;
        let mut seen = Vec::new();
        for &i in &o {
            let s = g[i as usize];
            if !seen.contains(&s) {
                seen.push(s);
            }
        }
        for s in &seen {
            for i in 0..300u32 {
                if g[i as usize] == *s {
                    stream_pos[i as usize] = pos;
                    pos += 1;
                }
            }
        }
        for (out_pos, &i) in o.iter().enumerate() {
            assert!(
                out_pos + 10 >= stream_pos[i as usize],
                "{i} left before it was read"
            );
        }
        // A buffer of 1 is the shard stream itself; a buffer of the whole
        // set mixes across shards.
        let one = order(&g, 1, &mut ChaCha8Rng::seed_from_u64(3));
        assert!(
            one.windows(2)
                .filter(|w| g[w[0] as usize] != g[w[1] as usize])
                .count()
                == 5
        );
        let all = order(&g, 300, &mut ChaCha8Rng::seed_from_u64(3));
        assert!(
            all.windows(2)
                .filter(|w| g[w[0] as usize] != g[w[1] as usize])
                .count()
                > 100
        );
    }

    #[test]
    fn the_order_follows_the_seed() {
        let g = groups();
        let a = order(&g, 16, &mut ChaCha8Rng::seed_from_u64(1));
        assert_eq!(a, order(&g, 16, &mut ChaCha8Rng::seed_from_u64(1)));
        assert_ne!(a, order(&g, 16, &mut ChaCha8Rng::seed_from_u64(2)));
    }
}
