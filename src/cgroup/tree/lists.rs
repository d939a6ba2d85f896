//! The intrusive lists of the tree (siblings, all groups, the registry):
//! pushed and unlinked under the tree's locks, walked lock-free under a
//! read guard.

use core::ptr::{self, NonNull};

use crate::sync::{AtomicPtr, Ordering};

/// Unlinks `item` from the singly linked list at `head` (links `next`)
/// and returns the pointer the list held: the one made when the item was
/// allocated, with the provenance of its memory, which it is freed
/// through (a pointer made from a shared reference may only read). An
/// item not found (not linked) comes back as given.
///
/// # Safety
///
/// Every item linked from `head` is live, and the caller holds the lock
/// under which the links change.
pub(super) unsafe fn unlink<T>(head: &AtomicPtr<T>, item: &T, next: impl Fn(&T) -> &AtomicPtr<T>) -> NonNull<T> {
    let me = item as *const T as *mut T;
    let after = next(item).load(Ordering::Relaxed);
    let mut link = head;
    loop {
        let cur = link.load(Ordering::Relaxed);
        let Some(c) = NonNull::new(cur) else { return NonNull::from(item) };
        if cur == me {
            link.store(after, Ordering::Release);
            return c;
        }
        // SAFETY: linked items are live (caller contract).
        link = next(unsafe { c.as_ref() });
    }
}

/// Unlinks `item` from the doubly linked list at `head` (links `next`,
/// and `prev` back, null at the first item) in constant time, and
/// returns the pointer the list held (see [`unlink`]). Walks that follow
/// `next` under a read guard see the list before or after, and one at
/// `item` goes on from it as before. An item not linked comes back as
/// given.
///
/// # Safety
///
/// As for [`unlink`].
pub(super) unsafe fn unlink_doubly<T>(
    head: &AtomicPtr<T>,
    item: &T,
    next: impl Fn(&T) -> &AtomicPtr<T>,
    prev: impl Fn(&T) -> &AtomicPtr<T>,
) -> NonNull<T> {
    let before = prev(item).load(Ordering::Relaxed);
    let after = next(item).load(Ordering::Relaxed);
    let link = match NonNull::new(before) {
        None => head,
        // SAFETY: linked items are live (caller contract).
        Some(b) => next(unsafe { b.as_ref() }),
    };
    let held = link.load(Ordering::Relaxed);
    if !ptr::eq(held, item) {
        return NonNull::from(item);
    }
    link.store(after, Ordering::Release);
    if let Some(a) = NonNull::new(after) {
        // SAFETY: as above.
        prev(unsafe { a.as_ref() }).store(before, Ordering::Relaxed);
    }
    prev(item).store(ptr::null_mut(), Ordering::Relaxed);
    // SAFETY: `held` equals `item`, so it is not null.
    unsafe { NonNull::new_unchecked(held) }
}

/// Links `item` (initialised, not linked) first in the doubly linked list
/// at `head`; published with `Release` for walks.
///
/// # Safety
///
/// As for [`unlink`]; `item` is live.
pub(super) unsafe fn push_doubly<T>(
    head: &AtomicPtr<T>,
    item: NonNull<T>,
    next: impl Fn(&T) -> &AtomicPtr<T>,
    prev: impl Fn(&T) -> &AtomicPtr<T>,
) {
    let first = head.load(Ordering::Relaxed);
    // SAFETY: live items (caller contract).
    unsafe {
        next(item.as_ref()).store(first, Ordering::Relaxed);
        prev(item.as_ref()).store(ptr::null_mut(), Ordering::Relaxed);
        if let Some(f) = NonNull::new(first) {
            prev(f.as_ref()).store(item.as_ptr(), Ordering::Relaxed);
        }
    }
    head.store(item.as_ptr(), Ordering::Release);
}

/// Calls `f` on every item of the singly linked list at `head` (links
/// `next`), first to last.
///
/// # Safety
///
/// Every item reachable from `head` stays live during the walk (the
/// caller holds a read guard, or the lock under which links change).
pub(super) unsafe fn walk<T>(head: &AtomicPtr<T>, next: impl Fn(&T) -> &AtomicPtr<T>, mut f: impl FnMut(&T)) {
    let mut cur = head.load(Ordering::Acquire);
    while let Some(p) = NonNull::new(cur) {
        // SAFETY: reachable, so live (caller contract).
        let item = unsafe { p.as_ref() };
        f(item);
        cur = next(item).load(Ordering::Acquire);
    }
}
