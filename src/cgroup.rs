//! Cgroup layer: the group tree and everything that lives and dies with
//! it.
//!
//! A [`Group`] owns a [`PageCounter`] whose parent is its parent group's
//! counter, so charges propagate up the tree. A group holds no cache: its
//! objects of an accounted cache come from that cache's *charged cache*,
//! shared by every group, and are charged to it one by one, in bytes,
//! through the slots' byte stocks (see `tree::objects`); an owner word per
//! object says whom a free uncharges, whoever frees it. The root's own
//! objects come from the accounted caches themselves (`Acct::Root`), and
//! the root's counter counts slabs, not objects.
//!
//! | file | holds |
//! | --- | --- |
//! | `cgroup.rs` | [`Group`]: its fields, references, walks up and down the tree, event counts; current-group tokens |
//! | `tree` | [`Tree`]: the root and its base caches, the list of groups, the mode word, the metadata caches |
//! | `lifecycle` | creating, removing and reclaiming groups: references, zombies, limbo, read guards |
//! | `lists` | the tree's intrusive lists |
//! | `names` | the sibling-name index |
//! | `ids` | group ids that shrinkers may hand back |
//! | `charged` | the charged caches: one per accounted cache, made at first use, shared by all groups |
//! | `objects` | charging objects one by one: the slots' byte stocks, a group's spare bytes, draining at removal |
//! | `registry` | the typed caches' descriptors, their accounting indices, destroying a cache |
//! | `protection` | effective `min` and `low`; what a reclaim pass may take from a subtree |
//! | `events` | counting events up the tree, the event hook |
//! | `reclaim` | charging with reclaim, reclaim passes, `high` throttling, contention steps, shrinkers; the one drain-and-shrink every reclaim, `shrink` and `reap` use |
//! | `pressure` | the named pressure resources of a group |
//! | `marks` | the context's current-group token, its marks, and swapping tokens |
//! | `inject` | fault injection per group |
//!
//! Every operation on the tree takes the allocator above as an [`Env`]:
//! the page source, the platform, the CPU slots and the magazines' cache.
//! The tree is built without a whole `Kmem`, as loom models do.
//!
//! Groups are created and linked under the tree lock; charged caches are
//! published with `Release` and read with `Acquire` on the allocation path
//! without locks.

use core::ptr::{self, NonNull};

use lock_api::RawMutex;

use crate::counter::PageCounter;
use crate::error::Name;
use crate::sync::{
    AtomicPtr, AtomicU8, AtomicU32, AtomicUsize, CellArray, Ordering, Stat, atomic_null, atomic_u8, atomic_u32,
    atomic_usize, fence, loom_const_fn, repeat,
};

mod inject;
mod marks;
mod pressure;
mod tree;

pub use inject::{FailRule, FaultInjection};
pub use marks::RECLAIM_OVERDRAFT;
use marks::untag;
pub(crate) use marks::{
    ATOMIC, Marks, RECLAIMING, acquire_token, in_callback, release_token, set_atomic, set_no_reclaim, swap_token,
};
pub(crate) use marks::{IN_HOOK, MEMALLOC};
pub(crate) use pressure::{PressureRow, STAT_PRESSURES};
#[cfg(all(test, not(loom)))]
pub(crate) use tree::delay;
pub(crate) use tree::{CacheDesc, Tree, class_name, mode};
pub use tree::{
    EventHook, GroupId, HIGH_DELAY_BATCH, HIGH_DELAY_MAX_NS, HIGH_DELAY_MIN_NS, HIGH_DELAY_NS, ShrinkControl, Shrinker,
};

/// `Group::state` of a live group.
const ONLINE: u8 = 0;
/// `Group::state` after `remove`: no new charges, no new stock.
const OFFLINE: u8 = 1;
/// `Group::state` written just before the group's memory is freed: a
/// poison that loom models (and a debugger) see through a stale pointer.
const FREED: u8 = 2;

/// What a platform's current-group token points to: a field of every
/// group at the same offset whatever its lock type ([`HEAD_OFFSET`]).
///
/// A token is shared by every allocator on the platform (with `std`, one
/// per thread for all of them), so code of one allocator may hold a token
/// of another's group, made with another lock type. It reads only this
/// head, which starts a `repr(C)` `Group<R>` (so it is where it is for
/// every `R`).
///
/// **Tokens hold references.** A platform's current-group slot owns one
/// reference on the group its token names (none for the root, whose token
/// is null): `Cgroup::enter` takes a reference and swaps the token in
/// ([`swap_token`]); the guard keeps the token it swapped out (and so that
/// reference); dropping the guard swaps that token back and releases
/// whatever token it swapped out, through `release`. Each swap moves
/// references, never copies them, so in any drop order (or after
/// `mem::forget` of a guard) the current group of every context is
/// referenced and cannot be freed; a forgotten guard only pins its group.
#[repr(C)]
pub(crate) struct TokenHead {
    /// The [`Tree`] the group belongs to (null for a root), with bit 0
    /// ([`REMOVED_BIT`]) set by `remove`: a token of another allocator is
    /// never charged here, and one compare tells an allocation both that
    /// the group is its tree's and that it is online (`Tree::charged_for`).
    /// `state` stays the authority on removal everywhere else.
    owner: AtomicPtr<()>,
    /// Drops one reference on the group this head starts (the
    /// monomorphised `Tree::release_token` of its tree).
    release: unsafe fn(NonNull<TokenHead>),
    /// Takes one reference on it (`Tree::acquire_token`): a callback of
    /// any allocator pins the context's current group, whoever made it.
    acquire: unsafe fn(NonNull<TokenHead>),
    /// The parent group's head, or null for the root; derived from a
    /// pointer to the whole parent group, so it leads back to it. Fixed;
    /// the parent outlives us. Here rather than in `Group<R>`, so a walk
    /// up the tree needs no lock type (`ShrinkControl::contains`).
    parent: *const TokenHead,
    /// `ONLINE` until `remove`, then `OFFLINE` (`FREED` just before the
    /// memory goes). Here for the same reason: `ShrinkControl::contains`
    /// leads objects of removed groups to their nearest online ancestor.
    state: AtomicU8,
}

/// Bit 0 of [`TokenHead::owner`]: set once the group is removed (a tree is
/// aligned to more than 1, so its address never has it).
const REMOVED_BIT: usize = 1;

impl TokenHead {
    /// The tree that made the group this head starts (null for a root),
    /// whether or not it is removed.
    #[inline]
    fn tree(&self) -> *const () {
        self.owner.load(Ordering::Relaxed).map_addr(|a| a & !REMOVED_BIT).cast_const()
    }

    /// Whether `remove` has run on the group this head starts.
    #[inline]
    fn is_offline(&self) -> bool {
        self.state.load(Ordering::Acquire) == OFFLINE
    }
}

/// Where the token head sits in every `Group<R>`: at its start, so the
/// same for every lock type.
const HEAD_OFFSET: usize = core::mem::offset_of!(Group<crate::platform::DefaultRawMutex>, head);

// Two groups and a slab header fit one page, so the group cache needs no
// larger runs (an order-3 slab for groups made `create_child` fail in a
// fragmented region); `GEOMETRY` keeps them in single pages whatever the
// waste. On every target: the 64-slot builds of x86_64 and aarch64 have
// the largest groups.
static_assertions::const_assert_eq!(Group::<crate::platform::DefaultRawMutex>::GEOMETRY.order, 0);

static_assertions::const_assert_eq!(HEAD_OFFSET, 0);
// The fields before the counter fit in 128 bytes on the 64-bit targets
// (its alignment on x86_64 and aarch64, and where `CachePadded` is
// smaller, riscv64's 64, where it then starts at 128; s390x's 256 puts
// it there): moving the head first cost no padding.
#[cfg(all(target_pointer_width = "64", not(loom)))]
static_assertions::const_assert_eq!(core::mem::offset_of!(Group<crate::platform::DefaultRawMutex>, counter), {
    let align = core::mem::align_of::<crossbeam_utils::CachePadded<u8>>();
    if align > 128 { align } else { 128 }
});

/// A memory event of a group (Linux `memory.events`): counted in the
/// group's [`GroupStat`](crate::GroupStat), locally and in each ancestor
/// (hierarchically), and reported to the allocator's event hook
/// ([`Kmem::set_event_hook`](crate::Kmem::set_event_hook)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Event {
    /// A charge would have taken the group over its `max`; reclaim runs.
    Max,
    /// A charge failed at the group's `max` even after reclaim (the
    /// allocation returned null or an error).
    Oom,
    /// An allocating task reclaimed from the group because its usage was
    /// above its `high`.
    High,
    /// The group was reclaimed while its usage was within its effective
    /// `low`: a pass that found nothing unprotected left (Linux's `low`).
    Low,
    /// The group was reclaimed while its usage was within its own `min`:
    /// only reclaim for its own limits (`max`, `high`) or
    /// [`Cgroup::reclaim`](crate::Cgroup::reclaim) on it does that, as a
    /// group's protection shields it from reclaim on behalf of others, not
    /// from its own limits.
    Min,
}

impl Event {
    /// Every event, in the order of their counters.
    pub const ALL: [Event; NEVENTS] = [Event::Max, Event::Oom, Event::High, Event::Low, Event::Min];

    /// The event's name, as in Linux `memory.events`.
    pub fn name(self) -> &'static str {
        match self {
            Event::Max => "max",
            Event::Oom => "oom",
            Event::High => "high",
            Event::Low => "low",
            Event::Min => "min",
        }
    }
}

/// Event kinds.
pub(crate) const NEVENTS: usize = 5;

/// A group's event counters, by [`Event`], and its soft-limit reclaim.
pub(crate) struct Events {
    /// Events of the group itself (Linux `memory.events.local`).
    local: CellArray<Stat, NEVENTS>,
    /// Events of the group and its descendants, removed ones included
    /// (Linux `memory.events`).
    all: CellArray<Stat, NEVENTS>,
    /// Soft-limit reclaim passes run on this group, and pages they freed.
    pub(crate) soft: Stat,
    pub(crate) soft_pages: Stat,
    /// `high` throttle delays this group's excess set, and their total in
    /// microseconds.
    pub(crate) throttled: Stat,
    pub(crate) throttled_us: Stat,
    /// Charges a `max` here refused that a callback of the allocator made
    /// anyway ([`RECLAIM_OVERDRAFT`]), and their pages.
    pub(crate) overdrafts: Stat,
    pub(crate) overdraft_pages: Stat,
}

impl Events {
    loom_const_fn! {
        fn new() -> Events {
            Events {
                local: CellArray::new(repeat!(Stat::new(); NEVENTS)),
                all: CellArray::new(repeat!(Stat::new(); NEVENTS)),
                soft: Stat::new(),
                soft_pages: Stat::new(),
                throttled: Stat::new(),
                throttled_us: Stat::new(),
                overdrafts: Stat::new(),
                overdraft_pages: Stat::new(),
            }
        }
    }

    /// The count of `e` in the group itself.
    pub(crate) fn local(&self, e: Event) -> usize {
        self.local[e as usize].get()
    }

    /// The count of `e` in the group and its descendants.
    pub(crate) fn hierarchical(&self, e: Event) -> usize {
        self.all[e as usize].get()
    }
}

/// One group of the tree.
///
/// `repr(C)`: the token head first, at [`HEAD_OFFSET`] 0 (see
/// [`TokenHead`]), so a token is the group's own address and the grouped
/// fast path charges the group its token names with no offset to take
/// off; then the fields the group's creation and its tree links touch,
/// which fill the counter's alignment; then the counter (the counter that
/// refused a charge leads back to its group through `PageCounter::owner`,
/// see `Tree::group_of_counter`). Two groups fit a page (the group
/// cache's slabs stay single pages; asserted above).
///
/// Fields are private to this layer; the layers above read a group through
/// its methods.
#[repr(C)]
pub(crate) struct Group<R: RawMutex> {
    /// Which tree made this group, and how a token drops a reference on it.
    head: TokenHead,
    name: Name,
    /// (`plan` and `visited` sit in the padding after the name.)
    /// What the reclaim pass being planned takes from this group (see
    /// `tree::protection`): written and read under the tree lock only, so
    /// `Relaxed`.
    plan: AtomicU8,
    /// The last contention-reclaim episode that reclaimed this group (0:
    /// none): how an episode reaches every group once, however many there
    /// are. `Relaxed`: a mark lost to a concurrent episode costs one more
    /// visit, within the episode's step bound.
    visited: AtomicU32,
    /// The group's index in its tree's id table (`tree::ids`), set before
    /// the group is published; `u32::MAX` for a root.
    index: u32,
    /// References: one while the group is online, and one per handle,
    /// guard, allocator handle, child group and large object, and one while
    /// its objects hold pages (`obj_pages`).
    /// The group's memory is reclaimed when it reaches zero.
    refs: AtomicUsize,
    /// Children, linked through `next_sibling` (and back through
    /// `prev_sibling`, read only under the tree lock, so a removal unlinks
    /// in constant time); changed under the tree lock.
    first_child: AtomicPtr<Group<R>>,
    next_sibling: AtomicPtr<Group<R>>,
    prev_sibling: AtomicPtr<Group<R>>,
    /// The next older group of the same tree; changed under the tree lock
    /// when a group is unlinked, read by iterations that hold a read guard
    /// (which keeps unlinked groups from being freed). `prev_all` links
    /// back, under the tree lock only.
    next_all: AtomicPtr<Group<R>>,
    /// Pages charged to this group and its descendants: at the first
    /// multiple of its alignment after the fields above.
    counter: PageCounter,
    prev_all: AtomicPtr<Group<R>>,
    /// Link on the zombie stack (written before the push, whose `Release`
    /// publishes it) and then in the tree lock's limbo list. An atomic, so
    /// it is written through shared references like every other field.
    next_zombie: AtomicPtr<Group<R>>,
    /// Bytes charged to this group for objects (in whole pages of its
    /// counter, below the root) that neither its objects nor a slot's
    /// stock hold: what is left of a page when a stock is flushed (see
    /// `tree::objects`). Under a page but transiently.
    spare: AtomicUsize,
    /// Pages charged to the counter for objects. While not zero, the
    /// group holds one reference for them (taken when it leaves zero,
    /// dropped when it returns there): a removed group lives until its
    /// last object is freed.
    obj_pages: AtomicUsize,
    /// The group's fault-injection rule (off until armed).
    pub(crate) inject: inject::Inject,
    /// Pages of large (page-run) objects charged to this group itself.
    large_pages: Stat,
    /// The usage at the last `high` throttle delay of this group: what was
    /// charged above `high` since is what the next delay is for. `Relaxed`
    /// (a swap per delay): concurrent tasks each take the growth they see,
    /// a statistic's precision.
    pub(crate) high_mark: AtomicUsize,
    events: Events,
    /// Named pressure resources (see `counter::pressure`).
    pressures: AtomicPtr<pressure::PressureNode>,
}

/// `TokenHead::release` and `acquire` of a root group: never called (a
/// root's token is null), and a root is never freed anyway.
fn release_root(_: NonNull<TokenHead>) {}

// A group is shared by handles across a caught panic as a `Kmem` is
// (see its `RefUnwindSafe`): its state is atomics and what the tree lock
// guards, consistent whenever no allocator code runs.
impl<R: RawMutex> core::panic::RefUnwindSafe for Group<R> {}

// SAFETY: all mutable state is atomic or written under the tree lock; the
// raw pointers refer to groups and caches that outlive this group.
unsafe impl<R: RawMutex + Sync> Sync for Group<R> {}
// SAFETY: as above.
unsafe impl<R: RawMutex + Send> Send for Group<R> {}

impl<R: RawMutex> Group<R> {
    /// Slab geometry of the internal cache groups live in: single pages
    /// whenever two groups fit one, whatever the waste.
    pub(crate) const GEOMETRY: crate::slab::Geometry =
        match crate::slab::Geometry::in_order(core::mem::size_of::<Self>(), core::mem::align_of::<Self>(), 0, 2) {
            Some(g) => g,
            None => panic!("Group does not fit a slab"),
        };

    loom_const_fn! {
        /// A group with `counter` below `parent` (null: a root), online,
        /// with its online reference, not yet linked.
        fn with(counter: PageCounter, head: TokenHead, name: Name) -> Self {
            Group {
                counter,
                head,
                name,
                plan: atomic_u8(0),
                visited: atomic_u32(0),
                index: u32::MAX,
                refs: atomic_usize(1),
                first_child: atomic_null(),
                next_sibling: atomic_null(),
                prev_sibling: atomic_null(),
                next_all: atomic_null(),
                prev_all: atomic_null(),
                next_zombie: atomic_null(),
                spare: atomic_usize(0),
                obj_pages: atomic_usize(0),
                inject: inject::Inject::new(),
                large_pages: Stat::new(),
                high_mark: atomic_usize(0),
                events: Events::new(),
                pressures: atomic_null(),
            }
        }
    }

    loom_const_fn! {
        /// The root group of a tree.
        fn new_root(name: Name) -> Self {
            let head =
                TokenHead {
                owner: atomic_null(),
                release: release_root,
                acquire: release_root,
                parent: ptr::null(),
                state: atomic_u8(ONLINE),
            };
            Self::with(PageCounter::new_root(), head, name)
        }
    }

    /// A child of `parent`, not yet linked.
    ///
    /// # Safety
    ///
    /// `parent` must outlive the new group.
    unsafe fn new_child(
        parent: &Group<R>,
        owner: *const (),
        [release, acquire]: [unsafe fn(NonNull<TokenHead>); 2],
        name: Name,
    ) -> Self {
        let parent_head = ptr::from_ref(parent).cast::<u8>().wrapping_add(HEAD_OFFSET).cast::<TokenHead>();
        let head = TokenHead {
            owner: AtomicPtr::new(owner.cast_mut()),
            release,
            acquire,
            parent: parent_head,
            state: atomic_u8(ONLINE),
        };
        // SAFETY: forwarded: the parent (and so its counter) outlives us.
        Self::with(unsafe { PageCounter::with_parent(&parent.counter) }, head, name)
    }

    /// Whether `g` is a proper ancestor of this group.
    pub(crate) fn is_below(&self, g: &Group<R>) -> bool {
        let mut up = self.parent();
        while let Some(p) = up {
            if core::ptr::eq(p, g) {
                return true;
            }
            up = p.parent();
        }
        false
    }

    /// What an object's owner word and a stock hold for this group: its
    /// address.
    #[inline(always)]
    pub(crate) fn key(&self) -> *mut () {
        core::ptr::from_ref(self).cast_mut().cast()
    }

    /// The group's index in its tree's id table (`u32::MAX`: a root).
    #[inline]
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// The group a token names if the tree `owner` made it: `Ok` while
    /// online, `Err(Some)` once removed, `Err(None)` for the root's (null)
    /// token or another tree's group. One load and one compare decide the
    /// online case (see [`TokenHead::owner`]); a group seen online here
    /// may be removed the next instant, as with any test of `state`.
    ///
    /// # Safety
    ///
    /// `token` is null or points to the head of a live group (of any
    /// allocator), and if `owner` made it, that group is a `Group<R>`.
    #[inline(always)]
    unsafe fn of_token<'a>(token: *const (), owner: *const ()) -> Result<&'a Group<R>, Option<&'a Group<R>>> {
        let head = untag(token).cast::<TokenHead>();
        if head.is_null() {
            return Err(None);
        }
        // SAFETY: a live group's head (caller contract); only the head is
        // read before the owner check.
        let o = unsafe { (*head).owner.load(Ordering::Relaxed) };
        if ptr::eq(o, owner) {
            // SAFETY: made by `owner`, so the head of a `Group<R>` (caller
            // contract), at `HEAD_OFFSET` from its start.
            return Ok(unsafe { Self::of_head(head) });
        }
        if o.addr() != owner.addr() | REMOVED_BIT {
            return Err(None);
        }
        // Pairs with `mark_removed`'s `Release` store of the bit: the
        // caller's walk to an online ancestor sees `state` as `OFFLINE`.
        fence(Ordering::Acquire);
        // SAFETY: as above.
        Err(Some(unsafe { Self::of_head(head) }))
    }

    /// The group whose head `head` is.
    ///
    /// # Safety
    ///
    /// `head` points to the `head` field of a live `Group<R>`.
    unsafe fn of_head<'a>(head: *const TokenHead) -> &'a Group<R> {
        // SAFETY: per the contract, at this fixed offset of the group.
        unsafe { &*head.byte_sub(HEAD_OFFSET).cast::<Group<R>>() }
    }

    /// The token that makes this group current: its head, as a pointer
    /// derived from the whole group (so the group can be found from it).
    fn token(&self) -> *const () {
        ptr::from_ref(self).cast::<u8>().wrapping_add(HEAD_OFFSET).cast()
    }

    /// Pages charged to this group and its descendants, and its limits.
    #[inline(always)]
    pub(crate) fn counter(&self) -> &PageCounter {
        &self.counter
    }

    /// The group's name ("/" for a root).
    pub(crate) fn name(&self) -> &Name {
        &self.name
    }

    /// Pages of large objects charged to this group itself.
    pub(crate) fn large_pages(&self) -> &Stat {
        &self.large_pages
    }

    /// The group's event counters.
    pub(crate) fn events(&self) -> &Events {
        &self.events
    }

    /// Counts `e` here, locally, and hierarchically here and in every
    /// ancestor (the tree reports it to the event hook).
    fn count(&self, e: Event) {
        self.events.local[e as usize].add(1);
        let mut g = Some(self);
        while let Some(x) = g {
            x.events.all[e as usize].add(1);
            g = x.parent();
        }
    }

    /// Whether the group's memory was freed (read through a stale
    /// pointer, by the loom models).
    #[cfg(loom)]
    pub(crate) fn is_freed(&self) -> bool {
        self.head.state.load(Ordering::Acquire) == FREED
    }

    /// Whether `remove` has run.
    #[inline]
    pub(crate) fn is_offline(&self) -> bool {
        self.head.is_offline()
    }

    /// Marks the group removed (`Tree::remove`, under the tree lock):
    /// `state` first, then the owner word's bit, both `Release`, so a
    /// context that sees the bit also sees `OFFLINE`.
    pub(crate) fn mark_removed(&self) {
        self.head.state.store(OFFLINE, Ordering::Release);
        let tree = self.head.tree();
        self.head.owner.store(tree.map_addr(|a| a | REMOVED_BIT).cast_mut(), Ordering::Release);
    }

    /// The tree that made this group (null for a root).
    pub(crate) fn tree_id(&self) -> *const () {
        self.head.tree()
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
    fn try_get(&self) -> bool {
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
    fn put(&self) -> bool {
        if self.refs.fetch_sub(1, Ordering::Release) == 1 {
            // Pairs with the Release of every other `put`: their uses of
            // the group happen before its reclamation.
            fence(Ordering::Acquire);
            return true;
        }
        false
    }

    /// The parent group.
    pub(crate) fn parent(&self) -> Option<&Group<R>> {
        let p = self.head.parent;
        // SAFETY: the parent outlives its children, and its head (made by
        // the same tree, so a `Group<R>`'s) leads back to it.
        (!p.is_null()).then(|| unsafe { Self::of_head(p) })
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
    /// recursion or allocation. The caller holds the tree lock, or a read
    /// guard taken while this group was referenced (see
    /// [`Group::walk_pruned`]).
    pub(crate) fn walk_subtree(&self, mut f: impl FnMut(&Group<R>)) {
        self.walk_pruned(|g| {
            f(g);
            true
        })
    }

    /// Calls `f` on this group and its descendants, pre-order, without
    /// recursion or allocation; below a group for which `f` returns
    /// `false`, on none.
    ///
    /// The caller holds the tree lock, or a read guard taken while this
    /// group was referenced. Under a read guard alone the walk is sound:
    /// every group it reaches was linked below this one when its link was
    /// read, after the guard was taken, so nothing it reaches is freed
    /// before the guard drops (a group removed meanwhile keeps the
    /// sibling link it had, to a group that was linked then); it may miss
    /// groups created or removed meanwhile.
    fn walk_pruned(&self, mut f: impl FnMut(&Group<R>) -> bool) {
        let top: *const Group<R> = self;
        let mut cur: &Group<R> = self;
        loop {
            if f(cur)
                && let Some(c) = NonNull::new(cur.first_child.load(Ordering::Acquire))
            {
                // SAFETY: a linked child is live (see above).
                cur = unsafe { c.as_ref() };
                continue;
            }
            loop {
                if ptr::eq(cur, top) {
                    return;
                }
                if let Some(s) = NonNull::new(cur.next_sibling.load(Ordering::Acquire)) {
                    // SAFETY: a linked sibling is live (see above).
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
}
