//! The registry of typed caches: their descriptors, and destroying a
//! cache with the charged cache groups' objects of it came from.

use core::fmt;
use core::mem::{align_of, size_of};
use core::ptr::NonNull;

use lock_api::RawMutex;

use super::Tree;
use super::lifecycle::Limbo;
use super::lists::{unlink, walk};
use crate::error::{Error, Name};
use crate::magazine::{Acct, Env, MagCache};
use crate::slab::classes::CLASS_SIZES;
use crate::slab::{Geometry, Pages};
use crate::sync::{AtomicBool, AtomicPtr, Ordering, atomic_bool, atomic_null, spin_hint};

/// A typed cache's descriptor, kept in the tree's own `descriptors` cache
/// (self-hosting) and linked into its registry.
///
/// Everything but the atomics is fixed once the descriptor is published,
/// so lock-free readers of the registry (under a read guard) may read it.
/// When its `KmemCache` is dropped, the descriptor is unlinked and freed
/// once no iteration is in progress, unless objects of it were leaked
/// (`mem::forget` of a box): then it stays, dead, since slabs still name
/// it.
pub(crate) struct CacheDesc<R: RawMutex> {
    pub(crate) cache: MagCache<R>,
    pub(crate) name: Name,
    /// Set while a `KmemCache` handle owns the descriptor.
    pub(crate) live: AtomicBool,
    /// Created with `ACCOUNT`: groups' objects come from the charged
    /// cache `cache.charged` names (null until first use).
    pub(crate) accounted: bool,
    /// The next older descriptor; changed under the registry lock
    /// (`Release`), read by iterations (`Acquire`).
    pub(super) next: AtomicPtr<CacheDesc<R>>,
    /// Link in the tree lock's list of descriptors waiting to be freed.
    pub(super) retired_next: AtomicPtr<CacheDesc<R>>,
}

/// Drain-and-look rounds before a destroyed cache that still holds slabs
/// is taken to have leaked objects.
const DESTROY_TRIES: usize = 64;

impl<R: RawMutex> CacheDesc<R> {
    /// Slab geometry of the descriptor cache.
    pub(crate) const GEOMETRY: Geometry = match Geometry::new(size_of::<Self>(), align_of::<Self>()) {
        Some(g) => g,
        None => panic!("cache descriptor does not fit a slab"),
    };
}

impl<R: RawMutex> Tree<R> {
    /// Registers a cache of `geo` objects named `name` (unique among live
    /// caches), with an accounting index if `accounted`.
    pub(crate) fn register_cache<E: Env<R>>(
        &self,
        env: &E,
        name: Name,
        geo: Geometry,
        accounted: bool,
    ) -> Result<&CacheDesc<R>, Error> {
        // The descriptor's memory first, with no lock held: when the page
        // source is dry, contention reclaim may run for it (it takes the
        // tree lock, and its shrinkers may register caches themselves).
        let mem = self.alloc_meta(env, &self.descriptors).ok_or(Error::OutOfMemory)?;
        let refuse = |e| {
            // SAFETY: ours, never written, unused.
            unsafe { self.descriptors.free(&Pages::plain(env.src()), mem) };
            Err(e)
        };
        let _registry = self.registry_lock.lock();
        let mut taken = false;
        self.for_each_desc(|d| taken |= d.name == name && d.live.load(Ordering::Relaxed));
        if taken {
            return refuse(Error::NameTaken);
        }
        let p = mem.cast::<CacheDesc<R>>();
        // SAFETY: `mem` is a fresh object of the descriptor cache, sized and
        // aligned for `CacheDesc<R>`.
        unsafe {
            p.as_ptr().write(CacheDesc {
                cache: MagCache::new(geo, if accounted { Acct::Root } else { Acct::None }),
                name,
                live: atomic_bool(true),
                accounted,
                next: AtomicPtr::new(self.registry.load(Ordering::Relaxed)),
                retired_next: atomic_null(),
            });
        }
        // Publishes the initialised descriptor to lock-free readers (pairs
        // with their Acquire loads of `registry`).
        self.registry.store(p.as_ptr(), Ordering::Release);
        // SAFETY: just initialised; freed only after `destroy_cache`.
        Ok(unsafe { &*p.as_ptr() })
    }

    /// Destroys the cache of `desc`, whose handle is being dropped and
    /// whose objects are all freed (or leaked): see [`CacheDesc`].
    ///
    /// # Safety
    ///
    /// `desc` is a live descriptor of this tree, from `register_cache`,
    /// whose handle is being dropped: this call may free it.
    pub(crate) unsafe fn destroy_cache<E: Env<R>>(&self, env: &E, desc: NonNull<CacheDesc<R>>) {
        // The descriptor arrives as a pointer and is borrowed only in this
        // body: `reclaim_groups` below may free it, and a reference
        // argument stays protected for the whole call (Stacked Borrows
        // rejects the drop of a protected descriptor).
        // SAFETY: live until freed below (caller contract); not used after.
        let desc = unsafe { desc.as_ref() };
        // Objects of the cache waiting in the detection quarantine still
        // sit in its slabs: give them back before the drain below (with no
        // lock held), or the cache looks leaked and keeps its index; and
        // wait for those another thread's eviction took out and is giving
        // back (that thread may be inside the cache after the object's
        // slab went: a review found it reading the descriptor after).
        env.flush_deferred();
        let settled = env.settle_deferred();
        let _registry = self.registry_lock.lock();
        desc.live.store(false, Ordering::Relaxed);
        let mut limbo = self.lock.lock();
        // Empty the cache (and its charged cache) of cached objects and
        // slabs; a slab left means a leaked object still names the cache,
        // or one is still on its way back (an eviction slower than the
        // wait above): the descriptor then stays, dead, and a later
        // `shrink` or `reap` retires it once nothing is in transit and its
        // slabs are gone (`retire_dead_caches`). A concurrent drain
        // (`reap`, `shrink`) may hold some of the cache's magazines for a
        // moment: look again a few times before concluding that objects
        // were leaked.
        if settled {
            for _ in 0..DESTROY_TRIES {
                if self.drain_dead(env, desc) {
                    self.retire(&mut limbo, desc);
                    break;
                }
                spin_hint();
            }
        }
        self.reclaim_groups(env, &mut limbo);
    }

    /// Retires the dead descriptors whose caches hold no slab any more:
    /// caches destroyed while some of their objects were on their way back
    /// from the quarantine, which `shrink` and `reap` (which call it,
    /// through `finish_reclaim`, after their drains) have emptied since.
    /// The caller holds the registry lock, `limbo` is the tree lock's, and
    /// no object is on its way back from the quarantine
    /// (`Env::deferred_settled`): no object of a dead cache can enter the
    /// quarantine again, so none is being given back into these caches.
    pub(super) fn retire_dead_caches(&self, limbo: &mut Limbo<R>) {
        loop {
            let mut empty = None;
            self.for_each_desc(|d| {
                if empty.is_none() && !d.live.load(Ordering::Relaxed) && self.holds_no_slab(d) {
                    empty = Some(NonNull::from(d));
                }
            });
            let Some(d) = empty else { break };
            // SAFETY: linked, so live; only the registry lock (the
            // caller's) unlinks it.
            self.retire(limbo, unsafe { d.as_ref() });
        }
    }

    /// Whether neither the cache of `desc` nor its charged cache holds a
    /// slab: no object of it is left anywhere (an object in a magazine or
    /// on its way back from the quarantine keeps its slab).
    fn holds_no_slab(&self, desc: &CacheDesc<R>) -> bool {
        let mut empty = true;
        self.for_each_cache_part(desc, |c| empty &= c.cache.nslabs() == 0);
        empty
    }

    /// Empties the dead cache of `desc` (and its charged cache) of cached
    /// objects and slabs; whether no slab is left. The caller holds the
    /// registry and tree locks.
    fn drain_dead<E: Env<R>>(&self, env: &E, desc: &CacheDesc<R>) -> bool {
        Self::drain_and_shrink(env, |f| self.for_each_cache_part(desc, |c| f(c)));
        self.holds_no_slab(desc)
    }

    /// Unlinks the dead, empty descriptor `desc` and queues it and its
    /// charged cache for freeing once no iteration runs. The caller holds
    /// the registry lock; `limbo` is the tree lock's.
    fn retire(&self, limbo: &mut Limbo<R>, desc: &CacheDesc<R>) {
        if let Some(c) = NonNull::new(desc.cache.charged.swap(core::ptr::null_mut(), Ordering::AcqRel)) {
            limbo.retire_cache(c);
        }
        // SAFETY: linked descriptors are live, and links change only under
        // the registry lock, which the caller holds.
        let desc = unsafe { unlink(&self.registry, desc, |d| &d.next) };
        limbo.retire_desc(desc);
    }

    /// Calls `f` on the cache of `desc` and on its charged cache, if it has
    /// one.
    pub(crate) fn for_each_cache_part(&self, desc: &CacheDesc<R>, mut f: impl FnMut(&MagCache<R>)) {
        // The charged cache may be freed by a shrink with no group left
        // (`release_charged`), once no read guard is held.
        let _read = self.read_guard();
        f(&desc.cache);
        // Freed only with the descriptor (which the caller's handle or
        // iteration keeps) or once no read guard is held.
        if let Some(c) = self.charged_of(&desc.cache) {
            f(c);
        }
    }

    /// Calls `f` on every typed cache's descriptor in the registry, newest
    /// first.
    pub(crate) fn for_each_desc(&self, f: impl FnMut(&CacheDesc<R>)) {
        let _read = self.read_guard();
        // SAFETY: the read guard keeps every descriptor reachable from the
        // registry alive, unlinked or not.
        unsafe { walk(&self.registry, |d| &d.next, f) }
    }
}

/// `kmalloc-<size>` for size class `c`.
pub(crate) fn class_name(c: usize) -> Name {
    let mut buf = [0u8; 16];
    let mut w = Cursor { buf: &mut buf, len: 0 };
    let _ = fmt::Write::write_fmt(&mut w, format_args!("kmalloc-{}", CLASS_SIZES[c]));
    let len = w.len;
    core::str::from_utf8(&buf[..len]).ok().and_then(|s| Name::new(s).ok()).unwrap_or(Name::UNKNOWN)
}

/// A `fmt::Write` into a byte buffer that truncates.
struct Cursor<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl fmt::Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = (self.len + s.len()).min(self.buf.len());
        let n = end - self.len;
        self.buf[self.len..end].copy_from_slice(&s.as_bytes()[..n]);
        self.len = end;
        Ok(())
    }
}
