//! The group lifecycle of a `Kmem`: references and the current-group
//! token's release, the zombie stack, reclamation under the tree lock once
//! no iteration runs (groups, and the child caches and descriptors of
//! destroyed typed caches), releasing dead caches' groups, and the read
//! guard that iterations of groups and descriptors hold.

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::Kmem;
use super::typed::CacheDesc;
use crate::cgroup::{Group, RECLAIMING, TokenHead, untag};
use crate::magazine::{Acct, MagCache};
use crate::platform::{PageSource, Platform};
use crate::slab::{Cache, Pages};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// What waits for no iteration to be in progress before it is freed:
/// groups unlinked from `all_groups` (linked through `next_zombie`), child
/// caches taken out of their group when their typed cache was destroyed
/// (through `MagCache::retired_next`), and destroyed caches' descriptors
/// unlinked from the registry (through `CacheDesc::retired_next`).
pub(crate) struct Limbo<R: RawMutex> {
    head: *mut Group<R>,
    caches: *mut MagCache<R>,
    descs: *mut CacheDesc<R>,
}

/// Unlinks `item` from the singly linked list at `head` (links `next`)
/// and returns the pointer the list held: the one made when the item was
/// allocated, with the provenance of its memory, which it is freed
/// through (a pointer made from a shared reference may only read). An
/// item not found (not linked) comes back as given.
///
/// # Safety
///
/// Every item linked from `head` is live, and the caller holds the lock
/// under which the links change.
pub(super) unsafe fn unlink<T>(head: &AtomicPtr<T>, item: &T, next: impl Fn(&T) -> &AtomicPtr<T>) -> NonNull<T> {
    let me = item as *const T as *mut T;
    let after = next(item).load(Ordering::Relaxed);
    let first = head.load(Ordering::Relaxed);
    if first == me {
        head.store(after, Ordering::Release);
        // SAFETY: equal to `me`, which is not null.
        return unsafe { NonNull::new_unchecked(first) };
    }
    let mut cur = first;
    while let Some(c) = NonNull::new(cur) {
        // SAFETY: linked items are live (caller contract).
        let c = unsafe { c.as_ref() };
        let n = next(c).load(Ordering::Relaxed);
        if n == me {
            next(c).store(after, Ordering::Release);
            // SAFETY: equal to `me`, which is not null.
            return unsafe { NonNull::new_unchecked(n) };
        }
        cur = n;
    }
    NonNull::from(item)
}

/// Calls `f` on every item of the singly linked list at `head` (links
/// `next`), first to last.
///
/// # Safety
///
/// Every item reachable from `head` stays live during the walk (the
/// caller holds a read guard, or the lock under which links change).
unsafe fn walk<T>(head: &AtomicPtr<T>, next: impl Fn(&T) -> &AtomicPtr<T>, mut f: impl FnMut(&T)) {
    let mut cur = head.load(Ordering::Acquire);
    while let Some(p) = NonNull::new(cur) {
        // SAFETY: reachable, so live (caller contract).
        let item = unsafe { p.as_ref() };
        f(item);
        cur = next(item).load(Ordering::Acquire);
    }
}

// SAFETY: what is in limbo is owned by the lists, which are only reached
// under the tree lock.
unsafe impl<R: RawMutex> Send for Limbo<R> {}

impl<R: RawMutex> Limbo<R> {
    pub(super) const fn new() -> Self {
        Limbo { head: core::ptr::null_mut(), caches: core::ptr::null_mut(), descs: core::ptr::null_mut() }
    }

    fn is_empty(&self) -> bool {
        self.head.is_null() && self.caches.is_null() && self.descs.is_null()
    }

    /// Queues a child cache taken out of its group (the pointer the group
    /// held, which it is freed through).
    pub(crate) fn retire_cache(&mut self, c: NonNull<MagCache<R>>) {
        // SAFETY: a live child cache (caller).
        unsafe { c.as_ref() }.retired_next.store(self.caches, Ordering::Relaxed);
        self.caches = c.as_ptr();
    }

    /// Queues a descriptor unlinked from the registry (the pointer the
    /// registry held, which it is freed through).
    pub(crate) fn retire_desc(&mut self, d: NonNull<CacheDesc<R>>) {
        // SAFETY: a live descriptor (caller).
        unsafe { d.as_ref() }.retired_next.store(self.descs, Ordering::Relaxed);
        self.descs = d.as_ptr();
    }
}

/// Keeps unlinked groups (and their caches) from being freed while it
/// lives; see [`Kmem::read_guard`].
pub(crate) struct ReadGuard<'a> {
    readers: &'a AtomicUsize,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.readers.fetch_sub(1, Ordering::Release);
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// `TokenHead::release` of this allocator's groups: drops the
    /// reference a current-group token held.
    ///
    /// # Safety
    ///
    /// `head` starts a live group of the `Kmem` its `owner` names, which is
    /// a `Kmem<S, R, P>` still at that address, and the caller gives up
    /// one reference on it.
    pub(super) unsafe fn release_token(head: NonNull<TokenHead>) {
        // SAFETY: caller contract: the head of a live group of this type,
        // made by the allocator it names, which is still in place (groups
        // already require that: their counters' parent is its root's).
        unsafe {
            let g = Group::<R>::of_head(head.as_ptr());
            let k = &*g.head.owner.cast::<Self>();
            k.put_group(g);
        }
    }

    /// The token head of a new group of this allocator.
    pub(crate) fn token_head(&self) -> TokenHead {
        TokenHead { owner: self.id(), release: Self::release_token }
    }

    /// Makes `token` (untagged) the calling context's current group and
    /// returns the token it replaces, with its reference. The context's
    /// `RECLAIMING` mark stays as it is: it belongs to the running context
    /// (a shrinker that enters or leaves a group stays marked), not to the
    /// token. The caller hands over the reference `token` carries.
    pub(crate) fn swap_token(&self, token: *const ()) -> *const () {
        let mark = self.platform.current_group().addr() & RECLAIMING;
        self.platform.set_current_group(untag(token).map_addr(|a| a | mark))
    }

    /// Starts an iteration of groups or their caches: groups unlinked from
    /// now on are not freed until the guard drops.
    pub(crate) fn read_guard(&self) -> ReadGuard<'_> {
        self.readers.fetch_add(1, Ordering::Relaxed);
        // Pairs with the fence in `reclaim_groups`: either it sees this
        // reader, or this reader sees its unlinks (Dekker).
        crate::sync::fence(Ordering::SeqCst);
        ReadGuard { readers: &self.readers }
    }

    /// Drops a reference on `g`; the last one hands it to reclamation.
    pub(crate) fn put_group(&self, g: &Group<R>) {
        if !core::ptr::eq(g, &self.root) && g.put() {
            // Only an identity on the stack: reclamation frees the group
            // through the pointer `all_groups` holds (see `unlink_all`).
            let gp = g as *const Group<R> as *mut Group<R>;
            let mut head = self.zombies.load(Ordering::Relaxed);
            loop {
                // Relaxed: published by the Release of the push below.
                g.next_zombie.store(head, Ordering::Relaxed);
                match self.zombies.compare_exchange_weak(head, gp, Ordering::Release, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(h) => head = h,
                }
            }
        }
    }

    /// Frees the groups whose last reference is gone: unlinks them from
    /// `all_groups`, and once no iteration is in progress, frees their
    /// caches and themselves and drops their parent's reference (which may
    /// free the parent in turn). Called with the tree lock held, from
    /// group creation and removal, `shrink` and `reap`.
    pub(crate) fn reclaim_groups(&self, limbo: &mut Limbo<R>) {
        loop {
            let mut z = self.zombies.swap(core::ptr::null_mut(), Ordering::Acquire);
            while let Some(g) = NonNull::new(z) {
                // SAFETY: a zombie is ours (its last reference is gone), and
                // still linked in `all_groups`, so live.
                let gr = unsafe { g.as_ref() };
                z = gr.next_zombie.load(Ordering::Relaxed);
                let g = self.unlink_all(gr);
                // SAFETY: as above; `g` is the same group.
                unsafe { g.as_ref() }.next_zombie.store(limbo.head, Ordering::Relaxed);
                limbo.head = g.as_ptr();
            }
            // Pairs with the fence in `read_guard`.
            crate::sync::fence(Ordering::SeqCst);
            // Acquire: the readers' last accesses happen before the frees.
            if limbo.is_empty() || self.readers.load(Ordering::Acquire) != 0 {
                return;
            }
            self.free_retired(limbo);
            let mut l = core::mem::replace(&mut limbo.head, core::ptr::null_mut());
            while let Some(g) = NonNull::new(l) {
                // SAFETY: unlinked, unreferenced, and no iteration can reach
                // it: ours to free.
                unsafe {
                    l = g.as_ref().next_zombie.load(Ordering::Relaxed);
                    self.free_group(g);
                }
            }
            if self.zombies.load(Ordering::Relaxed).is_null() {
                return;
            }
        }
    }

    /// Frees the child caches and descriptors waiting in `limbo`: no
    /// iteration is in progress, so nothing can reach them.
    pub(super) fn free_retired(&self, limbo: &mut Limbo<R>) {
        let caches = core::mem::replace(&mut limbo.caches, core::ptr::null_mut());
        // SAFETY: each was taken out of its group (so unreachable now that
        // no iteration runs), is empty, and is an object of `child_caches`.
        unsafe { self.free_chain(caches, &self.child_caches, |c| &c.retired_next) };
        let descs = core::mem::replace(&mut limbo.descs, core::ptr::null_mut());
        // SAFETY: each was unlinked from the registry (so unreachable now
        // that no iteration runs), its cache empty, and is an object of
        // `descriptors`.
        unsafe { self.free_chain(descs, &self.descriptors, |d| &d.retired_next) };
    }

    /// Drops and frees every object of the chain from `head`, linked by
    /// `next`, into `cache`.
    ///
    /// # Safety
    ///
    /// Every object of the chain is an object of `cache` that nothing can
    /// reach any more.
    pub(super) unsafe fn free_chain<T>(&self, head: *mut T, cache: &Cache<R>, next: impl Fn(&T) -> &AtomicPtr<T>) {
        let plain = Pages::plain(&self.source);
        let mut cur = head;
        while let Some(obj) = NonNull::new(cur) {
            // SAFETY: per the contract.
            unsafe {
                cur = next(obj.as_ref()).load(Ordering::Relaxed);
                obj.as_ptr().drop_in_place();
                cache.free(&plain, obj.cast());
            }
        }
    }

    /// Unlinks `g` from `all_groups` (tree lock held) and returns the
    /// pointer the list held, which reclamation frees through (see
    /// [`unlink`]).
    pub(super) fn unlink_all(&self, g: &Group<R>) -> NonNull<Group<R>> {
        // SAFETY: linked groups are live, and links change only under the
        // tree lock, which the caller holds.
        unsafe { unlink(&self.all_groups, g, |x| &x.next_all) }
    }

    /// Frees a reclaimed group's caches and the group, and drops its
    /// reference on its parent.
    ///
    /// # Safety
    ///
    /// `g` is unlinked everywhere, unreferenced, and no iteration is in
    /// progress.
    pub(super) unsafe fn free_group(&self, g: NonNull<Group<R>>) {
        let plain = Pages::plain(&self.source);
        // SAFETY: per the contract.
        let gr = unsafe { g.as_ref() };
        // Nothing may stay charged to the ancestors through this group.
        gr.counter.drain_stock();
        debug_assert_eq!(gr.counter.usage(), 0, "a reclaimed group still holds charges");
        for c in &gr.caches {
            if let Some(cache) = NonNull::new(c.load(Ordering::Relaxed)) {
                // SAFETY: a dead, empty child cache nobody can reach.
                unsafe {
                    cache.as_ptr().drop_in_place();
                    self.child_caches.free(&plain, cache.cast());
                }
            }
        }
        let parent = gr.parent;
        // SAFETY: per the contract; the group is an object of `groups`.
        unsafe {
            g.as_ptr().drop_in_place();
            self.groups.free(&plain, g.cast());
        }
        // SAFETY: a group's parent outlives it.
        if let Some(p) = unsafe { parent.as_ref() } {
            self.put_group(p);
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
            self.put_group(unsafe { Group::<R>::of_counter(k) });
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

    /// Calls `f` on every typed cache's descriptor in the registry, newest
    /// first.
    pub(crate) fn for_each_desc(&self, f: impl FnMut(&CacheDesc<R>)) {
        let _read = self.read_guard();
        // SAFETY: the read guard keeps every descriptor reachable from the
        // registry alive, unlinked or not.
        unsafe { walk(&self.registry, |d| &d.next, f) }
    }

    /// Calls `f` on every group but the root that is not yet reclaimed
    /// (removed ones included).
    pub(crate) fn for_each_group(&self, f: impl FnMut(&Group<R>)) {
        let _read = self.read_guard();
        // SAFETY: the read guard keeps every group reachable from the list
        // alive, unlinked or not.
        unsafe { walk(&self.all_groups, |g| &g.next_all, f) }
    }
}
