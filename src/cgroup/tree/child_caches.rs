//! Child caches: a group's own cache of each accounted cache it allocates
//! from, made at its first use, and let go once dead and empty.

use lock_api::RawMutex;

use super::Tree;
use crate::cgroup::Group;
use crate::magazine::{Acct, Env, MagCache};
use crate::slab::Pages;
use crate::sync::{Ordering, fence};

impl<R: RawMutex> Tree<R> {
    /// The cache of group `g` (null: root) for the accounted cache `base`
    /// at accounting index `idx`, created on first use.
    #[inline]
    pub(crate) fn cache_for<'a, E: Env<R>>(
        &'a self,
        env: &E,
        g: *const Group<R>,
        idx: usize,
        base: &'a MagCache<R>,
    ) -> Option<&'a MagCache<R>> {
        if g.is_null() {
            return Some(base);
        }
        // SAFETY: callers pass a live group of this tree.
        let g = unsafe { &*g };
        g.child_cache(idx).or_else(|| self.make_child_cache(env, g, idx, base))
    }

    /// Creates group `g`'s child cache at `idx`, or returns the one another
    /// thread published first.
    #[cold]
    #[inline(never)]
    fn make_child_cache<'a, E: Env<R>>(
        &self,
        env: &E,
        g: &'a Group<R>,
        idx: usize,
        base: &MagCache<R>,
    ) -> Option<&'a MagCache<R>> {
        let mem = self.alloc_meta(env, &self.child_caches)?;
        let fresh = mem.cast::<MagCache<R>>().as_ptr();
        // SAFETY: a fresh object of the child-cache cache, sized and aligned
        // for a `MagCache`.
        unsafe { fresh.write(MagCache::new(*base.cache.geometry(), Acct::Counter(&g.counter))) };
        match g.caches[idx].compare_exchange(core::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                g.get();
                // SAFETY: just published; lives as long as the group, on
                // which it holds a reference until it is dead and empty.
                let c = unsafe { &*fresh };
                // Pairs with the fence in `remove` (Dekker): either removal
                // sees this cache and marks it dead, or this sees the group
                // offline and does; a cache published after removal never
                // stays live, pinning its group.
                fence(Ordering::SeqCst);
                if g.is_offline() {
                    c.cache.mark_dead();
                }
                Some(c)
            }
            Err(winner) => {
                // SAFETY: ours, never published, holds nothing.
                unsafe { self.child_caches.free(&Pages::plain(env.src()), mem) };
                // SAFETY: the published one lives as long as the group.
                Some(unsafe { &*winner })
            }
        }
    }

    /// After a free into `owner`: a dead cache that just lost its last
    /// slab lets go of its group (once). The cache itself stays reachable
    /// from its group, which frees it with the group.
    #[inline]
    pub(crate) fn after_free(&self, owner: &MagCache<R>) {
        if owner.cache.is_dead() {
            self.release_if_empty(owner);
        }
    }

    #[cold]
    pub(super) fn release_if_empty(&self, c: &MagCache<R>) {
        if let Acct::Counter(k) = c.acct
            && c.take_empty_dead()
        {
            // SAFETY: a child cache's counter is its group's, and the
            // cache's reference keeps the group alive until this put.
            self.put_group(unsafe { self.group_of_counter(k) });
        }
    }

    /// Lets every dead cache that is empty by now release its group.
    pub(super) fn release_empty_dead(&self) {
        self.for_each_group(|g| {
            g.for_each_cache(|_, c| {
                if c.cache.is_dead() {
                    self.release_if_empty(c)
                }
            })
        });
    }
}
