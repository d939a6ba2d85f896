//! The page map of `OsPages`: one bit per page of the user address space,
//! in a two-level radix table of leaves mapped on first use (see the
//! parent module's *Ownership map*). Under `--cfg loom` a small model
//! build with the same API replaces it (`page_map_model`).

use super::super::{PAGE_SHIFT, PAGE_SIZE};
use super::{map_aligned, unmap_whole};
use crate::sync::{AtomicPtr, AtomicUsize, CellArray, Ordering, atomic_null};

/// Bits of the user address space the page map covers (48 on 64-bit
/// targets: x86-64 hands out 47, AArch64 48, without an explicit hint).
const ADDR_BITS: u32 = if usize::BITS >= 64 { 48 } else { usize::BITS };
/// Pages one leaf covers, as a power of two: 64 GiB of addresses (the whole
/// space on 32-bit targets).
const LEAF_PAGE_BITS: u32 = if ADDR_BITS - PAGE_SHIFT < 24 { ADDR_BITS - PAGE_SHIFT } else { 24 };
const LEAF_PAGES: usize = 1 << LEAF_PAGE_BITS;
/// Pages (bits) per bitmap word.
const WORD_PAGES: usize = usize::BITS as usize;
/// Bytes in one leaf: 2 MiB on 64-bit targets.
const LEAF_BYTES: usize = LEAF_PAGES / 8;
/// Leaves in the table: 4,096 on 64-bit targets.
const LEAVES: usize = 1 << (ADDR_BITS - PAGE_SHIFT - LEAF_PAGE_BITS);

/// One bit per page of the user address space: which pages lie in
/// mappings an [`OsPages`](super::OsPages) holds. A two-level radix table whose leaves are
/// mapped on first use (see the module docs).
///
/// Atomics: a leaf pointer is published once by CAS (`AcqRel`) and read
/// with `Acquire`; never changed again until drop. A page's bit is set
/// with `Release` after the page is mapped and before the source hands any
/// of it out, and cleared with `Release` before the page is unmapped; it is
/// read with `Acquire`. A lookup of a page that the caller got from this
/// source (through whatever synchronisation handed it over) therefore sees
/// its bit set. Tolerated race: a lookup of a stray pointer into a run that
/// another thread is unmapping may see the bit before it is cleared (its
/// caller may then read a page as it is unmapped); frees of pointers that
/// were never allocated cannot be told apart from that without a lock.
pub(in crate::platform) struct PageMap {
    /// `leaves[i]`: null, or a zeroed mapping of `LEAF_BYTES` holding the
    /// bits of pages `i * LEAF_PAGES ..`, live until drop.
    leaves: CellArray<AtomicPtr<AtomicUsize>, LEAVES>,
}

impl PageMap {
    /// Bytes of address space one leaf covers (for tests of the seams).
    #[cfg(test)]
    pub(in crate::platform) const LEAF_SPAN: usize = LEAF_PAGES * PAGE_SIZE;

    /// An empty map: no leaf mapped, no page set.
    pub(in crate::platform) const fn new() -> Self {
        PageMap { leaves: CellArray::new([const { atomic_null() }; LEAVES]) }
    }

    /// Whether the page holding `addr` is set.
    #[inline(always)]
    pub(in crate::platform) fn contains(&self, addr: usize) -> bool {
        let page = addr >> PAGE_SHIFT;
        // Indexed after an explicit test rather than with `get`: no call in
        // a user's debug build, where this runs in every checked free.
        if page >> LEAF_PAGE_BITS >= LEAVES {
            return false;
        }
        let leaf = self.leaves[page >> LEAF_PAGE_BITS].load(Ordering::Acquire);
        if leaf.is_null() {
            return false;
        }
        let i = page & (LEAF_PAGES - 1);
        // SAFETY: a non-null leaf is a live mapping of LEAF_PAGES bits, and
        // `i / WORD_PAGES` is below its word count; zeroed memory is a valid
        // `AtomicUsize`.
        let word = unsafe { &*leaf.add(i / WORD_PAGES) };
        word.load(Ordering::Acquire) & (1 << (i % WORD_PAGES)) != 0
    }

    /// Sets the pages of `[addr, addr + len)` (page-aligned), mapping the
    /// leaves they need first. `false`, with nothing set, if the range lies
    /// beyond the covered address space or a leaf cannot be mapped.
    pub(in crate::platform) fn mark(&self, addr: usize, len: usize) -> bool {
        let Some((first, end)) = page_range(addr, len) else { return false };
        for leaf in first >> LEAF_PAGE_BITS..end.div_ceil(LEAF_PAGES) {
            if self.leaf_or_map(leaf).is_none() {
                return false;
            }
        }
        self.update(first, end, |w, mask| {
            w.fetch_or(mask, Ordering::Release);
        });
        true
    }

    /// Clears the pages of `[addr, addr + len)` (page-aligned).
    pub(in crate::platform) fn clear(&self, addr: usize, len: usize) {
        let Some((first, end)) = page_range(addr, len) else { return };
        self.update(first, end, |w, mask| {
            w.fetch_and(!mask, Ordering::Release);
        });
    }

    /// Calls `f(word, mask)` for every bitmap word holding pages
    /// `first..end`, with the mask of those pages; skips unmapped leaves.
    fn update(&self, first: usize, end: usize, f: impl Fn(&AtomicUsize, usize)) {
        let mut p = first;
        while p < end {
            let leaf_end = (p | (LEAF_PAGES - 1)) + 1;
            let leaf = self.leaves[p >> LEAF_PAGE_BITS].load(Ordering::Acquire);
            let stop = end.min(leaf_end);
            while !leaf.is_null() && p < stop {
                let i = p & (LEAF_PAGES - 1);
                let bit = i % WORD_PAGES;
                let n = (WORD_PAGES - bit).min(stop - p);
                let mask = (usize::MAX >> (WORD_PAGES - n)) << bit;
                // SAFETY: as in `contains`.
                f(unsafe { &*leaf.add(i / WORD_PAGES) }, mask);
                p += n;
            }
            p = stop;
        }
    }

    /// Leaf `i`, mapping it if it is not yet; `None` if mmap fails.
    fn leaf_or_map(&self, i: usize) -> Option<*mut AtomicUsize> {
        let slot = &self.leaves[i];
        let leaf = slot.load(Ordering::Acquire);
        if !leaf.is_null() {
            return Some(leaf);
        }
        let new = map_aligned(LEAF_BYTES, PAGE_SIZE)?.cast::<AtomicUsize>();
        match slot.compare_exchange(core::ptr::null_mut(), new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Some(new),
            Err(winner) => {
                // SAFETY: our leaf is a whole mapping nobody else has seen.
                unsafe { unmap_whole(new.cast(), LEAF_BYTES) };
                Some(winner)
            }
        }
    }
}

impl Drop for PageMap {
    fn drop(&mut self) {
        for slot in self.leaves.get_mut() {
            let leaf = *slot.get_mut();
            if !leaf.is_null() {
                // SAFETY: a whole leaf mapping; `&mut self` means no lookup
                // can still read it.
                unsafe { unmap_whole(leaf.cast(), LEAF_BYTES) };
            }
        }
    }
}

/// The page numbers `first..end` of `[addr, addr + len)`, if the range lies
/// in the space the page map covers.
fn page_range(addr: usize, len: usize) -> Option<(usize, usize)> {
    let end = addr.checked_add(len)? >> PAGE_SHIFT;
    (end <= LEAVES << LEAF_PAGE_BITS).then_some((addr >> PAGE_SHIFT, end))
}
