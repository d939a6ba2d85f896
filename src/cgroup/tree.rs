//! The group tree of one allocator and its lifecycle: creation, removal,
//! references, the zombie stack, and reclamation of group metadata once
//! no iteration runs.
//!
//! # Lifecycle of a group
//!
//! 1. `create_child` links it under its parent and at the head of
//!    `all_groups`, with its *online* reference (and one for the caller).
//! 2. `remove` unlinks it from its parent, turns it offline, takes its
//!    bytes out of the slots' stocks, and drops the online reference.
//! 3. The last `put` (a handle, guard, child, its objects' last page, a
//!    large object, or a context's current-group token) pushes it on the
//!    zombie stack.
//! 4. `reclaim_groups`, under the tree lock, unlinks zombies from
//!    `all_groups` into the lock's [`Limbo`]; once no [`ReadGuard`] is
//!    held it frees them and drops their
//!    parents' references, which may free those in turn.
//!
//! Charged caches and descriptors of destroyed typed caches wait in the same
//! limbo (see `registry`).

use lock_api::{Mutex, RawMutex};

use super::Group;
use crate::counter::PageCounter;
use crate::error::{Error, Name};
#[cfg(not(all(miri, feature = "std", not(loom))))]
use crate::magazine::Acct;
use crate::magazine::{MagCache, Slots, Stocks};
use crate::platform::{MAX_NODES, PAGE_SIZE};
use crate::slab::Cache;
#[cfg(not(all(miri, feature = "std", not(loom))))]
use crate::slab::classes::GEOMETRIES;
use crate::slab::classes::NCLASSES;
use crate::sync::{
    AtomicPtr, AtomicU32, AtomicUsize, CellArray, OneCell, atomic_null, atomic_u32, atomic_usize, loom_const_fn,
};

mod charged;
#[cfg(all(miri, feature = "std", not(loom)))]
mod classes_miri;
mod events;
mod ids;
mod lifecycle;
mod lists;
mod names;
mod objects;
mod protection;
mod reclaim;
mod registry;

pub use events::EventHook;
pub(crate) use lifecycle::Limbo;
use lists::walk;
#[cfg(all(test, not(loom)))]
pub(crate) use reclaim::delay;
pub use reclaim::{
    GroupId, HIGH_DELAY_BATCH, HIGH_DELAY_MAX_NS, HIGH_DELAY_MIN_NS, HIGH_DELAY_NS, ShrinkControl, Shrinker,
};
pub(crate) use registry::{CacheDesc, class_name};

/// The group tree of one allocator: the root group with its base caches,
/// every other group until it is reclaimed, the typed-cache registry, the
/// shrinkers, and the self-hosted caches their metadata lives in.
///
/// A `Tree` must stay at one address once a group exists: tokens and
/// groups record it (a `Kmem` is a `static` or leaked).
pub(crate) struct Tree<R: RawMutex> {
    /// The root group: its counter is the parent of every group's.
    pub(super) root: OneCell<Group<R>>,
    /// The size classes: the root's own caches, and the base caches the
    /// charged caches of groups' objects copy.
    pub(super) classes: Classes<R>,
    /// Every group but the root that is not yet reclaimed, newest first.
    /// Pushed with `Release` and unlinked under `lock`; iterated under a
    /// read guard.
    pub(super) all_groups: AtomicPtr<Group<R>>,
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
    /// Self-hosted metadata: the charged caches (see `charged`).
    pub(crate) charged_caches: OneCell<Cache<R>>,
    /// Each slot's byte stock of object charges (see `objects`).
    pub(super) stocks: Stocks,
    /// Self-hosted metadata: descriptors of typed caches.
    pub(crate) descriptors: OneCell<Cache<R>>,
    /// Self-hosted metadata: groups' named pressure resources.
    pub(crate) pressure_nodes: OneCell<Cache<R>>,
    /// Typed caches, newest first. Pushed with `Release` and unlinked
    /// under `registry_lock`; read with `Acquire` without it, under a read
    /// guard: a destroyed cache's descriptor is unlinked and freed once no
    /// iteration is in progress (see [`Limbo`]), like a group.
    pub(super) registry: AtomicPtr<CacheDesc<R>>,
    /// Serialises cache creation and destruction (never waited for on an
    /// allocation path: `finish_reclaim`, which decay's reap runs inside
    /// allocations, only tries it, to retire dead caches). Taken before
    /// `lock`.
    pub(super) registry_lock: Mutex<R, ()>,
    /// Registered shrinkers (copied out before they are called).
    pub(super) shrinkers: Mutex<R, reclaim::Shrinkers>,
    /// Root usage (pages) above which allocations trigger contention
    /// reclaim; `usize::MAX`: only when the page source is exhausted.
    pub(super) contention_mark: AtomicUsize,
    /// Contention-reclaim episodes started (see `reclaim::Episode`).
    pub(super) episodes: AtomicU32,
    /// The event hook: null, or a [`EventHook`] (see `events`).
    pub(super) event_hook: AtomicPtr<()>,
    /// Which index names which group, for ids handed back (see `ids`).
    ids: ids::Ids,
}

/// The mode bits: what the allocation paths must do besides the plain
/// fast path, kept in the magazine layer's `Slots::word` beside the count
/// of drains, so that a fast path tests both with one load after its
/// handshake. Zero: no group but the root exists and no special path is
/// on, so an allocation takes the plain fast path. `GROUPS` mirrors
/// `Tree::all_groups` (set and cleared under the tree's lock), the other
/// bits belong to the heap layer. All below `magazine::MODE_BITS`.
pub(crate) mod mode {
    /// A group but the root exists (mirrors `Tree::all_groups`).
    pub(crate) const GROUPS: usize = 1;
    /// Frees take the detection path: always with red zones or poison;
    /// with sampling alone, only while a sampled object lives (set by
    /// the first live one and cleared by the free of the last, under the
    /// sample table's lock).
    pub(crate) const DEBUG: usize = 2;
    /// Some group armed fault injection (sticky).
    pub(crate) const INJECT: usize = 4;
    /// The heap has not yet read its debug settings from the environment.
    pub(crate) const ENV: usize = 8;
    /// Some group asked for its object bytes to be counted (sticky): the
    /// heap's special paths count them (`Cgroup::track_bytes`).
    pub(crate) const BYTES: usize = 16;
    /// Allocations take the detection path: always with red zones or
    /// poison, and while a sample is due with sampling alone.
    pub(crate) const ARMED: usize = 32;
}

/// Where a tree holds its size classes' caches: inline, so that a `Kmem`
/// can be a `static`.
#[cfg(not(any(loom, all(miri, feature = "std"))))]
pub(crate) type Classes<R> = CellArray<MagCache<R>, NCLASSES>;

/// Under Miri (with `std`): out of line, made at first use (see
/// `classes_miri`).
#[cfg(all(miri, feature = "std", not(loom)))]
pub(crate) type Classes<R> = classes_miri::OutOfLine<R>;

/// What [`Tree::classes`] hands out: the array (under Miri with `std`,
/// its out-of-line holder, with the same methods).
#[cfg(not(all(miri, feature = "std", not(loom))))]
pub(crate) type ClassesRef<R> = CellArray<MagCache<R>, NCLASSES>;
#[cfg(all(miri, feature = "std", not(loom)))]
pub(crate) type ClassesRef<R> = classes_miri::OutOfLine<R>;

/// Under loom, on the heap: a model thread's stack is 32 KiB unless the
/// test asks for more, and the 43 caches are about 52 KB of loom objects,
/// so a `Kmem` built inline could not be built inside a loom model as
/// users write it. Built in place, element by element.
#[cfg(loom)]
pub(crate) type Classes<R> = std::boxed::Box<CellArray<MagCache<R>, NCLASSES>>;

/// The size classes' caches, in place on the heap (see [`Classes`]).
#[cfg(loom)]
fn boxed_classes<R: RawMutex>() -> Classes<R> {
    let mut b = std::boxed::Box::<CellArray<MagCache<R>, NCLASSES>>::new_uninit();
    // `CellArray` is a transparent cell around the array, so its first
    // element is at its start.
    let first = b.as_mut_ptr().cast::<MagCache<R>>();
    for (i, geo) in GEOMETRIES.iter().enumerate() {
        // SAFETY: `i < NCLASSES`, inside the allocation; each slot is
        // written once, none read before all are.
        unsafe { first.add(i).write(MagCache::new(*geo, Acct::Root)) };
    }
    // SAFETY: every element was written above.
    unsafe { b.assume_init() }
}

loom_const_fn! {
    /// One cache per size class.
    #[cfg(not(any(loom, all(miri, feature = "std"))))]
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

/// Where the size classes' caches are when they are inline in the tree
/// (not under loom, nor under Miri with `std`): for
/// [`SizeClass::offset_in`](crate::slab::classes::SizeClass::offset_in).
#[cfg(not(any(loom, all(miri, feature = "std"))))]
impl<R: RawMutex> crate::slab::classes::ClassArray for Tree<R> {
    // `CellArray` is a transparent cell around the array.
    const BASE: usize = core::mem::offset_of!(Tree<R>, classes);
    const STRIDE: usize = core::mem::size_of::<MagCache<R>>();
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
                #[cfg(not(any(loom, all(miri, feature = "std"))))]
                classes: CellArray::new(class_caches()),
                #[cfg(all(miri, feature = "std", not(loom)))]
                classes: classes_miri::OutOfLine::new(),
                #[cfg(loom)]
                classes: boxed_classes(),
                all_groups: atomic_null(),
                lock: Mutex::const_new(R::INIT, Limbo::new()),
                readers: atomic_usize(0),
                zombies: atomic_null(),
                groups: OneCell::new(Cache::new(Group::<R>::GEOMETRY)),
                charged_caches: OneCell::new(Cache::new(MagCache::<R>::GEOMETRY)),
                stocks: Stocks::new(),
                descriptors: OneCell::new(Cache::new(CacheDesc::<R>::GEOMETRY)),
                pressure_nodes: OneCell::new(Cache::new(super::pressure::PressureNode::GEOMETRY)),
                registry: atomic_null(),
                registry_lock: Mutex::const_new(R::INIT, ()),
                shrinkers: Mutex::const_new(R::INIT, reclaim::Shrinkers::new()),
                contention_mark: atomic_usize(usize::MAX),
                episodes: atomic_u32(0),
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
    pub(crate) fn classes(&self) -> &ClassesRef<R> {
        &self.classes
    }

    /// Caps the slab order of the size classes and of the metadata caches
    /// at `cap` (see `slab::geometry`); charged caches made later copy
    /// their class's order.
    ///
    /// # Safety
    ///
    /// As for `Cache::refit`, for each of those caches.
    pub(crate) unsafe fn refit(&self, cap: u32) {
        let metadata = [&*self.groups, &*self.charged_caches, &*self.descriptors, &*self.pressure_nodes];
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

    /// Whether no group but the root was ever created, as the mode bits
    /// `slots` keeps say (the loom models check it).
    #[cfg(loom)]
    pub(crate) fn no_groups(&self, slots: &Slots) -> bool {
        slots.mode() & mode::GROUPS == 0
    }

    /// Arms (or, `None`, disarms) fault injection for group `g`.
    pub(crate) fn inject_faults(
        &self,
        slots: &Slots,
        g: &Group<R>,
        f: Option<super::FaultInjection>,
    ) -> Result<(), Error> {
        let _tree = self.lock.lock();
        if g.is_offline() {
            return Err(Error::Removed);
        }
        g.inject.set(f);
        if f.is_some() {
            slots.set_mode(mode::INJECT, true);
        }
        Ok(())
    }

    /// Starts counting the bytes of live objects for `g`'s byte peak: marks
    /// its counter and sends every allocation and free of this allocator
    /// through the heap's special paths from now on (sticky, as
    /// injection is).
    pub(crate) fn track_bytes(&self, slots: &Slots, g: &Group<R>) {
        g.counter().track_bytes();
        if slots.mode() & mode::BYTES == 0 {
            slots.set_mode(mode::BYTES, true);
        }
    }

    /// Whether group `g`'s fault-injection rule fails this allocation
    /// (`handle`: on a path that reports failure).
    pub(crate) fn inject_fails(&self, g: &Group<R>, handle: bool) -> bool {
        g.inject.fails(handle)
    }

    /// Failures injected into `g`.
    pub(crate) fn injected(&self, g: &Group<R>) -> usize {
        g.inject.injected()
    }

    /// The group to charge for a context whose current-group token is
    /// `token`: null for the root and for a token of another allocator.
    #[inline]
    pub(crate) fn charged_for(&self, token: *const ()) -> *const Group<R> {
        // SAFETY: a non-null token names a group that the context's slot
        // holds a reference on (see `TokenHead`), so it is live; one this
        // tree made is a `Group<R>`.
        match unsafe { Group::<R>::of_token(token, self.id()) } {
            // A token never names a root (the root's is null): an online
            // group is charged itself, with no walk and no root test.
            Ok(g) => g,
            Err(Some(g)) => self.effective(g),
            Err(None) => core::ptr::null(),
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

    /// Bytes charged to `g` and its descendants (removed ones included)
    /// that back something on each NUMA node: the slabs (the root's) and
    /// large objects each group's counter notes by node, and, below the
    /// root, the bytes of the subtree's live objects in the charged caches,
    /// by the node of their slab (found by their owner words). A walk of
    /// every group and every charged slab: reports are not on an
    /// allocation path.
    pub(crate) fn node_bytes(&self, g: &Group<R>) -> [usize; MAX_NODES] {
        let mut out = [0usize; MAX_NODES];
        let mut add = |x: &Group<R>| {
            for (node, o) in out.iter_mut().enumerate() {
                *o = o.saturating_add(x.counter.node_pages(node).saturating_mul(PAGE_SIZE));
            }
        };
        add(g);
        self.for_each_group(|x| {
            if x.is_below(g) {
                add(x);
            }
        });
        if !self.is_root(g) {
            // Owners of live objects are live, and the read guard keeps
            // one freed meanwhile from being unmapped under the walk.
            let _read = self.read_guard();
            self.for_each_charged(|_, c| {
                let size = c.cache.geometry().size;
                c.cache.for_each_allocated(|_, owner, node| {
                    // SAFETY: a live object's owner (see above).
                    if !owner.is_null() && (owner == g.key() || unsafe { &*owner.cast::<Group<R>>() }.is_below(g)) {
                        out[node.min(MAX_NODES - 1)] += size;
                    }
                });
            });
        }
        out
    }

    /// Calls `f` on every group, the root first.
    pub(crate) fn for_each_group_and_root(&self, mut f: impl FnMut(&Group<R>)) {
        f(&self.root);
        self.for_each_group(f);
    }
}
