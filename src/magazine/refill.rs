//! Refilling a slot's magazines: from the depot, else from the slabs, a
//! batch sized to the page source.

use core::ptr::{self, NonNull};

use lock_api::RawMutex;

use super::{Env, MagCache, Magazine, Spilled};
use crate::platform::{MAX_NODES, PageSource, Platform};
use crate::slab::{GrowError, Pages};

/// The most objects a refill takes from the slabs under Miri (no limit
/// elsewhere, see [`MagCache::refill_rounds`]): a user's test under Miri waits on every object a refill
/// takes and a drain gives back, most of which a short test never uses.
/// Magazines keep their size; only the refill is smaller, so the refill,
/// the drain and the frees run the same code.
const MIRI_REFILL_MAX: usize = 8;

impl<R: RawMutex> MagCache<R> {
    /// `loaded` is empty: swap, trade with the depot, or refill from slabs.
    ///
    /// # Safety
    ///
    /// The caller holds `slot`, and `m` is its magazines of this cache
    /// ([`CpuMags::spill`](super::CpuMags::spill)).
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn alloc_refill<E: Env<R>>(
        &self,
        cx: &E,
        slot: usize,
        m: &mut Spilled,
    ) -> Result<NonNull<u8>, GrowError> {
        let node = cx.plat().node_of(slot).min(MAX_NODES - 1);
        // SAFETY: the slot's magazines are ours (contract); magazines taken
        // from the depot become ours under its lock.
        unsafe {
            if !m.previous.is_null() && (*m.previous).count > 0 {
                core::mem::swap(&mut m.loaded, &mut m.previous);
                return Self::pop(m);
            }
            let mut depot = self.depots[node].lock();
            if let Some(full) = depot.full.pop() {
                if !m.previous.is_null() {
                    depot.empty.push(m.previous);
                }
                drop(depot);
                m.previous = m.loaded;
                m.loaded = full;
                return Self::pop(m);
            }
            if m.loaded.is_null() {
                m.loaded = match depot.empty.pop() {
                    Some(e) => e,
                    None => {
                        drop(depot);
                        return self.alloc_then_magazine(cx, slot, node, m);
                    }
                };
            } else {
                drop(depot);
            }
            let l = m.loaded;
            let fill = self.refill_rounds(cx.src());
            let n = self.cache.alloc_bulk(&self.pages(cx, Some(slot)), node, &mut (&mut (*l).rounds)[..fill]);
            (*l).count = *n.as_ref().unwrap_or(&0);
            n?;
            Self::pop(m)
        }
    }

    /// How many objects a refill takes from the slabs: a full magazine,
    /// but from a fixed page source (a [`crate::Region`]) at most what
    /// slabs of an eighth of its pages hold, and at least one. A refill
    /// grows slabs to fill the magazine, and a magazine of a large class
    /// holds several slabs' worth (4 rounds of 8 KiB objects are 12 pages
    /// with 3-page slabs): in a 64 KiB region that was three quarters of
    /// it, held by one slot for objects nobody asked for. A region of a
    /// few MiB or more fills every magazine in full, as before. Under
    /// Miri at most [`MIRI_REFILL_MAX`].
    pub(super) fn refill_rounds<S: PageSource>(&self, src: &S) -> usize {
        let full = match src.fixed_pages() {
            None => self.rounds,
            Some(pages) => {
                let geo = self.cache.geometry();
                (pages / 8 / geo.pages * geo.capacity).clamp(1, self.rounds)
            }
        };
        if cfg!(miri) && full > MIRI_REFILL_MAX { MIRI_REFILL_MAX } else { full }
    }

    /// The refill of a slot with no magazine at all, and none empty in the
    /// depot: the object from the slabs first, then a new magazine, filled
    /// with one round less than a full refill (the same objects leave the
    /// slabs). In that order a shortage falls on the magazine, which is
    /// optional (without one the object is served unbuffered), never on
    /// the object: in a small region the magazine's page may be the one
    /// the object's slab needs (a 16 KiB region has four pages: a slab for
    /// 8 KiB objects takes three of a run of four, which a magazine's page
    /// taken first would have split).
    ///
    /// # Safety
    ///
    /// As for [`MagCache::alloc_refill`], with `m.loaded` null.
    pub(super) unsafe fn alloc_then_magazine<E: Env<R>>(
        &self,
        cx: &E,
        slot: usize,
        node: usize,
        m: &mut Spilled,
    ) -> Result<NonNull<u8>, GrowError> {
        let p = self.cache.alloc(&self.pages(cx, Some(slot)), node)?;
        let Some(e) = Self::new_magazine(cx, node) else { return Ok(p) };
        // SAFETY: `e` is a fresh magazine, ours alone; with `m.loaded` null
        // (contract) it becomes the slot's loaded magazine, and its count
        // is set before anyone reads it (the caller's `reload`).
        unsafe {
            m.loaded = e;
            let rounds = &mut (&mut (*e).rounds)[..self.refill_rounds(cx.src()) - 1];
            // A shortage here leaves the magazine empty: the next
            // allocation refills it, or fails with its own report.
            (*e).count = self.cache.alloc_bulk(&self.pages(cx, Some(slot)), node, rounds).unwrap_or(0);
        }
        Ok(p)
    }

    /// An empty magazine from the internal magazine cache.
    pub(super) fn new_magazine<E: Env<R>>(cx: &E, node: usize) -> Option<*mut Magazine> {
        let p = cx.mags().alloc(&Pages::plain(cx.src()), node).ok()?.as_ptr() as *mut Magazine;
        // SAFETY: a fresh object of the magazine cache, laid out for one.
        unsafe { ptr::addr_of_mut!((*p).count).write(0) };
        Some(p)
    }
}
