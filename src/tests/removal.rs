//! Removing groups: what a removed group keeps (its objects' charges,
//! until they are freed), what it lets go (stocks, metadata), and its
//! frees (seed 001).

use core::alloc::{GlobalAlloc, Layout};
use std::string::ToString;
use std::sync::Barrier;
use std::thread;
use std::vec::Vec;

use super::groups::{
    K, alloc_blocks, assert_frees_one_group_record, assert_uncharged_after_shrink, free_blocks, free_on_threads,
    group_records, kmem, kmem_with_child, on_own_thread,
};
use crate::testutil::scaled;
use crate::{CacheFlags, Error, PAGE_SIZE};

#[test]
fn removal_bad_input() {
    let k = kmem();
    let root = k.root();
    assert_eq!(root.remove(), Err(Error::RootGroup));
    let p = root.create_child("p").unwrap();
    let c = p.create_child("c").unwrap();
    assert_eq!(p.remove(), Err(Error::Busy), "a group with children");
    c.remove().unwrap();
    assert!(c.is_removed());
    assert_eq!(c.remove(), Err(Error::Removed));
    assert_eq!(c.set_max(1 << 20), Err(Error::Removed));
    assert_eq!(c.set_high(1 << 20), Err(Error::Removed));
    assert_eq!(c.create_child("x").err(), Some(Error::Removed));
    // Reads of a removed group's handle still work.
    assert_eq!(c.usage(), 0);
    assert_eq!(c.name(), "c");
    let _ = c.stat().to_string();
    // Its name is free again among the parent's children.
    let c2 = p.create_child("c").unwrap();
    drop(c2);
    // A thread still inside a removed group charges the nearest online
    // ancestor.
    let g = p.create_child("g").unwrap();
    let guard = g.enter();
    g.remove().unwrap();
    let layout = Layout::from_size_align(200, 8).unwrap();
    // SAFETY: valid layout.
    let q = unsafe { k.alloc(layout) };
    assert!(!q.is_null());
    assert_eq!(g.usage(), 0, "a removed group takes no new charges");
    assert!(p.usage() > 0, "the parent was charged instead");
    // SAFETY: freed once.
    unsafe { k.dealloc(q, layout) };
    drop(guard);
    assert_uncharged_after_shrink(k, &[&p]);
}

#[test]
fn seed_001_a_removed_group_keeps_only_its_objects_and_goes_with_the_last() {
    let (k, parent) = kmem_with_child("parent");
    let g = parent.create_child("dying").unwrap();
    let layout = Layout::from_size_align(64, 8).unwrap();
    let objs: Vec<usize> = {
        let _in = g.enter();
        let v = alloc_blocks(k, layout, 20_000);
        // Free every other one: magazines and partial slabs fill up.
        // SAFETY: live blocks of `layout`, each freed once.
        unsafe { free_blocks(k, v.iter().step_by(2).copied(), layout) };
        v.into_iter().skip(1).step_by(2).collect()
    };
    let before = parent.usage();
    assert_eq!(before, g.usage());
    g.remove().unwrap();
    // Removal took the group's stocks: what stays charged is what its live
    // objects need, whole pages of their bytes, and the parent still
    // counts it.
    let pages = (objs.len() * 64).div_ceil(PAGE_SIZE);
    assert_eq!(g.usage(), pages * PAGE_SIZE, "a removed group keeps only its objects' pages");
    assert_eq!(parent.usage(), g.usage(), "the parent keeps counting the removed group's objects");
    assert!(g.usage() <= before);
    // Free the rest from other threads, racing each other.
    // SAFETY: live, freed once.
    unsafe { free_on_threads(k, &objs, 4, |_| layout) };
    // Their bytes went to the slots' stocks, as a live group's do: at most
    // a page each, taken by the next reap.
    assert!(g.usage() <= 4 * PAGE_SIZE, "more than the stocks' pages left: {}", g.usage());
    assert_eq!(parent.usage(), g.usage());
    k.reap();
    assert_eq!(g.usage(), 0);
    assert_eq!(parent.usage(), 0, "no charge lost or left");
    // The group goes with the last handle.
    assert_frees_one_group_record(k, "the group's metadata was freed", || drop(g));
    k.check_accounting();
}

/// Slow-path operations that went to a depot or the slabs, over all slots.
fn slot_misses(k: &K) -> usize {
    (0..crate::MAX_CPUS).map(|s| k.slot_stats(s).misses).sum()
}

/// Seed 001: frees of a removed group's objects stay on the fast path
/// (magazines of the charged cache every group shares), their bytes going
/// to the slot's stock as a live group's do; the stock keeps at most a
/// page of them, until a reap.
#[test]
fn seed_001_frees_after_removal_stay_on_the_fast_path() {
    let (k, g) = kmem_with_child("dying");
    let layout = Layout::from_size_align(64, 8).unwrap();
    let n = scaled(40_000, 20);
    on_own_thread(|| {
        let objs = {
            let _in = g.enter();
            alloc_blocks(k, layout, n)
        };
        g.remove().unwrap();
        let before = slot_misses(k);
        // SAFETY: live blocks of `layout`, each freed once.
        unsafe { free_blocks(k, objs, layout) };
        let slow = slot_misses(k) - before;
        // A miss per magazine of 64 (4 under Miri).
        assert!(slow < n / 2, "{slow} of {n} frees after removal took the slow path");
        assert!(g.usage() <= PAGE_SIZE, "more than the stock's page left: {}", g.usage());
    });
    k.reap();
    assert_eq!(g.usage(), 0);
    assert_frees_one_group_record(k, "the group's metadata was freed", || drop(g));
    k.check_accounting();
}

/// A removed group goes with its last object and the next reap while
/// another thread's slot is busy: the reap takes the stocks holding its
/// bytes from every slot, the busy one's too.
#[test]
fn a_removed_group_goes_with_its_last_object_and_a_reap_while_another_slot_is_busy() {
    let (k, g) = kmem_with_child("dying");
    let layout = Layout::from_size_align(64, 8).unwrap();
    let objs = {
        let g = &g;
        let mut objs = Vec::new();
        on_own_thread(|| {
            let _in = g.enter();
            objs = alloc_blocks(k, layout, scaled(20_000, 20));
        });
        objs
    };
    g.remove().unwrap();
    let (few, rest) = objs.split_at(3);
    let barrier = Barrier::new(2);
    let usage = thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: live blocks of `layout`, each freed once.
            unsafe { free_blocks(k, few.iter().copied(), layout) };
            barrier.wait();
            // This thread keeps its slot (and its buffer) until the other
            // has freed the rest.
            barrier.wait();
        });
        barrier.wait();
        // SAFETY: as above.
        unsafe { free_blocks(k, rest.iter().copied(), layout) };
        assert!(g.usage() <= 2 * PAGE_SIZE, "more than two stocks' pages left: {}", g.usage());
        k.reap();
        let seen = g.usage();
        barrier.wait();
        seen
    });
    assert_eq!(usage, 0, "the removed group is still charged");
    assert_frees_one_group_record(k, "the group's metadata was freed", || drop(g));
    k.check_accounting();
}

/// A removed group's bytes in a slot's stock go as soon as another group
/// takes that stock: its last objects pin nothing in the slot beyond it.
#[test]
fn a_removed_groups_stock_goes_when_another_group_takes_the_slot() {
    let (k, g) = kmem_with_child("dying");
    let h = k.root().create_child("live").unwrap();
    let layout = Layout::from_size_align(64, 8).unwrap();
    on_own_thread(|| {
        let objs = {
            let _in = g.enter();
            alloc_blocks(k, layout, 10)
        };
        g.remove().unwrap();
        // SAFETY: live blocks of `layout`, each freed once.
        unsafe { free_blocks(k, objs, layout) };
        assert_eq!(g.usage(), PAGE_SIZE, "the stock holds the removed group's bytes");
        let _in = h.enter();
        let x = alloc_blocks(k, layout, 1);
        assert_eq!(g.usage(), 0, "the live group's charge flushed the removed group's stock");
        // SAFETY: as above.
        unsafe { free_blocks(k, x, layout) };
    });
    assert_frees_one_group_record(k, "the group's metadata was freed", || drop(g));
    k.check_accounting();
}

/// Decay's reap flushes a removed group's stock by itself: a program
/// that frees a removed group's last objects and then allocates only in
/// the root (which touches no stock) still sees the group go, with no
/// `reap()` or `shrink()` call.
#[test]
fn decay_flushes_a_removed_groups_stock() {
    let (k, g) = kmem_with_child("dying");
    // A reap per 256 slow paths (no clock), so the test does not wait on
    // wall time.
    k.set_decay(crate::Decay::new(0, 256));
    let small = Layout::from_size_align(64, 8).unwrap();
    let big = Layout::from_size_align(4096, 8).unwrap();
    on_own_thread(|| {
        let objs = {
            let _in = g.enter();
            alloc_blocks(k, small, 10)
        };
        g.remove().unwrap();
        // SAFETY: live blocks of `small`, each freed once.
        unsafe { free_blocks(k, objs, small) };
        assert_eq!(g.usage(), PAGE_SIZE, "the stock holds the removed group's bytes");
        let reaps = k.decay_stats().0;
        // Root allocations of a class with 8-round magazines: every few
        // operations a refill or a spill, a slow path that counts towards
        // decay.
        for _ in 0..400 {
            let x = alloc_blocks(k, big, 20);
            // SAFETY: as above.
            unsafe { free_blocks(k, x, big) };
            if g.usage() == 0 {
                break;
            }
        }
        assert!(k.decay_stats().0 > reaps, "decay ran no reap");
        assert_eq!(g.usage(), 0, "decay's reap flushed the removed group's stock");
    });
    assert_frees_one_group_record(k, "the group's metadata was freed", || drop(g));
    k.check_accounting();
}

#[test]
fn zombie_groups_leave_nothing_behind() {
    let k = kmem();
    let layout = Layout::from_size_align(100, 8).unwrap();
    let typed = k.create_cache::<[u8; 300]>("zombie-objs", CacheFlags::ACCOUNT).unwrap();
    k.shrink();
    let baseline = k.stats().source.pages_in_use;
    let mut leftovers: Vec<usize> = Vec::new();
    let mut large = std::collections::BTreeSet::new();
    let mut boxes = Vec::new();
    for i in 0..10_000 {
        let g = k.root().create_child(&std::format!("z{i}")).unwrap();
        {
            let _in = g.enter();
            leftovers.extend(alloc_blocks(k, layout, 3));
            if i % 10 == 0 {
                boxes.push(typed.alloc([i as u8; 300]).unwrap());
                // A large object too.
                // SAFETY: valid layout.
                let p = unsafe { k.alloc(Layout::from_size_align(20_000, 8).unwrap()) } as usize;
                leftovers.push(p);
                large.insert(p);
            }
        }
        g.remove().unwrap();
    }
    assert_eq!(k.root().stat().failcnt, 0);
    // Free everything later, from other threads.
    // (Small objects can be page-aligned too, in slabs of several pages.)
    let layout_of = |p: usize| if large.contains(&p) { Layout::from_size_align(20_000, 8).unwrap() } else { layout };
    // SAFETY: live, freed once with its layout.
    unsafe { free_on_threads(k, &leftovers, 2, layout_of) };
    drop(boxes);
    k.shrink();
    assert_eq!(group_records(k), 0, "group metadata left behind");
    let mut n = 0;
    k.tree().for_each_group(|_| n += 1);
    assert_eq!(n, 0, "groups still listed");
    assert_eq!(k.root().usage() % PAGE_SIZE, 0);
    drop(typed);
    k.shrink();
    assert!(
        k.stats().source.pages_in_use <= baseline,
        "pages not back to the baseline: {} > {baseline}",
        k.stats().source.pages_in_use
    );
}

/// A shrink with no group left frees the charged caches, the size
/// classes' and a live typed cache's (an allocator whose groups are gone
/// keeps none of their memory: the fuzzer's `cgroup_tree` target found a
/// typed cache's kept), and a group made afterwards gets them anew; while
/// a group exists they stay.
#[test]
fn charged_caches_go_with_the_last_group_and_come_back() {
    let (k, g) = kmem_with_child("first");
    let typed = k.create_cache::<[u64; 3]>("kept", CacheFlags::ACCOUNT).unwrap();
    let layout = Layout::from_size_align(64, 8).unwrap();
    let objs = {
        let _in = g.enter();
        alloc_blocks(k, layout, 100)
    };
    drop(typed.alloc_in(&g, [1; 3]).unwrap());
    // SAFETY: live blocks of `layout`, each freed once.
    unsafe { free_blocks(k, objs, layout) };
    k.shrink();
    assert_eq!(
        k.tree().charged_caches.stats().active_objects,
        2,
        "a group exists: its class's and the typed cache's charged caches stay"
    );
    g.remove().unwrap();
    drop(g);
    k.shrink();
    assert_eq!(k.tree().charged_caches.stats().active_objects, 0, "no group left: charged caches freed");
    let h = k.root().create_child("second").unwrap();
    let objs = {
        let _in = h.enter();
        alloc_blocks(k, layout, 100)
    };
    assert!(h.usage() >= 100 * 64);
    let b = typed.alloc_in(&h, [2; 3]).unwrap();
    assert_eq!(k.tree().charged_caches.stats().active_objects, 2, "made anew");
    drop(b);
    // SAFETY: as above.
    unsafe { free_blocks(k, objs, layout) };
    assert_uncharged_after_shrink(k, &[&h]);
}

/// The extremes of one object's charge: the largest size class (16 KiB,
/// four pages for one object, more than a stock holds) and the smallest
/// (8 bytes), from two threads at once in one group: usage follows the
/// live bytes in whole pages, and nothing stays charged once all is freed.
#[test]
fn largest_and_smallest_classes_charge_and_uncharge_exactly() {
    let (k, g) = kmem_with_child("extremes");
    let (big, small) = (Layout::from_size_align(16384, 8).unwrap(), Layout::from_size_align(8, 8).unwrap());
    let n = scaled(64, 8);
    let (bigs, smalls) = thread::scope(|s| {
        let b = s.spawn(|| {
            let _in = g.enter();
            alloc_blocks(k, big, n)
        });
        let t = s.spawn(|| {
            let _in = g.enter();
            alloc_blocks(k, small, n)
        });
        (b.join().unwrap(), t.join().unwrap())
    });
    assert!(bigs.iter().chain(&smalls).all(|&p| p != 0));
    let live = n * 16384 + n * 8;
    // At least the live bytes; at most a page more per slot's stock.
    assert!(g.usage() >= live, "{} < {live}", g.usage());
    assert!(g.usage() <= live.next_multiple_of(PAGE_SIZE) + 64 * PAGE_SIZE, "{}", g.usage());
    // SAFETY: live blocks of their layouts, each freed once.
    unsafe {
        free_blocks(k, bigs, big);
        free_blocks(k, smalls, small);
    }
    assert_uncharged_after_shrink(k, &[&g]);
}

/// The accounting check (`Kmem::check_invariants`, feature `paranoid`)
/// holds on a heap where a removed grandchild of the root still holds an
/// object charged one by one: its pages are in its parent's usage, and
/// the check took them off only for groups it reached through the child
/// lists, which a removed group has left (review finding: "accounting of
/// group /", 8 against 9).
#[test]
fn accounting_check_counts_a_removed_grandchilds_objects() {
    use allocator_api2::alloc::Allocator;
    let k = kmem();
    let p = k.root().create_child("p").unwrap();
    let c = p.create_child("c").unwrap();
    let a = c.allocator();
    let l = Layout::from_size_align(100, 8).unwrap();
    let obj = a.allocate(l).unwrap();
    k.check_accounting();
    c.remove().unwrap();
    k.check_accounting();
    // SAFETY: allocated above with `l`, freed once.
    unsafe { a.deallocate(obj.cast(), l) };
    k.shrink();
    k.check_accounting();
    assert_eq!((c.usage(), p.usage(), k.root().usage()), (0, 0, 0));
}
