//! Group ids a shrinker may hand back after the group is gone: every group
//! but the root holds an index into this table, whose entry names the
//! group (its token head) from creation until the group is unlinked from
//! `all_groups`. [`super::GroupId`] carries the index beside the address,
//! so `ShrinkControl::contains` checks an id with three loads before it
//! follows the address.
//!
//! The table is two levels of pages taken straight from the page source
//! (uncharged, kept for the allocator's life): a directory page of chunk
//! pointers, and chunk pages of entries, made as indices are first needed.
//! Freed indices are reused first, so the table holds one entry per group
//! at the peak number of groups alive at once.
//!
//! Changes happen under the tree lock; lookups need none. An entry is
//! cleared (to a free-list link) when its group is unlinked, before the
//! unlink's `fence(SeqCst)` in `reclaim_groups`; a lookup runs under a read
//! guard, whose fence comes before its loads (Dekker): a lookup that still
//! finds the group's address has a guard the reclamation waits for, so the
//! group stays allocated until the lookup's caller is done with it.

use core::ptr::{self, NonNull};

use crate::platform::{PAGE_SIZE, PageSource};
use crate::sync::{AtomicPtr, AtomicU32, Ordering, atomic_null, atomic_u32, loom_const_fn};

/// Pointers per page: entries per chunk, and chunks in the directory (8
/// under loom, whose atomics are objects each model creates one by one).
const PER_PAGE: usize = if cfg!(loom) { 8 } else { PAGE_SIZE / core::mem::size_of::<AtomicPtr<()>>() };

/// Groups that can be alive at once in one tree (262,144 with 4 KiB pages
/// on 64-bit targets); one more fails `create_child` with `OutOfMemory`.
pub(crate) const MAX_GROUPS: usize = PER_PAGE * PER_PAGE;

/// The end of the free list (no index is this large).
const NONE: u32 = MAX_GROUPS as u32;

/// The index table (see the module docs).
pub(crate) struct Ids {
    /// The directory page: `PER_PAGE` pointers to chunk pages; null until
    /// the first group. Written under the tree lock (`Release`), read with
    /// `Acquire`.
    dir: AtomicPtr<AtomicPtr<AtomicPtr<()>>>,
    /// The first free index, or `NONE`; under the tree lock (`Relaxed`).
    free: AtomicU32,
    /// Indices handed out at least once; under the tree lock (`Relaxed`).
    fresh: AtomicU32,
}

impl Ids {
    loom_const_fn! {
        pub(super) fn new() -> Self {
            Ids { dir: atomic_null(), free: atomic_u32(NONE), fresh: atomic_u32(0) }
        }
    }

    /// A page of `PER_PAGE` null pointers from `src`.
    fn page<S: PageSource>(src: &S) -> Option<NonNull<AtomicPtr<()>>> {
        let run = src.alloc_pages(0, 0)?;
        let p = run.addr.cast::<AtomicPtr<()>>();
        static_assertions::const_assert!(PER_PAGE * core::mem::size_of::<AtomicPtr<()>>() <= PAGE_SIZE);
        for i in 0..PER_PAGE {
            // SAFETY: a fresh page, ours, aligned for pointers and large
            // enough for `PER_PAGE` of them (asserted above); each made as
            // an atomic (under loom, a model object).
            unsafe { p.as_ptr().add(i).write(atomic_null()) };
        }
        Some(p)
    }

    /// The entry of `index`, if its chunk exists.
    #[inline]
    fn entry(&self, index: u32) -> Option<&AtomicPtr<()>> {
        let i = index as usize;
        if i >= MAX_GROUPS {
            return None;
        }
        // Acquire: pairs with the Release publishing the page (zeroed).
        let dir = NonNull::new(self.dir.load(Ordering::Acquire))?;
        // SAFETY: the directory holds `PER_PAGE` pointers; `i / PER_PAGE`
        // is below that since `i < MAX_GROUPS`.
        let chunk = unsafe { &*dir.as_ptr().add(i / PER_PAGE) }.load(Ordering::Acquire);
        let chunk = NonNull::new(chunk)?;
        // SAFETY: a chunk holds `PER_PAGE` entries; pages are never freed.
        Some(unsafe { &*chunk.as_ptr().add(i % PER_PAGE) })
    }

    /// An index naming `token` from now on; `None` when every index is in
    /// use or a page for the table cannot be had. Under the tree lock.
    pub(super) fn insert<S: PageSource>(&self, src: &S, token: *const ()) -> Option<u32> {
        let head = self.free.load(Ordering::Relaxed);
        let index = if head != NONE {
            let e = self.entry(head)?;
            self.free.store(e.load(Ordering::Relaxed).addr() as u32 >> 1, Ordering::Relaxed);
            head
        } else {
            let index = self.fresh.load(Ordering::Relaxed);
            if index as usize >= MAX_GROUPS {
                return None;
            }
            let mut dir = self.dir.load(Ordering::Relaxed);
            if dir.is_null() {
                dir = Self::page(src)?.as_ptr().cast();
                self.dir.store(dir, Ordering::Release);
            }
            // SAFETY: as in `entry`.
            let slot = unsafe { &*dir.add(index as usize / PER_PAGE) };
            if slot.load(Ordering::Relaxed).is_null() {
                slot.store(Self::page(src)?.as_ptr().cast(), Ordering::Release);
            }
            self.fresh.store(index + 1, Ordering::Relaxed);
            index
        };
        // Release: a lookup that finds `token` sees the group written.
        self.entry(index)?.store(token.cast_mut(), Ordering::Release);
        Some(index)
    }

    /// Frees `index`: from now on it names nothing. Under the tree lock.
    pub(super) fn remove(&self, index: u32) {
        if let Some(e) = self.entry(index) {
            // A free-list link is odd, so it never equals a token (groups
            // are aligned to at least 8).
            let link = ptr::without_provenance_mut(((self.free.load(Ordering::Relaxed) as usize) << 1) | 1);
            e.store(link, Ordering::Release);
            self.free.store(index, Ordering::Relaxed);
        }
    }

    /// Empties the table (every index free, none handed out) and returns
    /// its pages, to be freed once no lookup can be reading them. Under
    /// the tree lock, when no group but the root exists.
    pub(super) fn detach(&self) -> Option<Detached> {
        self.free.store(NONE, Ordering::Relaxed);
        self.fresh.store(0, Ordering::Relaxed);
        // Release: orders nothing a lookup needs; lookups that load null
        // find nothing.
        NonNull::new(self.dir.swap(ptr::null_mut(), Ordering::Release)).map(|dir| Detached { dir })
    }

    /// Whether `index` names `token` now.
    #[inline]
    pub(super) fn names(&self, index: u32, token: *const ()) -> bool {
        !token.is_null() && self.entry(index).is_some_and(|e| ptr::eq(e.load(Ordering::Acquire), token))
    }
}

/// The pages of a detached table: its directory and the chunks it names.
pub(super) struct Detached {
    dir: NonNull<AtomicPtr<AtomicPtr<()>>>,
}

// SAFETY: owned pages, reached only by whoever holds the tree lock.
unsafe impl Send for Detached {}

impl Detached {
    /// Gives the pages back to `src`.
    ///
    /// # Safety
    ///
    /// The pages came from `src`, and no lookup can reach them any more.
    pub(super) unsafe fn free<S: PageSource>(self, src: &S) {
        for i in 0..PER_PAGE {
            // SAFETY: the directory holds `PER_PAGE` pointers.
            let chunk = unsafe { &*self.dir.as_ptr().add(i) }.load(Ordering::Relaxed);
            if let Some(c) = NonNull::new(chunk) {
                // SAFETY: a page of `src` (made by `Ids::page`), unreachable.
                unsafe { src.free_pages(c.cast(), 0) };
            }
        }
        // SAFETY: as above.
        unsafe { src.free_pages(self.dir.cast(), 0) };
    }
}
