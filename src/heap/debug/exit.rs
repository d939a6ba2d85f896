//! Checking quarantines when the program exits (`std`): a write after
//! free whose object is still quarantined then would go unseen otherwise.
//!
//! An allocator registers itself at its first poisoned free (at most
//! [`MAX`] at once; more are not checked at exit) and is unregistered
//! when its detector is dropped. One `atexit` handler checks them all.

use lock_api::RawMutex;

use crate::heap::Kmem;
use crate::platform::{PageSource, Platform};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// How many allocators can be checked at exit.
const MAX: usize = 16;

/// A registered allocator: its address (null: a free entry), and the
/// function that checks it (an `unsafe fn(*const ())`), written first.
struct Entry {
    kmem: AtomicPtr<()>,
    check: AtomicPtr<()>,
}

static ENTRIES: [Entry; MAX] =
    [const { Entry { kmem: AtomicPtr::new(core::ptr::null_mut()), check: AtomicPtr::new(core::ptr::null_mut()) } };
        MAX];

/// Set once the `atexit` handler is installed.
static HOOKED: AtomicUsize = AtomicUsize::new(0);

/// Checks the quarantine of the `Kmem<S, R, P>` at `k`.
///
/// # Safety
///
/// `k` is a live `Kmem<S, R, P>`.
unsafe fn check<S: PageSource, R: RawMutex, P: Platform>(k: *const ()) {
    // SAFETY: per the contract.
    unsafe { &*k.cast::<Kmem<S, R, P>>() }.check_quarantine();
}

/// Has `k`'s quarantine checked at exit. `k` stays where it is (a used
/// `Kmem` does) until its detector unregisters it.
pub(super) fn register<S: PageSource, R: RawMutex, P: Platform>(k: &Kmem<S, R, P>) {
    let f: unsafe fn(*const ()) = check::<S, R, P>;
    let kmem = (k as *const Kmem<S, R, P>).cast::<()>().cast_mut();
    for e in &ENTRIES {
        // AcqRel/Acquire pairs with `unregister`'s Release: the entry is
        // free. Then `kmem` is published (Release) after `check`.
        if e.check.compare_exchange(core::ptr::null_mut(), f as *mut (), Ordering::AcqRel, Ordering::Acquire).is_ok() {
            e.kmem.store(kmem, Ordering::Release);
            k.detect.exit_hooked.store(kmem.addr(), Ordering::Relaxed);
            break;
        }
    }
    // Relaxed: only the installation itself is guarded.
    if HOOKED.swap(1, Ordering::Relaxed) == 0 {
        // SAFETY: `at_exit` is an `extern "C" fn()` that lives as long as
        // the program. (glibc's `atexit` takes its own lock and uses a
        // static table for the first 32 handlers: it does not allocate
        // through us.)
        unsafe { libc::atexit(at_exit) };
    }
}

/// Forgets the allocator at address `kmem`, if registered.
pub(super) fn unregister(kmem: usize) {
    for e in &ENTRIES {
        if e.kmem.load(Ordering::Acquire).addr() == kmem {
            e.kmem.store(core::ptr::null_mut(), Ordering::Release);
            e.check.store(core::ptr::null_mut(), Ordering::Release);
        }
    }
}

/// The `atexit` handler: checks every registered allocator.
extern "C" fn at_exit() {
    for e in &ENTRIES {
        // Acquire pairs with `register`'s Release store of `kmem`, made
        // after that of `check`.
        let kmem = e.kmem.load(Ordering::Acquire);
        let f = e.check.load(Ordering::Acquire);
        if kmem.is_null() || f.is_null() {
            continue;
        }
        // SAFETY: `f` was stored from an `unsafe fn(*const ())` by
        // `register` for this `kmem`, which is live until its detector
        // unregisters it.
        unsafe { core::mem::transmute::<*mut (), unsafe fn(*const ())>(f)(kmem) };
    }
}
