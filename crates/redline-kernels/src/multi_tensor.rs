//! Packing a model's tensors into the launches of one multi-tensor kernel
//! (the optimizer update of every parameter in one launch, as `apex`'s and
//! PyTorch's `_foreach`/fused optimizers do).
//!
//! A launch takes up to [`MAX_TENSORS`] tensors by value in its argument
//! struct (their device addresses and lengths), and splits each into chunks
//! of [`CHUNK`] elements, one thread block per chunk. `chunk_start[i]` is the
//! first block of tensor `i`; block `b` works on the tensor `i` with
//! `chunk_start[i] <= b < chunk_start[i + 1]`. [`block_range`] is the
//! kernel's own lookup (`cuda/optim.cu`), so the CPU tests here check the
//! mapping the GPU runs.

use crate::error::{Error, Result};

/// Tensors per launch: what the kernel's argument struct holds.
pub const MAX_TENSORS: usize = 32;
/// Elements per thread block (256 threads, 4 elements each). The update is
/// latency-bound at these sizes (two IEEE divisions and a square root per
/// element, in a dependent chain): with 4096 the MLP's 101,770 parameters
/// took 28 blocks of an H100's 132 SMs, 9.8 us an update, and the CNN's
/// 22.5 us (`bench/results/h100-2026-11-26/call3`); with 1024, 102 blocks.
pub const CHUNK: usize = 1024;
/// Threads per block.
pub const BLOCK_THREADS: u32 = 256;
/// Most blocks in one launch's grid (CUDA's x-dimension limit).
const MAX_BLOCKS: u64 = (1 << 31) - 1;

/// One launch of a multi-tensor kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// Indices into the caller's tensor list, in order.
    pub tensors: Vec<usize>,
    /// First block of each tensor, then the total: `tensors.len() + 1` entries.
    pub chunk_start: Vec<u32>,
}

impl Launch {
    /// Thread blocks in the launch's grid.
    pub fn blocks(&self) -> u32 {
        self.chunk_start.last().copied().unwrap_or(0)
    }
}

/// Splits tensors of `sizes` elements into launches of at most
/// `max_tensors` tensors, each tensor in chunks of `chunk` elements. Empty
/// tensors get no blocks and are left out.
pub fn pack(sizes: &[usize], chunk: usize, max_tensors: usize) -> Result<Vec<Launch>> {
    if chunk == 0 || max_tensors == 0 {
        return Err(Error::Shape(format!(
            "multi-tensor packing needs a chunk and a tensor count above 0, got {chunk} and \
             {max_tensors}"
        )));
    }
    let mut launches = Vec::new();
    let mut cur = Launch {
        tensors: Vec::new(),
        chunk_start: vec![0],
    };
    for (i, &n) in sizes.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let chunks = n.div_ceil(chunk) as u64;
        if chunks > MAX_BLOCKS {
            return Err(Error::Shape(format!(
                "tensor {i} has {n} elements: {chunks} chunks of {chunk} exceed one launch's \
                 {MAX_BLOCKS} blocks"
            )));
        }
        let total = u64::from(cur.blocks()) + chunks;
        if cur.tensors.len() == max_tensors || total > MAX_BLOCKS {
            launches.push(std::mem::replace(
                &mut cur,
                Launch {
                    tensors: Vec::new(),
                    chunk_start: vec![0],
                },
            ));
        }
        let start = u64::from(cur.blocks()) + chunks;
        cur.tensors.push(i);
        cur.chunk_start.push(start as u32);
    }
    if !cur.tensors.is_empty() {
        launches.push(cur);
    }
    Ok(launches)
}

/// What block `block` of `launch` updates: `(slot, first, end)`, the slot
/// into `launch.tensors` and the element range `first..end` of that tensor
/// (`sizes` indexed like the caller's list). The scan is the kernel's.
pub fn block_range(
    launch: &Launch,
    sizes: &[usize],
    chunk: usize,
    block: u32,
) -> (usize, usize, usize) {
    let count = launch.tensors.len();
    let mut s = 0;
    while s + 1 < count && launch.chunk_start[s + 1] <= block {
        s += 1;
    }
    let first = (block - launch.chunk_start[s]) as usize * chunk;
    let n = sizes[launch.tensors[s]];
    (s, first, (first + chunk).min(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of every tensor is visited by exactly one block, once.
    fn check_cover(sizes: &[usize], chunk: usize, max: usize) -> Vec<Launch> {
        let launches = pack(sizes, chunk, max).unwrap_or_else(|e| panic!("{e}"));
        let mut seen: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
        for l in &launches {
            assert!(l.tensors.len() <= max && !l.tensors.is_empty());
            assert_eq!(l.chunk_start.len(), l.tensors.len() + 1);
            for b in 0..l.blocks() {
                let (s, first, end) = block_range(l, sizes, chunk, b);
                assert!(first < end, "block {b} has no work");
                for e in &mut seen[l.tensors[s]][first..end] {
                    *e += 1;
                }
            }
        }
        for (i, s) in seen.iter().enumerate() {
            assert!(
                s.iter().all(|&c| c == 1),
                "tensor {i} not covered exactly once"
            );
        }
        launches
    }

    #[test]
    fn the_mlp_is_one_launch() {
        // 784-128-10: fc1.weight, fc1.bias, fc2.weight, fc2.bias.
        let sizes = [100_352, 128, 1280, 10];
        let l = check_cover(&sizes, CHUNK, MAX_TENSORS);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].chunk_start, vec![0, 98, 99, 101, 102]);
        assert_eq!(l[0].blocks(), 102);
    }

    #[test]
    fn many_tensors_split_into_launches_and_empty_ones_are_skipped() {
        let sizes: Vec<usize> = (0..70)
            .map(|i| if i % 9 == 4 { 0 } else { 1 + i * 37 })
            .collect();
        let l = check_cover(&sizes, 64, 8);
        let nonempty = sizes.iter().filter(|&&n| n > 0).count();
        assert_eq!(l.iter().map(|l| l.tensors.len()).sum::<usize>(), nonempty);
        assert_eq!(l.len(), nonempty.div_ceil(8));
        assert!(l.iter().flat_map(|l| &l.tensors).all(|&i| sizes[i] > 0));
    }

    #[test]
    fn odd_sizes_and_tiny_chunks() {
        check_cover(&[1, 2, 3, 1025, 1024, 1023, 4097], CHUNK, MAX_TENSORS);
        check_cover(&[5, 1, 9], 1, 2);
        assert!(pack(&[], CHUNK, MAX_TENSORS).unwrap_or_default().is_empty());
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(pack(&[3], 0, 4).is_err());
        assert!(pack(&[3], 4, 0).is_err());
        let huge = pack(&[usize::MAX / 2], 1, 4).err().map(|e| e.to_string());
        assert!(huge.is_some_and(|e| e.contains("exceed one launch")));
    }
}
