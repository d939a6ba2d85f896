//! Cgroup layer: groups, their tree links, per-group child caches, and
//! the current-group tokens platforms keep (reclaim and the lifecycle are
//! in `heap` for now).
//!
//! A [`Group`] owns a [`PageCounter`] whose parent is its parent group's
//! counter, so charges propagate up the tree. For every accounted cache a
//! group allocates from, it gets a *child cache* of its own (created on
//! first use, with its own slabs and magazines, charging the group's
//! counter), kept in `Group::caches` at the cache's accounting index: the
//! size classes use indices `0..43`, accounted typed caches the rest. A
//! slab therefore belongs to exactly one group, and a free uncharges the
//! group that owns the slab, whoever frees it. The root group uses the
//! base caches themselves (`Acct::Root`).
//!
//! Groups are created and linked under the tree lock of their `Kmem`;
//! `caches` entries are published with `Release` and read with `Acquire` on
//! the allocation path without locks.

use core::ptr::{self, NonNull};

use lock_api::RawMutex;

use crate::counter::{PageCounter, PressureCounter};
use crate::error::Name;
use crate::magazine::MagCache;
use crate::sync::{
    AtomicPtr, AtomicU8, AtomicU32, AtomicUsize, Ordering, Stat, UnsafeCell, atomic_null, atomic_u8, atomic_u32,
    atomic_usize, fence,
};

/// `Group::state` of a live group.
pub(crate) const ONLINE: u8 = 0;
/// `Group::state` after `remove`: no new charges, caches dead.
pub(crate) const OFFLINE: u8 = 1;

/// Accounted typed caches (`CacheFlags::ACCOUNT`) that can be live at once
/// in one allocator; one more gives [`crate::Error::TooManyAccountedCaches`].
/// A dropped cache gives its index back.
pub const MAX_ACCOUNTED_CACHES: usize = 21;

/// Accounting indices: 43 size classes and [`MAX_ACCOUNTED_CACHES`]
/// accounted typed caches (the heap asserts the split).
pub(crate) const MAX_ACCOUNTED: usize = 43 + MAX_ACCOUNTED_CACHES;

/// What a platform's current-group token points to: a field of every
/// group at the same offset whatever its lock type ([`HEAD_OFFSET`]).
///
/// A token is shared by every allocator on the platform (with `std`, one
/// per thread for all of them), so code of one allocator may hold a token
/// of another's group, made with another lock type. It reads only this
/// head, which follows the counter in a `repr(C)` `Group<R>` (nothing
/// before it depends on `R`).
///
/// **Tokens hold references.** A platform's current-group slot owns one
/// reference on the group its token names (none for the root, whose token
/// is null): [`crate::heap`]'s `Cgroup::enter` takes a reference and swaps
/// the token in; the guard keeps the token it swapped out (and so that
/// reference); dropping the guard swaps that token back and releases
/// whatever token it swapped out, through `release`. Each swap moves
/// references, never copies them, so in any drop order (or after
/// `mem::forget` of a guard) the current group of every context is
/// referenced and cannot be freed; a forgotten guard only pins its group.
#[repr(C)]
pub(crate) struct TokenHead {
    /// The `Kmem` that made the group (null for a root): a token of
    /// another allocator is never charged here.
    pub(crate) owner: *const (),
    /// Drops one reference on the group this head starts (the
    /// monomorphised `Kmem::release_token` of its allocator).
    pub(crate) release: unsafe fn(NonNull<TokenHead>),
}

/// Where the token head sits in every `Group<R>`: after the counter, so
/// the same for every lock type.
pub(crate) const HEAD_OFFSET: usize = core::mem::offset_of!(Group<crate::platform::DefaultRawMutex>, head);

// Two groups and a slab header fit one page, so the group cache needs no
// larger runs (an order-3 slab for groups made `create_child` fail in a
// fragmented region).
// (Under Miri and loom, with 2 CPU slots, groups are smaller and the
// geometry picks larger slabs for less waste; the bound is for real builds.)
#[cfg(not(any(miri, loom)))]
static_assertions::const_assert_eq!(Group::<crate::platform::DefaultRawMutex>::GEOMETRY.order, 0);

static_assertions::const_assert_eq!(HEAD_OFFSET, core::mem::size_of::<PageCounter>());

/// The low bit of a current-group token: set while its context runs
/// shrinkers, so an allocation a shrinker makes skips reclaim instead of
/// re-entering it. A tagged token names the same group, with the same
/// reference, as the untagged one (groups are aligned to at least 8).
pub(crate) const RECLAIMING: usize = 1;

/// `token` without the [`RECLAIMING`] tag.
#[inline(always)]
pub(crate) fn untag(token: *const ()) -> *const () {
    token.map_addr(|a| a & !RECLAIMING)
}

/// Releases the reference a current-group token holds; null (the root)
/// holds none.
///
/// # Safety
///
/// `token` is null or points to the [`TokenHead`] of a live group, and the
/// caller owns one of its references, which this gives up.
pub(crate) unsafe fn release_token(token: *const ()) {
    if let Some(t) = NonNull::new(untag(token).cast_mut().cast::<TokenHead>()) {
        // SAFETY: a live group's head (caller contract); `release` is its
        // allocator's, for the reference the caller hands over.
        unsafe { (t.as_ref().release)(t) }
    }
}

/// One group of the tree.
///
/// `repr(C)`: the counter first (the counter that refused a charge leads
/// back to its group, [`Group::of_counter`]), then the token head at
/// [`HEAD_OFFSET`] (see [`TokenHead`]). Two groups fit a page (the group
/// cache's slabs stay single pages; asserted below).
#[repr(C)]
pub(crate) struct Group<R: RawMutex> {
    /// Pages charged to this group and its descendants.
    pub(crate) counter: PageCounter,
    /// Who made this group, and how a token drops a reference on it.
    pub(crate) head: TokenHead,
    /// The parent, or null for the root. Fixed; the parent outlives us.
    pub(crate) parent: *const Group<R>,
    pub(crate) name: Name,
    /// (`state` and `visited` sit in the padding after the name.)
    /// `ONLINE` until `remove`, then `OFFLINE`.
    pub(crate) state: AtomicU8,
    /// The last contention-reclaim episode that reclaimed this group (0:
    /// none): how an episode reaches every group once, however many there
    /// are. `Relaxed`: a mark lost to a concurrent episode costs one more
    /// visit, within the episode's step bound.
    pub(crate) visited: AtomicU32,
    /// References: one while the group is online, and one per handle,
    /// guard, allocator handle, child group, child cache and large object.
    /// The group's memory is reclaimed when it reaches zero.
    pub(crate) refs: AtomicUsize,
    /// Children, linked through `next_sibling`; changed under the tree lock.
    pub(crate) first_child: AtomicPtr<Group<R>>,
    pub(crate) next_sibling: AtomicPtr<Group<R>>,
    /// The next older group of the same `Kmem`; changed under the tree
    /// lock when a group is unlinked, read by iterations that hold a read
    /// guard (which keeps unlinked groups from being freed).
    pub(crate) next_all: AtomicPtr<Group<R>>,
    /// Link on the zombie stack (written before the push, whose `Release`
    /// publishes it) and then in the tree lock's limbo list. An atomic, so
    /// it is written through shared references like every other field.
    pub(crate) next_zombie: AtomicPtr<Group<R>>,
    /// Child caches by accounting index; null until first use.
    pub(crate) caches: [AtomicPtr<MagCache<R>>; MAX_ACCOUNTED],
    /// Pages of large (page-run) objects charged to this group itself.
    pub(crate) large_pages: Stat,
    /// Charges that would have gone over `max` (Linux `memory.events max`).
    pub(crate) ev_max: Stat,
    /// Charges that failed even after reclaim (`memory.events oom`).
    pub(crate) ev_oom: Stat,
    /// Times an allocating task reclaimed because usage was above `high`.
    pub(crate) ev_high: Stat,
    /// Soft-limit reclaim passes run on this group, and pages they freed.
    pub(crate) ev_soft: Stat,
    pub(crate) soft_pages: Stat,
    /// Times contention reclaim skipped this group as protected by `low`.
    pub(crate) ev_low: Stat,
    /// Named pressure resources (see `counter::pressure`).
    pub(crate) pressures: [PressureSlot; MAX_PRESSURES],
}

/// `TokenHead::release` of a root group: never called (a root's token is
/// null), and a root is never freed anyway.
fn release_root(_: NonNull<TokenHead>) {}

/// Named pressure resources one group can hold; a fifth name gives
/// [`crate::Error::TooManyResources`]. Resources live as long as their group.
pub const MAX_PRESSURES: usize = 4;

/// `PressureSlot::state`: unused.
pub(crate) const SLOT_EMPTY: u8 = 0;
/// `PressureSlot::state`: published; `inner` is fixed except for atomics.
pub(crate) const SLOT_LIVE: u8 = 2;

/// One named pressure resource of a group. `inner` is written once, under
/// the tree lock, before `state` becomes `SLOT_LIVE` with `Release`;
/// readers load `state` with `Acquire` first.
pub(crate) struct PressureSlot {
    pub(crate) state: AtomicU8,
    pub(crate) inner: UnsafeCell<(Name, PressureCounter)>,
}

impl PressureSlot {
    const fn new() -> Self {
        PressureSlot {
            state: atomic_u8(SLOT_EMPTY),
            // SAFETY: a null parent is always valid.
            inner: UnsafeCell::new((Name::EMPTY, unsafe { PressureCounter::new(ptr::null()) })),
        }
    }

    /// The name and counter, once published.
    pub(crate) fn get(&self) -> Option<(&Name, &PressureCounter)> {
        if self.state.load(Ordering::Acquire) != SLOT_LIVE {
            return None;
        }
        // SAFETY: published slots are never written again (their counter
        // is all atomics).
        self.inner.with_mut(|p| unsafe { Some((&(*p).0, &(*p).1)) })
    }
}

// SAFETY: all mutable state is atomic or written under the tree lock; the
// raw pointers refer to groups and caches that outlive this group.
unsafe impl<R: RawMutex + Sync> Sync for Group<R> {}
// SAFETY: as above.
unsafe impl<R: RawMutex + Send> Send for Group<R> {}

impl<R: RawMutex> Group<R> {
    /// Slab geometry of the internal cache groups live in.
    pub(crate) const GEOMETRY: crate::slab::Geometry =
        match crate::slab::Geometry::new(core::mem::size_of::<Self>(), core::mem::align_of::<Self>()) {
            Some(g) => g,
            None => panic!("Group does not fit a slab"),
        };

    /// The root group of a `Kmem`.
    #[cfg(not(loom))]
    pub(crate) const fn new_root(name: Name) -> Self {
        Group {
            head: TokenHead { owner: ptr::null(), release: release_root },
            counter: PageCounter::new_root(),
            parent: ptr::null(),
            name,
            refs: atomic_usize(1),
            state: atomic_u8(ONLINE),
            first_child: atomic_null(),
            next_sibling: atomic_null(),
            next_all: atomic_null(),
            next_zombie: atomic_null(),
            visited: atomic_u32(0),
            caches: [const { atomic_null() }; MAX_ACCOUNTED],
            large_pages: Stat::new(),
            ev_max: Stat::new(),
            ev_oom: Stat::new(),
            ev_high: Stat::new(),
            ev_soft: Stat::new(),
            soft_pages: Stat::new(),
            ev_low: Stat::new(),
            pressures: [const { PressureSlot::new() }; MAX_PRESSURES],
        }
    }

    /// A child of `parent`, not yet linked.
    ///
    /// # Safety
    ///
    /// `parent` must outlive the new group.
    #[cfg(not(loom))]
    pub(crate) unsafe fn new_child(parent: &Group<R>, head: TokenHead, name: Name, next_all: *mut Group<R>) -> Self {
        Group {
            head,
            // SAFETY: forwarded: the parent (and so its counter) outlives us.
            counter: unsafe { PageCounter::with_parent(&parent.counter) },
            parent,
            name,
            refs: atomic_usize(1),
            state: atomic_u8(ONLINE),
            first_child: atomic_null(),
            next_sibling: atomic_null(),
            next_all: AtomicPtr::new(next_all),
            next_zombie: atomic_null(),
            visited: atomic_u32(0),
            caches: [const { atomic_null() }; MAX_ACCOUNTED],
            large_pages: Stat::new(),
            ev_max: Stat::new(),
            ev_oom: Stat::new(),
            ev_high: Stat::new(),
            ev_soft: Stat::new(),
            soft_pages: Stat::new(),
            ev_low: Stat::new(),
            pressures: [const { PressureSlot::new() }; MAX_PRESSURES],
        }
    }

    /// The group whose counter `c` is.
    ///
    /// # Safety
    ///
    /// `c` must be the `counter` field of a live `Group<R>`.
    pub(crate) unsafe fn of_counter<'a>(c: *const PageCounter) -> &'a Group<R> {
        // SAFETY: `c` is the `counter` field of a live group (caller
        // contract), at this fixed offset of the `repr(C)` struct.
        unsafe { &*c.byte_sub(core::mem::offset_of!(Group<R>, counter)).cast::<Group<R>>() }
    }

    /// The group a token names, if `kmem` made it.
    ///
    /// # Safety
    ///
    /// `token` is null or points to the head of a live group (of any
    /// allocator), and if `kmem` made it, that group is a `Group<R>`.
    #[inline]
    pub(crate) unsafe fn of_token<'a>(token: *const (), kmem: *const ()) -> Option<&'a Group<R>> {
        let head = untag(token).cast::<TokenHead>();
        // SAFETY: a live group's head (caller contract); only the head is
        // read before the owner check.
        if head.is_null() || unsafe { (*head).owner } != kmem {
            return None;
        }
        // SAFETY: made by `kmem`, so the head of a `Group<R>` (caller
        // contract), at `HEAD_OFFSET` from its start.
        Some(unsafe { Self::of_head(head) })
    }

    /// The group whose head `head` is.
    ///
    /// # Safety
    ///
    /// `head` points to the `head` field of a live `Group<R>`.
    pub(crate) unsafe fn of_head<'a>(head: *const TokenHead) -> &'a Group<R> {
        // SAFETY: per the contract, at this fixed offset of the group.
        unsafe { &*head.byte_sub(HEAD_OFFSET).cast::<Group<R>>() }
    }

    /// The token that makes this group current: its head.
    pub(crate) fn token(&self) -> *const () {
        ptr::addr_of!(self.head).cast()
    }

    /// Whether `remove` has run.
    #[inline]
    pub(crate) fn is_offline(&self) -> bool {
        self.state.load(Ordering::Acquire) == OFFLINE
    }

    /// The nearest group from this one up that is online.
    pub(crate) fn online(&self) -> &Group<R> {
        let mut g = self;
        while g.is_offline() {
            match g.parent() {
                Some(p) => g = p,
                None => break,
            }
        }
        g
    }

    /// Takes a reference.
    #[inline]
    pub(crate) fn get(&self) {
        self.refs.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes a reference unless the last one is gone (the group is then
    /// on its way to reclamation and must not be revived); for walks that
    /// find a group without holding a reference on it.
    pub(crate) fn try_get(&self) -> bool {
        let mut n = self.refs.load(Ordering::Relaxed);
        while n != 0 {
            match self.refs.compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => n = now,
            }
        }
        false
    }

    /// Drops a reference; `true` if it was the last (the caller then
    /// hands the group to reclamation).
    #[inline]
    pub(crate) fn put(&self) -> bool {
        if self.refs.fetch_sub(1, Ordering::Release) == 1 {
            // Pairs with the Release of every other `put`: their uses of
            // the group happen before its reclamation.
            fence(Ordering::Acquire);
            return true;
        }
        false
    }

    /// The published pressure resource `name`, if any.
    pub(crate) fn pressure(&self, name: &Name) -> Option<&PressureCounter> {
        self.pressures.iter().filter_map(PressureSlot::get).find(|(n, _)| *n == name).map(|(_, c)| c)
    }

    /// The parent group.
    pub(crate) fn parent(&self) -> Option<&Group<R>> {
        // SAFETY: the parent outlives its children.
        unsafe { self.parent.as_ref() }
    }

    /// The children, first to last.
    pub(crate) fn children(&self) -> impl Iterator<Item = &Group<R>> {
        let mut cur = self.first_child.load(Ordering::Acquire);
        core::iter::from_fn(move || {
            let g = NonNull::new(cur)?;
            // SAFETY: linked children are live groups.
            let g = unsafe { g.as_ref() };
            cur = g.next_sibling.load(Ordering::Acquire);
            Some(g)
        })
    }

    /// Calls `f` on this group and every descendant (pre-order), without
    /// recursion or allocation. The caller holds the tree lock.
    pub(crate) fn walk_subtree(&self, mut f: impl FnMut(&Group<R>)) {
        let top: *const Group<R> = self;
        let mut cur: &Group<R> = self;
        loop {
            f(cur);
            if let Some(c) = NonNull::new(cur.first_child.load(Ordering::Acquire)) {
                // SAFETY: a linked child is live.
                cur = unsafe { c.as_ref() };
                continue;
            }
            loop {
                if ptr::eq(cur, top) {
                    return;
                }
                if let Some(s) = NonNull::new(cur.next_sibling.load(Ordering::Acquire)) {
                    // SAFETY: a linked sibling is live.
                    cur = unsafe { s.as_ref() };
                    break;
                }
                match cur.parent() {
                    Some(p) => cur = p,
                    None => return,
                }
            }
        }
    }

    /// Calls `f` on every child cache of this group.
    pub(crate) fn for_each_cache(&self, mut f: impl FnMut(usize, &MagCache<R>)) {
        for (i, c) in self.caches.iter().enumerate() {
            if let Some(c) = NonNull::new(c.load(Ordering::Acquire)) {
                // SAFETY: published child caches live as long as the group,
                // or until their typed cache is destroyed and no iteration
                // (read guard) or tree-lock holder runs: callers hold one
                // of those, or the typed cache's handle.
                f(i, unsafe { c.as_ref() });
            }
        }
    }
}
