//! The cgroup handle: groups, limits, entering a group, per-group
//! allocators and statistics.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use lock_api::RawMutex;

use super::GroupStat;
use crate::cgroup::FaultInjection;
use crate::cgroup::{Group, GroupId, release_token, set_atomic, swap_token};
use crate::error::{Error, Name};
use crate::heap::{Heap, Kmem, KmemOf};
use crate::platform::{PAGE_SIZE, PageSource, Platform};

/// Bytes to pages, rounding down; `usize::MAX` stays "no limit".
fn to_pages(bytes: usize) -> usize {
    if bytes == usize::MAX { usize::MAX } else { bytes / PAGE_SIZE }
}

/// Pages to bytes, saturating ("no limit" stays `usize::MAX`).
pub(super) fn to_bytes(pages: usize) -> usize {
    pages.saturating_mul(PAGE_SIZE)
}

/// A handle to a group of a [`Kmem`]: limits, statistics, children, and
/// the ways to allocate on its account. Handles are reference counted;
/// cloning is cheap.
///
/// Limits are set in bytes and kept in whole pages: a limit that is not a
/// multiple of the page is rounded down; `usize::MAX` means no limit.
pub struct Cgroup<'k, K: Heap = Kmem> {
    kmem: &'k KmemOf<K>,
    group: NonNull<Group<K::Lock>>,
}

// SAFETY: a handle is a shared reference to synchronised allocator state
// (atomics, and locks for the tree).
unsafe impl<K: Heap<Lock: Sync>> Send for Cgroup<'_, K> {}
// SAFETY: as above; every method takes `&self`.
unsafe impl<K: Heap<Lock: Sync>> Sync for Cgroup<'_, K> {}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// The root group: everything allocated outside any group is charged
    /// here, and every group's usage is part of its usage.
    pub fn root(&self) -> Cgroup<'_, Self> {
        Cgroup::new_ref(self, NonNull::from(self.tree().root()))
    }

    /// The calling context's current group.
    pub fn current_group(&self) -> Cgroup<'_, Self> {
        match NonNull::new(self.current() as *mut Group<R>) {
            Some(g) => Cgroup::new_ref(self, g),
            None => self.root(),
        }
    }

    /// Makes the calling context's allocations *atomic* until the scope
    /// drops (Linux `GFP_ATOMIC`, or `memalloc_noreclaim_save`): they never
    /// reclaim, never call shrinkers, never take the group-tree lock and
    /// never wait for reclaim; they are served from magazines, slabs and
    /// free pages within the limits, or fail at once (null, `AllocError`,
    /// or a typed error). Interrupt context is atomic without a scope (see
    /// [`crate::Platform::in_interrupt`]). Scopes nest: the outermost
    /// scope's drop ends the atomic state, in whatever order the scopes
    /// drop (an inner scope dropped after it no longer holds it). A
    /// forgotten outermost scope (`mem::forget`) leaves the thread's
    /// allocations atomic: sound, but they fail at a limit instead of
    /// reclaiming. Each thread (context) has its own state.
    pub fn atomic_scope(&self) -> AtomicScope<'_, Self> {
        AtomicScope { kmem: self, was: set_atomic(self.platform(), true), _context: PhantomData }
    }

    /// Makes the root current on the calling thread (through the platform
    /// without `std`) and lets go of the group that was current: the way
    /// back after guards were dropped out of order or forgotten (see
    /// [`Cgroup::enter`]). Guards still alive restore what they saved when
    /// they drop, as usual.
    ///
    /// In interrupt context ([`Platform::in_interrupt`]) it does nothing:
    /// the current group there is the interrupted code's, which may be
    /// allocating in it.
    pub fn reset_current_group(&self) {
        if self.platform().in_interrupt() {
            return;
        }
        let out = swap_token(self.platform(), core::ptr::null());
        // SAFETY: the slot owned a reference on the token it held (see
        // `TokenHead`); having swapped it out, it is ours to release.
        unsafe { release_token(out) };
    }
}

impl<'k, K: Heap> Cgroup<'k, K> {
    /// A new handle on `group`, taking a reference.
    fn new_ref(kmem: &'k KmemOf<K>, group: NonNull<Group<K::Lock>>) -> Self {
        // SAFETY: `group` is live (root, or referenced by the caller).
        unsafe { group.as_ref() }.get();
        Cgroup { kmem, group }
    }

    pub(crate) fn g(&self) -> &'k Group<K::Lock> {
        // SAFETY: the handle holds a reference, and groups are never freed
        // while referenced.
        unsafe { &*self.group.as_ptr() }
    }

    /// The allocator.
    pub(crate) fn kmem(&self) -> &'k KmemOf<K> {
        self.kmem
    }

    /// The group, or [`Error::Removed`].
    fn live(&self) -> Result<&'k Group<K::Lock>, Error> {
        let g = self.g();
        if g.is_offline() { Err(Error::Removed) } else { Ok(g) }
    }

    /// The identity shrinkers see for this group.
    pub fn id(&self) -> GroupId {
        self.kmem.tree().group_id(self.g())
    }

    /// Whether [`Cgroup::remove`] has run.
    pub fn is_removed(&self) -> bool {
        self.g().is_offline()
    }

    /// The group's name ("/" for the root).
    pub fn name(&self) -> &str {
        self.g().name().as_str()
    }

    /// The parent group; `None` for the root.
    pub fn parent(&self) -> Option<Cgroup<'k, K>> {
        self.g().parent().map(|p| Cgroup::new_ref(self.kmem, NonNull::from(p)))
    }

    /// Creates a child group. Names are 1 to [`crate::NAME_MAX`] bytes,
    /// without whitespace, control characters or `/`, not `.` or `..`
    /// ([`Error::NameInvalid`]), and unique among siblings. A child may have a limit above its parent's
    /// (as in Linux): the parent's still binds.
    pub fn create_child(&self, name: &str) -> Result<Cgroup<'k, K>, Error> {
        let name = Name::new_group(name)?;
        let g = self.kmem.tree().create_child(self.kmem, self.g(), name)?;
        // `create_child` gave us the handle's reference.
        Ok(Cgroup { kmem: self.kmem, group: g })
    }

    /// Removes the group (Linux `rmdir`): refused for the root
    /// ([`Error::RootGroup`]), while it has children ([`Error::Busy`]), and
    /// once done ([`Error::Removed`]).
    ///
    /// The group goes offline: it takes no new charges (a thread still
    /// inside it, or its allocator handle, charges the nearest online
    /// ancestor), its `min` and `low` go to 0 (what it still holds is
    /// reclaimed as its parent's), and the CPU slots' byte stocks give back
    /// what they hold for it. What its live objects hold stays charged to
    /// it and so to every ancestor, and is uncharged from them as those
    /// objects are freed, from any thread: no charge is lost. Those frees
    /// give their bytes to the freeing slot's stock as a live group's do
    /// (no atomic operation per free), so up to a page per slot stays
    /// charged to the removed group after its last free, until that slot's
    /// stock serves another group, a reclaim, [`Kmem::reap`](crate::Kmem::reap)
    /// (decay runs one once a second) or [`Kmem::shrink`](crate::Kmem::shrink).
    /// The group's memory is reclaimed once its last handle, guard, object
    /// and stocked byte are gone.
    /// Using a handle of a removed group: reads keep working; changes give
    /// [`Error::Removed`].
    pub fn remove(&self) -> Result<(), Error> {
        self.kmem.tree().remove(self.kmem, self.g())
    }

    /// Sets the hard limit in bytes. If the usage is above it, the group's
    /// subtree is reclaimed first; if it stays above,
    /// [`Error::LimitBelowUsage`].
    pub fn set_max(&self, bytes: usize) -> Result<(), Error> {
        let pages = to_pages(bytes);
        let g = self.live()?;
        g.counter().drain_stock();
        for _ in 0..3 {
            if g.counter().set_max(pages).is_ok() {
                return Ok(());
            }
            self.kmem.tree().reclaim(self.kmem, g, g.counter().usage().saturating_sub(pages));
        }
        g.counter().set_max(pages).map_err(|usage| Error::LimitBelowUsage { usage: to_bytes(usage) })
    }

    /// Sets `high` in bytes: above it, an allocating task reclaims from the
    /// group (once per magazine refill or large object) before its
    /// allocation returns; if the group stays above `high` all the same,
    /// the task is then delayed through [`Platform::throttle`], in
    /// proportion to the excess and to the pages charged above `high`
    /// since the group's last delay ([`crate::HIGH_DELAY_NS`] per
    /// [`crate::HIGH_DELAY_BATCH`] pages at twice `high`, at most
    /// [`crate::HIGH_DELAY_MAX_NS`] an allocation), counted in
    /// [`GroupStat::throttled`]. Never in atomic context (interrupts,
    /// [`Kmem::atomic_scope`], shrinkers, the event hook), which does not
    /// reclaim either. It never makes an allocation fail.
    pub fn set_high(&self, bytes: usize) -> Result<(), Error> {
        self.live()?.counter().set_high(to_pages(bytes));
        Ok(())
    }

    /// Sets the soft limit in bytes: under contention (see
    /// [`Kmem::set_contention_mark`]), groups above their soft limit are
    /// reclaimed first, largest excess first. A parent's soft limit covers
    /// its subtree.
    pub fn set_soft_limit(&self, bytes: usize) -> Result<(), Error> {
        self.live()?.counter().set_soft(to_pages(bytes));
        Ok(())
    }

    /// Sets `low` in bytes, the soft protection: while the group's usage
    /// is within its *effective* `low`, reclaim on behalf of others
    /// (contention, an ancestor's `max` or `high`, [`Cgroup::reclaim`] on
    /// an ancestor) takes nothing from it as long as it finds unprotected
    /// memory elsewhere; only then does it reclaim the group, counting a
    /// `low` event (see [`GroupStat::events`]).
    ///
    /// The effective protection is Linux cgroup v2's: a child of the
    /// group being reclaimed for (the root, under contention) keeps what
    /// it claims, its usage up to its `low`; deeper, a child's is bounded
    /// by its parent's, and when the children's claims together exceed
    /// their parent's effective protection, it is shared out in
    /// proportion to the claims. A group's protection covers its own
    /// objects and those of its children that claim protection too: a
    /// child that sets none gets none. A group's own limits (`max`,
    /// `high`) and [`Cgroup::reclaim`] on it are not held back by its own
    /// protection.
    ///
    /// The root cannot be protected ([`Error::RootGroup`]); a removed
    /// group protects nothing.
    pub fn set_low(&self, bytes: usize) -> Result<(), Error> {
        self.protectable()?.counter().set_low(to_pages(bytes));
        Ok(())
    }

    /// Sets `min` in bytes, the hard protection: while the group's usage is
    /// within its effective `min` (computed as for [`Cgroup::set_low`]),
    /// reclaim on behalf of others never takes from it, even when nothing
    /// else is left (then an allocation fails instead). Only the group's
    /// own limits and [`Cgroup::reclaim`] on it reclaim it below its
    /// `min`, counting a `min` event (see [`GroupStat::events`]).
    ///
    /// The root cannot be protected ([`Error::RootGroup`]); a removed
    /// group protects nothing.
    pub fn set_min(&self, bytes: usize) -> Result<(), Error> {
        self.protectable()?.counter().set_min(to_pages(bytes));
        Ok(())
    }

    /// The group, for a protection setting: not removed, not the root.
    fn protectable(&self) -> Result<&'k Group<K::Lock>, Error> {
        let g = self.live()?;
        if self.kmem.tree().is_root(g) { Err(Error::RootGroup) } else { Ok(g) }
    }

    /// Reclaims about `bytes` from the group's subtree now (Linux
    /// `memory.reclaim`): its magazines, empty slabs and stocks, then what
    /// its shrinkers free, asking them for no more objects than the rest
    /// needs at the bytes per object freed so far. It honours the `min`
    /// and `low` of the groups below it (`low` only while something
    /// unprotected is left), not the group's own (counted as a `min` event
    /// if it is within its `min`). Returns the bytes the group's usage fell
    /// by while it ran: more than asked when whole objects and slabs make
    /// it so, less when nothing more is reclaimable (or other threads
    /// charged the group meanwhile). Returns 0 in atomic context (see
    /// [`Kmem::atomic_scope`]) and inside a shrinker.
    pub fn reclaim(&self, bytes: usize) -> usize {
        let pages = bytes.div_ceil(PAGE_SIZE);
        if pages == 0 {
            return 0;
        }
        to_bytes(self.kmem.tree().reclaim(self.kmem, self.g(), pages))
    }

    /// Bytes charged to the group and its descendants (whole slabs, large
    /// objects with their header page, and stocked pages).
    pub fn usage(&self) -> usize {
        to_bytes(self.g().counter().usage())
    }

    /// The largest usage since creation or [`Cgroup::reset_peak`], bytes.
    pub fn peak(&self) -> usize {
        to_bytes(self.g().counter().watermark())
    }

    /// Restarts peak tracking from the current usage (which is kept): the
    /// page peak ([`Cgroup::peak`]) and the byte peak
    /// ([`Cgroup::peak_bytes`]).
    pub fn reset_peak(&self) {
        self.g().counter().reset_watermark();
        self.g().counter().reset_bytes_peak();
    }

    /// Starts counting the bytes of the objects this group's subtree holds,
    /// for [`Cgroup::peak_bytes`] and [`Cgroup::assert_peak_at_most`]:
    /// call it before the code under test allocates.
    ///
    /// [`Cgroup::usage`] and [`Cgroup::peak`] count pages charged, which
    /// include whole slabs (a group's first object of a size class charges
    /// a slab), the CPU stocks' pre-charged pages and magazine refills: one
    /// boxed `u64` peaks at tens of KiB there. The byte count is what the
    /// objects themselves take: each object's size class (a large object's
    /// whole pages, without its header page), added when it is allocated
    /// and taken off when it is freed, on the group charged and all its
    /// ancestors. It covers the size classes and large objects
    /// (`GlobalAlloc`, [`Cgroup::allocator`]), not typed caches, and is not
    /// kept while memory-error detection is on.
    ///
    /// Cost: from the first call on, every allocation and free of this
    /// allocator takes its special path (as with fault injection), and large
    /// objects are not resized in place; nothing changes for allocators
    /// that never call it. Objects already live when counting began are
    /// not counted (freeing them lowers the count, never below 0).
    pub fn track_bytes(&self) {
        self.kmem.tree().track_bytes(self.kmem.slots_ref(), self.g());
    }

    /// Bytes of live objects counted in this group's subtree since
    /// [`Cgroup::track_bytes`] (0 before it).
    pub fn object_bytes(&self) -> usize {
        self.g().counter().bytes()
    }

    /// The largest [`Cgroup::object_bytes`] since [`Cgroup::track_bytes`]
    /// or [`Cgroup::reset_peak`].
    pub fn peak_bytes(&self) -> usize {
        self.g().counter().bytes_peak()
    }

    /// The hard limit in bytes (`usize::MAX`: none).
    pub fn max(&self) -> usize {
        to_bytes(self.g().counter().max())
    }

    /// Charges refused at this group.
    pub fn failcnt(&self) -> usize {
        self.g().counter().failcnt()
    }

    /// An [`Allocator`](allocator_api2::alloc::Allocator) that charges this group, from any thread.
    pub fn allocator(&self) -> CgroupAllocator<'k, K> {
        CgroupAllocator { handle: self.clone() }
    }

    /// Arms fault injection for allocations charged to this group (see
    /// [`FaultInjection`] for which paths it applies to); arming again
    /// replaces the rule and restarts its count. Errors:
    /// [`Error::Removed`].
    pub fn inject_faults(&self, f: FaultInjection) -> Result<(), Error> {
        self.kmem.tree().inject_faults(self.kmem.slots_ref(), self.g(), Some(f))
    }

    /// Stops fault injection for this group (its count stays readable).
    pub fn stop_injecting(&self) {
        let _ = self.kmem.tree().inject_faults(self.kmem.slots_ref(), self.g(), None);
    }

    /// Allocations fault injection failed in this group.
    pub fn injected_failures(&self) -> usize {
        self.kmem.tree().injected(self.g())
    }

    /// For the end of a test's scope: whether the group's subtree holds no
    /// live object. First gives back what only waits to be reused (the
    /// quarantine, the subtree's magazines, empty slabs and stocks), so
    /// what is left is what the code under test still holds: then `Err`
    /// with the group's [`GroupStat`], whose `slab` rows and `large` line
    /// name it, per cache. What other threads are giving back at that
    /// moment (quarantined objects on their way to their caches, stocks a
    /// reclaim took) is waited for, a bounded while (about 65,000 tries,
    /// yielding the CPU with `std`, then with `std` up to 2 s more): a
    /// thread kept from running longer than that can still make an empty
    /// group look charged.
    // A snapshot by value, like `stat()`: a `no_std` crate has no box for it.
    #[allow(clippy::result_large_err)]
    pub fn check_empty(&self) -> Result<(), GroupStat> {
        if self.settle_empty() {
            return Ok(());
        }
        Err(self.stat())
    }

    /// [`Cgroup::check_empty`] as an assertion: panics with what the group
    /// still holds, per cache. On success it needs little stack (the
    /// [`GroupStat`] of a failure, 11 KiB, is built only then), so a
    /// kernel thread's or a loom model's small stack can call it.
    #[track_caller]
    pub fn assert_empty(&self) {
        if !self.settle_empty() {
            self.not_empty();
        }
    }

    /// The failure of [`Cgroup::assert_empty`], out of line: its frame
    /// holds the [`GroupStat`].
    #[cold]
    #[inline(never)]
    #[track_caller]
    fn not_empty(&self) -> ! {
        let st = self.stat();
        panic!("kmemcg: group {} is not empty at the end of its scope:\n{st}", st.name);
    }

    /// Gives back what only waits to be reused in the group's subtree (see
    /// [`Cgroup::check_empty`]); then whether nothing is charged to it.
    fn settle_empty(&self) -> bool {
        // What other threads took out of the quarantine or a slot's stock
        // (an eviction, a flush, a reclaim) is still charged until they
        // give it back: wait for them after each step, or a group whose
        // objects are all freed may look charged.
        self.kmem.flush_quarantine();
        self.kmem.settle_quarantine();
        let tree = self.kmem.tree();
        tree.reclaim_unused(self.kmem, self.g());
        crate::sync::wait_until(|| tree.stocks_in_transit() == 0);
        self.usage() == 0
    }

    /// Asserts that the group's subtree held at most `bytes` at once;
    /// panics with the group's [`GroupStat`] otherwise.
    ///
    /// After [`Cgroup::track_bytes`] (and with detection off) this is the
    /// byte peak, [`Cgroup::peak_bytes`]: the size-class bytes of the
    /// objects live at once, since `track_bytes` or [`Cgroup::reset_peak`].
    /// Otherwise it is the page peak, as [`Cgroup::assert_page_peak_at_most`].
    #[track_caller]
    pub fn assert_peak_at_most(&self, bytes: usize) {
        if !self.g().counter().tracks_bytes() || self.kmem.detecting() {
            return self.assert_page_peak_at_most(bytes);
        }
        let peak = self.peak_bytes();
        if peak > bytes {
            panic!(
                "kmemcg: group {}'s objects peaked at {peak} bytes, over its budget of {bytes}:\n{}",
                self.name(),
                self.stat()
            );
        }
    }

    /// Asserts that the group's peak usage ([`Cgroup::peak`]: pages
    /// charged, whole slabs and stocks included, since creation or
    /// [`Cgroup::reset_peak`]) stayed at most `bytes`; panics with the
    /// group's [`GroupStat`] otherwise.
    #[track_caller]
    pub fn assert_page_peak_at_most(&self, bytes: usize) {
        let peak = self.peak();
        if peak > bytes {
            panic!(
                "kmemcg: group {} peaked at {peak} bytes, over its budget of {bytes}:\n{}",
                self.name(),
                self.stat()
            );
        }
    }
}

impl<K: Heap> Cgroup<'static, K> {
    /// Makes this group current on the calling thread (with `std`; through
    /// the platform without) until the guard drops. Only for an allocator
    /// that lives as long as the program (a `static`, or leaked): the
    /// thread's current-group slot can keep a group referenced after every
    /// guard is gone (see below), and is shared by every allocator on the
    /// platform. Guards nest: dropping
    /// one restores the group that was current before it, so entering a
    /// group from inside another is allowed and undone in order.
    ///
    /// Guards dropped out of order, or forgotten, are sound: the current
    /// group is then whichever group the last dropped guard restored, and
    /// it is kept alive for as long as it is current (the thread's current
    /// group holds a reference). A removed group that stays current takes
    /// no charges (its nearest online ancestor does). Concretely, `let a = ga.enter(); let b = gb.enter(); drop(a);
    /// drop(b);` leaves `ga` current, and referenced, until
    /// [`Kmem::reset_current_group`] or another out-of-order drop replaces
    /// it (a thread that exits with it current leaves its metadata behind).
    ///
    /// In interrupt context ([`Platform::in_interrupt`](crate::Platform::in_interrupt))
    /// the guard changes nothing: the current group there is the
    /// interrupted code's, which may be allocating in it (and interrupt
    /// context charges the root anyway).
    pub fn enter(&self) -> CgroupGuard<'static, K> {
        if self.kmem.platform().in_interrupt() {
            return CgroupGuard { kmem: self.kmem, prev: core::ptr::null(), active: false };
        }
        let g = self.g();
        let token = self.kmem.tree().token(g);
        if !token.is_null() {
            // The reference the current-group slot owns while `g` is current.
            g.get();
        }
        // The swapped-out token's reference passes to the guard.
        let prev = swap_token(self.kmem.platform(), token);
        CgroupGuard { kmem: self.kmem, prev, active: true }
    }
}

impl<K: Heap> Clone for Cgroup<'_, K> {
    fn clone(&self) -> Self {
        Cgroup::new_ref(self.kmem, self.group)
    }
}

impl<K: Heap> Drop for Cgroup<'_, K> {
    fn drop(&mut self) {
        self.kmem.tree().put_group(self.g());
    }
}

impl<K: Heap> fmt::Debug for Cgroup<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cgroup").field("name", &self.name()).field("usage", &self.usage()).finish()
    }
}

/// Keeps the calling context's allocations atomic until dropped; see
/// [`Kmem::atomic_scope`]. Tied to the context that made it (`!Send`).
pub struct AtomicScope<'k, K: Heap = Kmem> {
    kmem: &'k KmemOf<K>,
    /// Whether the context was atomic already (an enclosing scope).
    was: bool,
    _context: PhantomData<*const ()>,
}

impl<K: Heap> Drop for AtomicScope<'_, K> {
    fn drop(&mut self) {
        // Only the scope that made the context atomic ends it: an inner
        // scope leaves the mark alone, so scopes dropped out of order never
        // leave a context atomic once the outermost one is gone. The mark
        // is the scopes' own (`cgroup::ATOMIC`): a callback's marks, put
        // back when it returns, neither keep nor end it.
        if !self.was {
            set_atomic(self.kmem.platform(), false);
        }
    }
}

/// Keeps a group current until dropped; see [`Cgroup::enter`].
///
/// Invariant (while `active`): `prev` is the token that was current when the guard was
/// made, and the guard owns the reference that token holds (see
/// `cgroup::TokenHead`); dropping the guard makes it current again,
/// handing that reference to the platform's slot, and releases the
/// reference of the token it replaces, whichever group (or allocator)
/// that names.
pub struct CgroupGuard<'k, K: Heap = Kmem> {
    kmem: &'k KmemOf<K>,
    prev: *const (),
    /// Whether the guard made its group current (false: made in
    /// interrupt context, it holds nothing and restores nothing).
    active: bool,
}

impl<K: Heap> Drop for CgroupGuard<'_, K> {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        if self.kmem.platform().in_interrupt() {
            // Dropped in an interrupt handler (which reached a guard of the
            // code it interrupted): that code's current group stays, as it
            // may be allocating in it; the guard lets go of what it saved.
            // SAFETY: the guard owns the reference of the token it saved.
            unsafe { release_token(self.prev) };
            return;
        }
        // The saved token's mark is dropped and the running context's kept
        // (a guard made inside a shrinker and dropped after it, or the
        // reverse, neither leaves the mark behind nor clears it early).
        let out = swap_token(self.kmem.platform(), self.prev);
        // SAFETY: the slot owned a reference on the token it held (see
        // `TokenHead`); having swapped it out, it is ours to release.
        unsafe { release_token(out) };
    }
}

/// An [`Allocator`](allocator_api2::alloc::Allocator) charging one group; see [`Cgroup::allocator`].
pub struct CgroupAllocator<'k, K: Heap = Kmem> {
    handle: Cgroup<'k, K>,
}

impl<K: Heap> Clone for CgroupAllocator<'_, K> {
    fn clone(&self) -> Self {
        CgroupAllocator { handle: self.handle.clone() }
    }
}

impl<'k, K: Heap> CgroupAllocator<'k, K> {
    /// The allocator.
    pub(crate) fn kmem(&self) -> &'k KmemOf<K> {
        self.handle.kmem
    }

    /// The group blocks are charged to now: the handle's, or its nearest
    /// online ancestor once it is removed (null: the root).
    pub(crate) fn charged(&self) -> *const Group<K::Lock> {
        self.handle.kmem.tree().effective(self.handle.g())
    }
}
