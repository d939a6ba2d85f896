//! Heap layer: [`Kmem`], the allocator itself.
//!
//! `Kmem` owns a page source and one slab cache per size class, routes each
//! request to a class or to an exact page run, and keeps the registry of
//! named typed caches. It never allocates from anywhere but its own page
//! source, and no allocation path panics or logs.

mod check;
mod classes;
mod groups;
mod large;
mod lifecycle;

pub(crate) use lifecycle::Limbo;
mod pressure;
mod reclaim;
mod report;
mod typed;

pub use classes::MAX_CLASS_SIZE;
pub use groups::{Cgroup, CgroupAllocator, CgroupGuard, GroupStat};
pub use pressure::Pressure;
pub use reclaim::{GroupId, MAX_SHRINKERS, ShrinkControl, Shrinker};
pub use report::{KmemStats, SlabInfo};
pub use typed::{CacheBox, CacheFlags, KmemCache};

use core::ptr::NonNull;

use lock_api::{Mutex, RawMutex};

use crate::cgroup::Group;
use crate::counter::PageCounter;
use crate::error::{Error, GroupName, Name};
use crate::magazine::{Acct, Env, MAGAZINE_GEOMETRY, MagCache, Slots};
use crate::page::pages_for;
pub(crate) use crate::platform::hardened_abort;
use crate::platform::{DefaultPlatform, DefaultRawMutex, DefaultSource, Ownership, PAGE_SIZE, PageSource, Platform};
use crate::slab::{Cache, GrowError, Pages};
use crate::sync::{AtomicPtr, AtomicU32, AtomicUsize, Ordering, Stat, atomic_null, atomic_u32, atomic_usize};
use classes::{GEOMETRIES, NCLASSES, class_of};
use typed::{AcctIndices, CacheDesc};

/// The allocator: size-class caches, a page path for large objects and named
/// typed caches over one page source.
///
/// `Kmem::new` is `const`, so a `Kmem` can be a `static` and serve as the
/// `#[global_allocator]`. Once it has handed out memory it must stay at one
/// address (a `static`, or a leaked box): slab headers record their cache.
///
/// ```
/// use kmemcg::{Kmem, Region};
/// use core::alloc::{GlobalAlloc, Layout};
///
/// static KMEM: Kmem<Region> = Kmem::new(Region::new());
/// static mut ARENA: [core::mem::MaybeUninit<u8>; 1 << 20] = [core::mem::MaybeUninit::uninit(); 1 << 20];
///
/// // SAFETY: the only reference ever taken to ARENA.
/// KMEM.source().add(unsafe { &mut *core::ptr::addr_of_mut!(ARENA) }, 0).unwrap();
/// let layout = Layout::new::<[u64; 4]>();
/// let p = unsafe { KMEM.alloc(layout) };
/// assert!(!p.is_null());
/// unsafe { KMEM.dealloc(p, layout) };
/// ```
pub struct Kmem<S: PageSource = DefaultSource, R: RawMutex = DefaultRawMutex, P: Platform = DefaultPlatform> {
    source: S,
    platform: P,
    /// Handshake state of the per-CPU slots, shared by all caches.
    slots: Slots,
    /// Self-hosted metadata: magazines of every cache.
    magazines: Cache<R>,
    /// The size classes; they are also the root group's caches.
    classes: [MagCache<R>; NCLASSES],
    /// The root group: its counter is the parent of every group's.
    root: Group<R>,
    /// Self-hosted metadata: groups.
    groups: Cache<R>,
    /// Self-hosted metadata: the child caches of groups.
    child_caches: Cache<R>,
    /// Every group but the root that is not yet reclaimed, newest first.
    /// Pushed with `Release` and unlinked under `tree_lock`; iterated under
    /// a read guard.
    all_groups: AtomicPtr<Group<R>>,
    /// Serialises changes to the group tree, subtree reclaim, and group
    /// reclamation (never taken on an allocation fast path). Holds the
    /// groups unlinked from `all_groups` but not yet freed.
    tree_lock: Mutex<R, Limbo<R>>,
    /// Iterations of `all_groups` (and of groups' caches) in progress; an
    /// unlinked group is freed only when none is (see [`Kmem::reclaim_groups`]).
    readers: AtomicUsize,
    /// Groups whose last reference is gone, pushed lock-free (a Treiber
    /// stack: push by CAS, taken whole by swap, so no ABA).
    zombies: AtomicPtr<Group<R>>,
    /// Self-hosted metadata: descriptors of typed caches.
    descriptors: Cache<R>,
    /// Typed caches, newest first. Pushed with `Release` and unlinked
    /// under `registry_lock`; read with `Acquire` without it, under a read
    /// guard: a destroyed cache's descriptor is unlinked and freed once no
    /// iteration is in progress (see `Limbo`), like a group.
    registry: AtomicPtr<CacheDesc<R>>,
    /// Serialises cache creation and destruction (never taken on an
    /// allocation path); holds the free accounting indices.
    registry_lock: Mutex<R, AcctIndices>,
    /// Registered shrinkers (copied out before they are called).
    shrinkers: Mutex<R, [Option<&'static dyn Shrinker>; reclaim::MAX_SHRINKERS]>,
    /// Root usage (pages) above which allocations trigger soft-limit
    /// reclaim; `usize::MAX`: only when the page source is exhausted.
    contention_mark: AtomicUsize,
    /// Contention-reclaim episodes started (see `reclaim::Episode`).
    episodes: AtomicU32,
    large_allocs: Stat,
    large_pages: Stat,
    bad_frees: Stat,
}

/// Hardened mode: marks `p` handed out by `cache`; an object handed out
/// twice means the heap is corrupt.
#[inline(always)]
pub(crate) fn hardened_on_alloc<R: RawMutex>(cache: &MagCache<R>, p: NonNull<u8>) {
    // SAFETY: `p` is an object the cache just handed out.
    if cfg!(feature = "hardened") && !unsafe { cache.cache.mark_allocated(p.as_ptr()) } {
        hardened_abort("kmemcg: an object was handed out twice (heap corruption)");
    }
}

/// Hardened mode: marks `p` freed in `cache`; freeing an object that is
/// not allocated is a double free.
#[inline(always)]
pub(crate) fn hardened_on_free<R: RawMutex>(cache: &MagCache<R>, p: NonNull<u8>) {
    // SAFETY: `p` is an object slot of `cache` (checked before in hardened
    // mode).
    if cfg!(feature = "hardened") && !unsafe { cache.cache.mark_freed(p.as_ptr()) } {
        hardened_abort("kmemcg: double free");
    }
}

/// A dangling, aligned pointer for zero-size blocks.
#[inline]
pub(crate) fn dangling(layout: core::alloc::Layout) -> NonNull<[u8]> {
    // SAFETY: an alignment is a non-zero power of two, so it is a non-null
    // address; a zero-length slice there is never dereferenced.
    let p = unsafe { NonNull::new_unchecked(core::ptr::without_provenance_mut::<u8>(layout.align())) };
    NonNull::slice_from_raw_parts(p, 0)
}

impl<S: PageSource, R: RawMutex> Kmem<S, R, DefaultPlatform> {
    /// An allocator over `source` with the default platform (per-thread
    /// slots with `std`, none without); nothing is allocated until first use.
    #[cfg(not(loom))]
    pub const fn new(source: S) -> Self {
        Self::with_platform(source, DefaultPlatform::new())
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// An allocator over `source` whose per-CPU slots and current groups
    /// `platform` tracks.
    #[cfg(not(loom))]
    pub const fn with_platform(source: S, platform: P) -> Self {
        Kmem {
            source,
            platform,
            slots: Slots::new(),
            magazines: Cache::new(MAGAZINE_GEOMETRY),
            classes: class_caches(),
            root: Group::new_root(match Name::new_const("/") {
                Some(n) => n,
                None => panic!("\"/\" is a valid name"),
            }),
            groups: Cache::new(Group::<R>::GEOMETRY),
            child_caches: Cache::new(MagCache::<R>::GEOMETRY),
            all_groups: atomic_null(),
            tree_lock: Mutex::const_new(R::INIT, Limbo::new()),
            readers: atomic_usize(0),
            zombies: atomic_null(),
            descriptors: Cache::new(CacheDesc::<R>::GEOMETRY),
            registry: atomic_null(),
            registry_lock: Mutex::const_new(R::INIT, AcctIndices::ALL),
            shrinkers: Mutex::const_new(R::INIT, [None; reclaim::MAX_SHRINKERS]),
            contention_mark: atomic_usize(usize::MAX),
            episodes: atomic_u32(0),
            large_allocs: Stat::new(),
            large_pages: Stat::new(),
            bad_frees: Stat::new(),
        }
    }

    /// The page source, e.g. to add regions to it.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The platform.
    pub fn platform(&self) -> &P {
        &self.platform
    }

    /// The node new slabs and runs should come from when no slot is held.
    #[inline]
    fn node(&self) -> usize {
        0
    }

    /// Whether no group but the root was ever created: then every object
    /// of a class is in its base cache, and the fast paths skip the group
    /// lookups. `Relaxed`: a group created concurrently is not current on
    /// this thread yet, and its caches hold no object this thread frees
    /// without having synchronised with its creation.
    #[inline(always)]
    fn no_groups(&self) -> bool {
        self.all_groups.load(Ordering::Relaxed).is_null()
    }

    /// This allocator's identity, recorded in its groups' token heads.
    #[inline]
    fn id(&self) -> *const () {
        (self as *const Self).cast()
    }

    /// The identity of the calling context's current group, for shrinkers
    /// that record which group their objects were charged to.
    pub fn current_group_id(&self) -> GroupId {
        // `current` is null for the root, which is `GroupId::ROOT`.
        GroupId(self.current().cast())
    }

    /// The calling context's current group, or null for the root (also for
    /// a token that belongs to another allocator).
    #[inline]
    fn current(&self) -> *const Group<R> {
        if self.no_groups() {
            return core::ptr::null();
        }
        let token = self.platform.current_group();
        // SAFETY: a non-null token names a group that the context's slot
        // holds a reference on (see `TokenHead`), so it is live; one this
        // allocator made is a `Group<R>`.
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
        if core::ptr::eq(g, &self.root) { core::ptr::null() } else { g }
    }

    /// The cache of group `g` (null: root) for the accounted cache `base`
    /// at accounting index `idx`, created on first use.
    #[inline]
    fn cache_for<'a>(&'a self, g: *const Group<R>, idx: usize, base: &'a MagCache<R>) -> Option<&'a MagCache<R>> {
        if g.is_null() {
            return Some(base);
        }
        // SAFETY: callers pass a live group of this allocator.
        let g = unsafe { &*g };
        Self::published_child(g, idx).or_else(|| self.make_child_cache(g, idx, base))
    }

    /// Group `g`'s child cache at accounting index `idx`, once published.
    #[inline(always)]
    fn published_child(g: &Group<R>, idx: usize) -> Option<&MagCache<R>> {
        let c = g.caches[idx].load(Ordering::Acquire);
        // SAFETY: a published child cache lives as long as its group, or
        // until its typed cache is destroyed, which needs the `KmemCache`
        // the caller allocates or frees through (or an iteration's read
        // guard, which holds its freeing off).
        (!c.is_null()).then(|| unsafe { &*c })
    }

    /// Creates group `g`'s child cache at `idx`, or returns the one another
    /// thread published first.
    #[cold]
    #[inline(never)]
    fn make_child_cache<'a>(&'a self, g: &'a Group<R>, idx: usize, base: &MagCache<R>) -> Option<&'a MagCache<R>> {
        let mem = self.alloc_meta(&self.child_caches)?;
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
                // Pairs with the fence in `Cgroup::remove` (Dekker): either
                // removal sees this cache and marks it dead, or this sees
                // the group offline and does; a cache published after
                // removal never stays live, pinning its group.
                crate::sync::fence(Ordering::SeqCst);
                if g.is_offline() {
                    c.cache.mark_dead();
                }
                Some(c)
            }
            Err(winner) => {
                // SAFETY: ours, never published, holds nothing.
                unsafe { self.child_caches.free(&Pages::plain(&self.source), mem) };
                // SAFETY: the published one lives as long as the group.
                Some(unsafe { &*winner })
            }
        }
    }

    /// An object of an internal metadata cache (groups, child caches); when
    /// the page source is exhausted, contention reclaim runs step by step
    /// until it can be had, as for any allocation.
    pub(crate) fn alloc_meta(&self, cache: &Cache<R>) -> Option<NonNull<u8>> {
        let pages = Pages::plain(&self.source);
        if let Ok(p) = cache.alloc(&pages, self.node()) {
            return Some(p);
        }
        // Other threads may take what each step frees before we retry, so
        // metadata (which everything else waits on) gets a few rounds.
        for _ in 0..8 {
            let mut done = self.episode();
            while self.contention_step(&mut done) {
                if let Ok(p) = cache.alloc(&pages, self.node()) {
                    return Some(p);
                }
            }
        }
        None
    }

    /// `size` bytes aligned to `align` for the current group, or `None`.
    /// `size == 0`, an alignment that is not a power of two, sizes whose
    /// rounding overflows and a refused charge all give `None`.
    #[inline]
    pub(crate) fn alloc_raw(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        self.alloc_in(self.current(), size, align)
    }

    /// [`Kmem::alloc_raw`] for a `Layout`, whose alignment is a power of
    /// two: the `GlobalAlloc` and `Allocator` entry, inlined into them.
    #[inline(always)]
    pub(crate) fn alloc_layout(&self, layout: core::alloc::Layout) -> Option<NonNull<u8>> {
        self.alloc_pow2(self.current(), layout.size(), layout.align())
    }

    /// As `alloc_raw`, charging group `g` (null: root).
    #[inline]
    pub(crate) fn alloc_in(&self, g: *const Group<R>, size: usize, align: usize) -> Option<NonNull<u8>> {
        if !align.is_power_of_two() {
            return None;
        }
        self.alloc_pow2(g, size, align)
    }

    /// [`Kmem::alloc_in`] for an `align` known to be a power of two.
    #[inline(always)]
    fn alloc_pow2(&self, g: *const Group<R>, size: usize, align: usize) -> Option<NonNull<u8>> {
        if size == 0 {
            return None;
        }
        match class_of(size, align) {
            Some(c) => {
                // SAFETY: `class_of` returns indices below NCLASSES.
                let base = unsafe { self.classes.get_unchecked(c) };
                let cache = if g.is_null() {
                    base
                } else {
                    // SAFETY: callers pass a live group of this allocator.
                    match Self::published_child(unsafe { &*g }, c) {
                        Some(child) => child,
                        None => return self.alloc_in_new_child(g, c, base),
                    }
                };
                let p = match cache.alloc_fast(self) {
                    Some(p) => p,
                    None => self.alloc_slow_opt(cache)?,
                };
                hardened_on_alloc(cache, p);
                Some(p)
            }
            None => self.alloc_large(g, size, align),
        }
    }

    /// [`Kmem::alloc_in`] for group `g`'s first object of class `c`:
    /// creates the child cache, then allocates. Out of line and called in
    /// tail position, so the fast path needs no stack frame.
    #[cold]
    #[inline(never)]
    fn alloc_in_new_child(&self, g: *const Group<R>, c: usize, base: &MagCache<R>) -> Option<NonNull<u8>> {
        let cache = self.cache_for(g, c, base)?;
        let p = self.alloc_from(cache).ok()?;
        hardened_on_alloc(cache, p);
        Some(p)
    }

    /// One object from `cache`: a magazine hit inline, everything else
    /// (refills, limits, throttling) out of line.
    #[inline(always)]
    pub(crate) fn alloc_from(&self, cache: &MagCache<R>) -> Result<NonNull<u8>, Error> {
        match cache.alloc_fast(self) {
            Some(p) => Ok(p),
            None => self.alloc_slow_from(cache),
        }
    }

    /// The slow path of [`Kmem::alloc_from`]: after a refill, the `high`
    /// and contention checks run here, once per magazine.
    #[cold]
    #[inline(never)]
    fn alloc_slow_from(&self, cache: &MagCache<R>) -> Result<NonNull<u8>, Error> {
        let r = match cache.alloc_slow(self) {
            Ok(p) => Ok(p),
            Err(e) => self.alloc_failed(cache, e),
        };
        if r.is_ok() {
            self.after_refill(cache);
        }
        r
    }

    /// [`Kmem::alloc_slow_from`] for the paths that want no error: an
    /// `Option` comes back in a register, so the fast path around it needs
    /// no stack frame.
    #[cold]
    #[inline(never)]
    fn alloc_slow_opt(&self, cache: &MagCache<R>) -> Option<NonNull<u8>> {
        self.alloc_slow_from(cache).ok()
    }

    /// A cache could not grow: for a refused charge, reclaim the refusing
    /// group's subtree and retry once; for an exhausted page source,
    /// reclaim from groups over their soft limits, then from all groups
    /// that are not protected, and retry. The error names the group whose
    /// limit held.
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_failed(&self, cache: &MagCache<R>, e: GrowError) -> Result<NonNull<u8>, Error> {
        let GrowError::Limit(k) = e else {
            // The page source is exhausted: reclaim step by step, soft
            // limits first, until the request can be met.
            let mut done = self.episode();
            while self.contention_step(&mut done) {
                if let Ok(p) = cache.alloc(self) {
                    return Ok(p);
                }
            }
            return cache.alloc(self).map_err(|e| self.refused(e));
        };
        // SAFETY: every counter that refuses a charge is a group's.
        let g = unsafe { Group::<R>::of_counter(k) };
        g.ev_max.add(1);
        self.reclaim(g, Self::reclaim_goal(g, cache.cache.geometry().slab_pages()));
        cache.alloc(self).map_err(|e| self.refused(e))
    }

    /// The error for a charge that failed after reclaim, counted as an
    /// `oom` event of the group that refused it.
    fn refused(&self, e: GrowError) -> Error {
        match e {
            GrowError::OutOfMemory => Error::OutOfMemory,
            GrowError::Limit(k) => {
                // SAFETY: every counter that refuses a charge is a group's.
                let g = unsafe { Group::<R>::of_counter(k) };
                g.ev_oom.add(1);
                Error::LimitExceeded { group: GroupName(g.name), max: g.counter.max().saturating_mul(PAGE_SIZE) }
            }
        }
    }

    /// Charges `pages` to `g`'s counter (root's for null), reclaiming and
    /// retrying once if a limit refuses. Returns the counter charged.
    pub(crate) fn charge_pages(&self, g: *const Group<R>, pages: usize) -> Result<&PageCounter, Error> {
        // SAFETY: callers pass a live group of this allocator or null.
        let counter = if g.is_null() { &self.root.counter } else { unsafe { &(*g).counter } };
        let Err(k) = counter.try_charge(pages) else { return Ok(counter) };
        // SAFETY: every counter is a group's.
        let refuser = unsafe { Group::<R>::of_counter(k) };
        refuser.ev_max.add(1);
        self.reclaim(refuser, Self::reclaim_goal(refuser, pages));
        match counter.try_charge(pages) {
            Ok(()) => Ok(counter),
            Err(k) => Err(self.refused(GrowError::Limit(k))),
        }
    }

    /// Frees what `alloc_raw(size, align)` returned.
    ///
    /// # Safety
    ///
    /// `ptr` must have come from `alloc_raw`/`alloc_in` (or `realloc_raw`)
    /// of this `Kmem` with this `size` and `align`, and not been freed since.
    #[inline(always)]
    pub(crate) unsafe fn free_raw(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        if size == 0 {
            return;
        }
        match class_of(size, align) {
            Some(c) => {
                // SAFETY: `class_of` returns indices below NCLASSES.
                let base = unsafe { self.classes.get_unchecked(c) };
                if (cfg!(debug_assertions) || cfg!(feature = "hardened")) && !self.is_object_of(base, ptr) {
                    self.bad_frees.add(1);
                    hardened_abort("kmemcg: free of a pointer that no cache owns");
                    return;
                }
                if self.no_groups() {
                    hardened_on_free(base, ptr);
                    // SAFETY: with no groups, every object of class `c` is
                    // in the base cache.
                    return unsafe { base.free(self, ptr) };
                }
                // SAFETY: forwarded.
                unsafe { self.free_owned(base, ptr) }
            }
            // SAFETY: forwarded: a live large object of this `Kmem`.
            None => unsafe { self.free_large(ptr) },
        }
    }

    /// Frees an object of `base`'s class once groups exist: into whichever
    /// cache (base or a group's child) owns its slab. Out of line, so the
    /// group-free fast path around it stays a leaf.
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of `base`'s class, in a slab of `base` or of
    /// one of its child caches.
    #[inline(never)]
    unsafe fn free_owned(&self, base: &MagCache<R>, ptr: NonNull<u8>) {
        // SAFETY: per the contract; a slab header names its `MagCache`.
        unsafe {
            let owner = &*(base.cache.owner_of(ptr.as_ptr()) as *const MagCache<R>);
            self.free_into(owner, ptr);
        }
    }

    /// Frees `ptr` into `owner`, the cache its slab names: a magazine push
    /// inline, everything else under a read guard. The slow path is the
    /// one that can return a dead cache's last slab, after which another
    /// thread (`reap`, `shrink`, removal) may see the cache empty and let
    /// go of its group; the guard, taken while this object still keeps the
    /// cache's slab (and so the group), defers any freeing of the group and
    /// its caches until this thread is done with them (the uncharge and
    /// `after_free`).
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of `owner`, freed once.
    #[inline(always)]
    pub(crate) unsafe fn free_into(&self, owner: &MagCache<R>, ptr: NonNull<u8>) {
        hardened_on_free(owner, ptr);
        // SAFETY: forwarded.
        if !unsafe { owner.free_fast(self, ptr) } {
            // SAFETY: forwarded.
            unsafe { self.free_into_slow(owner, ptr) }
        }
    }

    /// The slow path of [`Kmem::free_into`].
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_into`].
    #[cold]
    #[inline(never)]
    unsafe fn free_into_slow(&self, owner: &MagCache<R>, ptr: NonNull<u8>) {
        let _read = self.read_guard();
        // SAFETY: forwarded.
        unsafe { owner.free_slow(self, ptr) };
        self.after_free(owner);
    }

    /// Whether `ptr` is a live-looking object of the class `base` serves,
    /// in a slab of `base` or of one of its child caches. Reads the slab
    /// header only after the page source vouches for the address.
    fn is_object_of(&self, base: &MagCache<R>, ptr: NonNull<u8>) -> bool {
        // The header is read at the start of the run a slab of this class
        // would occupy: the source must own that page too (a stray pointer
        // into a one-page run of its own must not make us read below it).
        let header = crate::page::slab_base(ptr.as_ptr(), base.cache.geometry().order);
        if self.source.ownership(ptr.as_ptr() as usize) != Ownership::Owned
            || self.source.ownership(header as usize) != Ownership::Owned
        {
            return false;
        }
        // SAFETY: the source owns the address and the page where the slab
        // header would be, so it is readable; `slab_is_live` checks the
        // magic before the owner is used.
        unsafe {
            if !base.cache.slab_is_live(ptr.as_ptr()) {
                return false;
            }
            let owner = &*(base.cache.owner_of(ptr.as_ptr()) as *const MagCache<R>);
            owner.cache.geometry() == base.cache.geometry() && owner.cache.is_object(ptr)
        }
    }

    /// Resizes in place when the new size keeps the class (or the page
    /// count, or shrinks a page run), else moves. `None` leaves the old
    /// block intact.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`] with `old_size`.
    pub(crate) unsafe fn realloc_raw(
        &self,
        ptr: NonNull<u8>,
        old_size: usize,
        align: usize,
        new_size: usize,
    ) -> Option<NonNull<u8>> {
        if new_size == 0 || old_size == 0 {
            return None;
        }
        match (class_of(old_size, align), class_of(new_size, align)) {
            (Some(a), Some(b)) if a == b => return Some(ptr),
            // SAFETY: forwarded: a live large object.
            (None, None) if unsafe { self.resize_large_in_place(ptr, new_size) } => return Some(ptr),
            _ => {}
        }
        // The new block is charged to the current group, like any
        // allocation; the old one is uncharged from its owner.
        let new = self.alloc_raw(new_size, align)?;
        // SAFETY: both blocks are live, distinct, and at least this long.
        unsafe {
            core::ptr::copy_nonoverlapping(ptr.as_ptr(), new.as_ptr(), old_size.min(new_size));
            self.free_raw(ptr, old_size, align);
        }
        Some(new)
    }

    /// The bytes actually usable in a block of `size` and `align`: its class
    /// size, or its whole pages.
    pub(crate) fn usable_size(size: usize, align: usize) -> usize {
        match class_of(size, align) {
            Some(c) => GEOMETRIES[c].size,
            None => pages_for(size).map_or(size, |p| p * PAGE_SIZE),
        }
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Env<R> for Kmem<S, R, P> {
    type Src = S;
    type Plat = P;
    #[inline(always)]
    fn src(&self) -> &S {
        &self.source
    }
    #[inline(always)]
    fn plat(&self) -> &P {
        &self.platform
    }
    #[inline(always)]
    fn slots(&self) -> &Slots {
        &self.slots
    }
    #[inline(always)]
    fn mags(&self) -> &Cache<R> {
        &self.magazines
    }
    #[inline(always)]
    fn root_counter(&self) -> &PageCounter {
        &self.root.counter
    }
}

/// One cache per size class, built in a `const` context.
#[cfg(not(loom))]
const fn class_caches<R: RawMutex>() -> [MagCache<R>; NCLASSES] {
    let mut out = core::mem::MaybeUninit::<[MagCache<R>; NCLASSES]>::uninit();
    let first = out.as_mut_ptr() as *mut MagCache<R>;
    let mut i = 0;
    while i < NCLASSES {
        // SAFETY: `i < NCLASSES`, so the slot is inside the array; each slot
        // is written once and none is read before all are written.
        unsafe { first.add(i).write(MagCache::new(GEOMETRIES[i], Acct::Root)) };
        i += 1;
    }
    // SAFETY: the loop initialised every element.
    unsafe { out.assume_init() }
}

#[cfg(all(test, not(loom)))]
mod tests;
