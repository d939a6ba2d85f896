//! A binary buddy allocator over page-aligned zones of memory.
//!
//! Bookkeeping lives out of band, one byte per page in a *meta* array:
//! `FREE | order` on the first page of a free block, `0` on every other
//! page. A zone's meta array lies in the bytes of its memory before its
//! first whole page or after its last when they hold it (memory handed in
//! unaligned), else inside the buddy for a zone of up to [`INLINE_META`]
//! pages while room is left there, else in whole pages carved from the
//! zone; so a small region keeps all of its pages, and their alignment. In-band, a free block holds only its list links. Blocks
//! are naturally aligned in absolute addresses, so the buddy of the block at
//! `a` of order `k` is `a ^ (PAGE_SIZE << k)`, wherever zones begin.
//!
//! Each zone belongs to one of the buddy's `N` *nodes* (`N` is 1 but for
//! `OsPages`, whose chunks are bound to NUMA nodes): a free block is on
//! its zone's node's lists, so an allocation for a node takes only that
//! node's blocks, and blocks of two nodes never merge.
//!
//! Zones of one buddy may be *merged*: a free block may then straddle two
//! adjacent zones (both halves are free, so both are ours). An *island* zone
//! (an OS chunk) never merges, so it can be handed back whole once its
//! `used` count returns to zero.
//!
//! Invariants (checked by `Buddy::check` in tests):
//! * every free block is on exactly the list of its order, and its meta byte
//!   is `FREE | order`; no two free blocks overlap;
//! * two free buddies of one order never coexist when they may merge;
//! * `free_pages` equals the pages on all lists.

use core::cell::Cell;

use super::{MAX_ORDER, PAGE_SIZE};

#[cfg(test)]
mod check;
mod layout;

use layout::{MetaAt, ZoneLayout};

const FREE: u8 = 0x80;
const ORDERS: usize = MAX_ORDER as usize;
/// Meta bytes a buddy keeps inside itself, for its first small zones: a
/// zone of up to this many pages (256 KiB) needs no meta page, which in a
/// page-aligned region would also halve its largest block.
pub(crate) const INLINE_META: usize = 64;

/// One span of managed memory: pages `[start, start + pages * PAGE_SIZE)`,
/// with its meta array elsewhere (carved from the same memory the zone was
/// given).
///
/// Addresses are kept as integers for lookups and arithmetic; every pointer
/// the buddy forms or hands out is derived from `base` with
/// `pointer::with_addr`, so it carries the provenance of the memory the
/// zone was given (strict provenance: no integer is ever cast to a pointer).
#[derive(Clone, Copy)]
struct Zone {
    /// The memory the zone was built from, at `raw_start`.
    base: *mut u8,
    start: usize,
    pages: usize,
    /// The meta array; null: it is `Buddy::inline[inline_at..][..pages]`.
    meta: *mut u8,
    inline_at: usize,
    /// Pages handed out from this zone; maintained for islands only.
    used: usize,
    /// First address of the memory the zone was built from (incl. meta).
    raw_start: usize,
    /// Length of that memory.
    raw_len: usize,
    island: bool,
    /// The node whose lists hold the zone's free blocks (`< N`).
    node: u8,
}

impl Zone {
    const EMPTY: Zone = Zone {
        base: core::ptr::null_mut(),
        start: 0,
        pages: 0,
        meta: core::ptr::null_mut(),
        inline_at: 0,
        used: 0,
        raw_start: 0,
        raw_len: 0,
        island: false,
        node: 0,
    };

    #[inline]
    fn end(&self) -> usize {
        self.start + self.pages * PAGE_SIZE
    }

    /// A pointer to `addr`, which lies in the zone's memory.
    #[inline]
    fn ptr(&self, addr: usize) -> *mut u8 {
        self.base.with_addr(addr)
    }
}

/// Link words at the start of a free block (null ends a list), and the
/// index of its zone when it was pushed: a hint that spares `alloc_on`
/// the search over the zones (zones move in the array when one is added
/// or removed, so it is checked before use).
#[repr(C)]
struct FreeBlock {
    next: *mut FreeBlock,
    prev: *mut FreeBlock,
    zone: usize,
}

/// Why a zone could not be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZoneError {
    /// Too small to hold its meta array and one page.
    TooSmall,
    /// Overlaps a zone already managed.
    Overlap,
    /// The zone table is full.
    Full,
}

/// A buddy allocator over at most `Z` zones on `N` nodes. Not
/// synchronised: its owner wraps it in a lock.
pub(crate) struct Buddy<const Z: usize, const N: usize = 1> {
    /// Sorted by `start`; the first `nzones` entries are live.
    zones: [Zone; Z],
    nzones: usize,
    /// Head of the free list of each node and order (null = empty).
    heads: [[*mut FreeBlock; ORDERS]; N],
    /// Blocks on the free lists of each order, all nodes together (for
    /// reports: what a failed allocation found).
    counts: [usize; ORDERS],
    free_pages: usize,
    managed_pages: usize,
    /// Island zones that are entirely free.
    empty_islands: usize,
    /// Meta arrays of small zones (see [`INLINE_META`]), by offset rather
    /// than by pointer, so the buddy (and its `Region`) may move.
    inline: [Cell<u8>; INLINE_META],
    /// Bytes of `inline` taken.
    inline_used: usize,
}

// SAFETY: the raw meta pointers point into memory the buddy owns exclusively
// (carved from the zones handed to it); moving the buddy to another thread
// moves that ownership with it. Its owner serialises all access with a lock.
unsafe impl<const Z: usize, const N: usize> Send for Buddy<Z, N> {}

impl<const Z: usize, const N: usize> Buddy<Z, N> {
    /// An empty buddy allocator.
    pub(crate) const fn new() -> Self {
        Buddy {
            zones: [Zone::EMPTY; Z],
            nzones: 0,
            heads: [[core::ptr::null_mut(); ORDERS]; N],
            counts: [0; ORDERS],
            free_pages: 0,
            managed_pages: 0,
            empty_islands: 0,
            inline: [const { Cell::new(0) }; INLINE_META],
            inline_used: 0,
        }
    }

    /// Pages on the free lists.
    pub(crate) fn free_pages(&self) -> usize {
        self.free_pages
    }

    /// Pages handed out or free, excluding meta pages.
    pub(crate) fn managed_pages(&self) -> usize {
        self.managed_pages
    }

    /// Free blocks of each order.
    pub(crate) fn free_blocks(&self) -> &[usize; ORDERS] {
        &self.counts
    }

    #[cfg_attr(not(feature = "std"), allow(dead_code))] // used by OsPages
    /// Whether the zone table has room for another zone.
    pub(crate) fn has_room(&self) -> bool {
        self.nzones < Z
    }

    #[cfg_attr(not(feature = "std"), allow(dead_code))] // used by OsPages
    /// Number of island zones that are entirely free.
    pub(crate) fn empty_islands(&self) -> usize {
        self.empty_islands
    }

    /// Index of the zone holding `addr`.
    fn zone_of(&self, addr: usize) -> Option<usize> {
        let zones = &self.zones[..self.nzones];
        // Last zone whose start is <= addr.
        let idx = zones.partition_point(|z| z.start <= addr);
        if idx == 0 {
            return None;
        }
        let z = &zones[idx - 1];
        (addr < z.end()).then_some(idx - 1)
    }

    /// [`Buddy::zone_of`] for an address near one in zone `near`: no search
    /// when it lies in that zone too (the usual case for the halves,
    /// buddies and enclosing blocks of a block).
    #[inline]
    fn zone_near(&self, near: usize, addr: usize) -> Option<usize> {
        let z = &self.zones[near];
        if addr >= z.start && addr < z.end() { Some(near) } else { self.zone_of(addr) }
    }

    #[cfg_attr(not(feature = "std"), allow(dead_code))] // used by OsPages
    /// Whether `addr` lies in memory given to this buddy (meta included).
    pub(crate) fn contains_raw(&self, addr: usize) -> bool {
        self.zones[..self.nzones].iter().any(|z| addr >= z.raw_start && addr - z.raw_start < z.raw_len)
    }

    /// The meta byte of the page at `addr` in zone `zi`.
    #[inline]
    fn meta(&self, zi: usize, addr: usize) -> *mut u8 {
        let z = &self.zones[zi];
        debug_assert!(addr >= z.start && addr < z.end());
        self.meta_at(z, (addr - z.start) / PAGE_SIZE)
    }

    /// The meta byte of page `page` of zone `z`; `page < z.pages`.
    #[inline]
    fn meta_at(&self, z: &Zone, page: usize) -> *mut u8 {
        if z.meta.is_null() {
            // A `Cell`'s pointer may be written through a shared reference.
            self.inline[z.inline_at + page].as_ptr()
        } else {
            // SAFETY: `page < z.pages`, the meta array's length (every
            // caller looked the page up in the zone).
            unsafe { z.meta.add(page) }
        }
    }

    /// Adds `[start, start + len)` as a zone with its meta array, and frees
    /// its pages; refuses it if fewer than `min_pages` pages (at least 1)
    /// would be left for use. Returns the zone's usable address range.
    ///
    /// The meta array (a byte per usable page) goes into the bytes before
    /// the first whole page or after the last one when it fits there (memory
    /// handed in unaligned, as a `static` byte array usually is), so such a
    /// zone keeps every whole page; else it takes whole pages of the zone
    /// (one per 4,096 pages). Islands always take a page.
    ///
    /// # Safety
    ///
    /// The memory must be valid for reads and writes, unused by anything
    /// else, and stay so for as long as this buddy manages it.
    pub(crate) unsafe fn add_zone(
        &mut self,
        base: *mut u8,
        len: usize,
        island: bool,
        min_pages: usize,
    ) -> Result<(usize, usize), ZoneError> {
        // SAFETY: forwarded.
        unsafe { self.add_zone_on(base, len, island, min_pages, 0) }
    }

    /// [`Buddy::add_zone`] for node `node` (`< N`): the zone's free blocks
    /// go on that node's lists.
    ///
    /// # Safety
    ///
    /// As for [`Buddy::add_zone`].
    pub(crate) unsafe fn add_zone_on(
        &mut self,
        base: *mut u8,
        len: usize,
        island: bool,
        min_pages: usize,
        node: usize,
    ) -> Result<(usize, usize), ZoneError> {
        debug_assert!(node < N);
        let start = base.addr();
        let inline_room = if island { 0 } else { INLINE_META - self.inline_used };
        let Some(layout) = ZoneLayout::of(start, len, island, inline_room) else { return Err(ZoneError::TooSmall) };
        if layout.pages < min_pages.max(1) {
            return Err(ZoneError::TooSmall);
        }
        if self.nzones == Z {
            return Err(ZoneError::Full);
        }
        let (lo, hi) = (layout.lo, layout.hi);
        let (raw_lo, raw_hi) = layout.raw();
        if self.zones[..self.nzones].iter().any(|z| raw_lo < z.raw_start + z.raw_len && z.raw_start < raw_hi) {
            return Err(ZoneError::Overlap);
        }
        let pages = layout.pages;
        let mut zone = Zone {
            base: base.with_addr(lo),
            start: lo,
            pages,
            meta: core::ptr::null_mut(),
            inline_at: 0,
            used: 0,
            raw_start: raw_lo,
            raw_len: raw_hi - raw_lo,
            island,
            node: node.min(N - 1) as u8,
        };
        match layout.meta {
            MetaAt::Bytes(at) => zone.meta = base.with_addr(at),
            MetaAt::Inline => {
                zone.inline_at = self.inline_used;
                self.inline_used += pages;
            }
            MetaAt::Pages => {
                let meta_pages = (hi - lo) / PAGE_SIZE - pages;
                // Put the meta pages on the side away from a mergeable
                // neighbour below, so free blocks can grow across the seam.
                let low_neighbour = !island
                    && self.zones[..self.nzones]
                        .iter()
                        .any(|z| !z.island && z.node == zone.node && z.raw_start + z.raw_len == lo);
                if low_neighbour {
                    zone.meta = base.with_addr(lo + pages * PAGE_SIZE);
                } else {
                    zone.meta = base.with_addr(lo);
                    zone.start = lo + meta_pages * PAGE_SIZE;
                }
            }
        }
        for p in 0..pages {
            // SAFETY: the meta bytes lie inside the memory the caller gave
            // us, outside the usable pages (`ZoneLayout` placed them), or in
            // `inline`; `p < pages`, the array's length.
            unsafe { self.meta_at(&zone, p).write(0) };
        }
        let ustart = zone.start;
        let idx = self.zones[..self.nzones].partition_point(|z| z.start < ustart);
        self.zones.copy_within(idx..self.nzones, idx + 1);
        self.zones[idx] = zone;
        self.nzones += 1;
        self.managed_pages += pages;
        if island {
            self.empty_islands += 1;
        }
        // Free the usable range as maximal naturally aligned blocks.
        // SAFETY: each block is a fresh, unused part of the zone.
        for_each_block(zone.ptr(ustart), pages, |block, order| unsafe { self.release(block, order) });
        Ok((ustart, ustart + pages * PAGE_SIZE))
    }

    /// Pushes the free block `addr` of `order` on its list.
    ///
    /// # Safety
    ///
    /// The block must be managed, free, and on no list.
    unsafe fn push(&mut self, zi: usize, block: *mut u8, order: u32) {
        let node = usize::from(self.zones[zi].node);
        let head = self.heads[node][order as usize];
        let block = block.cast::<FreeBlock>();
        // SAFETY: the block is free memory we manage, at least a page long.
        unsafe { block.write(FreeBlock { next: head, prev: core::ptr::null_mut(), zone: zi }) };
        if !head.is_null() {
            // SAFETY: `head` is a free block on this list.
            unsafe { (*head).prev = block };
        }
        self.heads[node][order as usize] = block;
        self.counts[order as usize] += 1;
        // SAFETY: zone `zi` holds `block` (see `meta`).
        unsafe { *self.meta(zi, block.addr()) = FREE | order as u8 };
        self.free_pages += 1 << order;
    }

    /// Takes the free block `addr` of `order` off its list.
    ///
    /// # Safety
    ///
    /// The block must be on the list of `order`.
    unsafe fn unlink(&mut self, zi: usize, block: *mut u8, order: u32) {
        let node = usize::from(self.zones[zi].node);
        let block = block.cast::<FreeBlock>();
        // SAFETY: the block is free, so its links are ours to read and fix.
        unsafe {
            let FreeBlock { next, prev, .. } = block.read();
            if !prev.is_null() {
                (*prev).next = next;
            } else {
                self.heads[node][order as usize] = next;
            }
            if !next.is_null() {
                (*next).prev = prev;
            }
            *self.meta(zi, block.addr()) = 0;
        }
        self.counts[order as usize] -= 1;
        self.free_pages -= 1 << order;
    }

    /// A block of `2^order` pages (of node 0), or `None`.
    pub(crate) fn alloc(&mut self, order: u32) -> Option<*mut u8> {
        self.alloc_on(order, 0)
    }

    /// A block of `2^order` pages from the zones of `node`, or `None`
    /// (also for a node `>= N`).
    pub(crate) fn alloc_on(&mut self, order: u32, node: usize) -> Option<*mut u8> {
        let heads = self.heads.get(node)?;
        let mut k = order;
        while (k as usize) < ORDERS && heads[k as usize].is_null() {
            k += 1;
        }
        if k as usize >= ORDERS {
            return None;
        }
        let head = heads[k as usize];
        // SAFETY: `head` heads a free list, so it is a free block whose
        // header `push` wrote.
        let hint = unsafe { (*head).zone };
        let block = head.cast::<u8>();
        let zi = if hint < self.nzones { self.zone_near(hint, block.addr())? } else { self.zone_of(block.addr())? };
        // SAFETY: `block` heads the list of order k.
        unsafe { self.unlink(zi, block, k) };
        while k > order {
            k -= 1;
            let half = block.wrapping_add(PAGE_SIZE << k);
            let hz = self.zone_near(zi, half.addr())?;
            // SAFETY: the upper half of a free block we just took is free.
            unsafe { self.push(hz, half, k) };
        }
        let z = &mut self.zones[zi];
        if z.island {
            if z.used == 0 {
                self.empty_islands -= 1;
            }
            z.used += 1 << order;
        }
        Some(block)
    }

    /// Returns a block; `false` if `block` is not managed here.
    ///
    /// # Safety
    ///
    /// `block`/`order` must be a naturally aligned piece of a block handed out
    /// by `alloc` and not yet returned.
    pub(crate) unsafe fn free(&mut self, block: *mut u8, order: u32) -> bool {
        let Some(zi) = self.zone_of(block.addr()) else {
            return false;
        };
        let z = &mut self.zones[zi];
        if z.island {
            z.used -= 1 << order;
            if z.used == 0 {
                self.empty_islands += 1;
            }
        }
        // SAFETY: forwarded from the caller; the block is in zone `zi`.
        unsafe { self.release_in(zi, block, order) };
        true
    }

    /// Inserts a free block, merging it with free buddies.
    ///
    /// # Safety
    ///
    /// The block must be managed and unused, and on no list.
    unsafe fn release(&mut self, block: *mut u8, order: u32) {
        if let Some(zi) = self.zone_of(block.addr()) {
            // SAFETY: forwarded; the block is in zone `zi`.
            unsafe { self.release_in(zi, block, order) }
        }
    }

    /// [`Buddy::release`] of a block in zone `zi` (found once by the
    /// caller: a search over the zones per slab given back showed in the
    /// profile of frees in bulk).
    ///
    /// # Safety
    ///
    /// As for [`Buddy::release`], and `block` is in zone `zi`.
    unsafe fn release_in(&mut self, mut zi: usize, mut block: *mut u8, mut order: u32) {
        while order + 1 < MAX_ORDER {
            let buddy = block.addr() ^ (PAGE_SIZE << order);
            let Some(bz) = self.zone_near(zi, buddy) else { break };
            if bz != zi
                && (self.zones[bz].island || self.zones[zi].island || self.zones[bz].node != self.zones[zi].node)
            {
                break;
            }
            // SAFETY: `buddy` is in zone `bz`.
            if unsafe { *self.meta(bz, buddy) } != FREE | order as u8 {
                break;
            }
            let buddy = self.zones[bz].ptr(buddy);
            // SAFETY: its meta byte says it heads a free block of `order`.
            unsafe { self.unlink(bz, buddy, order) };
            if buddy < block {
                block = buddy;
                zi = bz;
            }
            order += 1;
        }
        // SAFETY: `block` is a free, unlisted block in zone `zi`.
        unsafe { self.push(zi, block, order) };
    }

    /// The free block that holds the page at `addr`, as (start, order,
    /// zone of its start).
    fn free_block_at(&self, addr: usize) -> Option<(usize, u32, usize)> {
        let za = self.zone_of(addr)?;
        // SAFETY: `addr` is in zone `za`.
        let m = unsafe { *self.meta(za, addr) };
        if m & FREE != 0 {
            // The head of a free block (the usual case in `claim`, which
            // steps from one block's end to the next one's head).
            return Some((addr & !(PAGE_SIZE - 1), u32::from(m & !FREE), za));
        }
        let z = self.zones[za];
        for k in 1..MAX_ORDER {
            let len = PAGE_SIZE << k;
            // No block of an island is longer than the island, and none
            // starts outside it: nothing larger can hold `addr`.
            if z.island && len > z.pages * PAGE_SIZE {
                break;
            }
            let b = addr & !(len - 1);
            let Some(zi) = self.zone_near(za, b) else { continue };
            // SAFETY: `b` is in zone `zi`.
            if unsafe { *self.meta(zi, b) } == FREE | k as u8 {
                return Some((b, k, zi));
            }
        }
        None
    }

    /// Takes the `pages` pages at `start` off the free lists so a run that
    /// ends at `start` can grow in place: only if every one of them is free
    /// (and, in an island, inside the island of the page before `start`);
    /// the parts of the free blocks that stick out go back. Returns whether
    /// it took them; on `false` nothing changed. `start` comes from a safe
    /// `PageSource::claim_pages`, so anything is checked: an address off a
    /// page boundary is refused (the pages' blocks would be found by
    /// rounding down, and the piece past the claim handed back, link and
    /// all, at an address off a page: a review found a misaligned write
    /// and unaligned runs handed out).
    pub(crate) fn claim(&mut self, start: *mut u8, pages: usize) -> bool {
        let lo = start.addr();
        let Some(hi) = pages.checked_mul(PAGE_SIZE).and_then(|len| lo.checked_add(len)) else { return false };
        if pages == 0 || lo < PAGE_SIZE || !lo.is_multiple_of(PAGE_SIZE) {
            return false;
        }
        let Some(z0) = self.zone_of(lo - PAGE_SIZE) else { return false };
        if self.zones[z0].island && hi > self.zones[z0].end() {
            return false;
        }
        // Check every page first, block by block.
        let mut a = lo;
        while a < hi {
            match self.free_block_at(a) {
                Some((b, k, _)) => a = b + (PAGE_SIZE << k),
                None => return false,
            }
        }
        let mut a = lo;
        while a < hi {
            let Some((b, k, zi)) = self.free_block_at(a) else { break };
            let end = b + (PAGE_SIZE << k);
            let block = self.zones[zi].ptr(b);
            // SAFETY: its meta byte says it heads a free block of order k.
            unsafe { self.unlink(zi, block, k) };
            // Give back what lies outside [lo, hi): free pages, unlisted now.
            let release = |this: &mut Self, p: *mut u8, o: u32| {
                // SAFETY: a piece of the block just unlinked, outside the
                // claimed range: free, managed, on no list.
                unsafe { this.release(p, o) }
            };
            if b < lo {
                for_each_block(block, (lo - b) / PAGE_SIZE, |p, o| release(self, p, o));
            }
            if end > hi {
                for_each_block(block.wrapping_add(hi - b), (end - hi) / PAGE_SIZE, |p, o| release(self, p, o));
            }
            let z = &mut self.zones[zi];
            if z.island {
                if z.used == 0 {
                    self.empty_islands -= 1;
                }
                z.used += (end.min(hi) - b.max(lo)) / PAGE_SIZE;
            }
            a = end;
        }
        true
    }

    #[cfg_attr(not(feature = "std"), allow(dead_code))] // used by OsPages
    /// Removes an island zone that is entirely free, returning its raw range
    /// so the caller can hand the memory back. `None` if `addr` is not in an
    /// empty island.
    pub(crate) fn remove_empty_island(&mut self, addr: usize) -> Option<(*mut u8, usize)> {
        let zi = self.zone_of(addr)?;
        let z = self.zones[zi];
        if !z.island || z.used != 0 {
            return None;
        }
        let mut a = z.start;
        while a < z.end() {
            // SAFETY: `a` is in zone `zi`.
            let m = unsafe { *self.meta(zi, a) };
            debug_assert!(m & FREE != 0, "empty island has a page that is not free");
            let order = u32::from(m & !FREE);
            // SAFETY: its meta byte says it heads a free block of `order`.
            unsafe { self.unlink(zi, z.ptr(a), order) };
            a += PAGE_SIZE << order;
        }
        self.zones.copy_within(zi + 1..self.nzones, zi);
        self.nzones -= 1;
        self.managed_pages -= z.pages;
        self.empty_islands -= 1;
        Some((z.base, z.raw_len))
    }

    /// Removes some island zone that is entirely free (see
    /// [`Buddy::remove_empty_island`]).
    #[cfg_attr(not(feature = "std"), allow(dead_code))] // used by OsPages
    pub(crate) fn take_empty_island(&mut self) -> Option<(*mut u8, usize)> {
        let z = self.zones[..self.nzones].iter().find(|z| z.island && z.used == 0)?.start;
        self.remove_empty_island(z)
    }
}

impl<const Z: usize, const N: usize> Buddy<Z, N> {
    /// The shortest memory starting at `start` that [`Buddy::add_zone`]
    /// (not an island) would accept with `pages` usable pages (exact below
    /// 4,096 pages, within a page above), or `usize::MAX` if none fits
    /// below the top of the address space.
    pub(crate) fn min_len(&self, start: usize, pages: usize) -> usize {
        let head = start.next_multiple_of(PAGE_SIZE) - start;
        let whole = |total: usize| total.checked_mul(PAGE_SIZE).and_then(|b| b.checked_add(head));
        // The meta array in the head or inline; in a tail of `pages`
        // bytes (less than a page); or in pages of its own.
        let len = if pages <= head || pages <= INLINE_META - self.inline_used {
            whole(pages)
        } else if pages < PAGE_SIZE {
            whole(pages).and_then(|b| b.checked_add(pages))
        } else {
            whole(pages + pages.div_ceil(PAGE_SIZE - 1))
        };
        match len {
            Some(len) if start.checked_add(len).is_some() => len,
            _ => usize::MAX,
        }
    }
}

/// The largest order of a naturally aligned block starting at `addr` and
/// ending at or before `end`.
fn max_block_order(addr: usize, end: usize) -> u32 {
    let align = (addr / PAGE_SIZE).trailing_zeros();
    let fit = usize::BITS - 1 - ((end - addr) / PAGE_SIZE).leading_zeros();
    align.min(fit).min(MAX_ORDER - 1)
}

/// Splits the `pages` pages at `start` into naturally aligned blocks and
/// calls `f` on each (pointer, order): how a caller frees an exact run's
/// tail. The pointers are derived from `start`.
pub(crate) fn for_each_block(start: *mut u8, pages: usize, mut f: impl FnMut(*mut u8, u32)) {
    let end = start.addr() + pages * PAGE_SIZE;
    let mut p = start;
    while p.addr() < end {
        let order = max_block_order(p.addr(), end);
        f(p, order);
        p = p.wrapping_add(PAGE_SIZE << order);
    }
}
