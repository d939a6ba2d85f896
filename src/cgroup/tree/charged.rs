//! Charged caches: for each accounted cache, the one cache that serves
//! every group's objects of it, its slabs shared by all groups, with an
//! owner word per object (Linux's `kmalloc-cg-*` caches and `obj_cgroup`
//! vectors). Made at first use, freed with the tree (a size class's) or
//! with its typed cache.

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::{Tree, class_name};
use crate::error::Name;
use crate::magazine::{Acct, Env, MagCache};
use crate::slab::Pages;
use crate::sync::{AtomicPtr, Ordering};

impl<R: RawMutex> Tree<R> {
    /// The charged cache of size class `c`, once made.
    #[cfg(test)]
    pub(crate) fn class_charged(&self, c: usize) -> Option<&MagCache<R>> {
        self.charged_of(self.classes().get(c)?)
    }

    /// The charged cache of `base` (a size class's or a typed cache's),
    /// once made.
    #[inline(always)]
    pub(crate) fn charged_of<'a>(&self, base: &'a MagCache<R>) -> Option<&'a MagCache<R>> {
        // A size class's is freed once no group is left (`release_charged`),
        // a typed cache's with its descriptor; callers hold a group (an
        // allocation) or a read guard (an iteration).
        // SAFETY: published (`make_charged`), so live until then.
        unsafe { base.charged.load(Ordering::Acquire).as_ref() }
    }

    /// The charged cache whose pointer `slot` holds (`base.charged`), made
    /// from `base` at first use; `None` when there is no memory for it.
    #[inline]
    pub(crate) fn charged_in<'a, E: Env<R>>(
        &self,
        env: &E,
        slot: &'a AtomicPtr<MagCache<R>>,
        base: &MagCache<R>,
    ) -> Option<&'a MagCache<R>> {
        // SAFETY: published, so live as long as what holds `slot`.
        match unsafe { slot.load(Ordering::Acquire).as_ref() } {
            Some(c) => Some(c),
            None => self.make_charged(env, slot, base),
        }
    }

    /// Creates the charged cache for `slot`, or returns the one another
    /// thread published first.
    #[cold]
    #[inline(never)]
    fn make_charged<'a, E: Env<R>>(
        &self,
        env: &E,
        slot: &'a AtomicPtr<MagCache<R>>,
        base: &MagCache<R>,
    ) -> Option<&'a MagCache<R>> {
        env.settle();
        let geo = base.cache.geometry().with_owners()?;
        let mem = self.alloc_meta(env, &self.charged_caches)?;
        let fresh = mem.cast::<MagCache<R>>().as_ptr();
        // Its slabs are charged to the root, which counts them as pages;
        // its objects to their groups, in bytes, below the root.
        // SAFETY: a fresh object of the charged-cache cache, sized and
        // aligned for a `MagCache`.
        unsafe { fresh.write(MagCache::new(geo, Acct::Root)) };
        match slot.compare_exchange(core::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: just published; lives as long as what holds `slot`.
            Ok(_) => Some(unsafe { &*fresh }),
            Err(winner) => {
                // SAFETY: ours, never published, holds nothing.
                unsafe { self.charged_caches.free(&Pages::plain(env.src()), mem) };
                // SAFETY: the published one lives as long as `slot`'s holder.
                Some(unsafe { &*winner })
            }
        }
    }

    /// Frees `ptr`, an object of charged cache `owner` whose bytes may be
    /// uncharged already, into it on the slow path, under a read guard:
    /// with its charge gone nothing keeps its group, and with no group
    /// left [`Tree::release_charged`] may free the cache once its slabs
    /// are gone, which this free's release of its slab can be; the cache's
    /// freeing waits for the guard.
    ///
    /// # Safety
    ///
    /// As for `MagCache::free_slow`: `ptr` is a live object of `owner`,
    /// freed once.
    #[inline(always)]
    pub(crate) unsafe fn free_uncharged<E: Env<R>>(&self, env: &E, owner: &MagCache<R>, ptr: NonNull<u8>) {
        // SAFETY: forwarded.
        unsafe { self.free_uncharged_then(env, owner, ptr, || {}) }
    }

    /// [`Tree::free_uncharged`], running `then` once the free is done,
    /// still under the guard (the loom model marks the end of the free's
    /// use of the cache with it).
    ///
    /// # Safety
    ///
    /// As for [`Tree::free_uncharged`].
    #[inline(always)]
    pub(crate) unsafe fn free_uncharged_then<E: Env<R>>(
        &self,
        env: &E,
        owner: &MagCache<R>,
        ptr: NonNull<u8>,
        then: impl FnOnce(),
    ) {
        let _read = self.read_guard();
        // SAFETY: forwarded.
        unsafe { owner.free_slow(env, ptr) };
        then();
    }

    /// Frees the charged caches once no group is left (a `shrink`), so an
    /// allocator whose groups are all gone holds none of their memory.
    /// Every allocation from a charged cache holds a reference on a group,
    /// and every charged object keeps its group, so with no group in the
    /// tree (checked under the tree lock, which creation takes) only the
    /// frees of objects already uncharged can still use them. Those run
    /// under a slot's hold, which the drain here waits for, or under a
    /// read guard (`Tree::free_uncharged`), which the caches' freeing
    /// waits for (they go through limbo). A cache is freed only once its
    /// slabs are gone, so a free whose object is still in a slab keeps it.
    /// A group made after the lock is let go makes them anew. (Typed
    /// caches' too: a destroy waits for the tree lock, then finds its
    /// descriptor's pointer null.)
    pub(crate) fn release_charged<E: Env<R>>(&self, env: &E) {
        let mut limbo = self.lock.lock();
        if !self.all_groups.load(Ordering::Acquire).is_null() {
            return;
        }
        let mut release = |slot: &AtomicPtr<MagCache<R>>| {
            let Some(c) = NonNull::new(slot.load(Ordering::Acquire)) else { return };
            // SAFETY: published, and nobody else uses it (above).
            let cache = unsafe { c.as_ref() };
            Self::drain_and_shrink(env, |f| f(cache));
            if cache.cache.nslabs() != 0 {
                // Cannot be (no group, no charged object); keep it if so.
                return;
            }
            slot.store(core::ptr::null_mut(), Ordering::Release);
            // Freed once no iteration (`for_each_charged` under a read
            // guard) can still reach it.
            limbo.retire_cache(c);
        };
        self.classes().iter().for_each(|b| release(&b.charged));
        self.for_each_desc(|d| release(&d.cache.charged));
        self.reclaim_groups(env, &mut limbo);
    }

    /// Calls `f` on every charged cache with the name of the cache it
    /// charges for: the size classes', then the typed caches'.
    pub(crate) fn for_each_charged(&self, mut f: impl FnMut(Name, &MagCache<R>)) {
        self.for_each_charged_of(|name, _, c| f(name, c));
    }

    /// [`Tree::for_each_charged`], also telling whether the cache each
    /// charges for is live (size classes always are; a destroyed typed
    /// cache stays, dead, while leaked objects keep its slabs).
    pub(crate) fn for_each_charged_of(&self, mut f: impl FnMut(Name, bool, &MagCache<R>)) {
        // A shrink with no group left frees charged caches once no reader
        // holds a guard (`release_charged`): a report may run without one.
        let _read = self.read_guard();
        for (c, base) in self.classes().iter().enumerate() {
            if let Some(cache) = self.charged_of(base) {
                f(class_name(c), true, cache);
            }
        }
        // The read guards keep a destroyed cache's charged cache from
        // being freed while `f` looks at it.
        self.for_each_desc(|d| {
            if let Some(cache) = self.charged_of(&d.cache) {
                f(d.name, d.live.load(Ordering::Relaxed), cache);
            }
        });
    }
}
