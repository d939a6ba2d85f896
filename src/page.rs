//! Page layer: exact page runs for large objects, and pointer → slab lookup.
//!
//! A slab is a naturally aligned run of `2^order` pages whose first bytes
//! hold its header, so the slab of an object is found in O(1), with no lock
//! and no per-object header, by masking the pointer with the slab size of
//! its cache (which the caller knows from the layout or the typed handle).
//!
//! Large objects get *exact* runs: the smallest order that fits is taken and
//! the pages past the object's end go straight back to the source, so a
//! 1 MiB + 1 B object holds 257 pages, not 512.

use core::ptr::NonNull;

use crate::platform::{PAGE_SHIFT, PAGE_SIZE, PageSource, order_for_pages};

use crate::platform::for_each_block;

/// The largest run [`alloc_exact`] takes to leave room after an object:
/// 2^8 pages (1 MiB), within what page sources pool (`OsPages` maps runs
/// above 2 MiB one by one).
pub(crate) const ROOM_MAX_ORDER: u32 = 8;

/// Pages needed for `bytes` (at least one), or `None` on overflow.
#[inline]
pub(crate) const fn pages_for(bytes: usize) -> Option<usize> {
    match bytes.checked_add(PAGE_SIZE - 1) {
        Some(b) => Some(if b >> PAGE_SHIFT == 0 { 1 } else { b >> PAGE_SHIFT }),
        None => None,
    }
}

/// The order of the run backing an exact run of `pages` pages aligned to
/// `align` bytes (`align` a power of two).
#[inline]
fn run_order(pages: usize, align: usize) -> Option<u32> {
    order_for_pages(pages.max(align >> PAGE_SHIFT))
}

/// Allocates `pages` pages aligned to `align` (a power of two), preferably
/// on `node`; returns them and the node they are on.
///
/// With `room` pages of room, the run is cut from one that also holds
/// `room` pages more (when the source has one, and up to an order of
/// [`ROOM_MAX_ORDER`]), so the pages right after the object are free when
/// it is made: a large object that grows can then claim them in place
/// (`PageSource::claim_pages`), unless other runs took them first.
pub(crate) fn alloc_exact<S: PageSource>(
    src: &S,
    pages: usize,
    room: usize,
    align: usize,
    node: usize,
) -> Option<(NonNull<u8>, usize)> {
    let order = run_order(pages, align)?;
    let roomy = run_order(pages.saturating_add(room), align).map_or(ROOM_MAX_ORDER, |r| r.min(ROOM_MAX_ORDER));
    let run = if roomy > order { src.alloc_pages(roomy, node) } else { None };
    let run = match run {
        Some(run) => run,
        None => src.alloc_pages(order, node)?,
    };
    let full = 1usize << run.order;
    if full > pages {
        let tail = run.addr.as_ptr().wrapping_add(pages * PAGE_SIZE);
        // SAFETY: the tail is an unused part of the run just allocated, split
        // into naturally aligned pieces as `free_pages` requires.
        for_each_block(tail, full - pages, |p, o| unsafe { src.free_pages(NonNull::new_unchecked(p), o) });
    }
    Some((run.addr, run.node))
}

/// Frees `pages` pages at `addr` (the first `pages` of an exact run, or its
/// remaining tail).
///
/// # Safety
///
/// `[addr, addr + pages * PAGE_SIZE)` must be live pages of runs from `src`
/// that start at a multiple of `PAGE_SIZE`, of which nothing is used after.
pub(crate) unsafe fn free_exact<S: PageSource>(src: &S, addr: NonNull<u8>, pages: usize) {
    // SAFETY: forwarded; each piece is naturally aligned and inside the run.
    for_each_block(addr.as_ptr(), pages, |p, o| unsafe { src.free_pages(NonNull::new_unchecked(p), o) });
}

/// The start of the slab of `2^order` pages that holds `ptr`. In a
/// user's debug build (where this runs in every checked free) stepped back
/// by the offset, which makes no calls; optimised, masked with `map_addr`,
/// one instruction (the step back costs three more per accounted free).
#[inline(always)]
pub(crate) fn slab_base(ptr: *mut u8, order: u32) -> *mut u8 {
    if cfg!(debug_assertions) {
        ptr.wrapping_sub(ptr.addr() & ((PAGE_SIZE << order) - 1))
    } else {
        ptr.map_addr(|a| a & !((PAGE_SIZE << order) - 1))
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
