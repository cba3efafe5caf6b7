//! An optimizer update split over the compute threads. Each element's update
//! reads and writes only that element (its parameter, gradient and state),
//! so the chunks are independent and the result is the same bits on any
//! thread count. The updates ran on the calling thread alone; a large
//! parameter's (the CNN's fc1, 401K weights) now takes every compute thread
//! ([`CHUNK_MIN`] says where the split pays).

use crate::gemm::threads;

/// Elements each thread takes at least; an update with fewer than twice as
/// many stays on the calling thread. Measured on the 2-core VM at 2
/// threads: the CNN's fc1 (401K weights) in two chunks took its bf16 Adam
/// step from 0.70 to 0.40 ms; the MLP's fc1 (100K) in two chunks of 16K or
/// more made the step slower (0.16 to 0.19 ms, and the loader's wait rose
/// from 3.7% to 6.9% of the step): a step that short shares its cores with
/// the loader's thread, which the split pushes aside.
pub(crate) const CHUNK_MIN: usize = 64 * 1024;

/// The chunk length that splits an update of `n` elements over `threads`
/// threads, each taking at least [`CHUNK_MIN`] (a multiple of 64, so that
/// chunks start on cache lines of every element type); `n` or more means
/// one chunk.
pub(crate) fn chunk_len(n: usize, threads: usize) -> usize {
    let parts = threads.min(n / CHUNK_MIN).max(1);
    n.div_ceil(parts).next_multiple_of(64).max(1)
}

/// Runs `f` on matching chunks of an update's parameter `p`, gradient `g`
/// and two state slices `a`, `b`, over the compute threads
/// ([`chunk_len`]). `g` is as long as `p`; a state slice is as long as `p`
/// or empty (no such state), and then each chunk gets it empty.
pub(crate) fn for_chunks<P, G, S, F>(p: &mut [P], g: &[G], a: &mut [S], b: &mut [S], f: F)
where
    P: Send,
    G: Sync,
    S: Send,
    F: Fn(&mut [P], &[G], &mut [S], &mut [S]) + Sync,
{
    let len = chunk_len(p.len(), threads());
    if len >= p.len() {
        return f(p, g, a, b);
    }
    let f = &f;
    rayon::scope(|s| {
        let (mut p, mut g, mut a, mut b) = (p, g, a, b);
        while !p.is_empty() {
            let k = len.min(p.len());
            let (p0, rest) = p.split_at_mut(k);
            p = rest;
            let (g0, rest) = g.split_at(k.min(g.len()));
            g = rest;
            let (a0, rest) = a.split_at_mut(k.min(a.len()));
            a = rest;
            let (b0, rest) = b.split_at_mut(k.min(b.len()));
            b = rest;
            s.spawn(move |_| f(p0, g0, a0, b0));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_update_once_each() {
        // Small updates stay whole; large ones split into at most `threads`
        // chunks of at least CHUNK_MIN.
        assert!(chunk_len(1000, 8) >= 1000);
        assert!(chunk_len(2 * CHUNK_MIN - 1, 8) >= 2 * CHUNK_MIN - 1);
        assert!(chunk_len(100_000, 1) >= 100_000);
        assert!(chunk_len(100_000, 2) >= 100_000);
        assert_eq!(chunk_len(401_408, 2), 200_704);
        assert_eq!(chunk_len(401_408, 64), 66_944);
        assert_eq!(chunk_len(0, 4), 1);

        let _t = redline_core::threads::scoped(3);
        let n = 3 * CHUNK_MIN + 5;
        let mut p = vec![0u32; n];
        let g: Vec<u32> = (0..n as u32).collect();
        let mut a = vec![0u32; n];
        for_chunks(&mut p, &g, &mut a, &mut [], |p, g, a, b| {
            assert!(b.is_empty());
            assert_eq!((p.len(), a.len()), (g.len(), g.len()));
            for ((p, g), a) in p.iter_mut().zip(g).zip(a.iter_mut()) {
                *p += g + 1;
                *a += 1;
            }
        });
        assert!(p.iter().enumerate().all(|(i, &x)| x == i as u32 + 1));
        assert!(a.iter().all(|&x| x == 1));
    }
}
