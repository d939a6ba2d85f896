//! Dead caches: frees buffered per slot until few objects are left, then
//! straight to the slabs (see the magazine module's *Dead caches*).

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::{CpuMags, Env, MagCache, drain};
use crate::platform::{MAX_CPUS, Platform};
use crate::sync::{Ordering, fence};

impl<R: RawMutex> MagCache<R> {
    /// [`MagCache::free_spill`] for a dead cache: the slot's loaded
    /// magazine is its write-only free buffer. A full one goes back to the
    /// slabs in one batch; a slot without one loads an empty one; once
    /// `unbuffered` is set, `ptr` goes straight to its slab. Returns
    /// whether the caller must end buffering (see the module docs).
    ///
    /// # Safety
    ///
    /// As for `free_spill`, whose caller called `note_slot` for the slot.
    pub(super) unsafe fn free_dead<E: Env<R>>(&self, cx: &E, node: usize, m: &mut CpuMags, ptr: NonNull<u8>) -> bool {
        // After `note_slot`'s fence (Dekker with `end_buffering`).
        if self.unbuffered.load(Ordering::Relaxed) {
            // SAFETY: forwarded.
            unsafe { self.cache.free(&self.pages(cx, None), ptr) };
            return false;
        }
        if m.loaded.is_null() {
            m.loaded = match Self::new_magazine(cx, node) {
                Some(e) => e,
                None => {
                    // SAFETY: forwarded.
                    unsafe { self.cache.free(&self.pages(cx, None), ptr) };
                    return self.buffering_ends(cx);
                }
            };
        } else {
            let l = m.loaded;
            // SAFETY: the slot's loaded magazine, with its current count:
            // free objects of this cache, now ours to return.
            unsafe {
                self.cache.free_bulk(&self.pages(cx, None), &(&(*l).rounds)[..(*l).count]);
                (*l).count = 0;
            }
        }
        let l = m.loaded;
        // SAFETY: a live magazine of the slot, just emptied or fresh.
        unsafe {
            (*l).rounds[(*l).count] = ptr.as_ptr();
            (*l).count += 1;
        }
        self.buffering_ends(cx)
    }

    /// For a dead cache whose frees are buffered: whether its slots could
    /// now buffer every object out of its slabs, `MAX_CPUS * rounds`
    /// (see the module's *Dead caches*). The first caller to find it so
    /// sets `unbuffered` and gets `true`: it must call
    /// [`MagCache::end_buffering`] once it holds no slot. Always `false`
    /// in interrupt context, which may not drain.
    pub(super) fn buffering_ends<E: Env<R>>(&self, cx: &E) -> bool {
        if self.unbuffered.load(Ordering::Relaxed)
            || cx.plat().in_interrupt()
            || self.cache.active_objects() > MAX_CPUS * self.rounds
        {
            return false;
        }
        !self.unbuffered.swap(true, Ordering::Relaxed)
    }

    /// Ends a dead cache's buffering for the caller that
    /// [`MagCache::buffering_ends`] chose: drains every slot's buffer to
    /// the slabs. The caller holds no slot; after this, the free of the
    /// cache's last object empties it.
    #[cold]
    #[inline(never)]
    pub(super) fn end_buffering<E: Env<R>>(&self, cx: &E) {
        // Pairs with the fence in `note_slot` (Dekker): a holder either
        // sees `unbuffered` and buffers nothing more, or set its slot bit
        // before, and the drain reads the bits after this fence.
        fence(Ordering::SeqCst);
        // Only the slots: a dead cache's depots get no magazine, and the
        // removal's drain empties those it had.
        let used = self.used_slots.load(Ordering::Relaxed) as u64;
        drain::drain_slots(cx, |f| f(self), used, false);
    }

    /// The removal's part, after its drain emptied every magazine this
    /// cache had while alive: from now on a slot buffers at most `rounds`
    /// of its objects, so if the objects out of its slabs are already
    /// within the bound, buffering ends here (see the module docs).
    pub(crate) fn dead_drained<E: Env<R>>(&self, cx: &E) {
        if self.cache.is_dead() && self.buffering_ends(cx) {
            self.end_buffering(cx);
        }
    }

    /// For a dead cache that holds no slab any more: `true` exactly once,
    /// so its owner can let go of it.
    pub(crate) fn take_empty_dead(&self) -> bool {
        self.cache.is_dead() && self.cache.nslabs() == 0 && !self.released.swap(true, Ordering::AcqRel)
    }
}
