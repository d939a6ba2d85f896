//! Under Miri (with `std`): the size classes' caches out of line.
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
//! Same caches, same code paths: only where the array lives differs. It is
//! made at first use (a `Kmem` is `const`), with `std::alloc::System` (the
//! one allocation kmemcg makes outside its page source, and only under
//! Miri), published by compare-and-swap; a loser of the race frees its
//! copy. Freed with the tree.

use core::alloc::Layout;
use core::ptr;
use std::alloc::{GlobalAlloc, System};

use lock_api::RawMutex;

use crate::magazine::{Acct, MagCache};
use crate::slab::classes::{GEOMETRIES, NCLASSES};
use crate::sync::{AtomicPtr, Ordering, atomic_null};

/// The size classes' caches, on Miri's heap from first use.
///
/// `first`: null until first use, then the first of `NCLASSES` caches,
/// published once with `Release` (after they are written) and read with
/// `Acquire`; never changed again until drop.
pub(crate) struct OutOfLine<R: RawMutex> {
    first: AtomicPtr<MagCache<R>>,
}

// SAFETY: only `&MagCache` ever leaves a shared `OutOfLine`, as from the
// inline array; the caches are `Sync`.
unsafe impl<R: RawMutex + Sync> Sync for OutOfLine<R> {}
// SAFETY: the caches are owned by the value, as inline.
unsafe impl<R: RawMutex + Send> Send for OutOfLine<R> {}

impl<R: RawMutex> OutOfLine<R> {
    const LAYOUT: Layout = match Layout::array::<MagCache<R>>(NCLASSES) {
        Ok(l) => l,
        Err(_) => panic!("the size classes' caches fit a layout"),
    };

    /// No caches yet: made at first use.
    pub(crate) const fn new() -> Self {
        OutOfLine { first: atomic_null() }
    }

    /// The first cache, made and published if this is the first use.
    #[inline(always)]
    fn first(&self) -> *mut MagCache<R> {
        let p = self.first.load(Ordering::Acquire);
        if p.is_null() { self.make() } else { p }
    }

    #[cold]
    #[inline(never)]
    fn make(&self) -> *mut MagCache<R> {
        // SAFETY: a layout of non-zero size.
        let p = unsafe { System.alloc(Self::LAYOUT) }.cast::<MagCache<R>>();
        if p.is_null() {
            // Miri's heap does not run out; nothing to fall back on.
            std::process::abort();
        }
        for (i, geo) in GEOMETRIES.iter().enumerate() {
            // SAFETY: `i < NCLASSES`: inside the fresh allocation, each
            // slot written once before the array is published.
            unsafe { p.add(i).write(MagCache::new(*geo, Acct::Root)) };
        }
        // Release: publishes the writes above. Acquire on failure: reads
        // the winner's caches.
        match self.first.compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => p,
            Err(winner) => {
                // SAFETY: ours, never published, caches with nothing in
                // them yet (`MagCache` owns no memory until it is used).
                unsafe { System.dealloc(p.cast(), Self::LAYOUT) };
                winner
            }
        }
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
        // SAFETY: in bounds (caller) of the published array, which lives
        // as long as `self`; only shared references are made to it.
        unsafe { &*self.first().add(i) }
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
        let p = *self.first.get_mut();
        if !p.is_null() {
            // SAFETY: the published array, ours alone now (`&mut self`):
            // its caches are dropped in place and the block freed with the
            // layout it was made with.
            unsafe {
                ptr::drop_in_place(ptr::slice_from_raw_parts_mut(p, NCLASSES));
                System.dealloc(p.cast(), Self::LAYOUT);
            }
        }
    }
}
