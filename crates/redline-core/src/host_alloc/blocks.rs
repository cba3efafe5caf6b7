//! [`HostAlloc`]: large blocks from their own mappings, kept for reuse.
//!
//! A block of [`BIG`] bytes or more is mapped on its own, 2 MiB aligned
//! and advised to use transparent huge pages (one fault per 2 MiB instead
//! of one per 4 KiB). When it is freed it goes to a small cache instead of
//! back to the kernel, and the next allocation of the same mapped size
//! takes it: a training step allocates the same sizes every step. The
//! cache holds at most half of the machine's memory; past that, the
//! oldest cached blocks are unmapped. Everything smaller goes to the
//! system allocator. On other systems than Linux everything does.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Blocks of this many bytes or more get their own mapping.
pub const BIG: usize = 4 << 20;
/// Mappings are whole huge pages.
const HUGE: usize = 2 << 20;
/// Freed blocks the cache can hold: a bf16-true ResNet-18 step at batch
/// 32, 224 px frees more than 64 (a cache that small evicted every block
/// before its next use, and faulted 15% of the step back in).
const SLOTS: usize = 1024;

/// The binaries' global allocator (see the module docs).
pub struct HostAlloc;

/// Whether freed blocks are cached (`REDLINE_HOST_ALLOC=system`: no).
static KEEP: AtomicBool = AtomicBool::new(true);
/// The cache's limit in bytes (0: not yet read from the machine).
static LIMIT: AtomicUsize = AtomicUsize::new(0);
static CACHE: Mutex<Cache> = Mutex::new(Cache::new());

/// Sets whether freed blocks are kept for reuse (blocks already kept stay).
pub(super) fn keep_freed_blocks(keep: bool) {
    KEEP.store(keep, Ordering::Relaxed);
}

/// Unmaps every cached block (the CPU's `empty_cache`, and before a peak
/// is measured from scratch); returns the bytes given back.
pub fn release_cached() -> usize {
    let mut all = [(0, 0); SLOTS];
    let n = {
        let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let n = c.n;
        all[..n].copy_from_slice(&c.blocks[..n]);
        c.n = 0;
        c.bytes = 0;
        n
    };
    #[cfg(target_os = "linux")]
    for b in &all[..n] {
        os::unmap(*b);
    }
    all[..n].iter().map(|b| b.1).sum()
}

/// Freed blocks `(address, mapped length)`, oldest first.
struct Cache {
    blocks: [(usize, usize); SLOTS],
    n: usize,
    bytes: usize,
}

impl Cache {
    const fn new() -> Self {
        Self {
            blocks: [(0, 0); SLOTS],
            n: 0,
            bytes: 0,
        }
    }

    /// A cached block of exactly `len` mapped bytes, taken out.
    fn take(&mut self, len: usize) -> Option<usize> {
        let i = self.blocks[..self.n].iter().position(|b| b.1 == len)?;
        let (addr, _) = self.blocks[i];
        self.blocks.copy_within(i + 1..self.n, i);
        self.n -= 1;
        self.bytes -= len;
        Some(addr)
    }

    /// Keeps block `(addr, len)` within `limit` bytes in all, making room
    /// by dropping the oldest; what must be unmapped is written to
    /// `victims` (the new block itself when it cannot fit), and their count
    /// returned.
    fn put(
        &mut self,
        block: (usize, usize),
        limit: usize,
        victims: &mut [(usize, usize)],
    ) -> usize {
        if block.1 > limit {
            victims[0] = block;
            return 1;
        }
        let mut out = 0;
        while self.n > 0 && (self.n == SLOTS || self.bytes + block.1 > limit) && out < victims.len()
        {
            victims[out] = self.blocks[0];
            self.bytes -= self.blocks[0].1;
            self.blocks.copy_within(1..self.n, 0);
            self.n -= 1;
            out += 1;
        }
        if self.n == SLOTS || self.bytes + block.1 > limit {
            victims[out] = block;
            return out + 1;
        }
        self.blocks[self.n] = block;
        self.n += 1;
        self.bytes += block.1;
        out
    }
}

/// The mapped length of a block of `size` bytes: whole huge pages.
fn mapped_len(size: usize) -> Option<usize> {
    size.checked_next_multiple_of(HUGE)
}

/// Whether `layout` is served by a mapping of its own.
fn is_big(layout: Layout) -> bool {
    layout.size() >= BIG && layout.align() <= HUGE
}

#[cfg(target_os = "linux")]
mod os {
    use super::HUGE;

    /// A fresh zeroed mapping of `len` bytes (a multiple of `HUGE`),
    /// `HUGE`-aligned and advised to use huge pages; null when the kernel
    /// refuses.
    pub(super) fn map(len: usize) -> *mut u8 {
        let Some(over) = len.checked_add(HUGE) else {
            return std::ptr::null_mut();
        };
        // SAFETY: an anonymous private mapping of `over` bytes; the parts
        // before and after the aligned `len` bytes are unmapped again, and
        // nothing else refers to them.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return std::ptr::null_mut();
            }
            let start = p as usize;
            let aligned = start.next_multiple_of(HUGE);
            if aligned > start {
                libc::munmap(p, aligned - start);
            }
            let tail = aligned + len;
            if start + over > tail {
                libc::munmap(tail as *mut libc::c_void, start + over - tail);
            }
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            aligned as *mut u8
        }
    }

    /// Unmaps `(address, len)`, a block of [`map`].
    pub(super) fn unmap((addr, len): (usize, usize)) {
        // SAFETY: the block was mapped by `map` with this length and no
        // longer has an owner.
        unsafe {
            libc::munmap(addr as *mut libc::c_void, len);
        }
    }

    /// Physical memory in bytes (0 when unknown).
    pub(super) fn memory() -> usize {
        // SAFETY: sysconf only reads system parameters.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        usize::try_from(pages)
            .unwrap_or(0)
            .saturating_mul(usize::try_from(size).unwrap_or(0))
    }
}

#[cfg(target_os = "linux")]
impl HostAlloc {
    /// The cache's limit: half of physical memory.
    fn limit() -> usize {
        match LIMIT.load(Ordering::Relaxed) {
            0 => {
                let l = (os::memory() / 2).max(1);
                LIMIT.store(l, Ordering::Relaxed);
                l
            }
            l => l,
        }
    }

    /// A big block: cached (its old contents; `false`) or fresh (zeroed;
    /// `true`). Null when the kernel refuses.
    fn big(layout: Layout) -> (*mut u8, bool) {
        let Some(len) = mapped_len(layout.size()) else {
            return (std::ptr::null_mut(), true);
        };
        let cached = CACHE.lock().unwrap_or_else(|e| e.into_inner()).take(len);
        match cached {
            Some(addr) => (addr as *mut u8, false),
            None => (os::map(len), true),
        }
    }
}

#[cfg(target_os = "linux")]
// SAFETY: big blocks are whole mappings owned by one allocation at a time
// (taken out of the cache under its lock), aligned to 2 MiB (at least the
// layout's alignment, checked by `is_big`) and at least `size` bytes long;
// the rest is `System`'s. `dealloc` tells the two apart by the layout the
// block was allocated with, as `GlobalAlloc` guarantees it is given.
unsafe impl GlobalAlloc for HostAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_big(layout) {
            return Self::big(layout).0;
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_big(layout) {
            let (p, fresh) = Self::big(layout);
            if !fresh && !p.is_null() {
                // SAFETY: a cached block of at least `size` bytes, owned now.
                unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
            }
            return p;
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !is_big(layout) {
            // SAFETY: a `System` block (small layouts never come from a
            // mapping), with the caller's guarantees.
            return unsafe { System.dealloc(ptr, layout) };
        }
        let Some(len) = mapped_len(layout.size()) else {
            return;
        };
        let block = (ptr as usize, len);
        if !KEEP.load(Ordering::Relaxed) {
            return os::unmap(block);
        }
        let mut victims = [(0, 0); SLOTS + 1];
        let n =
            CACHE
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .put(block, Self::limit(), &mut victims);
        for v in &victims[..n] {
            os::unmap(*v);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if !is_big(layout) && !is_big(new) {
            // SAFETY: both `System` blocks; forwarded.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: a new block, the old one's bytes copied (the shorter of
        // the two lengths), then the old one freed by its own layout.
        unsafe {
            let p = self.alloc(new);
            if !p.is_null() {
                std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            p
        }
    }
}

#[cfg(not(target_os = "linux"))]
// SAFETY: every call forwarded to `System` with the caller's guarantees.
unsafe impl GlobalAlloc for HostAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    #[test]
    fn the_cache_takes_exact_sizes_and_drops_the_oldest_past_its_limit() {
        let mut c = Cache::new();
        let mut v = [(0, 0); SLOTS + 1];
        assert_eq!(c.put((1, 4 * MB), 10 * MB, &mut v), 0);
        assert_eq!(c.put((2, 6 * MB), 10 * MB, &mut v), 0);
        assert_eq!(c.take(8 * MB), None, "only exact sizes are reused");
        // A third block over the limit pushes out the oldest.
        assert_eq!(c.put((3, 4 * MB), 10 * MB, &mut v), 1);
        assert_eq!(v[0], (1, 4 * MB));
        assert_eq!(c.bytes, 10 * MB);
        assert_eq!(c.take(4 * MB), Some(3));
        assert_eq!(c.take(4 * MB), None);
        assert_eq!(c.take(6 * MB), Some(2));
        assert_eq!((c.n, c.bytes), (0, 0));
        // A block bigger than the limit is never kept.
        assert_eq!(c.put((4, 12 * MB), 10 * MB, &mut v), 1);
        assert_eq!(v[0], (4, 12 * MB));
        // Every slot full: the oldest goes.
        for i in 0..SLOTS {
            assert_eq!(c.put((10 + i, 2 * MB), usize::MAX, &mut v), 0);
        }
        assert_eq!(c.put((99, 2 * MB), usize::MAX, &mut v), 1);
        assert_eq!(v[0], (10, 2 * MB));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn big_blocks_are_aligned_reused_and_zeroed_on_request() {
        let a = HostAlloc;
        // An odd size, so that no other test's block shares the mapped length.
        let layout = Layout::from_size_align(BIG + 12_345, 64).unwrap();
        // SAFETY: blocks of `layout`, written within it, freed once each.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            assert_eq!(p as usize % HUGE, 0);
            std::ptr::write_bytes(p, 7, layout.size());
            a.dealloc(p, layout);
            let q = a.alloc_zeroed(layout);
            assert_eq!(q, p, "the freed block is reused");
            // Released blocks are unmapped, not reused.
            a.dealloc(q, layout);
            assert!(release_cached() >= mapped_len(layout.size()).unwrap());
            let q = a.alloc_zeroed(layout);
            let s = std::slice::from_raw_parts(q, layout.size());
            assert!(
                s.iter().all(|&b| b == 0),
                "a reused block zeroed for alloc_zeroed"
            );
            // Growing a big block keeps its bytes.
            *q.add(100) = 42;
            let r = a.realloc(q, layout, 2 * BIG);
            assert_eq!(*r.add(100), 42);
            a.dealloc(r, Layout::from_size_align(2 * BIG, 64).unwrap());
            // Small blocks are the system's.
            let small = Layout::from_size_align(1000, 8).unwrap();
            let s = a.alloc(small);
            assert!(!s.is_null());
            let s2 = a.realloc(s, small, BIG + 12_345);
            a.dealloc(s2, Layout::from_size_align(BIG + 12_345, 8).unwrap());
        }
    }
}
