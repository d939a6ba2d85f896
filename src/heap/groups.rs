//! The cgroup handle API: groups, limits, entering a group, per-group
//! allocators and statistics.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;

use lock_api::RawMutex;

use super::Kmem;
use super::classes::{CLASS_SIZES, NCLASSES};
use crate::cgroup::{Group, MAX_ACCOUNTED};
use crate::error::{Error, GroupName, Name};
use crate::platform::{DefaultPlatform, DefaultRawMutex, DefaultSource, PAGE_SIZE, PageSource, Platform};
use crate::sync::Ordering;

/// Bytes to pages, rounding down; `usize::MAX` stays "no limit".
fn to_pages(bytes: usize) -> usize {
    if bytes == usize::MAX { usize::MAX } else { bytes / PAGE_SIZE }
}

/// Pages to bytes, saturating ("no limit" stays `usize::MAX`).
fn to_bytes(pages: usize) -> usize {
    pages.saturating_mul(PAGE_SIZE)
}

/// A handle to a group of a [`Kmem`]: limits, statistics, children, and
/// the ways to allocate on its account. Handles are reference counted;
/// cloning is cheap.
///
/// Limits are set in bytes and kept in whole pages: a limit that is not a
/// multiple of the page is rounded down; `usize::MAX` means no limit.
pub struct Cgroup<'k, S: PageSource = DefaultSource, R: RawMutex = DefaultRawMutex, P: Platform = DefaultPlatform> {
    kmem: &'k Kmem<S, R, P>,
    group: NonNull<Group<R>>,
}

// SAFETY: a handle is a shared reference to synchronised allocator state
// (atomics, and locks for the tree).
unsafe impl<S: PageSource, R: RawMutex + Sync, P: Platform> Send for Cgroup<'_, S, R, P> {}
// SAFETY: as above; every method takes `&self`.
unsafe impl<S: PageSource, R: RawMutex + Sync, P: Platform> Sync for Cgroup<'_, S, R, P> {}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// The root group: everything allocated outside any group is charged
    /// here, and every group's usage is part of its usage.
    pub fn root(&self) -> Cgroup<'_, S, R, P> {
        Cgroup::new_ref(self, NonNull::from(&self.root))
    }

    /// The calling context's current group.
    pub fn current_group(&self) -> Cgroup<'_, S, R, P> {
        match NonNull::new(self.current() as *mut Group<R>) {
            Some(g) => Cgroup::new_ref(self, g),
            None => self.root(),
        }
    }

    /// Makes the root current on the calling thread (through the platform
    /// without `std`) and lets go of the group that was current: the way
    /// back after guards were dropped out of order or forgotten (see
    /// [`Cgroup::enter`]). Guards still alive restore what they saved when
    /// they drop, as usual.
    pub fn reset_current_group(&self) {
        let out = self.swap_token(core::ptr::null());
        // SAFETY: the slot owned a reference on the token it held (see
        // `TokenHead`); having swapped it out, it is ours to release.
        unsafe { crate::cgroup::release_token(out) };
    }

    /// The platform token that makes `g` current (null for the root).
    fn token(&self, g: &Group<R>) -> *const () {
        if core::ptr::eq(g, &self.root) { core::ptr::null() } else { g.token() }
    }
}

impl<'k, S: PageSource, R: RawMutex, P: Platform> Cgroup<'k, S, R, P> {
    /// A new handle on `group`, taking a reference.
    fn new_ref(kmem: &'k Kmem<S, R, P>, group: NonNull<Group<R>>) -> Self {
        // SAFETY: `group` is live (root, or referenced by the caller).
        unsafe { group.as_ref() }.get();
        Cgroup { kmem, group }
    }

    pub(crate) fn g(&self) -> &'k Group<R> {
        // SAFETY: the handle holds a reference, and groups are never freed
        // while referenced.
        unsafe { &*self.group.as_ptr() }
    }

    /// The allocator.
    pub(crate) fn kmem(&self) -> &'k Kmem<S, R, P> {
        self.kmem
    }

    /// The group.
    pub(crate) fn group_ref(&self) -> &'k Group<R> {
        self.g()
    }

    /// The group, or [`Error::Removed`].
    fn live(&self) -> Result<&'k Group<R>, Error> {
        let g = self.g();
        if g.is_offline() { Err(Error::Removed) } else { Ok(g) }
    }

    /// The identity shrinkers see for this group.
    pub fn id(&self) -> crate::GroupId {
        self.kmem.group_id(self.g())
    }

    /// Whether [`Cgroup::remove`] has run.
    pub fn is_removed(&self) -> bool {
        self.g().is_offline()
    }

    /// The group's name ("/" for the root).
    pub fn name(&self) -> &str {
        self.g().name.as_str()
    }

    /// The parent group; `None` for the root.
    pub fn parent(&self) -> Option<Cgroup<'k, S, R, P>> {
        self.g().parent().map(|p| Cgroup::new_ref(self.kmem, NonNull::from(p)))
    }

    /// Creates a child group. Names are 1 to [`crate::NAME_MAX`] bytes,
    /// without whitespace, control characters or `/`, not `.` or `..`
    /// ([`Error::NameInvalid`]), and unique among siblings. A child may have a limit above its parent's
    /// (as in Linux): the parent's still binds.
    pub fn create_child(&self, name: &str) -> Result<Cgroup<'k, S, R, P>, Error> {
        let name = Name::new_group(name)?;
        let k = self.kmem;
        let parent = self.g();
        let mut tree = k.tree_lock.lock();
        k.reclaim_groups(&mut tree);
        if parent.is_offline() {
            return Err(Error::Removed);
        }
        if parent.children().any(|c| c.name == name) {
            return Err(Error::NameTaken);
        }
        // Contention reclaim must not run under the tree lock (it takes it).
        drop(tree);
        let mem = k.alloc_meta(&k.groups).ok_or(Error::OutOfMemory)?;
        let _tree = k.tree_lock.lock();
        if parent.is_offline() || parent.children().any(|c| c.name == name) {
            // SAFETY: ours, unused.
            unsafe { k.groups.free(&crate::slab::Pages::plain(&k.source), mem) };
            return Err(if parent.is_offline() { Error::Removed } else { Error::NameTaken });
        }
        let g = mem.cast::<Group<R>>();
        // SAFETY: a fresh object of the group cache, sized and aligned for a
        // `Group`; the parent outlives it (it holds a reference on it).
        unsafe {
            g.as_ptr().write(Group::new_child(parent, k.token_head(), name, k.all_groups.load(Ordering::Relaxed)));
            let gr = g.as_ref();
            gr.next_sibling.store(parent.first_child.load(Ordering::Relaxed), Ordering::Relaxed);
            // Publish the initialised group (pairs with Acquire in walks).
            parent.first_child.store(g.as_ptr(), Ordering::Release);
            k.all_groups.store(g.as_ptr(), Ordering::Release);
        }
        // The child holds a reference on its parent.
        parent.get();
        // The group starts with its online reference; this handle takes one.
        Ok(Cgroup::new_ref(k, g))
    }

    /// Removes the group (Linux `rmdir`): refused for the root
    /// ([`Error::RootGroup`]), while it has children ([`Error::Busy`]), and
    /// once done ([`Error::Removed`]).
    ///
    /// The group goes offline: it takes no new charges (a thread still
    /// inside it, or its allocator handle, charges the nearest online
    /// ancestor), its stock is drained, and each of its caches turns dead:
    /// its magazines are emptied on every CPU at once, later frees go
    /// straight to slabs, and empty slabs go back immediately. What its
    /// live objects hold stays charged to it and so to every ancestor, and
    /// is uncharged from them as those objects are freed, from any thread:
    /// no charge is lost. The group's memory (and its caches') is reclaimed
    /// once its last handle, guard, cache slab and large object are gone.
    /// Using a handle of a removed group: reads keep working; changes give
    /// [`Error::Removed`].
    pub fn remove(&self) -> Result<(), Error> {
        let k = self.kmem;
        let g = self.g();
        if core::ptr::eq(g, &k.root) {
            return Err(Error::RootGroup);
        }
        let mut tree = k.tree_lock.lock();
        if g.is_offline() {
            return Err(Error::Removed);
        }
        if g.children().next().is_some() {
            return Err(Error::Busy);
        }
        // Unlink from the parent's children.
        if let Some(parent) = g.parent() {
            let gp = g as *const Group<R> as *mut Group<R>;
            let next = g.next_sibling.load(Ordering::Relaxed);
            if parent.first_child.load(Ordering::Relaxed) == gp {
                parent.first_child.store(next, Ordering::Release);
            } else {
                let mut c = parent.first_child.load(Ordering::Relaxed);
                while let Some(cur) = NonNull::new(c) {
                    // SAFETY: linked siblings are live; we hold the tree lock.
                    let cur = unsafe { cur.as_ref() };
                    let n = cur.next_sibling.load(Ordering::Relaxed);
                    if n == gp {
                        cur.next_sibling.store(next, Ordering::Release);
                        break;
                    }
                    c = n;
                }
            }
        }
        g.state.store(crate::cgroup::OFFLINE, Ordering::Release);
        // Pairs with the fence after a child cache is published (see
        // `make_child_cache`).
        crate::sync::fence(Ordering::SeqCst);
        g.for_each_cache(|_, c| c.cache.mark_dead());
        {
            let _read = k.read_guard();
            crate::magazine::drain_many(k, |f| g.for_each_cache(|_, c| f(c)), None);
            g.for_each_cache(|_, c| {
                c.cache.shrink(&c.pages(k, None));
            });
        }
        g.counter.drain_stock();
        g.for_each_cache(|_, c| k.after_free(c));
        // Drop the online reference; handles keep the group until dropped.
        k.put_group(g);
        k.reclaim_groups(&mut tree);
        Ok(())
    }

    /// Sets the hard limit in bytes. If the usage is above it, the group's
    /// subtree is reclaimed first; if it stays above,
    /// [`Error::LimitBelowUsage`].
    pub fn set_max(&self, bytes: usize) -> Result<(), Error> {
        let pages = to_pages(bytes);
        let g = self.live()?;
        g.counter.drain_stock();
        for _ in 0..3 {
            if g.counter.set_max(pages).is_ok() {
                return Ok(());
            }
            self.kmem.reclaim(g, g.counter.usage().saturating_sub(pages));
        }
        g.counter.set_max(pages).map_err(|usage| Error::LimitBelowUsage { usage: to_bytes(usage) })
    }

    /// Sets `high` in bytes: above it, an allocating task reclaims from the
    /// group (once per magazine refill) before its allocation returns. It
    /// never makes an allocation fail.
    pub fn set_high(&self, bytes: usize) -> Result<(), Error> {
        self.live()?.counter.set_high(to_pages(bytes));
        Ok(())
    }

    /// Sets the soft limit in bytes: under contention (see
    /// [`Kmem::set_contention_mark`]), groups above their soft limit are
    /// reclaimed first, largest excess first. A parent's soft limit covers
    /// its subtree.
    pub fn set_soft_limit(&self, bytes: usize) -> Result<(), Error> {
        self.live()?.counter.set_soft(to_pages(bytes));
        Ok(())
    }

    /// Sets `low` in bytes: while its usage is at most `low`, contention
    /// reclaim passes the group over.
    pub fn set_low(&self, bytes: usize) -> Result<(), Error> {
        self.live()?.counter.set_low(to_pages(bytes));
        Ok(())
    }

    /// Bytes charged to the group and its descendants (whole slabs, large
    /// objects with their header page, and stocked pages).
    pub fn usage(&self) -> usize {
        to_bytes(self.g().counter.usage())
    }

    /// The largest usage since creation or [`Cgroup::reset_peak`], bytes.
    pub fn peak(&self) -> usize {
        to_bytes(self.g().counter.watermark())
    }

    /// Restarts peak tracking from the current usage (which is kept).
    pub fn reset_peak(&self) {
        self.g().counter.reset_watermark();
    }

    /// The hard limit in bytes (`usize::MAX`: none).
    pub fn max(&self) -> usize {
        to_bytes(self.g().counter.max())
    }

    /// Charges refused at this group.
    pub fn failcnt(&self) -> usize {
        self.g().counter.failcnt()
    }

    /// An [`Allocator`](allocator_api2::alloc::Allocator) that charges this group, from any thread.
    pub fn allocator(&self) -> CgroupAllocator<'k, S, R, P> {
        CgroupAllocator { handle: self.clone() }
    }

    /// A `memory.stat`-like snapshot.
    pub fn stat(&self) -> GroupStat {
        let g = self.g();
        let k = self.kmem;
        let mut st = GroupStat {
            name: GroupName(g.name),
            usage: self.usage(),
            peak: self.peak(),
            max: self.max(),
            high: to_bytes(g.counter.high()),
            soft_limit: to_bytes(g.counter.soft()),
            low: to_bytes(g.counter.low()),
            failcnt: g.counter.failcnt(),
            events_max: g.ev_max.get(),
            events_oom: g.ev_oom.get(),
            events_high: g.ev_high.get(),
            events_low: g.ev_low.get(),
            soft_reclaim_passes: g.ev_soft.get(),
            soft_reclaim_bytes: to_bytes(g.soft_pages.get()),
            stocked: to_bytes(g.counter.stocked()),
            large: 0,
            caches: [CacheRow::EMPTY; MAX_ACCOUNTED],
            ncaches: 0,
            pressures: super::pressure::rows(g),
        };
        let mut add = |name: Name, objects: usize, pages: usize| {
            if st.ncaches < MAX_ACCOUNTED && pages > 0 {
                st.caches[st.ncaches] = CacheRow { name, objects, pages };
                st.ncaches += 1;
            }
        };
        if core::ptr::eq(g, &k.root) {
            for (c, cache) in k.classes.iter().enumerate() {
                let s = cache.cache.stats();
                add(class_name(c), s.active_objects, s.pages);
            }
            st.large = to_bytes(k.large_pages.get());
        } else {
            // Child caches of a destroyed typed cache are freed once no
            // iteration runs: hold one off while reading them.
            let _read = k.read_guard();
            g.for_each_cache(|i, cache| {
                let s = cache.cache.stats();
                add(k.acct_name(i), s.active_objects, s.pages);
            });
            st.large = to_bytes(g.large_pages.get());
        }
        st
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Cgroup<'static, S, R, P> {
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
    pub fn enter(&self) -> CgroupGuard<'static, S, R, P> {
        let g = self.g();
        let token = self.kmem.token(g);
        if !token.is_null() {
            // The reference the current-group slot owns while `g` is current.
            g.get();
        }
        // The swapped-out token's reference passes to the guard.
        let prev = self.kmem.swap_token(token);
        CgroupGuard { kmem: self.kmem, prev }
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

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// The name of the accounted cache at accounting index `i`.
    pub(crate) fn acct_name(&self, i: usize) -> Name {
        if i < NCLASSES {
            return class_name(i);
        }
        let mut found = Name::UNKNOWN;
        self.for_each_desc(|d| {
            if d.acct_idx == i {
                found = d.name;
            }
        });
        found
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Clone for Cgroup<'_, S, R, P> {
    fn clone(&self) -> Self {
        Cgroup::new_ref(self.kmem, self.group)
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Drop for Cgroup<'_, S, R, P> {
    fn drop(&mut self) {
        self.kmem.put_group(self.g());
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> fmt::Debug for Cgroup<'_, S, R, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cgroup").field("name", &self.name()).field("usage", &self.usage()).finish()
    }
}

/// Keeps a group current until dropped; see [`Cgroup::enter`].
///
/// Invariant: `prev` is the token that was current when the guard was
/// made, and the guard owns the reference that token holds (see
/// `cgroup::TokenHead`); dropping the guard makes it current again,
/// handing that reference to the platform's slot, and releases the
/// reference of the token it replaces, whichever group (or allocator)
/// that names.
pub struct CgroupGuard<'k, S: PageSource = DefaultSource, R: RawMutex = DefaultRawMutex, P: Platform = DefaultPlatform>
{
    kmem: &'k Kmem<S, R, P>,
    prev: *const (),
}

impl<S: PageSource, R: RawMutex, P: Platform> Drop for CgroupGuard<'_, S, R, P> {
    fn drop(&mut self) {
        // The saved token's mark is dropped and the running context's kept
        // (a guard made inside a shrinker and dropped after it, or the
        // reverse, neither leaves the mark behind nor clears it early).
        let out = self.kmem.swap_token(self.prev);
        // SAFETY: the slot owned a reference on the token it held (see
        // `TokenHead`); having swapped it out, it is ours to release.
        unsafe { crate::cgroup::release_token(out) };
    }
}

/// An [`Allocator`](allocator_api2::alloc::Allocator) charging one group; see [`Cgroup::allocator`].
pub struct CgroupAllocator<
    'k,
    S: PageSource = DefaultSource,
    R: RawMutex = DefaultRawMutex,
    P: Platform = DefaultPlatform,
> {
    handle: Cgroup<'k, S, R, P>,
}

impl<S: PageSource, R: RawMutex, P: Platform> Clone for CgroupAllocator<'_, S, R, P> {
    fn clone(&self) -> Self {
        CgroupAllocator { handle: self.handle.clone() }
    }
}

impl<'k, S: PageSource, R: RawMutex, P: Platform> CgroupAllocator<'k, S, R, P> {
    /// The allocator.
    pub(crate) fn kmem(&self) -> &'k Kmem<S, R, P> {
        self.handle.kmem
    }

    /// `Allocator::allocate`, charging this group: `None` for `AllocError`.
    pub(crate) fn block_allocate(&self, layout: Layout) -> Option<NonNull<[u8]>> {
        let k = self.handle.kmem;
        if layout.size() == 0 {
            return Some(super::dangling(layout));
        }
        let g = k.effective(self.handle.g());
        let p = k.alloc_in(g, layout.size(), layout.align())?;
        Some(NonNull::slice_from_raw_parts(p, Kmem::<S, R, P>::usable_size(layout.size(), layout.align())))
    }

    /// Moves a block to a new layout, charging the new block to this group;
    /// `None` leaves the old block as it was.
    ///
    /// # Safety
    ///
    /// `ptr` is a live block of this `Kmem` that `old` fits.
    pub(crate) unsafe fn block_resize(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<[u8]>> {
        let k = self.handle.kmem;
        if old.size() != 0 && new.size() != 0 && old.align() == new.align() {
            // In place when the class or page count allows.
            let len = Kmem::<S, R, P>::usable_size(new.size(), new.align());
            if Kmem::<S, R, P>::usable_size(old.size(), old.align()) == len {
                return Some(NonNull::slice_from_raw_parts(ptr, len));
            }
        }
        let fresh = self.block_allocate(new)?;
        // SAFETY: both blocks are live and distinct; the copy fits both.
        unsafe {
            core::ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.as_ptr() as *mut u8, old.size().min(new.size()));
            if old.size() != 0 {
                k.free_raw(ptr, old.size(), old.align());
            }
        }
        Some(fresh)
    }
}

/// One accounted cache's line in a [`GroupStat`].
#[derive(Clone, Copy)]
struct CacheRow {
    name: Name,
    objects: usize,
    pages: usize,
}

impl CacheRow {
    const EMPTY: CacheRow = CacheRow { name: Name::EMPTY, objects: 0, pages: 0 };
}

/// A `memory.stat`-like snapshot of a group; `Display` writes one
/// `key value` pair per line (sizes in bytes, `max` for no limit), then
/// one `slab <cache> <objects> <pages>` line per cache.
#[derive(Clone, Copy)]
pub struct GroupStat {
    /// The group's name.
    pub name: GroupName,
    /// Bytes charged (group and descendants).
    pub usage: usize,
    /// Largest usage since the last reset.
    pub peak: usize,
    /// Hard limit.
    pub max: usize,
    /// Throttling threshold.
    pub high: usize,
    /// Soft limit.
    pub soft_limit: usize,
    /// Protection.
    pub low: usize,
    /// Charges refused at this group.
    pub failcnt: usize,
    /// Charges that hit `max` (before reclaim).
    pub events_max: usize,
    /// Charges that failed after reclaim.
    pub events_oom: usize,
    /// Times an allocating task reclaimed because usage was above `high`.
    pub events_high: usize,
    /// Times contention reclaim passed this group over, protected by `low`.
    pub events_low: usize,
    /// Soft-limit reclaim passes run on this group.
    pub soft_reclaim_passes: usize,
    /// Bytes those passes freed.
    pub soft_reclaim_bytes: usize,
    /// Bytes pre-charged in CPU stocks.
    pub stocked: usize,
    /// Bytes of large objects (with their header pages) charged here.
    pub large: usize,
    caches: [CacheRow; MAX_ACCOUNTED],
    ncaches: usize,
    pressures: ([super::pressure::PressureRow; crate::cgroup::MAX_PRESSURES], usize),
}

impl GroupStat {
    /// `(cache name, objects out of the slabs, pages)` of each of the
    /// group's own caches that holds pages.
    pub fn caches(&self) -> impl Iterator<Item = (&str, usize, usize)> {
        self.caches[..self.ncaches].iter().map(|r| (r.name.as_str(), r.objects, r.pages))
    }
}

fn limit(f: &mut fmt::Formatter<'_>, key: &str, v: usize) -> fmt::Result {
    if v >= usize::MAX / PAGE_SIZE * PAGE_SIZE { writeln!(f, "{key} max") } else { writeln!(f, "{key} {v}") }
}

impl fmt::Display for GroupStat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "group {}", self.name)?;
        writeln!(f, "usage {}", self.usage)?;
        writeln!(f, "peak {}", self.peak)?;
        limit(f, "max", self.max)?;
        limit(f, "high", self.high)?;
        limit(f, "soft_limit", self.soft_limit)?;
        writeln!(f, "low {}", self.low)?;
        writeln!(f, "failcnt {}", self.failcnt)?;
        writeln!(f, "events_max {}", self.events_max)?;
        writeln!(f, "events_oom {}", self.events_oom)?;
        writeln!(f, "events_high {}", self.events_high)?;
        writeln!(f, "events_low {}", self.events_low)?;
        writeln!(f, "soft_reclaim_passes {}", self.soft_reclaim_passes)?;
        writeln!(f, "soft_reclaim_bytes {}", self.soft_reclaim_bytes)?;
        writeln!(f, "stocked {}", self.stocked)?;
        writeln!(f, "large {}", self.large)?;
        for (name, objects, pages) in self.caches() {
            writeln!(f, "slab {name} {objects} {pages}")?;
        }
        for row in &self.pressures.0[..self.pressures.1] {
            writeln!(f, "{row}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for GroupStat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
