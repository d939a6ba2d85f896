//! Under Miri (with `std`): a `Kmem`'s tree out of line, in an allocation
//! of its own from its first shared use.
//!
//! Tree Borrows walks every range of the allocation a reference points
//! into (not only the reference's own) when it records a retag, ends a
//! call's protector, or collects a dead tag. Inline, the tree's ~190 ranges
//! (its root group's counters, its caches' locks, the charged-cache table)
//! were part of the `Kmem`'s ~480, walked by every retag into any part of
//! a `Kmem` static: the dozens of `&Kmem`, `&Tree`, `&Group` and `&Stat`
//! an allocation makes. Out of line, a retag into the tree walks the
//! tree's ranges and one into the rest of the `Kmem` the rest's.
//!
//! A `Kmem` is `const`, so its tree is built inline (the template, behind
//! one cell, so that a retag of the `Kmem` walks it as one range) and
//! moved to `std::alloc::System` at its first shared use, published by
//! compare-and-swap; a loser of the race frees its copy without dropping
//! it (the winner's copy owns what the template owned). The const
//! builders (`tree_mut`) write the template, before anything is shared.
//! Same tree, same code paths: only where it lives differs. Freed with the
//! `Kmem`.

use core::alloc::Layout;
use core::cell::UnsafeCell;
use core::mem::ManuallyDrop;
use core::ptr;
use std::alloc::{GlobalAlloc, System};

use lock_api::RawMutex;

use crate::cgroup::Tree;
use crate::sync::{AtomicPtr, Ordering, atomic_null};

/// A tree, inline until its first shared use, then out of line.
///
/// `template`: the tree as built; only written through `&mut self`, and
/// only while `live` is null; moved out (read bitwise) by the first shared
/// use, and never read again then. `live`: null until then, then the tree
/// on `System`'s heap, published once with `Release` (after it is written)
/// and read with `Acquire`; never changed again until drop.
pub(super) struct OutOfLineTree<R: RawMutex> {
    template: UnsafeCell<ManuallyDrop<Tree<R>>>,
    live: AtomicPtr<Tree<R>>,
}

// SAFETY: only `&Tree` ever leaves a shared `OutOfLineTree` (the template
// is read, never written, while shared), as from an inline tree, which is
// `Sync`.
unsafe impl<R: RawMutex> Sync for OutOfLineTree<R> where Tree<R>: Sync {}
// SAFETY: the tree (template or copy) is owned by the value, as inline.
unsafe impl<R: RawMutex> Send for OutOfLineTree<R> where Tree<R>: Send {}

impl<R: RawMutex> OutOfLineTree<R> {
    const LAYOUT: Layout = Layout::new::<Tree<R>>();

    /// Tree `t`, inline until its first shared use.
    pub(super) const fn new(t: Tree<R>) -> Self {
        OutOfLineTree { template: UnsafeCell::new(ManuallyDrop::new(t)), live: atomic_null() }
    }

    /// The template, to set up (`const`, before the `Kmem` is shared:
    /// nothing has moved it out yet).
    pub(super) const fn template_mut(&mut self) -> &mut Tree<R> {
        // `ManuallyDrop` is `repr(transparent)`.
        // SAFETY: `&mut self`: nothing else refers to the template.
        unsafe { &mut *self.template.get().cast::<Tree<R>>() }
    }

    /// Moves the tree out of line (the first shared use), or returns the
    /// tree another thread moved meanwhile.
    #[cold]
    #[inline(never)]
    fn make(&self) -> *mut Tree<R> {
        // SAFETY: a layout of non-zero size.
        let p = unsafe { System.alloc(Self::LAYOUT) }.cast::<Tree<R>>();
        if p.is_null() {
            // Miri's heap does not run out; nothing to fall back on.
            std::process::abort();
        }
        // The template is only read while shared (no `&mut self` exists),
        // and its copy is used only if it is published below, after which
        // the template is never read or dropped again.
        // SAFETY: `p` is a fresh allocation for one tree; as just above.
        unsafe { p.write(ptr::read(self.template.get().cast::<Tree<R>>())) };
        // Release: publishes the write above. Acquire on failure: reads the
        // winner's tree.
        match self.live.compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => p,
            Err(winner) => {
                // SAFETY: ours, never published: a bitwise copy of the
                // template that the winner's copy owns in its stead, so it
                // is freed without being dropped.
                unsafe { System.dealloc(p.cast(), Self::LAYOUT) };
                winner
            }
        }
    }
}

impl<R: RawMutex> core::ops::Deref for OutOfLineTree<R> {
    type Target = Tree<R>;
    #[inline(always)]
    fn deref(&self) -> &Tree<R> {
        // `live` by hand: one call fewer for Miri to run on every use.
        let p = self.live.load(Ordering::Acquire);
        let p = if p.is_null() { self.make() } else { p };
        // SAFETY: the published tree lives as long as `self` and is only
        // written through `&mut self`.
        unsafe { &*p }
    }
}

impl<R: RawMutex> core::ops::DerefMut for OutOfLineTree<R> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Tree<R> {
        let p = *self.live.get_mut();
        if p.is_null() {
            self.template_mut()
        } else {
            // SAFETY: the published tree, ours alone (`&mut self`).
            unsafe { &mut *p }
        }
    }
}

impl<R: RawMutex> Drop for OutOfLineTree<R> {
    fn drop(&mut self) {
        let p = *self.live.get_mut();
        if p.is_null() {
            // SAFETY: never moved out: the template is the tree, dropped
            // once here.
            unsafe { ManuallyDrop::drop(self.template.get_mut()) };
        } else {
            // SAFETY: the published tree, ours alone now (`&mut self`),
            // dropped in place once and freed with the layout it was made
            // with; the template was moved out and is not dropped.
            unsafe {
                ptr::drop_in_place(p);
                System.dealloc(p.cast(), Self::LAYOUT);
            }
        }
    }
}
