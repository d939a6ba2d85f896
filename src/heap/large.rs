//! The page path: objects larger than the largest size class, or aligned
//! above a page.
//!
//! Each large object gets an exact page run plus one header page in front
//! of it, which records the group charged and the run's extent. That page
//! is what lets a free uncharge the right group and lets `realloc` resize
//! in place; it costs one page per large object (at most 20% of the
//! smallest, 16 KiB + 1 B, and under 1% from 400 KiB up).
//!
//! A block that `realloc` moves onto the page path because it grows (past
//! the largest size class, or a large object whose next pages are taken)
//! is placed with room to double twice more in place, when the page source
//! allows it (`PageSource::room_to_grow`: `OsPages` does, a fixed `Region`
//! does not, as every such object starting a block of its own fragments a
//! fixed amount of memory sooner; the random model of `src/tests/heap.rs`
//! saw order-8 runs run out in a 256 MiB region): its run is cut from
//! one of the source's that holds four times its pages (up to 1 MiB,
//! `page::ROOM_MAX_ORDER`), and the rest goes back at once, free right
//! after the object for the next `resize_large_in_place` to claim. Nothing
//! stays reserved: pages another allocation takes first are simply not
//! there to claim, and the object moves again.

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::Kmem;
use crate::cgroup::Group;
use crate::counter::PageCounter;
use crate::page::{alloc_exact, free_exact, pages_for};
use crate::platform::{MAX_ORDER, PAGE_SIZE, PageSource, Platform, order_for_pages};

/// Marks a live large-object header ("kmlarge\\0").
const LARGE_MAGIC: u64 = 0x6b6d_6c61_7267_6500;

/// The page in front of a large object.
#[repr(C)]
struct LargeHeader {
    magic: u64,
    /// The group charged (a `Group<R>` of this allocator, whose lock type
    /// the header need not name); null for the root.
    group: *const (),
    /// Pages of the object (the header page not included).
    pages: usize,
    /// The NUMA node its pages are on.
    node: usize,
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// A large object of `size` bytes aligned to `align`, charged to `g`
    /// (null: root); `grown`: `realloc` moves a growing block here, so the
    /// run is placed with room after it (see the module docs).
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_large(
        &self,
        g: *const Group<R>,
        size: usize,
        align: usize,
        grown: bool,
    ) -> Option<NonNull<u8>> {
        self.alloc_large_as(g, size, align, grown, false)
    }

    /// [`Kmem::alloc_large`] for a guard-page sample (`debug`), which is
    /// only a try: the caller allocates from a slab when it fails. So a
    /// refused charge neither reclaims nor counts (no `max` or `oom`
    /// event, no `failcnt`), and an exhausted page source gets neither
    /// contention reclaim nor the out-of-memory handler.
    #[cold]
    #[inline(never)]
    pub(crate) fn try_alloc_large_sample(&self, g: *const Group<R>, size: usize) -> Option<NonNull<u8>> {
        self.alloc_large_as(g, size, PAGE_SIZE, false, true)
    }

    /// [`Kmem::alloc_large`], or with `sample` its try
    /// ([`Kmem::try_alloc_large_sample`]).
    #[inline(always)]
    fn alloc_large_as(
        &self,
        g: *const Group<R>,
        size: usize,
        align: usize,
        grown: bool,
        sample: bool,
    ) -> Option<NonNull<u8>> {
        if !self.settle_alloc() {
            return None;
        }
        let align = align.max(PAGE_SIZE);
        if size > isize::MAX as usize - align {
            return None;
        }
        let pages = pages_for(size)?;
        let lead = align / PAGE_SIZE; // pages from the run start to the object
        // A run no page source can hand out: refused before any charge,
        // reclaim or out-of-memory handler (a review found the handler
        // asked for 2^48 pages), reported as beyond every order.
        if lead.checked_add(pages).and_then(order_for_pages).is_none() {
            if !sample {
                self.record_oom_large(size, MAX_ORDER, pages.saturating_add(1));
            }
            return None;
        }
        // Charged before the run is looked for (a refused charge takes
        // nothing from the source), but noted in the peaks only once it
        // is found.
        let (counter, overdraft) = if sample {
            // SAFETY: callers pass null or a live group of this allocator.
            let counter = unsafe { g.as_ref() }.map_or(self.tree.root().counter(), |g| g.counter());
            counter.try_charge_pending(pages + 1, 0, false, core::ptr::null()).ok()?;
            (counter, 0)
        } else {
            self.tree.charge_pending(self, g, pages + 1).ok()?
        };
        // Uncharged unless the run is found: also when a shrinker or the
        // out-of-memory handler unwinds.
        let charge = Uncharge { counter, pages: pages + 1 };
        let room = if grown && self.source.room_to_grow() { pages.saturating_mul(3) } else { 0 };
        let alloc = || alloc_exact(&self.source, lead + pages, room, align, self.node());
        // An exhausted page source: contention reclaim, step by step (not
        // for a sample, which falls back to a slab).
        let run = if sample {
            alloc()
        } else {
            // Recorded for `last_oom` before the handler runs, and again
            // if its memory did not do.
            let short = || {
                let order = order_for_pages(lead + pages).unwrap_or(MAX_ORDER);
                self.record_oom_large(size, order, pages + 1);
            };
            alloc().or_else(|| self.tree.under_contention(self, alloc)).or_else(|| {
                short();
                if !self.out_of_memory(lead + pages) {
                    return None;
                }
                let run = alloc();
                if run.is_none() {
                    short();
                }
                run
            })
        };
        let (run, node) = run?;
        core::mem::forget(charge);
        counter.note_charged(core::ptr::null(), overdraft);
        counter.add_node_pages(node, pages + 1);
        let obj = run.as_ptr().wrapping_add(align);
        let header = obj.wrapping_sub(PAGE_SIZE).cast::<LargeHeader>();
        if lead > 1 {
            // SAFETY: the pages before the header page are an unused,
            // naturally aligned piece at the start of the run.
            unsafe { free_exact(&self.source, run, lead - 1) };
        }
        // SAFETY: the header page is ours and page aligned.
        unsafe {
            header.write(LargeHeader { magic: LARGE_MAGIC, group: g.cast(), pages, node });
        }
        if let Some(grp) = NonNull::new(g as *mut Group<R>) {
            // SAFETY: a live group of this allocator; the object holds a
            // reference on it until freed.
            let grp = unsafe { grp.as_ref() };
            grp.large_pages().add(pages + 1);
            grp.get();
        }
        self.large_allocs.add(1);
        self.large_pages.add(pages + 1);
        // SAFETY: `g` is null or a live group of ours (the object's
        // reference keeps it so).
        let grp = unsafe { g.as_ref() }.unwrap_or(self.tree.root());
        // SAFETY: inside the run, so not null.
        let obj = unsafe { NonNull::new_unchecked(obj) };
        // `high` reclaim may call shrinkers and the event hook: if one
        // unwinds, the object goes back.
        let undo = FreeLargeOnUnwind { kmem: self, obj };
        self.tree.over_high(self, grp);
        core::mem::forget(undo);
        Some(obj)
    }

    /// The header of the large object at `ptr`, if it looks live.
    fn large_header(&self, ptr: NonNull<u8>) -> Option<*mut LargeHeader> {
        let a = ptr.as_ptr().addr();
        if (cfg!(debug_assertions) || cfg!(feature = "hardened"))
            && (!a.is_multiple_of(PAGE_SIZE)
                || a < PAGE_SIZE
                || self.source.ownership(a - PAGE_SIZE) == crate::platform::Ownership::Foreign)
        {
            return None;
        }
        let h = ptr.as_ptr().wrapping_sub(PAGE_SIZE).cast::<LargeHeader>();
        // SAFETY: the object's header page precedes it (checked readable in
        // debug builds); a volatile read, as a bad pointer may point anywhere.
        let magic = unsafe { core::ptr::addr_of!((*h).magic).read_volatile() };
        (magic == LARGE_MAGIC).then_some(h)
    }

    /// The pages of the live large object at `ptr` (its header says), if
    /// it looks live.
    pub(crate) fn large_pages_of(&self, ptr: NonNull<u8>) -> Option<usize> {
        let h = self.large_header(ptr)?;
        // SAFETY: a live header (its magic said so).
        Some(unsafe { core::ptr::addr_of!((*h).pages).read() })
    }

    /// The group a live large object is charged to (`None` inside: the
    /// root); `None` if debug builds or `hardened` find no large object at
    /// `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live large object of this `Kmem`.
    pub(crate) unsafe fn large_group(&self, ptr: NonNull<u8>) -> Option<Option<&Group<R>>> {
        let h = self.large_header(ptr)?;
        // SAFETY: a live object's header; its reference keeps its group
        // (a live group of this allocator, or null) alive.
        Some(unsafe { (*h).group.cast::<Group<R>>().as_ref() })
    }

    /// Frees a large object and uncharges its group.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live large object of this `Kmem`.
    #[inline(never)]
    pub(crate) unsafe fn free_large(&self, ptr: NonNull<u8>) {
        self.settle();
        let Some(h) = self.large_header(ptr) else {
            self.bad_frees.add(1);
            super::hardened_abort("kmemcg: double free or foreign free of a large object");
            return;
        };
        // SAFETY: a live header; clearing the magic makes a second free of
        // the same pointer detectable while the page stays unused.
        let group = unsafe {
            let LargeHeader { group, pages, node, .. } = h.read();
            (*h).magic = 0;
            self.uncharge_large(group, node, pages + 1);
            free_exact(&self.source, NonNull::new_unchecked(h.cast()), pages + 1);
            group
        };
        self.large_allocs.sub(1);
        // SAFETY: the object's reference kept the group alive until now.
        if let Some(g) = unsafe { group.cast::<Group<R>>().as_ref() } {
            self.tree().put_group(g);
        }
    }

    /// Uncharges `pages` of large objects on `node` from `group` (null:
    /// root).
    fn uncharge_large(&self, group: *const (), node: usize, pages: usize) {
        // SAFETY: a large object's group is a live `Group<R>` of ours.
        let counter = match unsafe { group.cast::<Group<R>>().as_ref() } {
            Some(g) => {
                g.large_pages().sub(pages);
                g.counter()
            }
            None => self.tree().root().counter(),
        };
        counter.sub_node_pages(node, pages);
        counter.uncharge(pages);
        self.large_pages.sub(pages);
    }

    /// Resizes the large object at `ptr` to `new_size` bytes without moving
    /// it: gives back the tail when it needs fewer pages, and takes the
    /// pages right after it from the page source when it needs more and
    /// they are free (charged to the object's group first). Returns whether
    /// it did.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live large object of this `Kmem`.
    pub(crate) unsafe fn resize_large_in_place(&self, ptr: NonNull<u8>, new_size: usize) -> bool {
        let Some(new_pages) = pages_for(new_size) else { return false };
        let Some(h) = self.large_header(ptr) else { return false };
        // SAFETY: a live header of ours.
        let pages = unsafe { (*h).pages };
        if new_pages > pages {
            // SAFETY: a live header of ours; the object's group outlives it.
            return unsafe { self.grow_large_in_place(ptr, h, pages, new_pages) };
        }
        if new_pages < pages {
            let tail = ptr.as_ptr().wrapping_add(new_pages * PAGE_SIZE);
            // SAFETY: the tail pages belong to this object and are past what
            // the caller keeps; the header is ours to update.
            unsafe {
                free_exact(&self.source, NonNull::new_unchecked(tail), pages - new_pages);
                (*h).pages = new_pages;
                self.uncharge_large((*h).group, (*h).node, pages - new_pages);
            }
        }
        true
    }

    /// Grows the large object at `ptr` (header `h`, `pages` pages) to
    /// `new_pages` pages in place, if the page source has the pages after
    /// it free and the object's group can be charged for them.
    ///
    /// # Safety
    ///
    /// `ptr` is a live large object of this `Kmem` with header `h`.
    unsafe fn grow_large_in_place(
        &self,
        ptr: NonNull<u8>,
        h: *mut LargeHeader,
        pages: usize,
        new_pages: usize,
    ) -> bool {
        let extra = new_pages - pages;
        // An object no run could hold (its pages and the header's above
        // `MAX_ORDER`) is refused before any charge, as `alloc_large_as`
        // refuses one (a review found such growth charged, and counted as
        // refused, up to every ancestor, before the page source said no).
        if new_pages.checked_add(1).and_then(order_for_pages).is_none() {
            return false;
        }
        // SAFETY: a live header of ours.
        let group = unsafe { (*h).group };
        // SAFETY: a large object's group is a live `Group<R>` of ours.
        let group = unsafe { group.cast::<Group<R>>().as_ref() };
        // A removed group takes no new charges (a review found growth in
        // place charging it, under its old `max`): the object moves, to a
        // run charged to its nearest online ancestor. The header names one
        // group for all its pages, so the extra ones cannot go elsewhere.
        if group.is_some_and(|g| g.is_offline()) {
            return false;
        }
        let counter = group.map_or(self.tree().root(), |g| g).counter();
        // Noted in the peaks once the pages are claimed (see
        // `alloc_large_as`).
        if counter.try_charge_pending(extra, 0, true, core::ptr::null()).is_err() {
            return false;
        }
        // SAFETY: the end of the object's pages, inside or just past its run.
        let end = unsafe { NonNull::new_unchecked(ptr.as_ptr().wrapping_add(pages * PAGE_SIZE)) };
        if !self.source.claim_pages(end, extra) {
            counter.uncharge(extra);
            return false;
        }
        counter.note_charged(core::ptr::null(), 0);
        // SAFETY: a live header of ours.
        unsafe { (*h).pages = new_pages };
        // The pages right after the object's, in the same span of the
        // source: on its node.
        // SAFETY: as above.
        counter.add_node_pages(unsafe { (*h).node }, extra);
        if let Some(g) = group {
            g.large_pages().add(extra);
        }
        self.large_pages.add(extra);
        // `high` holds for a growth as for any charge (a review found it
        // skipped here): a removed group's levels from its nearest online
        // ancestor up. Its reclaim may call shrinkers and the event hook;
        // the object is grown and consistent if one unwinds.
        let eff = group.map_or(core::ptr::null(), |g| self.tree.effective(g));
        // SAFETY: null, or the object's group or an ancestor, which the
        // object's reference keeps alive.
        self.tree.over_high(self, unsafe { eff.as_ref() }.unwrap_or(self.tree.root()));
        true
    }
}

/// Pages charged for a large object whose run is still to be found:
/// uncharged when dropped, unless forgotten once the run is there.
struct Uncharge<'a> {
    counter: &'a PageCounter,
    pages: usize,
}

impl Drop for Uncharge<'_> {
    fn drop(&mut self) {
        self.counter.uncharge(self.pages);
    }
}

/// A large object not yet handed out: freed when dropped, which happens
/// only if a callback reached before it is handed out unwinds.
struct FreeLargeOnUnwind<'a, S: PageSource, R: RawMutex, P: Platform> {
    kmem: &'a Kmem<S, R, P>,
    obj: NonNull<u8>,
}

impl<S: PageSource, R: RawMutex, P: Platform> Drop for FreeLargeOnUnwind<'_, S, R, P> {
    #[cold]
    fn drop(&mut self) {
        // SAFETY: a live large object of ours that nobody else has; freed
        // once.
        unsafe { self.kmem.free_large(self.obj) };
    }
}
