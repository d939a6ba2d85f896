//! Callbacks that misbehave: shrinkers that allocate in the group being
//! reclaimed, shrinkers whose counts lie, shrinkers that change limits or
//! enter groups. Before the fixes of issue 13 (item 6) the first recursed
//! through reclaim until the stack overflowed and the second panicked
//! inside the allocator in debug builds (`attempt to add with overflow`),
//! so each case runs in a child process (this test binary, re-run with an
//! environment variable) and the parent checks that it exited cleanly.

#[path = "support/child.rs"]
mod child;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

use allocator_api2::alloc::Allocator;
use kmemcg::{Cgroup, Kmem, OsPages, ShrinkControl, Shrinker};

type K = Kmem<OsPages>;

fn kmem() -> &'static K {
    Box::leak(Box::new(Kmem::new(OsPages::new())))
}

/// Runs `case` in a child; returns (success, stderr).
fn child(case: &str) -> (bool, String) {
    child::run("KMEMCG_HOSTILE_CASE", case)
}

const OBJ: Layout = match Layout::from_size_align(64 << 10, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// A shrinker that, asked to scan, allocates in the group it was built
/// for (which is at its max) and frees nothing.
struct Greedy {
    kmem: &'static K,
    group: std::sync::OnceLock<Cgroup<'static, Kmem<OsPages>>>,
    scans: AtomicUsize,
    nested_ok: AtomicUsize,
}

impl Shrinker for Greedy {
    fn count(&self, _: &ShrinkControl) -> usize {
        1
    }
    fn scan(&self, _: &ShrinkControl, _: usize) -> usize {
        self.scans.fetch_add(1, Ordering::Relaxed);
        if let Some(g) = self.group.get() {
            // Through the group's allocator and by entering it: both charge
            // the group at its max, both would reclaim.
            if let Ok(p) = g.allocator().allocate(OBJ) {
                self.nested_ok.fetch_add(1, Ordering::Relaxed);
                // SAFETY: just allocated with this layout.
                unsafe { g.allocator().deallocate(p.cast(), OBJ) };
            }
            let _in = g.enter();
            if let Ok(p) = (&self.kmem).allocate(OBJ) {
                self.nested_ok.fetch_add(1, Ordering::Relaxed);
                // SAFETY: just allocated with this layout.
                unsafe { (&self.kmem).deallocate(p.cast(), OBJ) };
            }
            // Changing the limit from inside reclaim must not deadlock or
            // recurse either.
            let _ = g.set_max(g.max());
            // Nor may resetting the thread's current group clear the mark
            // that keeps this shrinker's allocations out of reclaim.
            self.kmem.reset_current_group();
            let _in = g.enter();
            if let Ok(p) = (&self.kmem).allocate(OBJ) {
                self.nested_ok.fetch_add(1, Ordering::Relaxed);
                // SAFETY: just allocated with this layout.
                unsafe { (&self.kmem).deallocate(p.cast(), OBJ) };
            }
        }
        0
    }
}

/// A shrinker that, asked to scan, grows a block of its own by doubling
/// through the group's allocator (the page path, where a grown block is
/// placed with room after it) and frees nothing.
struct Grower {
    group: std::sync::OnceLock<Cgroup<'static, Kmem<OsPages>>>,
    scans: AtomicUsize,
    nested_ok: AtomicUsize,
}

impl Shrinker for Grower {
    fn count(&self, _: &ShrinkControl) -> usize {
        1
    }
    fn scan(&self, _: &ShrinkControl, _: usize) -> usize {
        self.scans.fetch_add(1, Ordering::Relaxed);
        if let Some(g) = self.group.get() {
            let a = g.allocator();
            let mut l = Layout::from_size_align(8, 8).unwrap();
            let Ok(mut p) = a.allocate(l) else { return 0 };
            while l.size() < 1 << 20 {
                let bigger = Layout::from_size_align(l.size() * 2, 8).unwrap();
                // SAFETY: `p` is live with layout `l`.
                match unsafe { a.grow(p.cast(), l, bigger) } {
                    Ok(q) => (p, l) = (q, bigger),
                    Err(_) => break,
                }
            }
            if l.size() == 1 << 20 {
                self.nested_ok.fetch_add(1, Ordering::Relaxed);
            }
            // SAFETY: live with layout `l`, freed once.
            unsafe { a.deallocate(p.cast(), l) };
        }
        0
    }
}

/// A shrinker whose `count` says it holds everything and whose `scan`
/// claims to have freed more than it was asked.
struct Liar;

impl Shrinker for Liar {
    fn count(&self, _: &ShrinkControl) -> usize {
        usize::MAX
    }
    fn scan(&self, _: &ShrinkControl, _: usize) -> usize {
        usize::MAX
    }
}

/// A shrinker that collects its victims in a `Vec` in the group being
/// reclaimed (at its max), as a program would; a refused allocation there
/// calls `handle_alloc_error`, which aborts.
struct VecShrinker {
    group: std::sync::OnceLock<Cgroup<'static, Kmem<OsPages>>>,
    scans: AtomicUsize,
}

impl Shrinker for VecShrinker {
    fn count(&self, _: &ShrinkControl) -> usize {
        1
    }
    fn scan(&self, _: &ShrinkControl, nr: usize) -> usize {
        self.scans.fetch_add(1, Ordering::Relaxed);
        if let Some(g) = self.group.get() {
            let mut victims = allocator_api2::vec::Vec::with_capacity_in(nr.clamp(4096, 8192), g.allocator());
            victims.extend((0..victims.capacity()).map(|i| i as u64));
            assert!(!victims.is_empty());
        }
        0
    }
}

/// An event hook that panics.
fn panicking_hook(_: kmemcg::GroupId, _: kmemcg::Event) {
    panic!("hook panics");
}

/// The child's side: does what `KMEMCG_HOSTILE_CASE` says, and panics if
/// something is wrong.
#[test]
fn run_case() {
    let Ok(case) = std::env::var("KMEMCG_HOSTILE_CASE") else { return };
    let k = kmem();
    let g = k.root().create_child("capped").unwrap();
    g.set_max(1 << 20).unwrap();
    match case.as_str() {
        "reentrant_shrinker" => {
            let greedy: &'static Greedy = Box::leak(Box::new(Greedy {
                kmem: k,
                group: std::sync::OnceLock::new(),
                scans: AtomicUsize::new(0),
                nested_ok: AtomicUsize::new(0),
            }));
            let _ = greedy.group.set(g.clone());
            k.register_shrinker(greedy).unwrap();
            let a = g.allocator();
            let mut held = Vec::new();
            // Fill the group to its max: the last allocations reclaim, call
            // the shrinker, whose own allocations must not reclaim again:
            // they overdraw the max (issue 26, item 13: a refused
            // allocation would abort a program that collects victims in a
            // `Vec`), within `RECLAIM_OVERDRAFT`, and are freed at once.
            while let Ok(p) = a.allocate(OBJ) {
                held.push(p);
                assert!(held.len() < 64, "the max did not hold");
            }
            assert!(greedy.scans.load(Ordering::Relaxed) > 0, "reclaim never called the shrinker");
            assert!(greedy.nested_ok.load(Ordering::Relaxed) > 0, "the shrinker's allocations failed at the max");
            assert!(g.stat().overdrafts > 0);
            // The allocation that started the reclaim was held to the max.
            assert!(held.len() * (OBJ.size() + 4096) <= g.max());
            for p in held {
                // SAFETY: allocated above with this layout.
                unsafe { a.deallocate(p.cast(), OBJ) };
            }
            k.unregister_shrinker(greedy);
            // Reclaim works again after the shrinker returned.
            assert!(a.allocate(OBJ).is_ok());
        }
        "lying_shrinker" => {
            k.register_shrinker(&Liar).unwrap();
            let a = g.allocator();
            let mut held = Vec::new();
            while let Ok(p) = a.allocate(OBJ) {
                held.push(p);
                assert!(held.len() < 64, "the max did not hold");
            }
            assert!(g.stat().events.oom > 0);
            for p in held {
                // SAFETY: allocated above with this layout.
                unsafe { a.deallocate(p.cast(), OBJ) };
            }
            k.unregister_shrinker(&Liar);
        }
        "growing_shrinker" => {
            let grower: &'static Grower = Box::leak(Box::new(Grower {
                group: std::sync::OnceLock::new(),
                scans: AtomicUsize::new(0),
                nested_ok: AtomicUsize::new(0),
            }));
            let _ = grower.group.set(g.clone());
            k.register_shrinker(grower).unwrap();
            // Grow one block by doubling in the 1 MiB group until its max
            // refuses: the refused growth reclaims and calls the shrinker,
            // whose own growth must fail at the max too, not recurse.
            let a = g.allocator();
            let mut l = Layout::from_size_align(8, 8).unwrap();
            let mut p = a.allocate(l).unwrap();
            // SAFETY: `p` is live with `l.size()` bytes.
            unsafe { p.cast::<u8>().as_ptr().write_bytes(0x5a, l.size()) };
            loop {
                let bigger = Layout::from_size_align(l.size() * 2, 8).unwrap();
                // SAFETY: `p` is live with layout `l`.
                match unsafe { a.grow(p.cast(), l, bigger) } {
                    Ok(q) => {
                        // SAFETY: the new block holds the old contents and
                        // `bigger.size()` bytes.
                        unsafe {
                            let q8 = q.cast::<u8>().as_ptr();
                            assert!(std::slice::from_raw_parts(q8, l.size()).iter().all(|&b| b == 0x5a));
                            q8.add(l.size()).write_bytes(0x5a, l.size());
                        }
                        (p, l) = (q, bigger);
                    }
                    Err(_) => break,
                }
                assert!(l.size() <= 1 << 20, "the max did not hold");
            }
            // The room a grown block was placed with is not charged: the
            // group holds the block's pages and its header page. (With
            // detection on, growth takes its usual path and the quarantine
            // keeps the blocks it moved from charged for a while.)
            if std::env::var_os("KMEMCG_DEBUG").is_none() {
                assert!(g.usage() <= l.size() + 2 * 4096, "usage {} for a block of {}", g.usage(), l.size());
            }
            assert!(grower.scans.load(Ordering::Relaxed) > 0, "reclaim never called the shrinker");
            assert_eq!(grower.nested_ok.load(Ordering::Relaxed), 0, "a nested growth passed the max");
            // SAFETY: the refused growth left the block as it was.
            unsafe {
                assert!(std::slice::from_raw_parts(p.cast::<u8>().as_ptr(), l.size()).iter().all(|&b| b == 0x5a));
                a.deallocate(p.cast(), l);
            }
            k.unregister_shrinker(grower);
        }
        "vec_shrinker" => {
            let v: &'static VecShrinker =
                Box::leak(Box::new(VecShrinker { group: std::sync::OnceLock::new(), scans: AtomicUsize::new(0) }));
            let _ = v.group.set(g.clone());
            k.register_shrinker(v).unwrap();
            let a = g.allocator();
            let mut held = Vec::new();
            while let Ok(p) = a.allocate(OBJ) {
                held.push(p);
                assert!(held.len() < 64, "the max did not hold");
            }
            assert!(v.scans.load(Ordering::Relaxed) > 0, "reclaim never called the shrinker");
            assert!(g.stat().overdrafts > 0);
            for p in held {
                // SAFETY: allocated above with this layout.
                unsafe { a.deallocate(p.cast(), OBJ) };
            }
            k.unregister_shrinker(v);
        }
        "panic_in_global_alloc" => {
            k.set_event_hook(Some(panicking_hook));
            let _in = g.enter();
            let mut held = Vec::new();
            // GlobalAlloc must not unwind: the hook's panic aborts here.
            loop {
                // SAFETY: a valid layout.
                let p = unsafe { GlobalAlloc::alloc(k, OBJ) };
                if p.is_null() {
                    break;
                }
                held.push(p);
            }
            unreachable!("the hook was not called");
        }
        other => panic!("unknown case {other}"),
    }
    println!("case {case} done");
}

#[test]
fn a_shrinker_that_allocates_in_the_group_at_its_max_does_not_recurse() {
    let (ok, err) = child("reentrant_shrinker");
    assert!(ok, "child failed: {err}");
}

#[test]
fn a_shrinker_that_grows_a_block_at_the_max_does_not_recurse() {
    let (ok, err) = child("growing_shrinker");
    assert!(ok, "child failed: {err}");
}

#[test]
fn a_shrinker_whose_counts_lie_does_not_break_reclaim() {
    let (ok, err) = child("lying_shrinker");
    assert!(ok, "child failed: {err}");
}

#[test]
fn a_shrinker_that_collects_victims_in_a_vec_at_the_max_does_not_abort() {
    let (ok, err) = child("vec_shrinker");
    assert!(ok, "child failed: {err}");
}

#[test]
fn a_callback_that_panics_inside_global_alloc_aborts_instead_of_unwinding() {
    let (ok, err) = child("panic_in_global_alloc");
    assert!(!ok);
    assert!(err.contains("inside GlobalAlloc, which must not unwind"), "child did not abort: {err}");
}
