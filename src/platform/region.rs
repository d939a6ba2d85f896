//! `Region`: a page source over memory the caller hands in.

use core::mem::MaybeUninit;
use core::ptr::NonNull;

use lock_api::{Mutex, RawMutex};

use super::buddy::{Buddy, ZoneError};
use super::{DefaultRawMutex, MAX_NODES, MAX_ORDER, Ownership, PageRun, PageSource, SourceStats};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering, Stat, atomic_null, atomic_usize, loom_const_fn};

/// Usable pages the first region of a [`Region`] must give (later ones
/// need one): a `Kmem`'s first allocation takes an order-0 slab for its
/// size class and one for the magazine that caches it, and every size
/// class up to 3.5 KiB fits an order-0 slab in a region this small.
pub const FIRST_REGION_PAGES: usize = 2;

/// Why a region was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionError {
    /// `node` is not below [`MAX_NODES`].
    BadNode,
    /// Too small: fewer usable pages than a region needs (one;
    /// [`FIRST_REGION_PAGES`] for the first one) once its partial pages
    /// and its page metadata are taken off.
    TooSmall {
        /// The shortest region at the same start address that would have
        /// been accepted, in bytes.
        min_len: usize,
    },
    /// Overlaps a region already added.
    Overlap,
    /// The node already has `ZONES` regions.
    Full,
}

impl core::fmt::Display for RegionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RegionError::BadNode => f.write_str("node id out of range"),
            RegionError::TooSmall { min_len } => write!(
                f,
                "region too small for its page metadata and the pages it must give; \
                 at least {min_len} bytes at this address are needed"
            ),
            RegionError::Overlap => f.write_str("region overlaps one already added"),
            RegionError::Full => f.write_str("no room for another region on this node"),
        }
    }
}

impl core::error::Error for RegionError {}

/// One entry of the lock-free address → node map.
///
/// Written once, before `Region::spans` is bumped with `Release`; read after
/// an `Acquire` load of `spans`, so a reader never sees a half-written entry.
struct Span {
    start: AtomicUsize,
    end: AtomicUsize,
    node: AtomicUsize,
    /// The pointer the memory was handed in with: its provenance covers
    /// the span (`PageSource::rebase` under Miri).
    base: AtomicPtr<u8>,
    /// The end of the memory as handed in: past `end` where the bytes
    /// after the last whole page keep the region's page metadata.
    limit: AtomicUsize,
}

/// A page source over memory handed in by the caller: static arrays, or the
/// ranges of a boot memory map. Each node has its own buddy allocator and
/// lock; regions can be added at any time (`add` takes `&self`), and
/// adjacent regions of one node merge.
///
/// `ZONES` bounds the regions per node. Each region keeps a byte of page
/// metadata per page: in the bytes before its first whole page or after
/// its last when they hold it (memory handed in unaligned), else in whole
/// pages of its own (one per 4,096 pages, so at least one). The first
/// region must give [`FIRST_REGION_PAGES`] usable pages, later ones one
/// ([`RegionError::TooSmall`] names the shortest length accepted).
pub struct Region<R: RawMutex = DefaultRawMutex, const ZONES: usize = 32> {
    nodes: [Mutex<R, Buddy<ZONES>>; MAX_NODES],
    /// Address → node map for `free_pages`, append-only.
    span_table: [[Span; ZONES]; MAX_NODES],
    /// Published spans per node (`Release` after writing the entry).
    spans: [AtomicUsize; MAX_NODES],
    in_use: Stat,
    reserved: Stat,
}

impl<R: RawMutex, const ZONES: usize> Default for Region<R, ZONES> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R: RawMutex, const ZONES: usize> Region<R, ZONES> {
    /// An empty page source; add memory with [`Region::add`].
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Region {
            nodes: [const { Mutex::const_new(R::INIT, Buddy::new()) }; MAX_NODES],
            span_table: [const { [const { Span::new() }; ZONES] }; MAX_NODES],
            spans: [const { atomic_usize(0) }; MAX_NODES],
            in_use: Stat::new(),
            reserved: Stat::new(),
        }
    }

    /// An empty page source (loom: not `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        Region {
            nodes: core::array::from_fn(|_| Mutex::const_new(R::INIT, Buddy::new())),
            span_table: core::array::from_fn(|_| core::array::from_fn(|_| Span::new())),
            spans: core::array::from_fn(|_| atomic_usize(0)),
            in_use: Stat::new(),
            reserved: Stat::new(),
        }
    }

    /// Hands a `'static` buffer (e.g. a `static mut` array) to `node`.
    pub fn add(&self, mem: &'static mut [MaybeUninit<u8>], node: usize) -> Result<(), RegionError> {
        // SAFETY: a `&'static mut` is exclusive for the rest of the program,
        // so the memory is valid, unused elsewhere, and lives long enough.
        unsafe { self.add_raw(mem.as_mut_ptr().cast(), mem.len(), node) }
    }

    /// Hands `[start, start + len)` to `node`. Partial pages at either end
    /// are left unused.
    ///
    /// # Safety
    ///
    /// The range must be valid for reads and writes, used by nothing else,
    /// and stay so for as long as this `Region` exists. It must not hold
    /// address 0, which Rust never reads or writes through (start a memory
    /// map's first range, if it begins there, a page later).
    pub unsafe fn add_raw(&self, start: *mut u8, len: usize, node: usize) -> Result<(), RegionError> {
        if node >= MAX_NODES {
            return Err(RegionError::BadNode);
        }
        if self.overlaps_a_span(start, len) {
            return Err(RegionError::Overlap);
        }
        let mut buddy = self.nodes[node].lock();
        // The first region of the source serves a `Kmem`'s first
        // allocation. (Two regions added at once to different nodes may
        // both count as first; each is then big enough for it.)
        let min_pages = if self.reserved.get() == 0 { FIRST_REGION_PAGES } else { 1 };
        let n = self.spans[node].load(Ordering::Relaxed);
        let before = buddy.managed_pages();
        // SAFETY: forwarded from the caller.
        let (lo, hi) = unsafe { buddy.add_zone(start, len, false, min_pages) }.map_err(|e| match e {
            ZoneError::TooSmall => RegionError::TooSmall { min_len: buddy.min_len(start.addr(), min_pages) },
            ZoneError::Overlap => RegionError::Overlap,
            ZoneError::Full => RegionError::Full,
        })?;
        let span = &self.span_table[node][n];
        span.start.store(lo, Ordering::Relaxed);
        span.end.store(hi, Ordering::Relaxed);
        span.node.store(node, Ordering::Relaxed);
        span.base.store(start, Ordering::Relaxed);
        span.limit.store(start.addr().saturating_add(len), Ordering::Relaxed);
        // Publishes the entry to `node_of` (pairs with its Acquire load).
        self.spans[node].store(n + 1, Ordering::Release);
        self.reserved.add(buddy.managed_pages() - before);
        Ok(())
    }

    /// Whether `[start, start + len)` overlaps a region of any node (as it
    /// was handed in, metadata before or after its pages included). Each
    /// node's buddy refuses overlaps among its own zones; this covers the
    /// others: frees find their node by address, so memory added to two
    /// nodes (a block of this source, leaked and added again elsewhere)
    /// sent one node's pages to the other.
    fn overlaps_a_span(&self, start: *mut u8, len: usize) -> bool {
        let (lo, hi) = (start.addr(), start.addr().saturating_add(len));
        (0..MAX_NODES).any(|node| {
            let n = self.spans[node].load(Ordering::Acquire);
            self.span_table[node][..n].iter().any(|s| {
                let (base, end) = (s.base.load(Ordering::Relaxed).addr(), s.limit.load(Ordering::Relaxed));
                lo < end && base < hi
            })
        })
    }

    /// The span that holds `addr`, without taking a lock.
    fn span_of(&self, addr: usize) -> Option<&Span> {
        (0..MAX_NODES).find_map(|node| {
            let n = self.spans[node].load(Ordering::Acquire);
            self.span_table[node][..n].iter().find(|s| {
                let (lo, hi) = (s.start.load(Ordering::Relaxed), s.end.load(Ordering::Relaxed));
                addr >= lo && addr < hi
            })
        })
    }

    /// The node whose regions hold `addr`, without taking a lock.
    fn node_of(&self, addr: usize) -> Option<usize> {
        self.span_of(addr).map(|s| s.node.load(Ordering::Relaxed))
    }

    /// Free pages on `node`.
    pub fn free_pages_on(&self, node: usize) -> usize {
        self.nodes.get(node).map_or(0, |b| b.lock().free_pages())
    }

    /// Walks every node's buddy and checks its invariants (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        for b in &self.nodes {
            b.lock().check();
        }
    }
}

impl Span {
    loom_const_fn! {
        fn new() -> Self {
            Span {
                start: atomic_usize(0),
                end: atomic_usize(0),
                node: atomic_usize(0),
                base: atomic_null(),
                limit: atomic_usize(0),
            }
        }
    }
}

// Unwind safe: its state is behind its locks and atomics, and nothing it
// runs can panic part way through an update (it calls no user code).
impl<R: RawMutex, const ZONES: usize> core::panic::RefUnwindSafe for Region<R, ZONES> {}

// SAFETY: (1) runs come from a buddy that hands each block out once, aligned
// to its size, inside memory the caller vouched for; (2) the node is the
// index of the buddy, below MAX_NODES; (3) the buddy accepts any aligned
// piece of a live block; (4) it takes only its own lock, allocates nothing,
// and has no panicking path outside debug assertions; (5) each node's
// buddy is behind a lock, and the span map is written before it is
// published with Release; (6) `claim_pages` takes only pages the node's
// buddy lists as free, and the buddy accepts their pieces back.
unsafe impl<R: RawMutex + Sync, const ZONES: usize> PageSource for Region<R, ZONES> {
    fn alloc_pages(&self, order: u32, node: usize) -> Option<PageRun> {
        if order >= super::MAX_ORDER {
            return None;
        }
        let home = node.min(MAX_NODES - 1);
        // The preferred node first, then the others in order.
        for n in core::iter::once(home).chain((0..MAX_NODES).filter(|&n| n != home)) {
            if self.spans[n].load(Ordering::Relaxed) == 0 {
                continue;
            }
            if let Some(block) = self.nodes[n].lock().alloc(order) {
                self.in_use.add(1 << order);
                // SAFETY: the buddy never hands out address 0.
                let addr = unsafe { NonNull::new_unchecked(block) };
                return Some(PageRun { addr, order, node: n });
            }
        }
        None
    }

    unsafe fn free_pages(&self, addr: NonNull<u8>, order: u32) {
        let a = addr.as_ptr().addr();
        let Some(node) = self.node_of(a) else {
            debug_assert!(false, "Region::free_pages of a foreign address {a:#x}");
            return;
        };
        // SAFETY: forwarded from the caller.
        if unsafe { self.nodes[node].lock().free(addr.as_ptr(), order) } {
            self.in_use.sub(1 << order);
        }
    }

    fn ownership(&self, addr: usize) -> Ownership {
        if self.node_of(addr).is_some() { Ownership::Owned } else { Ownership::Foreign }
    }

    #[cfg(miri)]
    fn rebase(&self, ptr: NonNull<u8>) -> NonNull<u8> {
        match self.span_of(ptr.as_ptr().addr()).and_then(|s| NonNull::new(s.base.load(Ordering::Relaxed))) {
            Some(base) => base.with_addr(ptr.addr()),
            None => ptr,
        }
    }

    fn claim_pages(&self, at: NonNull<u8>, pages: usize) -> bool {
        // The run being grown ends at `at`: its node's buddy has the pages.
        let Some(node) = at.as_ptr().addr().checked_sub(1).and_then(|a| self.node_of(a)) else { return false };
        let taken = self.nodes[node].lock().claim(at.as_ptr(), pages);
        if taken {
            self.in_use.add(pages);
        }
        taken
    }

    fn stats(&self) -> SourceStats {
        SourceStats { pages_in_use: self.in_use.get(), pages_reserved: self.reserved.get() }
    }

    /// The pages of every region added so far: a `Region` never maps more
    /// by itself.
    fn fixed_pages(&self) -> Option<usize> {
        Some(self.reserved.get())
    }

    fn free_runs(&self, out: &mut [usize; MAX_ORDER as usize]) -> bool {
        out.fill(0);
        for (n, buddy) in self.nodes.iter().enumerate() {
            if self.spans[n].load(Ordering::Relaxed) == 0 {
                continue;
            }
            for (o, k) in out.iter_mut().zip(buddy.lock().free_blocks()) {
                *o += k;
            }
        }
        true
    }
}
