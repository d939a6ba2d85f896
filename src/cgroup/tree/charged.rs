//! Charged caches: for each accounted cache, the one cache that serves
//! every group's objects of it, its slabs shared by all groups, with an
//! owner word per object (Linux's `kmalloc-cg-*` caches and `obj_cgroup`
//! vectors). Made at first use, freed with the tree (a size class's) or
//! with its typed cache.

use lock_api::RawMutex;

use super::{Tree, class_name};
use crate::error::Name;
use crate::magazine::{Acct, Env, MagCache};
use crate::slab::Pages;
use crate::slab::classes::NCLASSES;
use crate::sync::{AtomicPtr, CellArray, Ordering};

impl<R: RawMutex> Tree<R> {
    /// The charged cache of size class `c`, once made.
    #[inline(always)]
    pub(crate) fn class_charged(&self, c: usize) -> Option<&MagCache<R>> {
        // SAFETY: `class_of` gives indices below NCLASSES (callers).
        let slot = unsafe { self.charged.get_unchecked(c) };
        // SAFETY: published, so live until the tree goes.
        unsafe { slot.load(Ordering::Acquire).as_ref() }
    }

    /// Where the size classes' charged caches are published.
    #[inline(always)]
    pub(crate) fn charged_slots(&self) -> &CellArray<AtomicPtr<MagCache<R>>, NCLASSES> {
        &self.charged
    }

    /// The charged cache whose pointer `slot` holds (a size class's in the
    /// tree, a typed cache's in its descriptor), made from `base` at first
    /// use; `None` when there is no memory for it.
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

    /// Calls `f` on every charged cache with the name of the cache it
    /// charges for: the size classes', then the typed caches'.
    pub(crate) fn for_each_charged(&self, mut f: impl FnMut(Name, &MagCache<R>)) {
        for c in 0..NCLASSES {
            if let Some(cache) = self.class_charged(c) {
                f(class_name(c), cache);
            }
        }
        self.for_each_desc(|d| {
            // SAFETY: published; the read guard of `for_each_desc` keeps
            // a destroyed cache's charged cache from being freed.
            if let Some(cache) = unsafe { d.charged.load(Ordering::Acquire).as_ref() } {
                f(d.name, cache);
            }
        });
    }
}
