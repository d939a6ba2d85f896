//! `high` throttling (issue 18, item 4): a task left above `high` after
//! reclaim is delayed in proportion to the excess through
//! `Platform::throttle`, bounded, counted, and never in atomic context.

use core::alloc::{GlobalAlloc, Layout};
use std::boxed::Box;
use std::sync::Mutex;
use std::vec::Vec;

use crate::cgroup::delay;
use crate::platform::{DefaultRawMutex, NoCpus, PAGE_SIZE, Platform, Region};
use crate::sync::{AtomicBool, Ordering};
use crate::testutil::arena;
use crate::{Cgroup, HIGH_DELAY_BATCH, HIGH_DELAY_MAX_NS, HIGH_DELAY_MIN_NS, HIGH_DELAY_NS, Kmem};

/// One context (`NoCpus`) whose throttle records the delays it is asked
/// for instead of sleeping, and whose interrupt context is a switch.
struct Recorder {
    inner: NoCpus,
    interrupt: AtomicBool,
    delays: Mutex<Vec<u64>>,
}

// SAFETY: every method forwards to `NoCpus` (which meets the contract) or
// touches only the recorder's own state; nothing calls the allocator.
unsafe impl Platform for Recorder {
    fn current_group(&self) -> *const () {
        self.inner.current_group()
    }
    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.set_current_group(token) }
    }
    unsafe fn enter(&self) -> Option<usize> {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.enter() }
    }
    unsafe fn exit(&self, slot: usize) {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.exit(slot) }
    }
    fn in_interrupt(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed)
    }
    fn throttle(&self, ns: u64) {
        self.delays.lock().unwrap().push(ns);
    }
}

type K = Kmem<Region<DefaultRawMutex, 8>, DefaultRawMutex, Recorder>;

const MB: usize = 1 << 20;
/// Large objects of 7 pages, charged 8 with their header page.
const SIZE: usize = 7 * PAGE_SIZE;
const OBJ: usize = 8 * PAGE_SIZE;
const MS: u64 = 1_000_000;

fn kmem() -> &'static K {
    let platform = Recorder { inner: NoCpus::new(), interrupt: AtomicBool::new(false), delays: Mutex::new(Vec::new()) };
    let k: &'static K = Box::leak(Box::new(Kmem::with_platform(Region::new(), platform)));
    k.source().add(arena(16 * MB), 0).unwrap();
    k
}

/// `n` objects charged to `g` (the root: `None`), no shrinker knows of.
fn pinned(k: &'static K, g: Option<&Cgroup<'static, K>>, n: usize, out: &mut Vec<usize>) {
    let _in = g.map(|g| g.enter());
    let l = Layout::from_size_align(SIZE, 8).unwrap();
    for _ in 0..n {
        // SAFETY: a valid layout.
        let p = unsafe { k.alloc(l) };
        assert!(!p.is_null());
        out.push(p as usize);
    }
}

fn delays(k: &K) -> Vec<u64> {
    core::mem::take(&mut *k.platform().delays.lock().unwrap())
}

#[test]
fn the_delay_is_in_proportion_to_the_excess_and_bounded() {
    let batch = HIGH_DELAY_BATCH;
    assert_eq!(delay(80, 80, batch), HIGH_DELAY_NS);
    assert_eq!(delay(8, 80, batch), HIGH_DELAY_NS / 10);
    assert_eq!(delay(80, 80, batch / 4), HIGH_DELAY_NS / 4);
    assert_eq!(delay(80, 80, 0), 0, "nothing charged, no delay");
    assert_eq!(delay(120, 8, batch), HIGH_DELAY_MAX_NS, "capped");
    assert_eq!(delay(5, 0, batch), HIGH_DELAY_MAX_NS, "a high of 0 counts as 1 page");
    assert_eq!(delay(1, 8000, batch), 0, "under {HIGH_DELAY_MIN_NS} ns: none");
    assert_eq!(delay(usize::MAX, 1, usize::MAX), HIGH_DELAY_MAX_NS);
}

/// Nothing can be reclaimed, so every allocation above `high` is
/// delayed, for the 8 pages it charged: 250 us per 8 pages of excess
/// over a `high` of 80 pages (20 ms * 8/64 * excess/80), in the group
/// whose excess it is (the parent's here), capped at 100 ms.
#[test]
fn a_task_left_above_high_is_delayed_in_proportion() {
    let k = kmem();
    let p = k.root().create_child("p").unwrap();
    let g = p.create_child("g").unwrap();
    p.set_high(10 * OBJ).unwrap();
    let mut objs = Vec::new();
    pinned(k, Some(&g), 10, &mut objs);
    assert_eq!(delays(k), [0u64; 0], "at high, not above");
    pinned(k, Some(&g), 5, &mut objs);
    assert_eq!(delays(k), [MS / 4, MS / 2, 3 * MS / 4, MS, 5 * MS / 4]);
    let st = p.stat();
    assert_eq!((st.throttled, st.throttled_us, st.events_local.high), (5, 3750, 5));
    assert_eq!((g.stat().throttled, g.stat().events_local.high), (0, 0), "g's own high held");
    // g's own high is further behind (120 pages over 8): the larger delay,
    // capped, is g's.
    g.set_high(OBJ).unwrap();
    pinned(k, Some(&g), 1, &mut objs);
    assert_eq!(delays(k), [HIGH_DELAY_MAX_NS]);
    assert_eq!((g.stat().throttled, g.stat().throttled_us), (1, 100_000));
    assert_eq!(p.stat().throttled, 5);
    // Without a high, no delay.
    p.set_high(usize::MAX).unwrap();
    g.set_high(usize::MAX).unwrap();
    pinned(k, Some(&g), 1, &mut objs);
    assert_eq!(delays(k), [0u64; 0]);
    for o in objs {
        // SAFETY: allocated by `pinned` with this layout, freed once.
        unsafe { k.dealloc(o as *mut u8, Layout::from_size_align(SIZE, 8).unwrap()) };
    }
}

/// Atomic scopes and interrupt context do not reclaim, and are never
/// delayed; the `high` events still count.
#[test]
fn atomic_and_interrupt_context_are_never_throttled() {
    let k = kmem();
    let g = k.root().create_child("g").unwrap();
    g.set_high(0).unwrap();
    let mut objs = Vec::new();
    {
        let _atomic = k.atomic_scope();
        pinned(k, Some(&g), 3, &mut objs);
    }
    assert_eq!(delays(k), [0u64; 0]);
    assert_eq!((g.stat().events_local.high, g.stat().throttled), (3, 0));
    // Interrupt context charges the root.
    k.root().set_high(0).unwrap();
    k.platform().interrupt.store(true, Ordering::Relaxed);
    pinned(k, None, 2, &mut objs);
    k.platform().interrupt.store(false, Ordering::Relaxed);
    assert_eq!(delays(k), [0u64; 0]);
    assert_eq!((k.root().stat().events_local.high, k.root().stat().throttled), (2, 0));
    // Out of both, the same allocation is delayed (capped: a high of 0).
    pinned(k, Some(&g), 1, &mut objs);
    assert_eq!(delays(k), [HIGH_DELAY_MAX_NS]);
    for o in objs {
        // SAFETY: allocated by `pinned` with this layout, freed once.
        unsafe { k.dealloc(o as *mut u8, Layout::from_size_align(SIZE, 8).unwrap()) };
    }
}

#[test]
fn threads_throttle_sleeps() {
    let t = std::time::Instant::now();
    crate::Threads::new().throttle(2 * MS);
    assert!(t.elapsed() >= core::time::Duration::from_millis(2));
}

/// A large object grown in place past its group's `high` counts a `high`
/// event and delays the task, as the same pages charged by an allocation
/// would (found by a review: in-place growth charged without the check).
#[test]
fn growth_in_place_above_high_counts_and_delays() {
    use allocator_api2::alloc::Allocator;
    // A region aligned to its size: the pages after the first object are
    // free, so every growth below is in place.
    let platform = Recorder { inner: NoCpus::new(), interrupt: AtomicBool::new(false), delays: Mutex::new(Vec::new()) };
    let k: &'static K = Box::leak(Box::new(Kmem::with_platform(Region::new(), platform)));
    let aligned = Layout::from_size_align(16 * MB, 16 * MB).unwrap();
    // SAFETY: a layout of non-zero size; the memory is leaked to the
    // region, as `arena`'s is.
    let mem = unsafe { std::alloc::alloc(aligned) };
    assert!(!mem.is_null());
    // SAFETY: 16 MiB just allocated, ours alone from here on.
    k.source().add(unsafe { core::slice::from_raw_parts_mut(mem.cast(), 16 * MB) }, 0).unwrap();
    let g = k.root().create_child("g").unwrap();
    g.set_high(4 * OBJ).unwrap();
    let a = g.allocator();
    let mut cur = Layout::from_size_align(OBJ, 8).unwrap();
    let p = a.allocate(cur).unwrap().cast::<u8>();
    for i in 2..=8 {
        let new = Layout::from_size_align(i * OBJ, 8).unwrap();
        // SAFETY: `p` is live with layout `cur`.
        let q = unsafe { a.grow(p, cur, new) }.unwrap();
        assert_eq!(q.cast::<u8>(), p, "growth {i} moved: the pages after the object were not free");
        cur = new;
    }
    assert!(g.usage() > 4 * OBJ);
    let (high, throttled) = (g.stat().events_local.high, g.stat().throttled);
    assert!(high >= 4 && throttled >= 4, "high events {high}, delays {throttled}");
    assert!(!delays(k).is_empty());
    // SAFETY: live with layout `cur`, freed once.
    unsafe { a.deallocate(p, cur) };
}
