//! A group's life: creation, removal, references, and the reclamation of
//! groups (and what waits with them in [`Limbo`]) once no iteration runs.
//! See the tree module's *Lifecycle of a group*.

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::lists::{push_doubly, unlink_doubly};
use super::{CacheDesc, Tree, ids, mode, names};
use crate::cgroup::pressure::PressureNode;
use crate::cgroup::{FREED, Group, TokenHead};
use crate::error::{Error, Name};
use crate::magazine::{Env, MagCache};
use crate::slab::{Cache, Pages};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering, fence};

/// What waits for no iteration to be in progress before it is freed:
/// groups unlinked from `all_groups` (linked through `next_zombie`), child
/// caches taken out of their group when their typed cache was destroyed
/// (through `MagCache::retired_next`), and destroyed caches' descriptors
/// unlinked from the registry (through `CacheDesc::retired_next`).
pub(crate) struct Limbo<R: RawMutex> {
    groups: *mut Group<R>,
    caches: *mut MagCache<R>,
    descs: *mut CacheDesc<R>,
    /// Pressure resource nodes made for descendants that are all gone
    /// (see `PressureNode`), unlinked from their groups' lists.
    pnodes: *mut PressureNode,
    /// The id table's pages, detached when the last group went.
    ids: Option<ids::Detached>,
    /// The sibling-name index (not something waiting: kept here because
    /// it changes only under the tree lock).
    names: names::Names,
}

// SAFETY: what is in limbo is owned by the lists, which are only reached
// under the tree lock.
unsafe impl<R: RawMutex> Send for Limbo<R> {}

impl<R: RawMutex> Limbo<R> {
    pub(super) const fn new() -> Self {
        Limbo {
            groups: core::ptr::null_mut(),
            caches: core::ptr::null_mut(),
            descs: core::ptr::null_mut(),
            pnodes: core::ptr::null_mut(),
            ids: None,
            names: names::Names::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.groups.is_null()
            && self.caches.is_null()
            && self.descs.is_null()
            && self.pnodes.is_null()
            && self.ids.is_none()
    }

    /// Queues a pressure resource node unlinked from its group's list.
    pub(crate) fn retire_pressure_node(&mut self, n: NonNull<PressureNode>) {
        // SAFETY: a live node (caller).
        unsafe { n.as_ref() }.retired_next().store(self.pnodes, Ordering::Relaxed);
        self.pnodes = n.as_ptr();
    }

    /// Queues a charged cache taken out of the tree with its typed cache
    /// (the pointer the tree held, which it is freed through).
    pub(super) fn retire_cache(&mut self, c: NonNull<MagCache<R>>) {
        // SAFETY: a live charged cache (caller).
        unsafe { c.as_ref() }.retired_next.store(self.caches, Ordering::Relaxed);
        self.caches = c.as_ptr();
    }

    /// Queues a descriptor unlinked from the registry (the pointer the
    /// registry held, which it is freed through).
    pub(super) fn retire_desc(&mut self, d: NonNull<CacheDesc<R>>) {
        // SAFETY: a live descriptor (caller).
        unsafe { d.as_ref() }.retired_next.store(self.descs, Ordering::Relaxed);
        self.descs = d.as_ptr();
    }
}

/// Keeps what is unlinked from being freed while it lives; see
/// [`Tree::read_guard`].
pub(crate) struct ReadGuard<'a> {
    readers: &'a AtomicUsize,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.readers.fetch_sub(1, Ordering::Release);
    }
}

impl<R: RawMutex> Tree<R> {
    /// `TokenHead::release` of this tree's groups: drops the reference a
    /// current-group token held.
    ///
    /// # Safety
    ///
    /// `head` starts a live group of the tree its `owner` names, which is
    /// a `Tree<R>` still at that address, and the caller gives up one
    /// reference on it.
    unsafe fn release_token(head: NonNull<TokenHead>) {
        // SAFETY: caller contract: the head of a live group of this type,
        // made by the tree it names, which is still in place (groups
        // already require that: their counters' parent is its root's).
        unsafe {
            let g = Group::<R>::of_head(head.as_ptr());
            (*g.tree_id().cast::<Self>()).put_group(g);
        }
    }

    /// `TokenHead::acquire` of this tree's groups: takes a reference.
    ///
    /// # Safety
    ///
    /// `head` starts a live group of this type (made by a `Tree<R>`).
    unsafe fn acquire_token(head: NonNull<TokenHead>) {
        // SAFETY: caller contract: the head of a live group of this type.
        unsafe { Group::<R>::of_head(head.as_ptr()) }.get();
    }

    /// Creates a child of `parent` named `name` (checked by the caller);
    /// the caller owns one reference on the group returned.
    pub(crate) fn create_child<E: Env<R>>(
        &self,
        env: &E,
        parent: &Group<R>,
        name: Name,
    ) -> Result<NonNull<Group<R>>, Error> {
        let check = |limbo: &Limbo<R>| {
            if parent.is_offline() {
                Err(Error::Removed)
            }
            // SAFETY: indexed groups are live: they leave the index at
            // removal, before they can be freed.
            else if unsafe { limbo.names.contains(parent, &name) } {
                Err(Error::NameTaken)
            } else {
                Ok(())
            }
        };
        let mut limbo = self.lock.lock();
        self.reclaim_groups(env, &mut limbo);
        check(&limbo)?;
        // Contention reclaim must not run under the tree lock (it takes it).
        drop(limbo);
        let mem = self.alloc_meta(env, &self.groups).ok_or(Error::OutOfMemory)?;
        let mut limbo = self.lock.lock();
        if let Err(e) = check(&limbo) {
            // SAFETY: ours, unused.
            unsafe { self.groups.free(&Pages::plain(env.src()), mem) };
            return Err(e);
        }
        let g = mem.cast::<Group<R>>();
        let token = g.as_ptr().cast::<u8>().wrapping_add(crate::cgroup::HEAD_OFFSET).cast_const().cast::<()>();
        let Some(index) = self.ids.insert(env.src(), token) else {
            // SAFETY: ours, unused.
            unsafe { self.groups.free(&Pages::plain(env.src()), mem) };
            return Err(Error::OutOfMemory);
        };
        // SAFETY: a fresh object of the group cache, sized and aligned for a
        // `Group`; the parent outlives it (it holds a reference on it).
        unsafe {
            g.as_ptr().write(Group::new_child(parent, self.id(), [Self::release_token, Self::acquire_token], name));
            core::ptr::addr_of_mut!((*g.as_ptr()).index).write(index);
            // The way back from the counter, with the group's provenance;
            // before anyone can see the group.
            core::ptr::addr_of_mut!((*g.as_ptr()).counter.owner).write(g.as_ptr().cast_const().cast());
            if !limbo.names.insert(env.src(), g.as_ref()) {
                self.ids.remove(index);
                core::ptr::drop_in_place(g.as_ptr());
                self.groups.free(&Pages::plain(env.src()), mem);
                return Err(Error::OutOfMemory);
            }
            // Publish the initialised group (pairs with Acquire in walks).
            push_doubly(&parent.first_child, g, |x| &x.next_sibling, |x| &x.prev_sibling);
            push_doubly(&self.all_groups, g, |x| &x.next_all, |x| &x.prev_all);
            env.slots().set_mode(mode::GROUPS, true);
            // The group starts with its online reference; the caller's.
            g.as_ref().get();
        }
        // The child holds a reference on its parent.
        parent.get();
        Ok(g)
    }

    /// Removes `g` (see `Cgroup::remove`).
    pub(crate) fn remove<E: Env<R>>(&self, env: &E, g: &Group<R>) -> Result<(), Error> {
        if self.is_root(g) {
            return Err(Error::RootGroup);
        }
        let mut limbo = self.lock.lock();
        if g.is_offline() {
            return Err(Error::Removed);
        }
        if g.children().next().is_some() {
            return Err(Error::Busy);
        }
        if let Some(parent) = g.parent() {
            // SAFETY: siblings are live, and we hold the tree lock;
            // indexed groups are live.
            unsafe {
                unlink_doubly(&parent.first_child, g, |x| &x.next_sibling, |x| &x.prev_sibling);
                limbo.names.remove(env.src(), g);
            }
        }
        g.mark_removed();
        // A removed group protects nothing (Linux resets both at offline):
        // what its objects hold is reclaimed with its parent's.
        g.counter.set_min(0);
        g.counter.set_low(0);
        // Pairs with the fence after a stock takes the group (see
        // `objects`): either that holder sees the group offline, or the
        // drain below sees its stock.
        fence(Ordering::SeqCst);
        g.counter.drain_stock();
        // Its objects stay charged to it until freed; what stocks hold
        // beyond them goes now, so nothing but its live objects keeps it.
        self.drain_stocks_of(env, g);
        // Drop the online reference; handles keep the group until dropped.
        self.put_group(g);
        self.reclaim_groups(env, &mut limbo);
        Ok(())
    }

    /// Starts an iteration of groups, their caches or the registry: what is
    /// unlinked from now on is not freed until the guard drops.
    pub(crate) fn read_guard(&self) -> ReadGuard<'_> {
        self.readers.fetch_add(1, Ordering::Relaxed);
        // Pairs with the fence in `reclaim_groups`: either it sees this
        // reader, or this reader sees its unlinks (Dekker).
        fence(Ordering::SeqCst);
        ReadGuard { readers: &self.readers }
    }

    /// Drops a reference on `g`; the last one hands it to reclamation.
    pub(crate) fn put_group(&self, g: &Group<R>) {
        if !self.is_root(g) && g.put() {
            // Only an identity on the stack: reclamation frees the group
            // through the pointer `all_groups` holds (see `unlink`).
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
    /// `all_groups`, and once no iteration is in progress, frees them, what
    /// else waits in `limbo`, and drops their parents' references (which
    /// may free the parents in turn). Called with the tree lock held.
    pub(crate) fn reclaim_groups<E: Env<R>>(&self, env: &E, limbo: &mut Limbo<R>) {
        loop {
            let mut z = self.zombies.swap(core::ptr::null_mut(), Ordering::Acquire);
            while let Some(g) = NonNull::new(z) {
                // SAFETY: a zombie is ours (its last reference is gone), and
                // still linked in `all_groups`, so live.
                let gr = unsafe { g.as_ref() };
                z = gr.next_zombie.load(Ordering::Relaxed);
                // Its id names nothing from here on (before the fence below).
                self.ids.remove(gr.index);
                // SAFETY: linked groups are live, and we hold the tree lock.
                let g = unsafe { unlink_doubly(&self.all_groups, gr, |x| &x.next_all, |x| &x.prev_all) };
                // SAFETY: as above; `g` is the same group.
                unsafe { g.as_ref() }.next_zombie.store(limbo.groups, Ordering::Relaxed);
                limbo.groups = g.as_ptr();
            }
            if self.all_groups.load(Ordering::Relaxed).is_null() {
                env.slots().set_mode(mode::GROUPS, false);
                // No id names a group now: the table's pages go too, once
                // no lookup can be reading them (before the fence below).
                if limbo.ids.is_none() {
                    limbo.ids = self.ids.detach();
                }
            }
            // Pairs with the fence in `read_guard`.
            fence(Ordering::SeqCst);
            // Acquire: the readers' last accesses happen before the frees.
            if limbo.is_empty() || self.readers.load(Ordering::Acquire) != 0 {
                return;
            }
            let caches = core::mem::replace(&mut limbo.caches, core::ptr::null_mut());
            // SAFETY: each was taken out of the tree with its typed cache
            // (so unreachable now that no iteration runs), is empty, and
            // is an object of `charged_caches`.
            unsafe { self.free_chain(env, caches, &self.charged_caches, |c| &c.retired_next) };
            let descs = core::mem::replace(&mut limbo.descs, core::ptr::null_mut());
            // SAFETY: each was unlinked from the registry (so unreachable
            // now that no iteration runs), its cache empty, and is an
            // object of `descriptors`.
            unsafe { self.free_chain(env, descs, &self.descriptors, |d| &d.retired_next) };
            let pnodes = core::mem::replace(&mut limbo.pnodes, core::ptr::null_mut());
            // Each was unlinked from its group's list (so unreachable now
            // that no iteration runs: every walk of a live group's list
            // holds a read guard or the tree lock) and is counted by no
            // node below.
            // SAFETY: so nothing reaches them; objects of `pressure_nodes`.
            unsafe { self.free_chain(env, pnodes, &self.pressure_nodes, |n| n.retired_next()) };
            if let Some(pages) = limbo.ids.take() {
                // SAFETY: detached before the fence above, and no lookup
                // runs (no reader): nothing can reach them.
                unsafe { pages.free(env.src()) };
            }
            let mut l = core::mem::replace(&mut limbo.groups, core::ptr::null_mut());
            while let Some(g) = NonNull::new(l) {
                // SAFETY: unlinked, unreferenced, and no iteration can reach
                // it: ours to free.
                unsafe {
                    l = g.as_ref().next_zombie.load(Ordering::Relaxed);
                    self.free_group(env, g, limbo);
                }
            }
            // Round again for nodes the frees retired (freed once no
            // reader can be on them) as for zombies they made.
            if self.zombies.load(Ordering::Relaxed).is_null() && limbo.pnodes.is_null() {
                return;
            }
        }
    }

    /// Drops and frees every object of the chain from `head`, linked by
    /// `next`, into `cache`.
    ///
    /// # Safety
    ///
    /// Every object of the chain is an object of `cache` that nothing can
    /// reach any more.
    unsafe fn free_chain<T, E: Env<R>>(
        &self,
        env: &E,
        head: *mut T,
        cache: &Cache<R>,
        next: impl Fn(&T) -> &AtomicPtr<T>,
    ) {
        let mut cur = head;
        while let Some(obj) = NonNull::new(cur) {
            // SAFETY: per the contract.
            unsafe {
                cur = next(obj.as_ref()).load(Ordering::Relaxed);
                Self::free_object(env, obj, cache);
            }
        }
    }

    /// Drops `obj` and frees it into `cache`.
    ///
    /// # Safety
    ///
    /// `obj` is an object of `cache` that nothing can reach any more.
    unsafe fn free_object<T, E: Env<R>>(env: &E, obj: NonNull<T>, cache: &Cache<R>) {
        // SAFETY: per the contract.
        unsafe {
            obj.as_ptr().drop_in_place();
            cache.free(&Pages::plain(env.src()), obj.cast());
        }
    }

    /// Frees a reclaimed group's caches and the group, and drops its
    /// reference on its parent.
    ///
    /// # Safety
    ///
    /// `g` is unlinked everywhere, unreferenced, and no iteration is in
    /// progress.
    unsafe fn free_group<E: Env<R>>(&self, env: &E, g: NonNull<Group<R>>, limbo: &mut Limbo<R>) {
        // SAFETY: per the contract.
        let gr = unsafe { g.as_ref() };
        // Nothing may stay charged to the ancestors through this group.
        gr.counter.drain_stock();
        debug_assert_eq!(gr.counter.usage(), 0, "a reclaimed group still holds charges");
        debug_assert_eq!(gr.obj_pages.load(Ordering::Relaxed), 0, "a reclaimed group still holds objects");
        // Bytes charged through its pressure resources, which no handle
        // can give back now, leave its ancestors' resources.
        gr.give_back_pressures();
        for node in gr.pressure_nodes() {
            // SAFETY: a node of a group being freed, whose ancestors live
            // (it holds a reference on its parent until the end).
            unsafe { node.leave_above(|n| limbo.retire_pressure_node(n)) };
        }
        let nodes = gr.pressures.load(Ordering::Relaxed);
        // SAFETY: the group's resources, which nothing can reach once the
        // group cannot be (handles keep the group), objects of
        // `pressure_nodes`.
        unsafe { self.free_chain(env, nodes, &self.pressure_nodes, |n| n.next()) };
        let parent = gr.parent().map(NonNull::from);
        gr.head.state.store(FREED, Ordering::Release);
        // SAFETY: per the contract; the group is an object of `groups`.
        unsafe { Self::free_object(env, g, &self.groups) };
        if let Some(p) = parent {
            // SAFETY: a group's parent outlives it.
            self.put_group(unsafe { p.as_ref() });
        }
    }
}
