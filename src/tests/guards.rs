//! Guards of the current group: dropped out of order, forgotten, of two
//! allocators, reset under a live guard.

use core::alloc::{GlobalAlloc, Layout};
use std::vec::Vec;

use super::groups::{assert_frees_one_group_record, group_records, kmem, kmem_with_child, on_own_thread};

/// Issue 13, item 1: guards dropped out of order used to leave the thread's
/// current group at `a` with no reference held, so after `a` was removed
/// and freed, its memory was reused by a new group that the thread's
/// allocations were then charged to (a use-after-free from safe code).
/// Now the current group is referenced for as long as it is current.
#[test]
fn guards_dropped_out_of_order_keep_the_current_group_alive() {
    let k = kmem();
    on_own_thread(|| {
        let a = k.root().create_child("a").unwrap();
        let b = k.root().create_child("b").unwrap();
        let ga = a.enter();
        let gb = b.enter();
        drop(ga);
        drop(gb);
        assert_eq!(k.current_group().name(), "a", "the last dropped guard restored a");
        a.remove().unwrap();
        drop(a);
        b.remove().unwrap();
        drop(b);
        k.shrink();
        // New groups may reuse freed group memory; `a`'s is not freed.
        let fresh: Vec<_> = (0..32).map(|i| k.root().create_child(&std::format!("c{i}")).unwrap()).collect();
        let layout = Layout::from_size_align(4000, 8).unwrap();
        // SAFETY: valid layout.
        let p = unsafe { k.alloc(layout) };
        assert!(!p.is_null());
        for c in &fresh {
            assert_eq!(c.usage(), 0, "{} was charged for an allocation of a thread that never entered it", c.name());
        }
        assert_eq!(k.current_group().name(), "/", "a removed current group charges its online ancestor");
        // SAFETY: allocated above with this layout.
        unsafe { k.dealloc(p, layout) };
        for c in fresh {
            c.remove().unwrap();
        }
    });
    k.check_accounting();
}

/// Forgotten guards pin their group; nothing dangles.
#[test]
fn forgotten_guards_pin_their_group() {
    let k = kmem();
    on_own_thread(|| {
        let a = k.root().create_child("a").unwrap();
        core::mem::forget(a.enter());
        a.remove().unwrap();
        drop(a);
        k.shrink();
        let fresh = k.root().create_child("fresh").unwrap();
        let layout = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: valid layout.
        let p = unsafe { k.alloc(layout) };
        assert_eq!(fresh.usage(), 0);
        // SAFETY: allocated above with this layout.
        unsafe { k.dealloc(p, layout) };
        // Guards made after a forgotten one still nest.
        {
            let _in = fresh.enter();
            assert_eq!(k.current_group().name(), "fresh");
        }
        assert_eq!(k.current_group().name(), "/");
        fresh.remove().unwrap();
        drop(fresh);
        // `a` is still pinned; resetting lets it go.
        k.shrink();
        assert!(group_records(k) >= 1);
        assert_frees_one_group_record(k, "the reset released the pinned group", || k.reset_current_group());
    });
    k.check_accounting();
}

/// Guards of two allocators interleaved out of order: each release goes to
/// the allocator that made the group.
#[test]
fn guards_of_two_allocators_dropped_out_of_order() {
    let (k1, a) = kmem_with_child("a");
    let (k2, b) = kmem_with_child("b");
    on_own_thread(|| {
        let ga = a.enter();
        let gb = b.enter();
        assert_eq!(k1.current_group().name(), "/", "another allocator's token is not k1's group");
        assert_eq!(k2.current_group().name(), "b");
        drop(ga);
        assert_eq!(k2.current_group().name(), "/");
        drop(gb);
        assert_eq!(k1.current_group().name(), "a");
        // Out of order again: `a`'s reference is released to k1, `b`
        // (k2's) stays current.
        let gb = b.enter();
        let groot = k1.root().enter();
        drop(gb);
        drop(groot);
        assert_eq!(k1.current_group().name(), "/");
        assert_eq!(k2.current_group().name(), "b");
        a.remove().unwrap();
        b.remove().unwrap();
    });
    k1.check_accounting();
    k2.check_accounting();
}

/// `reset_current_group` with a guard still alive: the reset releases the
/// group, the guard later restores what it saved; every reference is
/// released exactly once, so the removed group is reclaimed. Resetting
/// with nothing current, or twice, does nothing.
#[test]
fn reset_current_group_with_a_live_guard_and_twice() {
    let k = kmem();
    on_own_thread(|| {
        k.reset_current_group();
        k.reset_current_group();
        assert_eq!(k.current_group().name(), "/");
        let a = k.root().create_child("a").unwrap();
        k.shrink();
        assert_frees_one_group_record(k, "a was released once and reclaimed", || {
            let guard = a.enter();
            k.reset_current_group();
            assert_eq!(k.current_group().name(), "/", "the reset made the root current");
            drop(guard);
            assert_eq!(k.current_group().name(), "/", "the guard restored the root it saved");
            a.remove().unwrap();
            drop(a);
        });
    });
    k.check_accounting();
}
