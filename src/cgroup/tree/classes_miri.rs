//! Under Miri (with `std`): the size classes' caches out of line, each in
//! an allocation of its own.
//!
//! Miri's borrow trackers (Stacked and Tree Borrows) keep per-location
//! state for every byte a reference covers, split into as many ranges as
//! the bytes have different histories, and every retag of a reference
//! (each call taking `&self`) walks all of its ranges. Inline, the 43
//! caches are 52 KB with some 40 ranges each (a lock, its padding and its
//! data per node list and depot): about 1,700 of the 1,800 ranges of a
//! `Kmem`, walked on every one of the dozens of `&Kmem` and `&Tree`
//! retags an allocation makes, which was most of a user's Miri run. Out of
//! line, a `&Tree` covers a pointer, and an allocation walks only the one
//! cache it uses.
//!
//! Tree Borrows also walks every range of the *allocation* a reference
//! points into (not only the reference's own) when it records a retag,
//! ends a call's protector, or collects a dead tag: with the 43 caches in
//! one array (some 2,500 ranges by the end of a user's small suite), a
//! retag into any cache walked all of them, most of a Tree Borrows run.
//! So each cache has an allocation of its own, and the tree holds a table
//! of their 43 pointers (a plain array, read by value: no references into
//! it are made).
//!
//! Same caches, same code paths: only where they live differs. They are
//! made at first use (a `Kmem` is `const`), with `std::alloc::System` (the
//! one allocator kmemcg uses outside its page source, and only under
//! Miri), published by compare-and-swap; a loser of the race frees its
//! copies. Freed with the tree.

use core::alloc::Layout;
use core::ptr;
use std::alloc::{GlobalAlloc, System};

use lock_api::RawMutex;

use crate::magazine::{Acct, MagCache};
use crate::slab::classes::{GEOMETRIES, NCLASSES};
use crate::sync::{AtomicPtr, Ordering, atomic_null};

/// The table of the size classes' caches: one pointer per class, each to
/// a cache in an allocation of its own.
type Table<R> = [*mut MagCache<R>; NCLASSES];

/// The size classes' caches, on Miri's heap from first use.
///
/// `table`: null until first use, then a table of `NCLASSES` pointers to
/// caches, published once with `Release` (after the table and every cache
/// are written) and read with `Acquire`; never changed again until drop.
pub(crate) struct OutOfLine<R: RawMutex> {
    table: AtomicPtr<Table<R>>,
}

// SAFETY: only `&MagCache` ever leaves a shared `OutOfLine`, as from the
// inline array; the caches are `Sync`.
unsafe impl<R: RawMutex + Sync> Sync for OutOfLine<R> {}
// SAFETY: the caches are owned by the value, as inline.
unsafe impl<R: RawMutex + Send> Send for OutOfLine<R> {}

impl<R: RawMutex> OutOfLine<R> {
    const TABLE: Layout = Layout::new::<Table<R>>();
    const CACHE: Layout = Layout::new::<MagCache<R>>();

    /// No caches yet: made at first use.
    pub(crate) const fn new() -> Self {
        OutOfLine { table: atomic_null() }
    }

    /// The table, made and published if this is the first use.
    #[inline(always)]
    fn table(&self) -> *mut Table<R> {
        let p = self.table.load(Ordering::Acquire);
        if p.is_null() { self.make() } else { p }
    }

    #[cold]
    #[inline(never)]
    fn make(&self) -> *mut Table<R> {
        // SAFETY: a layout of non-zero size.
        let t = unsafe { System.alloc(Self::TABLE) }.cast::<Table<R>>();
        if t.is_null() {
            // Miri's heap does not run out; nothing to fall back on.
            std::process::abort();
        }
        let slots = t.cast::<*mut MagCache<R>>();
        for (i, geo) in GEOMETRIES.iter().enumerate() {
            // SAFETY: a layout of non-zero size.
            let c = unsafe { System.alloc(Self::CACHE) }.cast::<MagCache<R>>();
            if c.is_null() {
                std::process::abort();
            }
            // SAFETY: `c` is a fresh allocation for one cache, written once
            // here; `i < NCLASSES`, so `slots.add(i)` is inside the fresh
            // table, each slot written once before the table is published.
            unsafe {
                c.write(MagCache::new(*geo, Acct::Root));
                slots.add(i).write(c);
            }
        }
        // Release: publishes the writes above. Acquire on failure: reads
        // the winner's table.
        match self.table.compare_exchange(ptr::null_mut(), t, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => t,
            Err(winner) => {
                // SAFETY: ours, never published, caches with nothing in
                // them yet (`MagCache` owns no memory until it is used).
                unsafe { Self::free(t) };
                winner
            }
        }
    }

    /// Drops and frees every cache of table `t`, then the table.
    ///
    /// # Safety
    ///
    /// `t` is a table made by `make`, every slot written, and nothing
    /// refers to it or to its caches any more.
    unsafe fn free(t: *mut Table<R>) {
        let slots = t.cast::<*mut MagCache<R>>();
        for i in 0..NCLASSES {
            // SAFETY: `i < NCLASSES`, a written slot of the table; its cache
            // was made with `CACHE` and is ours alone (caller), dropped in
            // place once and freed.
            unsafe {
                let c = slots.add(i).read();
                ptr::drop_in_place(c);
                System.dealloc(c.cast(), Self::CACHE);
            }
        }
        // SAFETY: the table was made with `TABLE` (caller).
        unsafe { System.dealloc(t.cast(), Self::TABLE) };
    }

    /// The cache at `i`, if `i < NCLASSES`.
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> Option<&MagCache<R>> {
        // SAFETY: in bounds (checked).
        if i < NCLASSES { Some(unsafe { self.get_unchecked(i) }) } else { None }
    }

    /// The cache at `i`, unchecked.
    ///
    /// # Safety
    ///
    /// `i < NCLASSES`.
    #[inline(always)]
    pub(crate) unsafe fn get_unchecked(&self, i: usize) -> &MagCache<R> {
        // The slot is read by value (never written after publication); it
        // points to a live cache that lives as long as `self`, to which
        // only shared references are made.
        // SAFETY: `i < NCLASSES` (caller): a slot of the published table.
        unsafe { &*self.table().cast::<*mut MagCache<R>>().add(i).read() }
    }

    /// The caches, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &MagCache<R>> {
        // SAFETY: every index below NCLASSES.
        (0..NCLASSES).map(move |i| unsafe { self.get_unchecked(i) })
    }
}

impl<R: RawMutex> core::ops::Index<usize> for OutOfLine<R> {
    type Output = MagCache<R>;
    #[inline(always)]
    fn index(&self, i: usize) -> &MagCache<R> {
        match self.get(i) {
            Some(c) => c,
            None => panic!("size class index out of bounds"),
        }
    }
}

impl<R: RawMutex> Drop for OutOfLine<R> {
    fn drop(&mut self) {
        let t = *self.table.get_mut();
        if !t.is_null() {
            // SAFETY: the published table, ours alone now (`&mut self`),
            // with its caches.
            unsafe { Self::free(t) };
        }
    }
}
