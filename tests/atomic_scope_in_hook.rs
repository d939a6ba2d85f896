//! An atomic scope dropped inside the event hook (which runs in the
//! scope's context, with the callback marks added) ends the atomic state:
//! before, the hook's marks were put back with the scope's when it
//! returned, so the thread stayed atomic for good, every later scope
//! found it atomic already, and its allocations stopped reclaiming
//! (found by a review). A scope made inside a callback and kept ends it
//! when it drops, after the callback.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use allocator_api2::alloc::{Allocator, Layout};
use kmemcg::{AtomicScope, Cgroup, Event, GroupId, Kmem, OsPages};

type K = Kmem<OsPages>;

thread_local! {
    static SCOPE: RefCell<Option<AtomicScope<'static, K>>> = const { RefCell::new(None) };
}
static HOOKED: AtomicBool = AtomicBool::new(false);
static KM: OnceLock<&'static K> = OnceLock::new();
/// false: the hook drops the thread's scope; true: it makes one and
/// keeps it.
static MAKE: AtomicBool = AtomicBool::new(false);

fn hook(_: GroupId, e: Event) {
    if e == Event::Max {
        HOOKED.store(true, Ordering::SeqCst);
        if MAKE.load(Ordering::SeqCst) {
            SCOPE.with(|s| *s.borrow_mut() = Some(KM.get().unwrap().atomic_scope()));
        } else {
            SCOPE.with(|s| drop(s.borrow_mut().take()));
        }
    }
}

/// Allocates and frees through `g`'s allocator, leaving reclaimable
/// memory (magazines and empty slabs charged to `g`).
fn churn(g: &Cgroup<'static, K>) {
    let a = g.allocator();
    let l = Layout::from_size_align(512, 8).unwrap();
    let v: Vec<_> = (0..2000).map(|_| a.allocate(l).unwrap()).collect();
    for p in v {
        // SAFETY: allocated above with `l`.
        unsafe { a.deallocate(p.cast(), l) };
    }
}

/// A `max` event on this thread: a 64-byte allocation in a group at max 0.
fn refused_in(tight: &Cgroup<'static, K>) {
    HOOKED.store(false, Ordering::SeqCst);
    assert!(tight.allocator().allocate(Layout::from_size_align(64, 8).unwrap()).is_err());
    assert!(HOOKED.load(Ordering::SeqCst), "the hook ran");
}

#[test]
fn atomic_scopes_dropped_or_made_in_the_hook() {
    let k: &'static K = Box::leak(Box::new(Kmem::new(OsPages::new())));
    KM.set(k).ok();
    let g = k.root().create_child("g").unwrap();
    churn(&g);
    assert!(g.reclaim(1 << 20) > 0, "reclaim works outside a scope");
    let tight = k.root().create_child("tight").unwrap();
    tight.set_max(0).unwrap();
    k.set_event_hook(Some(hook));

    // The outermost scope, dropped inside the hook.
    SCOPE.with(|s| *s.borrow_mut() = Some(k.atomic_scope()));
    churn(&g);
    assert_eq!(g.reclaim(1 << 20), 0, "atomic inside the scope: no reclaim");
    refused_in(&tight);
    assert!(SCOPE.with(|s| s.borrow().is_none()), "the hook dropped the only scope");
    churn(&g);
    assert!(g.reclaim(1 << 20) > 0, "no scope is alive: the thread reclaims again");
    drop(k.atomic_scope());
    churn(&g);
    assert!(g.reclaim(1 << 20) > 0, "a scope made and dropped leaves it so");

    // A scope made inside the hook and kept: atomic after the hook, until
    // it drops.
    MAKE.store(true, Ordering::SeqCst);
    refused_in(&tight);
    assert!(SCOPE.with(|s| s.borrow().is_some()), "the hook made a scope");
    churn(&g);
    assert_eq!(g.reclaim(1 << 20), 0, "the hook's scope is alive: atomic");
    SCOPE.with(|s| drop(s.borrow_mut().take()));
    assert!(g.reclaim(1 << 20) > 0, "its drop ends the atomic state");

    k.set_event_hook(None);
    g.remove().unwrap();
    tight.remove().unwrap();
}
