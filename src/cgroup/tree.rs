//! The group tree of one allocator and its lifecycle: creation, removal,
//! references, the zombie stack, and reclamation of group metadata once
//! no iteration runs.
//!
//! # Lifecycle of a group
//!
//! 1. `create_child` links it under its parent and at the head of
//!    `all_groups`, with its *online* reference (and one for the caller).
//! 2. `remove` unlinks it from its parent, turns it offline and its caches
//!    dead, and drops the online reference.
//! 3. The last `put` (a handle, guard, child, child cache, large object,
//!    or a context's current-group token) pushes it on the zombie stack.
//! 4. `reclaim_groups`, under the tree lock, unlinks zombies from
//!    `all_groups` into the lock's [`Limbo`]; once no [`ReadGuard`] is
//!    held it frees them (their child caches first) and drops their
//!    parents' references, which may free those in turn.
//!
//! Child caches and descriptors of destroyed typed caches wait in the same
//! limbo (see `registry`).

use core::ptr::{self, NonNull};

use lock_api::{Mutex, RawMutex};

use super::{FREED, Group, OFFLINE, TokenHead};
use crate::counter::PageCounter;
use crate::error::{Error, Name};
use crate::magazine::{Acct, Env, MagCache};
use crate::platform::MAX_NODES;
use crate::slab::classes::{GEOMETRIES, NCLASSES};
use crate::slab::{Cache, Pages};
use crate::sync::{
    AtomicPtr, AtomicU32, AtomicUsize, CellArray, OneCell, Ordering, atomic_null, atomic_u32, atomic_usize, fence,
    loom_const_fn,
};

mod events;
mod ids;
mod protection;
mod reclaim;
mod registry;

pub use events::EventHook;
#[cfg(all(test, not(loom)))]
pub(crate) use reclaim::delay;
pub use reclaim::{
    GroupId, HIGH_DELAY_BATCH, HIGH_DELAY_MAX_NS, HIGH_DELAY_MIN_NS, HIGH_DELAY_NS, MAX_SHRINKERS, ShrinkControl,
    Shrinker,
};
use registry::AcctIndices;
pub(crate) use registry::{CacheDesc, NOT_ACCOUNTED, class_name};

/// The group tree of one allocator: the root group with its base caches,
/// every other group until it is reclaimed, the typed-cache registry, the
/// shrinkers, and the self-hosted caches their metadata lives in.
///
/// A `Tree` must stay at one address once a group exists: tokens and
/// groups record it (a `Kmem` is a `static` or leaked).
pub(crate) struct Tree<R: RawMutex> {
    /// The root group: its counter is the parent of every group's.
    pub(super) root: OneCell<Group<R>>,
    /// The size classes: the root's own caches, and the base caches every
    /// group's child caches of a class copy.
    pub(super) classes: CellArray<MagCache<R>, NCLASSES>,
    /// Every group but the root that is not yet reclaimed, newest first.
    /// Pushed with `Release` and unlinked under `lock`; iterated under a
    /// read guard.
    pub(super) all_groups: AtomicPtr<Group<R>>,
    /// What the allocation paths must do besides the plain fast path, in
    /// one word so that path tests it once ([`mode`]): `GROUPS` mirrors
    /// `all_groups` (set and cleared under `lock`), the other bits belong
    /// to the heap layer.
    pub(crate) mode: AtomicUsize,
    /// Serialises changes to the tree, subtree reclaim, and reclamation
    /// (never taken on an allocation fast path). Holds what was unlinked
    /// but not yet freed.
    pub(super) lock: Mutex<R, Limbo<R>>,
    /// Iterations of `all_groups` (and of groups' caches, and of the
    /// registry) in progress; what is unlinked is freed only when none is.
    readers: AtomicUsize,
    /// Groups whose last reference is gone, pushed lock-free (a Treiber
    /// stack: push by CAS, taken whole by swap, so no ABA).
    zombies: AtomicPtr<Group<R>>,
    /// Self-hosted metadata: groups.
    pub(crate) groups: OneCell<Cache<R>>,
    /// Self-hosted metadata: the child caches of groups.
    pub(crate) child_caches: OneCell<Cache<R>>,
    /// Self-hosted metadata: descriptors of typed caches.
    pub(crate) descriptors: OneCell<Cache<R>>,
    /// Typed caches, newest first. Pushed with `Release` and unlinked
    /// under `registry_lock`; read with `Acquire` without it, under a read
    /// guard: a destroyed cache's descriptor is unlinked and freed once no
    /// iteration is in progress (see [`Limbo`]), like a group.
    pub(super) registry: AtomicPtr<CacheDesc<R>>,
    /// Serialises cache creation and destruction (never taken on an
    /// allocation path); holds the free accounting indices. Taken before
    /// `lock`.
    pub(super) registry_lock: Mutex<R, AcctIndices>,
    /// Registered shrinkers (copied out before they are called).
    pub(super) shrinkers: Mutex<R, [Option<&'static dyn Shrinker>; MAX_SHRINKERS]>,
    /// Root usage (pages) above which allocations trigger contention
    /// reclaim; `usize::MAX`: only when the page source is exhausted.
    pub(super) contention_mark: AtomicUsize,
    /// Contention-reclaim episodes started (see `reclaim::Episode`).
    pub(super) episodes: AtomicU32,
    /// Groups' fault-injection rules.
    injections: super::inject::Table,
    /// The event hook: null, or a [`EventHook`] (see `events`).
    pub(super) event_hook: AtomicPtr<()>,
    /// Which index names which group, for ids handed back (see `ids`).
    ids: ids::Ids,
}

/// The bits of [`Tree::mode`]. Zero: no group but the root exists and no
/// special path is on, so an allocation takes the plain fast path.
pub(crate) mod mode {
    /// A group but the root exists (mirrors `Tree::all_groups`).
    pub(crate) const GROUPS: usize = 1;
    /// Memory-error detection is on (the heap layer's debug paths).
    pub(crate) const DEBUG: usize = 2;
    /// Some group armed fault injection (sticky).
    pub(crate) const INJECT: usize = 4;
    /// The heap has not yet read its debug settings from the environment.
    pub(crate) const ENV: usize = 8;
    /// Some group asked for its object bytes to be counted (sticky): the
    /// heap's special paths count them (`Cgroup::track_bytes`).
    pub(crate) const BYTES: usize = 16;
    /// Allocations take the detection path: always with red zones or
    /// poison, and while a sample is due with sampling alone (`DEBUG`
    /// stays set for the frees).
    pub(crate) const ARMED: usize = 32;
}

/// What waits for no iteration to be in progress before it is freed:
/// groups unlinked from `all_groups` (linked through `next_zombie`), child
/// caches taken out of their group when their typed cache was destroyed
/// (through `MagCache::retired_next`), and destroyed caches' descriptors
/// unlinked from the registry (through `CacheDesc::retired_next`).
pub(crate) struct Limbo<R: RawMutex> {
    groups: *mut Group<R>,
    caches: *mut MagCache<R>,
    descs: *mut CacheDesc<R>,
    /// The id table's pages, detached when the last group went.
    ids: Option<ids::Detached>,
}

// SAFETY: what is in limbo is owned by the lists, which are only reached
// under the tree lock.
unsafe impl<R: RawMutex> Send for Limbo<R> {}

impl<R: RawMutex> Limbo<R> {
    const fn new() -> Self {
        Limbo { groups: core::ptr::null_mut(), caches: core::ptr::null_mut(), descs: core::ptr::null_mut(), ids: None }
    }

    fn is_empty(&self) -> bool {
        self.groups.is_null() && self.caches.is_null() && self.descs.is_null() && self.ids.is_none()
    }

    /// Queues a child cache taken out of its group (the pointer the group
    /// held, which it is freed through).
    pub(super) fn retire_cache(&mut self, c: NonNull<MagCache<R>>) {
        // SAFETY: a live child cache (caller).
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
    let mut link = head;
    loop {
        let cur = link.load(Ordering::Relaxed);
        let Some(c) = NonNull::new(cur) else { return NonNull::from(item) };
        if cur == me {
            link.store(after, Ordering::Release);
            return c;
        }
        // SAFETY: linked items are live (caller contract).
        link = next(unsafe { c.as_ref() });
    }
}

/// Calls `f` on every item of the singly linked list at `head` (links
/// `next`), first to last.
///
/// # Safety
///
/// Every item reachable from `head` stays live during the walk (the
/// caller holds a read guard, or the lock under which links change).
pub(super) unsafe fn walk<T>(head: &AtomicPtr<T>, next: impl Fn(&T) -> &AtomicPtr<T>, mut f: impl FnMut(&T)) {
    let mut cur = head.load(Ordering::Acquire);
    while let Some(p) = NonNull::new(cur) {
        // SAFETY: reachable, so live (caller contract).
        let item = unsafe { p.as_ref() };
        f(item);
        cur = next(item).load(Ordering::Acquire);
    }
}

loom_const_fn! {
    /// One cache per size class.
    fn class_caches<R: RawMutex>() -> [MagCache<R>; NCLASSES] {
        let mut out = core::mem::MaybeUninit::<[MagCache<R>; NCLASSES]>::uninit();
        let first = out.as_mut_ptr() as *mut MagCache<R>;
        let mut i = 0;
        while i < NCLASSES {
            // SAFETY: `i < NCLASSES`, so the slot is inside the array; each
            // slot is written once and none is read before all are written.
            unsafe { first.add(i).write(MagCache::new(GEOMETRIES[i], Acct::Root)) };
            i += 1;
        }
        // SAFETY: the loop initialised every element.
        unsafe { out.assume_init() }
    }
}

impl<R: RawMutex> Tree<R> {
    loom_const_fn! {
        /// A tree with only its root; nothing is allocated until first use.
        pub(crate) fn new() -> Self {
            Tree {
                root: OneCell::new(Group::new_root(match Name::new_const("/") {
                    Some(n) => n,
                    None => panic!("\"/\" is a valid name"),
                })),
                classes: CellArray::new(class_caches()),
                all_groups: atomic_null(),
                mode: atomic_usize(0),
                lock: Mutex::const_new(R::INIT, Limbo::new()),
                readers: atomic_usize(0),
                zombies: atomic_null(),
                groups: OneCell::new(Cache::new(Group::<R>::GEOMETRY)),
                child_caches: OneCell::new(Cache::new(MagCache::<R>::GEOMETRY)),
                descriptors: OneCell::new(Cache::new(CacheDesc::<R>::GEOMETRY)),
                registry: atomic_null(),
                registry_lock: Mutex::const_new(R::INIT, AcctIndices::ALL),
                shrinkers: Mutex::const_new(R::INIT, [None; MAX_SHRINKERS]),
                contention_mark: atomic_usize(usize::MAX),
                episodes: atomic_u32(0),
                injections: super::inject::Table::new(),
                event_hook: atomic_null(),
                ids: ids::Ids::new(),
            }
        }
    }

    /// The root group.
    #[inline(always)]
    pub(crate) fn root(&self) -> &Group<R> {
        &self.root
    }

    /// Whether `g` is the root.
    #[inline(always)]
    pub(crate) fn is_root(&self, g: &Group<R>) -> bool {
        core::ptr::eq(g, &*self.root)
    }

    /// The size classes' caches.
    #[inline(always)]
    pub(crate) fn classes(&self) -> &CellArray<MagCache<R>, NCLASSES> {
        &self.classes
    }

    /// Caps the slab order of the size classes and of the metadata caches
    /// at `cap` (see `slab::geometry`); child caches made later copy their
    /// class's.
    ///
    /// # Safety
    ///
    /// As for `Cache::refit`, for each of those caches.
    pub(crate) unsafe fn refit(&self, cap: u32) {
        let metadata = [&*self.groups, &*self.child_caches, &*self.descriptors];
        for c in self.classes.iter().map(|c| &c.cache).chain(metadata) {
            // SAFETY: forwarded; the geometry is copied out before the write.
            unsafe { c.refit(c.geometry().within(cap)) };
        }
    }

    /// This tree's identity, recorded in its groups' token heads.
    #[inline(always)]
    fn id(&self) -> *const () {
        (self as *const Self).cast()
    }

    /// Whether no group but the root was ever created: then every object
    /// of a class is in its base cache, and the fast paths skip the group
    /// lookups. `Relaxed`: a group created concurrently is not current on
    /// this thread yet, and its caches hold no object this thread frees
    /// without having synchronised with its creation.
    #[inline(always)]
    pub(crate) fn no_groups(&self) -> bool {
        self.mode() & mode::GROUPS == 0
    }

    /// The allocation paths' mode word (see [`mode`]); 0: the plain fast
    /// path. `Relaxed`, as for [`Tree::no_groups`]; a path that acts on a
    /// bit other than `GROUPS` reads [`Tree::mode_acquire`] first.
    #[inline(always)]
    pub(crate) fn mode(&self) -> usize {
        self.mode.load(Ordering::Relaxed)
    }

    /// The mode word with `Acquire`: what was written before a bit was
    /// set with [`Tree::set_mode`] is visible.
    #[inline]
    pub(crate) fn mode_acquire(&self) -> usize {
        self.mode.load(Ordering::Acquire)
    }

    /// Sets (`on`) or clears bits of the mode word, `Release`.
    pub(crate) fn set_mode(&self, bits: usize, on: bool) {
        if on {
            self.mode.fetch_or(bits, Ordering::Release);
        } else {
            self.mode.fetch_and(!bits, Ordering::Release);
        }
    }

    /// Arms (or, `None`, disarms) fault injection for group `g`.
    pub(crate) fn inject_faults(&self, g: &Group<R>, f: Option<super::FaultInjection>) -> Result<(), Error> {
        let _tree = self.lock.lock();
        if g.is_offline() {
            return Err(Error::Removed);
        }
        self.injections.arm(ptr::from_ref(g).cast(), f)?;
        if f.is_some() {
            self.set_mode(mode::INJECT, true);
        }
        Ok(())
    }

    /// Starts counting the bytes of live objects for `g`'s byte peak: marks
    /// its counter and sends every allocation and free of this allocator
    /// through the heap's special paths from now on (sticky, as
    /// injection is).
    pub(crate) fn track_bytes(&self, g: &Group<R>) {
        g.counter().track_bytes();
        if self.mode() & mode::BYTES == 0 {
            self.set_mode(mode::BYTES, true);
        }
    }

    /// Whether group `g`'s fault-injection rule fails this allocation
    /// (`handle`: on a path that reports failure).
    pub(crate) fn inject_fails(&self, g: &Group<R>, handle: bool) -> bool {
        self.injections.fails(ptr::from_ref(g).cast(), handle)
    }

    /// Failures injected into `g`.
    pub(crate) fn injected(&self, g: &Group<R>) -> usize {
        self.injections.injected(ptr::from_ref(g).cast())
    }

    /// The group to charge for a context whose current-group token is
    /// `token`: null for the root and for a token of another allocator.
    #[inline]
    pub(crate) fn charged_for(&self, token: *const ()) -> *const Group<R> {
        // SAFETY: a non-null token names a group that the context's slot
        // holds a reference on (see `TokenHead`), so it is live; one this
        // tree made is a `Group<R>`.
        match unsafe { Group::<R>::of_token(token, self.id()) } {
            Some(g) => self.effective(g),
            None => core::ptr::null(),
        }
    }

    /// The group to charge for `g`: itself while online, else its nearest
    /// online ancestor (a removed group takes no new charges); null for
    /// the root.
    #[inline]
    pub(crate) fn effective(&self, g: &Group<R>) -> *const Group<R> {
        let g = if g.is_offline() { g.online() } else { g };
        if self.is_root(g) { core::ptr::null() } else { g }
    }

    /// The group whose counter `c` is.
    ///
    /// # Safety
    ///
    /// `c` is the counter of a live group of this tree.
    pub(crate) unsafe fn group_of_counter(&self, c: *const PageCounter) -> &Group<R> {
        if core::ptr::eq(c, &self.root.counter) {
            return &self.root;
        }
        // SAFETY: a live group's counter (caller contract), whose `owner`
        // `create_child` set to the group before publishing it.
        unsafe { &*(*c).owner.cast::<Group<R>>() }
    }

    /// The platform token that makes `g` current (null for the root).
    pub(crate) fn token(&self, g: &Group<R>) -> *const () {
        if self.is_root(g) { core::ptr::null() } else { g.token() }
    }

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
            (*g.head.owner.cast::<Self>()).put_group(g);
        }
    }

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

    /// Creates a child of `parent` named `name` (checked by the caller);
    /// the caller owns one reference on the group returned.
    pub(crate) fn create_child<E: Env<R>>(
        &self,
        env: &E,
        parent: &Group<R>,
        name: Name,
    ) -> Result<NonNull<Group<R>>, Error> {
        let check = || {
            if parent.is_offline() {
                Err(Error::Removed)
            } else if parent.children().any(|c| c.name == name) {
                Err(Error::NameTaken)
            } else {
                Ok(())
            }
        };
        let mut limbo = self.lock.lock();
        self.reclaim_groups(env, &mut limbo);
        check()?;
        // Contention reclaim must not run under the tree lock (it takes it).
        drop(limbo);
        let mem = self.alloc_meta(env, &self.groups).ok_or(Error::OutOfMemory)?;
        let _tree = self.lock.lock();
        if let Err(e) = check() {
            // SAFETY: ours, unused.
            unsafe { self.groups.free(&Pages::plain(env.src()), mem) };
            return Err(e);
        }
        let g = mem.cast::<Group<R>>();
        let token = g.as_ptr().cast::<u8>().wrapping_add(super::HEAD_OFFSET).cast_const().cast::<()>();
        let Some(index) = self.ids.insert(env.src(), token) else {
            // SAFETY: ours, unused.
            unsafe { self.groups.free(&Pages::plain(env.src()), mem) };
            return Err(Error::OutOfMemory);
        };
        // SAFETY: a fresh object of the group cache, sized and aligned for a
        // `Group`; the parent outlives it (it holds a reference on it).
        unsafe {
            g.as_ptr().write(Group::new_child(parent, self.id(), Self::release_token, name));
            core::ptr::addr_of_mut!((*g.as_ptr()).index).write(index);
            // The way back from the counter, with the group's provenance;
            // before anyone can see the group.
            core::ptr::addr_of_mut!((*g.as_ptr()).counter.owner).write(g.as_ptr().cast_const().cast());
            let gr = g.as_ref();
            gr.next_all.store(self.all_groups.load(Ordering::Relaxed), Ordering::Relaxed);
            gr.next_sibling.store(parent.first_child.load(Ordering::Relaxed), Ordering::Relaxed);
            // Publish the initialised group (pairs with Acquire in walks).
            parent.first_child.store(g.as_ptr(), Ordering::Release);
            self.all_groups.store(g.as_ptr(), Ordering::Release);
            self.set_mode(mode::GROUPS, true);
            // The group starts with its online reference; the caller's.
            gr.get();
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
            // SAFETY: siblings are live, and we hold the tree lock.
            unsafe { unlink(&parent.first_child, g, |x| &x.next_sibling) };
        }
        g.head.state.store(OFFLINE, Ordering::Release);
        // A removed group protects nothing (Linux resets both at offline):
        // what its objects hold is reclaimed with its parent's.
        g.counter.set_min(0);
        g.counter.set_low(0);
        // Pairs with the fence after a child cache is published (see
        // `make_child_cache`).
        fence(Ordering::SeqCst);
        g.for_each_cache(|_, c| c.cache.mark_dead());
        {
            let _read = self.read_guard();
            Self::drain_and_shrink(env, |f| g.for_each_cache(|_, c| f(c)));
        }
        g.counter.drain_stock();
        // Frees into the dead caches are buffered per slot from now on,
        // unless few objects are left (see the magazine layer's docs).
        g.for_each_cache(|_, c| c.dead_drained(env));
        g.for_each_cache(|_, c| self.after_free(c));
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
                let g = unsafe { unlink(&self.all_groups, gr, |x| &x.next_all) };
                // SAFETY: as above; `g` is the same group.
                unsafe { g.as_ref() }.next_zombie.store(limbo.groups, Ordering::Relaxed);
                limbo.groups = g.as_ptr();
            }
            if self.all_groups.load(Ordering::Relaxed).is_null() {
                self.set_mode(mode::GROUPS, false);
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
            // SAFETY: each was taken out of its group (so unreachable now
            // that no iteration runs), is empty, and is an object of
            // `child_caches`.
            unsafe { self.free_chain(env, caches, &self.child_caches, |c| &c.retired_next) };
            let descs = core::mem::replace(&mut limbo.descs, core::ptr::null_mut());
            // SAFETY: each was unlinked from the registry (so unreachable
            // now that no iteration runs), its cache empty, and is an
            // object of `descriptors`.
            unsafe { self.free_chain(env, descs, &self.descriptors, |d| &d.retired_next) };
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
                    self.injections.forget(g.as_ptr().cast_const().cast());
                    self.free_group(env, g);
                }
            }
            if self.zombies.load(Ordering::Relaxed).is_null() {
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
    unsafe fn free_group<E: Env<R>>(&self, env: &E, g: NonNull<Group<R>>) {
        // SAFETY: per the contract.
        let gr = unsafe { g.as_ref() };
        // Nothing may stay charged to the ancestors through this group.
        gr.counter.drain_stock();
        debug_assert_eq!(gr.counter.usage(), 0, "a reclaimed group still holds charges");
        for c in gr.caches.iter() {
            if let Some(cache) = NonNull::new(c.load(Ordering::Relaxed)) {
                // SAFETY: a dead, empty child cache nobody can reach.
                unsafe { Self::free_object(env, cache, &self.child_caches) };
            }
        }
        let parent = gr.parent().map(NonNull::from);
        gr.head.state.store(FREED, Ordering::Release);
        // SAFETY: per the contract; the group is an object of `groups`.
        unsafe { Self::free_object(env, g, &self.groups) };
        if let Some(p) = parent {
            // SAFETY: a group's parent outlives it.
            self.put_group(unsafe { p.as_ref() });
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

    /// Calls `f` on every group but the root that is not yet reclaimed
    /// (removed ones included).
    pub(crate) fn for_each_group(&self, f: impl FnMut(&Group<R>)) {
        let _read = self.read_guard();
        // SAFETY: the read guard keeps every group reachable from the list
        // alive, unlinked or not.
        unsafe { walk(&self.all_groups, |g| &g.next_all, f) }
    }

    /// Takes the tree's own locks once (a loom model's `LoomRawMutex`
    /// makes its loom atomic on first use, which must happen before the
    /// model's threads run).
    #[cfg(loom)]
    pub(crate) fn touch_locks(&self) {
        drop(self.lock.lock());
        drop(self.registry_lock.lock());
        drop(self.shrinkers.lock());
    }

    /// Pages charged to `g` and its descendants (removed ones included)
    /// that back slabs and large objects on each NUMA node: each group
    /// notes its own, and this sums them over the subtree (a walk of every
    /// group, as reports are not on an allocation path).
    pub(crate) fn node_pages(&self, g: &Group<R>) -> [usize; MAX_NODES] {
        let mut out = [0usize; MAX_NODES];
        let mut add = |x: &Group<R>| {
            for (node, o) in out.iter_mut().enumerate() {
                *o = o.saturating_add(x.counter.node_pages(node));
            }
        };
        add(g);
        self.for_each_group(|x| {
            let mut up = x.parent();
            while let Some(p) = up {
                if core::ptr::eq(p, g) {
                    add(x);
                    break;
                }
                up = p.parent();
            }
        });
        out
    }

    /// Calls `f` on every group, the root first.
    pub(crate) fn for_each_group_and_root(&self, mut f: impl FnMut(&Group<R>)) {
        f(&self.root);
        self.for_each_group(f);
    }
}
