//! Callbacks that panic (issue 26, items 11 to 13): a shrinker, the event
//! hook and the out-of-memory handler that panic once, caught by the
//! program, leave their thread able to reclaim and to call them again, and
//! the counters as they were; a `T::drop` that panics still frees its
//! `CacheBox`'s object; a shrinker that allocates in a group at its max
//! overdraws it, within a bound, counted, and the limit holds for the
//! allocation that started the reclaim.
//!
//! The allocations that reach the callbacks go through the `Allocator`
//! API, which may unwind (`GlobalAlloc` may not: there a callback that
//! unwinds aborts, see `tests/hostile.rs`).

use std::alloc::Layout;
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use allocator_api2::alloc::Allocator;
use kmemcg::{
    CacheFlags, Cgroup, Event, GroupId, Kmem, OsPages, PAGE_SIZE, Platform, RECLAIM_OVERDRAFT, Region, ShrinkControl,
    Shrinker,
};

type K = Kmem<OsPages>;

fn kmem() -> &'static K {
    Box::leak(Box::new(Kmem::new(OsPages::new())))
}

/// A large object: 16 pages and a header page.
const OBJ: Layout = match Layout::from_size_align(64 << 10, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// Allocates `OBJ`s through `a` until one fails; returns them.
fn fill(a: &impl Allocator) -> Vec<std::ptr::NonNull<[u8]>> {
    let mut held = Vec::new();
    while let Ok(p) = a.allocate(OBJ) {
        held.push(p);
        assert!(held.len() < 1000, "the max did not hold");
    }
    held
}

fn free_all(a: &impl Allocator, held: Vec<std::ptr::NonNull<[u8]>>) {
    for p in held {
        // SAFETY: allocated by `fill` with `OBJ`, freed once.
        unsafe { a.deallocate(p.cast(), OBJ) };
    }
}

/// Silences the default panic message of the panics these tests cause
/// (the rest go to the default hook).
fn quiet() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>().is_some_and(|s| s.starts_with("planned")) {
                return;
            }
            default(info)
        }));
    });
}

/// Allocates `OBJ`s through `a` until a callback panics: asserts that it
/// did, and that the thread's current-group token (with its marks) is as
/// before; returns what was allocated.
fn fill_until_a_callback_panics<P: Platform>(
    platform: &P,
    a: &impl Allocator,
    what: &str,
) -> Vec<std::ptr::NonNull<[u8]>> {
    let before = platform.current_group();
    let mut held = Vec::new();
    let r = catch_unwind(AssertUnwindSafe(|| {
        while let Ok(p) = a.allocate(OBJ) {
            held.push(p);
        }
    }));
    assert!(r.is_err(), "the {what} did not panic");
    assert_eq!(platform.current_group(), before, "the thread's marks are as before");
    held
}

/// A shrinker that panics on its first scan while armed, and counts its
/// scans.
struct Panicky {
    armed: AtomicBool,
    scans: AtomicUsize,
}

impl Shrinker for Panicky {
    fn count(&self, _: &ShrinkControl) -> usize {
        1
    }
    fn scan(&self, _: &ShrinkControl, _: usize) -> usize {
        self.scans.fetch_add(1, Ordering::SeqCst);
        if self.armed.swap(false, Ordering::SeqCst) {
            panic!("planned: shrinker");
        }
        0
    }
}

/// Item 11: a shrinker that panicked once is called again by the next
/// reclaim on its thread, whose marks are as before; nothing stays charged.
#[test]
fn a_shrinker_that_panicked_once_is_called_again() {
    quiet();
    let k = kmem();
    let s: &'static Panicky = Box::leak(Box::new(Panicky { armed: AtomicBool::new(true), scans: AtomicUsize::new(0) }));
    k.register_shrinker(s).unwrap();
    let g = k.root().create_child("g").unwrap();
    g.set_max(1 << 20).unwrap();
    let a = g.allocator();
    let held = fill_until_a_callback_panics(k.platform(), &a, "shrinker");
    assert_eq!(s.scans.load(Ordering::SeqCst), 1);
    // The next refused allocation reclaims again, and calls the shrinker.
    assert!(a.allocate(OBJ).is_err());
    assert!(s.scans.load(Ordering::SeqCst) > 1, "reclaim no longer calls the shrinker on this thread");
    free_all(&a, held);
    k.unregister_shrinker(s);
    // Nothing stays charged (`shrink` also empties detection's quarantine).
    k.shrink();
    assert_eq!(g.usage(), 0, "the unwound allocation stayed charged");
    g.remove().unwrap();
}

static HOOK_ARMED: AtomicBool = AtomicBool::new(false);
static HOOK_CALLS: AtomicUsize = AtomicUsize::new(0);

fn panicking_hook(_: GroupId, e: Event) {
    if e == Event::Max {
        HOOK_CALLS.fetch_add(1, Ordering::SeqCst);
        if HOOK_ARMED.swap(false, Ordering::SeqCst) {
            panic!("planned: hook");
        }
    }
}

/// Item 11: an event hook that panicked once is called again with the
/// next event on its thread.
#[test]
fn an_event_hook_that_panicked_once_is_called_again() {
    quiet();
    let k = kmem();
    let g = k.root().create_child("g").unwrap();
    g.set_max(1 << 20).unwrap();
    k.set_event_hook(Some(panicking_hook));
    HOOK_ARMED.store(true, Ordering::SeqCst);
    let a = g.allocator();
    let held = fill_until_a_callback_panics(k.platform(), &a, "hook");
    assert_eq!(HOOK_CALLS.load(Ordering::SeqCst), 1);
    assert!(a.allocate(OBJ).is_err());
    assert_eq!(HOOK_CALLS.load(Ordering::SeqCst), 2, "the hook is no longer called on this thread");
    k.set_event_hook(None);
    free_all(&a, held);
    k.shrink();
    assert_eq!(g.usage(), 0, "the unwound allocation stayed charged");
    g.remove().unwrap();
}

static OOM_ARMED: AtomicBool = AtomicBool::new(false);
static OOM_CALLS: AtomicUsize = AtomicUsize::new(0);

fn panicking_handler(_: &Kmem<Region>, _: usize) -> bool {
    OOM_CALLS.fetch_add(1, Ordering::SeqCst);
    if OOM_ARMED.swap(false, Ordering::SeqCst) {
        panic!("planned: out-of-memory handler");
    }
    false
}

/// Item 11: an out-of-memory handler that panicked once is called again
/// with the next out-of-memory on its thread, and the large object whose
/// charge was made before the handler ran is uncharged.
#[test]
fn an_oom_handler_that_panicked_once_is_called_again() {
    quiet();
    let k: &'static Kmem<Region> = Box::leak(Box::new(Kmem::new(Region::new())));
    let mem: &'static mut [MaybeUninit<u8>] =
        Box::leak(vec![MaybeUninit::uninit(); (1 << 20) + (1 << 16)].into_boxed_slice());
    let skew = mem.as_ptr().align_offset(1 << 16);
    k.source().add(&mut mem[skew..skew + (1 << 20)], 0).unwrap();
    k.set_oom_handler(Some(panicking_handler));
    OOM_ARMED.store(true, Ordering::SeqCst);
    let g = k.root().create_child("g").unwrap();
    let a = g.allocator();
    let held = fill_until_a_callback_panics(k.platform(), &a, "handler");
    assert_eq!(OOM_CALLS.load(Ordering::SeqCst), 1);
    assert!(a.allocate(OBJ).is_err());
    assert_eq!(OOM_CALLS.load(Ordering::SeqCst), 2, "the handler is no longer called on this thread");
    k.set_oom_handler(None);
    free_all(&a, held);
    k.shrink();
    assert_eq!(g.usage(), 0, "the unwound allocation stayed charged");
}

/// A value whose drop panics while `BOMB_ARMED` is set.
struct Bomb(#[allow(dead_code)] [u64; 8]);

static BOMB_ARMED: AtomicBool = AtomicBool::new(true);

impl Drop for Bomb {
    fn drop(&mut self) {
        if BOMB_ARMED.load(Ordering::SeqCst) {
            panic!("planned: drop");
        }
    }
}

/// Item 12: a `CacheBox` whose `T::drop` panics frees its object all the
/// same (as `Box` does): the group is uncharged and the cache empty.
#[test]
fn a_cache_box_whose_drop_panics_frees_its_object() {
    quiet();
    let k = kmem();
    let g = k.root().create_child("g").unwrap();
    // Many cycles: a leaked object would keep its cache alive.
    for round in 0..24 {
        let cache = k.create_cache::<Bomb>("bombs", CacheFlags::ACCOUNT).unwrap();
        let b = {
            let _in = g.enter();
            cache.alloc(Bomb([round as u64; 8])).unwrap()
        };
        assert!(g.usage() > 0);
        let r = catch_unwind(AssertUnwindSafe(move || drop(b)));
        assert!(r.is_err(), "the drop did not panic");
        // Magazines back to the slabs: no object is out of them.
        k.shrink();
        assert_eq!(cache.stats().active_objects, 0, "round {round}: the object was not freed");
        assert_eq!(g.usage(), 0, "round {round}: the group stayed charged");
    }
    k.shrink();
    assert_eq!(g.usage(), 0);
    BOMB_ARMED.store(false, Ordering::SeqCst);
}

/// A shrinker that allocates `bytes` in its group for a list of victims,
/// keeps the result, and frees nothing.
struct Hoarder {
    group: std::sync::OnceLock<Cgroup<'static, K>>,
    bytes: usize,
    ok: AtomicUsize,
    refused: AtomicUsize,
    kept: Mutex<Vec<(usize, Layout)>>,
}

impl Shrinker for Hoarder {
    fn count(&self, _: &ShrinkControl) -> usize {
        1
    }
    fn scan(&self, _: &ShrinkControl, _: usize) -> usize {
        let Some(g) = self.group.get() else { return 0 };
        let l = Layout::from_size_align(self.bytes, 8).unwrap();
        match g.allocator().allocate(l) {
            Ok(p) => {
                self.ok.fetch_add(1, Ordering::SeqCst);
                self.kept.lock().unwrap().push((p.cast::<u8>().as_ptr() as usize, l));
            }
            Err(_) => {
                self.refused.fetch_add(1, Ordering::SeqCst);
            }
        }
        0
    }
}

impl Hoarder {
    fn release(&self) {
        let g = self.group.get().unwrap();
        for (p, l) in self.kept.lock().unwrap().drain(..) {
            // SAFETY: allocated in `scan` with `l`, freed once.
            unsafe { g.allocator().deallocate(std::ptr::NonNull::new(p as *mut u8).unwrap(), l) };
        }
    }
}

/// Item 13: a shrinker's allocation in a group at its max is charged past
/// the max (counted as an overdraft) instead of failing, within
/// `RECLAIM_OVERDRAFT`; the allocation that started the reclaim still
/// fails at the max, and once the shrinker lets go the group is back under
/// it.
#[test]
fn a_shrinker_that_allocates_at_the_max_overdraws_it_within_the_bound() {
    let k = kmem();
    let g = k.root().create_child("g").unwrap();
    g.set_max(1 << 20).unwrap();
    let h: &'static Hoarder = Box::leak(Box::new(Hoarder {
        group: std::sync::OnceLock::new(),
        bytes: 4 * PAGE_SIZE,
        ok: AtomicUsize::new(0),
        refused: AtomicUsize::new(0),
        kept: Mutex::new(Vec::new()),
    }));
    let _ = h.group.set(g.clone());
    k.register_shrinker(h).unwrap();
    let a = g.allocator();
    let held = fill(&a);
    assert!(h.ok.load(Ordering::SeqCst) > 0, "the shrinker's allocations failed");
    let st = g.stat();
    assert!(st.overdrafts > 0 && st.overdraft_bytes > 0, "overdrafts not counted: {st}");
    assert!(st.to_string().contains("overdrafts "));
    // Over the max by no more than the overdraft.
    assert!(g.usage() > g.max(), "nothing overdrawn");
    assert!(g.usage() <= g.max() + RECLAIM_OVERDRAFT * PAGE_SIZE);
    // The original allocation failed, naming the group's max, and so does
    // the next one while the shrinker holds the overdraft, whose own
    // allocations are now refused beyond the bound.
    for _ in 0..64 {
        assert!(a.allocate(OBJ).is_err());
        if h.refused.load(Ordering::SeqCst) > 0 {
            break;
        }
    }
    assert!(h.refused.load(Ordering::SeqCst) > 0, "the overdraft is unbounded");
    assert!(g.usage() <= g.max() + RECLAIM_OVERDRAFT * PAGE_SIZE);
    k.unregister_shrinker(h);
    h.release();
    let mut held = held;
    let one = held.pop().unwrap();
    // SAFETY: allocated by `fill` with `OBJ`, freed once.
    unsafe { a.deallocate(one.cast(), OBJ) };
    // The next charge that the max refuses reclaims the overdraft (the
    // shrinker's freed slabs) with its own need, and then fits.
    let p = a.allocate(OBJ).expect("the group did not come back under its max");
    assert!(g.usage() <= g.max());
    // SAFETY: just allocated with `OBJ`.
    unsafe { a.deallocate(p.cast(), OBJ) };
    free_all(&a, held);
}

fn high_hook(_: GroupId, e: Event) {
    if e == Event::High {
        panic!("planned: high");
    }
}

/// Item 11: a hook that panics at `high`, which is checked after the
/// allocation took its object (a slab object, or a large object), makes
/// the allocation give the object back as the panic unwinds.
#[test]
fn an_allocation_whose_high_hook_panics_gives_its_object_back() {
    quiet();
    let k = kmem();
    let g = k.root().create_child("g").unwrap();
    g.set_high(0).unwrap();
    k.set_event_hook(Some(high_hook));
    let a = g.allocator();
    for l in [Layout::from_size_align(64, 8).unwrap(), OBJ] {
        let r = catch_unwind(AssertUnwindSafe(|| a.allocate(l)));
        assert!(r.is_err(), "the hook did not panic for {l:?}");
        k.shrink();
        assert_eq!(g.usage(), 0, "the object of {l:?} stayed allocated");
    }
    k.set_event_hook(None);
    g.remove().unwrap();
}

/// A shrinker that checks another group empty from inside the reclaim
/// that called it: `check_empty` and `assert_empty` waits for objects and
/// stocks other threads hold in transit, but only for a bounded while,
/// and a reclaim's own nested drain is skipped, so the calls return
/// (here: the other group is empty) instead of waiting on the reclaim
/// they run in.
struct Checker {
    group: std::sync::OnceLock<Cgroup<'static, K>>,
    checks: AtomicUsize,
}

impl Shrinker for Checker {
    fn count(&self, _: &ShrinkControl) -> usize {
        1
    }
    fn scan(&self, _: &ShrinkControl, _: usize) -> usize {
        if let Some(h) = self.group.get() {
            assert!(h.check_empty().is_ok());
            h.assert_empty();
            self.checks.fetch_add(1, Ordering::SeqCst);
        }
        0
    }
}

#[test]
fn check_empty_from_inside_a_shrinker_returns() {
    let k = kmem();
    let c: &'static Checker =
        Box::leak(Box::new(Checker { group: std::sync::OnceLock::new(), checks: AtomicUsize::new(0) }));
    let h = k.root().create_child("checked-from-a-shrinker").unwrap();
    assert!(c.group.set(h).is_ok());
    k.register_shrinker(c).unwrap();
    let g = k.root().create_child("reclaimed").unwrap();
    g.set_max(1 << 20).unwrap();
    let a = g.allocator();
    let held = fill(&a);
    assert!(c.checks.load(Ordering::SeqCst) > 0, "the refused allocations' reclaim called the shrinker");
    free_all(&a, held);
    k.unregister_shrinker(c);
    g.assert_empty();
    g.remove().unwrap();
}
