//! `OsPages`: a page source over anonymous memory mappings.
//!
//! # Where runs come from
//!
//! Runs of up to 2 MiB come from a buddy allocator over 4 MiB *chunks*,
//! each one mapping aligned to its size; the pool holds at most
//! `max_chunks` of them (1,024, 4 GiB, unless built with
//! [`OsPages::with_max_chunks`]). Larger runs, and every run once the pool
//! is full and has no free block, are mapped directly, aligned to their
//! size, and unmapped piece by piece as they are freed (the tail of an
//! exact run goes back at once).
//!
//! # Nodes
//!
//! Each pooled chunk belongs to the node it was first mapped for: the
//! buddy keeps one set of free lists per node (`Buddy<_, MAX_NODES>`), so
//! a run asked for node `n` comes from node `n`'s chunks, and a chunk
//! mapped for `n` (and a direct run) is bound to `n` with
//! `mbind(MPOL_PREFERRED)` before anything touches it. On a host with one
//! node, or a kernel without NUMA, the bind is skipped (the node count is
//! asked once); a failed bind is ignored, and the pages then go where
//! first touched. A program on one node asks for node 0 only, and pays
//! for the other nodes' list heads (28 words each) and nothing else.
//! Trade-off: an entirely free chunk stays its node's until a trim unmaps
//! it (up to `RETAINED_CHUNKS` of them across nodes), so one node's
//! retained chunks do not serve another's runs; once the pool holds
//! `max_chunks`, a node without a free block of its own maps its runs
//! directly, as any run above a chunk is.
//!
//! # Ownership map
//!
//! [`PageSource::ownership`] runs on every checked free (debug builds and
//! feature `hardened`), so it must be cheap, lock-free, and right for every
//! page handed out, pooled or direct. A [`PageMap`] keeps one bit per page
//! of the user address space (48 bits): set iff the page lies in a mapping
//! this source made and still holds (a pooled chunk, metadata page
//! included, or a live piece of a direct mapping). It is a two-level radix
//! table: a fixed array of 4,096 leaf pointers, one per 64 GiB of
//! addresses, each leaf a 2 MiB bitmap mapped on first use and unmapped
//! only when the source is dropped (the table adds 32 KiB to `OsPages`; a
//! leaf costs resident memory only where bits were set, 32 KiB per GiB
//! mapped). A lookup is two dependent loads; a page's bit is set
//! (`Release`) after its mapping is made and before any run in it is
//! handed out, and cleared before the page is unmapped. Bits are per page,
//! not per chunk, because direct runs made once the pool is full can be as
//! small as a page and share a chunk-sized granule with mappings that are
//! not ours, and because the freed tail of a direct run is no longer ours.
//!
//! # Loom
//!
//! Under `--cfg loom` the page map is a model build with the same API
//! (`page_map_model`: loom atomics cannot live in mapped memory, and loom
//! could not run 4,096 of them per execution), the pool tracks at most 4
//! chunks, and dropping an `OsPages` unmaps every page it still holds: a
//! loom model builds and drops its allocator in every execution, which
//! would otherwise leave a mapping behind each time. (Outside loom an
//! `OsPages` keeps its mappings when dropped: a thread's current-group
//! token may still point into them.)
//!
//! # Miri
//!
//! Miri supports `mmap` only with `MAP_PRIVATE | MAP_ANONYMOUS` and
//! `munmap` only of whole mappings, so under `cfg(miri)` mappings are made
//! without `MAP_NORESERVE`, over-sized ones are not trimmed, and pieces of
//! mappings are never unmapped (the page map is still cleared, so
//! ownership answers as in a real run; Miri runs ignore leaks). Leaves are
//! whole mappings and are unmapped as usual. Every pointer is derived from
//! a mapping with `wrapping_add`/`with_addr` (strict provenance).

use core::ptr::NonNull;

use lock_api::{Mutex, RawMutex};

use super::buddy::Buddy;
use super::{DefaultRawMutex, MAX_NODES, MAX_ORDER, Ownership, PAGE_SIZE, PageRun, PageSource, SourceStats};
use crate::sync::{Stat, loom_const_fn};

#[cfg(not(loom))]
mod page_map;
#[cfg(loom)]
mod page_map_model;
#[cfg(not(loom))]
pub(super) use page_map::PageMap;
#[cfg(loom)]
use page_map_model::PageMap;

/// Pages in one pooled chunk: 4 MiB.
const CHUNK_PAGES: usize = 1024;
const CHUNK_BYTES: usize = CHUNK_PAGES * PAGE_SIZE;
/// Orders served from chunks; one page of each chunk holds its metadata, so
/// the largest block a chunk yields is half of it.
const CHUNK_MAX_ORDER: u32 = 9;
/// Chunks the pool can track: 4 GiB of pooled pages (16 MiB under loom).
/// Beyond that, and for runs above `CHUNK_MAX_ORDER`, runs are mapped
/// directly.
const POOL_ZONES: usize = if cfg!(loom) { 4 } else { 1024 };
/// Entirely free chunks `trim` keeps mapped.
const SPARE_CHUNKS: usize = 1;
/// Entirely free chunks kept mapped between trims (1 GiB): memory freed in
/// a burst is reused without page faults until `Kmem::reap` or
/// `Kmem::shrink` trims it (jemalloc's and mimalloc's retention, with an
/// explicit trim instead of a decay timer).
const RETAINED_CHUNKS: usize = 256;

/// `mmap` flags of every mapping. `MAP_NORESERVE`: pooled chunks are mostly
/// untouched, so they should not count against a strict overcommit limit
/// (Miri supports only the two basic flags).
#[cfg(not(miri))]
const MAP_FLAGS: libc::c_int = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
/// `mmap` flags of every mapping (Miri supports only these two).
#[cfg(miri)]
const MAP_FLAGS: libc::c_int = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;

/// A page source that maps memory from the OS.
///
/// Small runs (up to 2 MiB) come from a buddy allocator over 4 MiB chunks.
/// Chunks whose pages are all free stay mapped (up to 1 GiB of them) until
/// [`PageSource::trim`] unmaps all but one; `Kmem::reap` and `Kmem::shrink`
/// call it. Larger runs, and small ones once the pool holds its maximum of
/// chunks ([`OsPages::with_max_chunks`]) and has no free block, are mapped
/// and unmapped directly. Runs are tagged with the node the caller asked
/// for, and pooled runs for a node come from chunks mapped for it and
/// bound to it (`mbind`, where the host has several nodes; see the
/// module's *Nodes*).
///
/// [`PageSource::ownership`] is exact to the page, takes no lock and costs
/// two loads (see the module's *Ownership map*).
pub struct OsPages<R: RawMutex = DefaultRawMutex> {
    pool: Mutex<R, Pool>,
    /// The most chunks `pool` may hold (at most `POOL_ZONES`); fixed.
    max_chunks: usize,
    /// Every page of every mapping this source holds.
    owned: PageMap,
    in_use: Stat,
    mapped: Stat,
    /// Under Miri: every mapping made, for `PageSource::rebase` (Miri
    /// never unmaps a piece, so the list only grows).
    #[cfg(miri)]
    maps: Mutex<R, Mappings>,
}

/// The mappings an `OsPages` made (Miri builds only): base pointers, with
/// the provenance of `mmap`, and lengths.
#[cfg(miri)]
struct Mappings {
    list: [(*mut u8, usize); 1024],
    len: usize,
}

// SAFETY: the pointers are only re-addressed, under the lock around this.
#[cfg(miri)]
unsafe impl Send for Mappings {}

/// The chunk pool, behind the pool lock.
struct Pool {
    /// Chunks of every node, each on its node's lists (see *Nodes*).
    buddy: Buddy<POOL_ZONES, MAX_NODES>,
    /// Chunks in `buddy` (all its zones are chunks); at most
    /// `OsPages::max_chunks`.
    chunks: usize,
}

impl<R: RawMutex> Default for OsPages<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R: RawMutex> OsPages<R> {
    loom_const_fn! {
        /// A page source with nothing mapped yet, whose pool may grow to
        /// 1,024 chunks (4 GiB; 4 under loom). (Under `--cfg loom` not
        /// `const`.)
        pub fn new() -> Self {
            Self::with_max_chunks(POOL_ZONES)
        }
    }

    loom_const_fn! {
        /// A page source with nothing mapped yet, whose pool holds at most
        /// `max_chunks` 4 MiB chunks (values above 1,024 mean 1,024; above
        /// 4 under loom, 4). Once the pool is full and has no free block of
        /// the size asked for, runs are mapped directly: a small limit
        /// exercises that path in tests, and `0` maps every run directly.
        /// (Under `--cfg loom` not `const`.)
        pub fn with_max_chunks(max_chunks: usize) -> Self {
            OsPages {
                pool: Mutex::const_new(R::INIT, Pool { buddy: Buddy::new(), chunks: 0 }),
                max_chunks: if max_chunks < POOL_ZONES { max_chunks } else { POOL_ZONES },
                owned: PageMap::new(),
                in_use: Stat::new(),
                mapped: Stat::new(),
                #[cfg(miri)]
                maps: Mutex::const_new(R::INIT, Mappings { list: [(core::ptr::null_mut(), 0); 1024], len: 0 }),
            }
        }
    }

    /// Maps `len` bytes aligned to `align` (both page multiples), binds
    /// them to `node` (see *Nodes*) and marks them in the page map. `None`
    /// if mapping or marking fails (then nothing stays mapped or marked).
    fn map(&self, len: usize, align: usize, node: usize) -> Option<*mut u8> {
        let p = map_aligned(len, align)?;
        #[cfg(not(loom))]
        // SAFETY: the mapping was just made, is ours, and nothing has
        // touched it.
        unsafe {
            super::numa::bind(p, len, node)
        };
        #[cfg(loom)]
        let _ = node;
        if !self.owned.mark(p.addr(), len) {
            // SAFETY: just mapped, and nothing refers to it.
            unsafe { unmap_piece(p, len) };
            return None;
        }
        self.mapped.add(len / PAGE_SIZE);
        #[cfg(miri)]
        {
            let mut maps = self.maps.lock();
            if maps.len < maps.list.len() {
                let n = maps.len;
                maps.list[n] = (p, len);
                maps.len += 1;
            }
        }
        Some(p)
    }

    /// Unmarks and unmaps `len` bytes at `addr`.
    ///
    /// # Safety
    ///
    /// The range must be a page-aligned piece of a mapping made by
    /// [`OsPages::map`] of this source, not yet unmapped, and unused.
    unsafe fn unmap(&self, addr: *mut u8, len: usize) {
        // Unmark first: from here on a stray lookup says Foreign and reads
        // nothing.
        self.owned.clear(addr.addr(), len);
        // SAFETY: forwarded from the caller.
        unsafe { unmap_piece(addr, len) };
        self.mapped.sub(len / PAGE_SIZE);
    }

    /// Walks the pool's lists and checks them (tests).
    #[cfg(test)]
    pub(super) fn check(&self) {
        self.pool.lock().buddy.check();
    }

    /// Whether the pool may take another chunk.
    fn has_room(&self, pool: &Pool) -> bool {
        pool.chunks < self.max_chunks && pool.buddy.has_room()
    }

    /// A run from `node`'s chunks (`node < MAX_NODES`), mapping a new
    /// chunk for it when they are dry and the pool may grow; `None` sends
    /// the caller to a direct mapping.
    fn alloc_pooled(&self, order: u32, node: usize) -> Option<*mut u8> {
        {
            let mut pool = self.pool.lock();
            if let Some(a) = pool.buddy.alloc_on(order, node) {
                return Some(a);
            }
            if !self.has_room(&pool) {
                return None;
            }
        }
        // Map outside the lock: a syscall is not a slab-list update.
        let chunk = self.map(CHUNK_BYTES, CHUNK_BYTES, node)?;
        let mut pool = self.pool.lock();
        if self.has_room(&pool) {
            // SAFETY: the chunk was just mapped and is ours alone.
            if unsafe { pool.buddy.add_zone_on(chunk, CHUNK_BYTES, true, 1, node) }.is_ok() {
                pool.chunks += 1;
                return pool.buddy.alloc_on(order, node);
            }
        }
        // Another thread filled the pool meanwhile.
        drop(pool);
        // SAFETY: the chunk is a whole mapping of ours, unused.
        unsafe { self.unmap(chunk, CHUNK_BYTES) };
        None
    }
}

// Unwind safe: its state is behind its lock, and nothing it runs can
// panic part way through an update (it calls no user code).
impl<R: RawMutex> core::panic::RefUnwindSafe for OsPages<R> {}

// SAFETY: (1) pooled runs come from a buddy over chunks we mapped, direct runs
// from fresh aligned mappings, so runs are aligned, writable and disjoint;
// (2) nodes are clamped below MAX_NODES; (3) the buddy accepts aligned pieces
// of live blocks and munmap accepts any page-aligned piece of a mapping;
// (4) only the pool lock, the page map's atomics and mmap/munmap are used: no
// allocation, no callback, no panic outside debug assertions; (5) the pool is
// behind a lock, the page map and the counters are atomics; (6) `claim_pages`
// takes only pages the pool's buddy lists as free (never part of a direct
// mapping).
unsafe impl<R: RawMutex + Sync> PageSource for OsPages<R> {
    #[cfg(miri)]
    fn rebase(&self, ptr: NonNull<u8>) -> NonNull<u8> {
        let a = ptr.as_ptr().addr();
        let maps = self.maps.lock();
        match maps.list[..maps.len].iter().find(|&&(b, len)| a >= b.addr() && a < b.addr() + len) {
            Some(&(b, _)) => NonNull::new(b.with_addr(a)).unwrap_or(ptr),
            None => ptr,
        }
    }

    fn alloc_pages(&self, order: u32, node: usize) -> Option<PageRun> {
        if order >= MAX_ORDER {
            return None;
        }
        let node = node.min(MAX_NODES - 1);
        let addr = if order <= CHUNK_MAX_ORDER { self.alloc_pooled(order, node) } else { None };
        let addr = match addr {
            Some(a) => a,
            None => {
                let len = PAGE_SIZE.checked_shl(order)?;
                self.map(len, len, node)?
            }
        };
        self.in_use.add(1 << order);
        Some(PageRun {
            // SAFETY: mmap and the buddy never return address 0.
            addr: unsafe { NonNull::new_unchecked(addr) },
            order,
            node,
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
                    let release = if unsafe { pool.buddy.free(a, order) } {
                        if pool.buddy.empty_islands() > RETAINED_CHUNKS {
                            let island = pool.buddy.remove_empty_island(a.addr());
                            pool.chunks -= usize::from(island.is_some());
                            island
                        } else {
                            None
                        }
                    } else {
                        // Not pooled: (a piece of) a direct mapping, never a
                        // chunk's metadata page.
                        debug_assert!(!pool.buddy.contains_raw(a.addr()), "free of a chunk's metadata page");
                        Some((a, PAGE_SIZE << order))
                    };
                    if let Some(u) = release {
                        unmap[n] = u;
                        n += 1;
                    }
                }
            }
            for &(raw, len) in &unmap[..n] {
                // SAFETY: an unlinked, entirely free island (a whole chunk
                // mapping), or a piece of a direct mapping the caller gave
                // back.
                unsafe { self.unmap(raw, len) };
            }
        }
    }

    /// `mprotect`; not under Miri, which does not model it.
    unsafe fn protect(&self, at: NonNull<u8>, pages: usize, off: bool) -> bool {
        if cfg!(miri) {
            return false;
        }
        let prot = if off { libc::PROT_NONE } else { libc::PROT_READ | libc::PROT_WRITE };
        // SAFETY: the caller passes pages of a live run of ours that it
        // owns (the contract), mapped read-write by us; changing their
        // protection touches no other mapping.
        unsafe { libc::mprotect(at.as_ptr().cast(), pages * PAGE_SIZE, prot) == 0 }
    }

    /// Yes: a run that fragmentation keeps from the pool is mapped anew.
    fn room_to_grow(&self) -> bool {
        true
    }

    fn claim_pages(&self, at: NonNull<u8>, pages: usize) -> bool {
        let taken = self.pool.lock().buddy.claim(at.as_ptr(), pages);
        if taken {
            self.in_use.add(pages);
        }
        taken
    }

    /// `Owned` iff `addr` lies in a page this source holds mapped (a pooled
    /// chunk, or a live piece of a direct mapping), else `Foreign`; never
    /// `Unknown`. Lock-free: two loads.
    #[inline(always)]
    fn ownership(&self, addr: usize) -> Ownership {
        if self.owned.contains(addr) { Ownership::Owned } else { Ownership::Foreign }
    }

    fn stats(&self) -> SourceStats {
        SourceStats { pages_in_use: self.in_use.get(), pages_reserved: self.mapped.get() }
    }

    /// The free blocks of the pooled chunks (runs mapped directly are
    /// never free here).
    fn free_runs(&self, out: &mut [usize; MAX_ORDER as usize]) -> bool {
        out.copy_from_slice(self.pool.lock().buddy.free_blocks());
        true
    }

    fn trim(&self) -> usize {
        let mut pages = 0;
        loop {
            let mut pool = self.pool.lock();
            if pool.buddy.empty_islands() <= SPARE_CHUNKS {
                return pages;
            }
            let Some((raw, len)) = pool.buddy.take_empty_island() else { return pages };
            pool.chunks -= 1;
            drop(pool);
            // SAFETY: the island was entirely free and is now unlinked: a
            // whole chunk mapping.
            unsafe { self.unmap(raw, len) };
            pages += len / PAGE_SIZE;
        }
    }
}

/// Under loom: unmaps every page this source still holds (see the module's
/// *Loom*).
#[cfg(loom)]
impl<R: RawMutex> Drop for OsPages<R> {
    fn drop(&mut self) {
        self.owned.take_all(|addr, len| {
            // munmap only reads the address: a pointer without provenance
            // is enough (nothing is ever read or written through it).
            let p = core::ptr::without_provenance_mut(addr);
            // SAFETY: pages of mappings this source made and still holds;
            // `&mut self` means the allocator that owned it is gone, and
            // with it every run it handed out.
            unsafe { unmap_piece(p, len) };
        });
    }
}

/// Maps `len` bytes aligned to `align` (both page multiples), trimming the
/// excess of an over-sized mapping (under Miri the excess stays mapped).
/// Returns the mapping or `None`.
fn map_aligned(len: usize, align: usize) -> Option<*mut u8> {
    let span = len.checked_add(align - PAGE_SIZE)?;
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing touches no existing memory.
    let p = unsafe { libc::mmap(core::ptr::null_mut(), span, libc::PROT_READ | libc::PROT_WRITE, MAP_FLAGS, -1, 0) };
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
            unmap_piece(base, head);
        }
        if tail != 0 {
            unmap_piece(start.wrapping_add(len), tail);
        }
    }
    Some(start)
}

/// A fresh read-write mapping of `len` bytes (page multiple), for tests.
#[cfg(all(test, not(loom)))]
pub(super) fn map_for_test(len: usize) -> *mut u8 {
    map_aligned(len, PAGE_SIZE).expect("mmap")
}

/// Unmaps what [`map_for_test`] mapped.
#[cfg(all(test, not(loom)))]
pub(super) fn unmap_for_test(p: *mut u8, len: usize) {
    // SAFETY: a whole mapping of `map_for_test`, no longer used.
    unsafe { unmap_whole(p, len) };
}

/// Unmaps a page-aligned piece of a mapping; under Miri, which unmaps only
/// whole mappings, leaves it mapped (leaked).
///
/// # Safety
///
/// `[addr, addr + len)` must be a page-aligned piece of a live mapping that
/// nothing uses any more.
unsafe fn unmap_piece(addr: *mut u8, len: usize) {
    if cfg!(miri) {
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { libc::munmap(addr.cast(), len) };
}

/// Unmaps a whole mapping.
///
/// # Safety
///
/// `addr` and `len` must be exactly a live mapping that nothing uses any
/// more.
unsafe fn unmap_whole(addr: *mut u8, len: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { libc::munmap(addr.cast(), len) };
}
