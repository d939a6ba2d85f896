//! `OsPages`: a page source over anonymous memory mappings.

use core::ptr::NonNull;

use lock_api::{Mutex, RawMutex};

use super::buddy::Buddy;
use super::{DefaultRawMutex, MAX_NODES, MAX_ORDER, Ownership, PAGE_SIZE, PageRun, PageSource, SourceStats};
use crate::sync::Stat;

/// Pages in one pooled chunk: 4 MiB.
const CHUNK_PAGES: usize = 1024;
const CHUNK_BYTES: usize = CHUNK_PAGES * PAGE_SIZE;
/// Orders served from chunks; one page of each chunk holds its metadata, so
/// the largest block a chunk yields is half of it.
const CHUNK_MAX_ORDER: u32 = 9;
/// Chunks the pool can track: 4 GiB of pooled pages. Beyond that, and for
/// runs above `CHUNK_MAX_ORDER`, runs are mapped directly.
const POOL_ZONES: usize = 1024;
/// Entirely free chunks `trim` keeps mapped.
const SPARE_CHUNKS: usize = 1;
/// Entirely free chunks kept mapped between trims (1 GiB): memory freed in
/// a burst is reused without page faults until `Kmem::reap` or
/// `Kmem::shrink` trims it (jemalloc's and mimalloc's retention, with an
/// explicit trim instead of a decay timer).
const RETAINED_CHUNKS: usize = 256;

/// A page source that maps memory from the OS.
///
/// Small runs (up to 2 MiB) come from a buddy allocator over 4 MiB chunks.
/// Chunks whose pages are all free stay mapped (up to 1 GiB of them) until
/// [`PageSource::trim`] unmaps all but one; `Kmem::reap` and `Kmem::shrink`
/// call it. Larger
/// runs are mapped and unmapped directly. Runs are tagged with the node the
/// caller asked for: the OS places pages on first touch, which is normally
/// the asking CPU's node.
pub struct OsPages<R: RawMutex = DefaultRawMutex> {
    pool: Mutex<R, Buddy<POOL_ZONES>>,
    in_use: Stat,
    mapped: Stat,
}

impl<R: RawMutex> Default for OsPages<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R: RawMutex> OsPages<R> {
    /// A page source with nothing mapped yet.
    pub const fn new() -> Self {
        OsPages { pool: Mutex::const_new(R::INIT, Buddy::new()), in_use: Stat::new(), mapped: Stat::new() }
    }

    /// Maps `len` bytes aligned to `align` (both page multiples), trimming the
    /// excess of an over-sized mapping. Returns the mapping or `None`.
    fn map_aligned(&self, len: usize, align: usize) -> Option<*mut u8> {
        let span = len.checked_add(align - PAGE_SIZE)?;
        // SAFETY: an anonymous private mapping at an address of the kernel's
        // choosing touches no existing memory.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let base = p.cast::<u8>();
        let head = base.addr().next_multiple_of(align) - base.addr();
        let start = base.wrapping_add(head);
        let tail = span - head - len;
        // SAFETY: both trimmed pieces belong to the mapping just made and
        // nothing refers to them.
        unsafe {
            if head != 0 {
                libc::munmap(base.cast(), head);
            }
            if tail != 0 {
                libc::munmap(start.wrapping_add(len).cast(), tail);
            }
        }
        self.mapped.add(len / PAGE_SIZE);
        Some(start)
    }

    /// Unmaps `len` bytes at `addr`.
    ///
    /// # Safety
    ///
    /// The range must be mapped by this source and unused.
    unsafe fn unmap(&self, addr: *mut u8, len: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { libc::munmap(addr.cast(), len) };
        self.mapped.sub(len / PAGE_SIZE);
    }

    /// A run from the chunk pool, mapping a new chunk when the pool is dry.
    fn alloc_pooled(&self, order: u32) -> Option<*mut u8> {
        if let Some(a) = self.pool.lock().alloc(order) {
            return Some(a);
        }
        // Map outside the lock: a syscall is not a slab-list update.
        let chunk = self.map_aligned(CHUNK_BYTES, CHUNK_BYTES)?;
        let mut pool = self.pool.lock();
        if pool.has_room() {
            // SAFETY: the chunk was just mapped and is ours alone.
            if unsafe { pool.add_zone(chunk, CHUNK_BYTES, true) }.is_ok() {
                return pool.alloc(order);
            }
        }
        drop(pool);
        // SAFETY: the chunk is unused.
        unsafe { self.unmap(chunk, CHUNK_BYTES) };
        None
    }
}

// SAFETY: (1) pooled runs come from a buddy over chunks we mapped, direct runs
// from fresh aligned mappings, so runs are aligned, writable and disjoint;
// (2) nodes are clamped below MAX_NODES; (3) the buddy accepts aligned pieces
// of live blocks and munmap accepts any page-aligned piece of a mapping;
// (4) only the pool lock and mmap/munmap are used: no allocation, no
// callback, no panic outside debug assertions; (5) the pool is behind a lock
// and the counters are atomics; (6) `claim_pages` takes only pages the
// pool's buddy lists as free (never part of a direct mapping).
unsafe impl<R: RawMutex + Sync> PageSource for OsPages<R> {
    fn alloc_pages(&self, order: u32, node: usize) -> Option<PageRun> {
        if order >= MAX_ORDER {
            return None;
        }
        let addr = if order <= CHUNK_MAX_ORDER { self.alloc_pooled(order) } else { None };
        let addr = match addr {
            Some(a) => a,
            None => {
                let len = PAGE_SIZE.checked_shl(order)?;
                self.map_aligned(len, len)?
            }
        };
        self.in_use.add(1 << order);
        Some(PageRun {
            // SAFETY: mmap and the buddy never return address 0.
            addr: unsafe { NonNull::new_unchecked(addr) },
            order,
            node: node.min(MAX_NODES - 1),
        })
    }

    unsafe fn free_pages(&self, addr: NonNull<u8>, order: u32) {
        // SAFETY: forwarded.
        unsafe { self.free_pages_bulk(&[addr], order) }
    }

    unsafe fn free_pages_bulk(&self, runs: &[NonNull<u8>], order: u32) {
        // Islands to unmap after the lock: at most one per run.
        const BATCH: usize = 8;
        for chunk in runs.chunks(BATCH) {
            self.in_use.sub(chunk.len() << order);
            let mut unmap = [(core::ptr::null_mut::<u8>(), 0usize); BATCH];
            let mut n = 0;
            {
                let mut pool = self.pool.lock();
                for &r in chunk {
                    let a = r.as_ptr();
                    // SAFETY: forwarded from the caller.
                    let release = if unsafe { pool.free(a, order) } {
                        if pool.empty_islands() > RETAINED_CHUNKS { pool.remove_empty_island(a.addr()) } else { None }
                    } else {
                        // Not pooled: (a piece of) a direct mapping.
                        Some((a, PAGE_SIZE << order))
                    };
                    if let Some(u) = release {
                        unmap[n] = u;
                        n += 1;
                    }
                }
            }
            for &(raw, len) in &unmap[..n] {
                // SAFETY: an unlinked, entirely free island, or a direct
                // mapping the caller gave back.
                unsafe { self.unmap(raw, len) };
            }
        }
    }

    fn claim_pages(&self, at: NonNull<u8>, pages: usize) -> bool {
        let taken = self.pool.lock().claim(at.as_ptr(), pages);
        if taken {
            self.in_use.add(pages);
        }
        taken
    }

    fn ownership(&self, addr: usize) -> Ownership {
        if self.pool.lock().contains_raw(addr) { Ownership::Owned } else { Ownership::Unknown }
    }

    fn stats(&self) -> SourceStats {
        SourceStats { pages_in_use: self.in_use.get(), pages_reserved: self.mapped.get() }
    }

    fn trim(&self) -> usize {
        let mut pages = 0;
        loop {
            let mut pool = self.pool.lock();
            if pool.empty_islands() <= SPARE_CHUNKS {
                return pages;
            }
            let Some((raw, len)) = pool.take_empty_island() else { return pages };
            drop(pool);
            // SAFETY: the island was entirely free and is now unlinked.
            unsafe { self.unmap(raw, len) };
            pages += len / PAGE_SIZE;
        }
    }
}
