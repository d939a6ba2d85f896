//! Safe code against the allocator's own invariants (issue 26): a `Kmem`
//! moved after its first use, and shrinkers handed ids of groups that are
//! gone. Before the fixes the first crashed in `MagCache::free_fast`
//! (slab headers name caches inside the old `Kmem`) and the second in
//! `ShrinkControl::contains` (it walked the parent chain of a freed
//! group). Each case runs in a child process (this test binary, re-run
//! with an environment variable), so a crash is a failed test, not a dead
//! test binary.

#[path = "support/child.rs"]
mod child;

use std::alloc::Layout;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use allocator_api2::alloc::Allocator;
use kmemcg::{GroupId, Kmem, OsPages, ShrinkControl, Shrinker};

type K = Kmem<OsPages>;

/// Runs `case` in a child; returns (success, stderr).
fn child(case: &str) -> (bool, String) {
    child::run("KMEMCG_SOUNDNESS_CASE", case)
}

const SMALL: Layout = match Layout::from_size_align(64, 8) {
    Ok(l) => l,
    Err(_) => panic!(),
};

/// Allocates and frees enough through `k` that every path runs: magazine
/// hits, refills, flushes back to the slabs, and the page path.
fn churn(k: &K) {
    let mut held = Vec::new();
    for round in 0..4 {
        for i in 0..2_000 {
            let l = if i % 100 == 0 { Layout::from_size_align(64 << 10, 8).unwrap() } else { SMALL };
            held.push((k.allocate(l).expect("allocation"), l));
        }
        if round % 2 == 1 {
            for (p, l) in held.drain(..) {
                // SAFETY: allocated above with this layout, freed once.
                unsafe { k.deallocate(p.cast(), l) };
            }
        }
    }
    for (p, l) in held {
        // SAFETY: as above.
        unsafe { k.deallocate(p.cast(), l) };
    }
}

/// Records what `contains` says of the ids it is given.
struct Prober {
    stale: Mutex<Vec<GroupId>>,
    live: Mutex<Vec<GroupId>>,
    calls: AtomicUsize,
    wrong: AtomicUsize,
}

impl Shrinker for Prober {
    fn count(&self, sc: &ShrinkControl) -> usize {
        self.calls.fetch_add(1, Ordering::Relaxed);
        for &id in self.stale.lock().unwrap().iter() {
            if sc.contains(id) {
                self.wrong.fetch_add(1, Ordering::Relaxed);
            }
        }
        for &id in self.live.lock().unwrap().iter() {
            if !sc.contains(id) {
                self.wrong.fetch_add(1, Ordering::Relaxed);
            }
        }
        // The root is no descendant of a group below it.
        if sc.target() != GroupId::ROOT && sc.contains(GroupId::ROOT) {
            self.wrong.fetch_add(1, Ordering::Relaxed);
        }
        0
    }
    fn scan(&self, _: &ShrinkControl, _: usize) -> usize {
        0
    }
}

/// The child's side: does what `KMEMCG_SOUNDNESS_CASE` says, and panics
/// if something is wrong.
#[test]
fn run_case() {
    let Ok(case) = std::env::var("KMEMCG_SOUNDNESS_CASE") else { return };
    match case.as_str() {
        // Used (a group, objects in it and in the root), then moved out of
        // its box and used again: the allocator must stop the program with
        // its message, never follow the old addresses.
        "moved_after_use_with_groups" => {
            let boxed = Box::new(Kmem::new(OsPages::new()));
            {
                let g = boxed.root().create_child("tenant").unwrap();
                let a = g.allocator();
                let p = a.allocate(SMALL).unwrap();
                // SAFETY: allocated above with this layout.
                unsafe { a.deallocate(p.cast(), SMALL) };
                churn(&boxed);
            }
            let moved: K = *boxed;
            let g = moved.root().create_child("other").unwrap();
            churn(&moved);
            drop(g);
        }
        "moved_after_use_plain" => {
            let boxed = Box::new(Kmem::new(OsPages::new()));
            churn(&boxed);
            let moved: K = *boxed;
            churn(&moved);
            moved.shrink();
        }
        // Moving a `Kmem` before its first use is fine (building one in a
        // `Box` moves it).
        "moved_before_use" => {
            let k = Kmem::new(OsPages::new());
            let boxed = Box::new(k);
            let moved: K = *boxed;
            let leaked: &'static K = Box::leak(Box::new(moved));
            churn(leaked);
            let g = leaked.root().create_child("tenant").unwrap();
            let a = g.allocator();
            let p = a.allocate(SMALL).unwrap();
            // SAFETY: allocated above with this layout.
            unsafe { a.deallocate(p.cast(), SMALL) };
        }
        // Ids of removed and freed groups, whose metadata pages went back
        // to the OS, handed to `contains` from inside a reclaim.
        "stale_group_ids" => {
            let k: &'static K = Box::leak(Box::new(Kmem::new(OsPages::new())));
            let prober: &'static Prober = Box::leak(Box::new(Prober {
                stale: Mutex::new(Vec::new()),
                live: Mutex::new(Vec::new()),
                calls: AtomicUsize::new(0),
                wrong: AtomicUsize::new(0),
            }));
            // A thousand pairs live at once (so their ids differ), then all
            // removed and their metadata freed.
            let mut stale = Vec::new();
            let mut pairs = Vec::new();
            for i in 0..1_000 {
                let g = k.root().create_child(&format!("gone-{i}")).unwrap();
                let c = g.create_child("below").unwrap();
                stale.push(g.id());
                stale.push(c.id());
                let a = c.allocator();
                let p = a.allocate(SMALL).unwrap();
                // SAFETY: allocated above with this layout.
                unsafe { a.deallocate(p.cast(), SMALL) };
                pairs.push((g, c));
            }
            for (g, c) in pairs {
                c.remove().unwrap();
                g.remove().unwrap();
            }
            k.shrink();
            k.shrink();
            let target = k.root().create_child("target").unwrap();
            let below = target.create_child("below").unwrap();
            // An id is an address: a new group may take a freed one's, and
            // then its id names the new group. Those are left out.
            let live = vec![target.id(), below.id()];
            stale.retain(|id| !live.contains(id));
            assert!(stale.len() > 1_900);
            *prober.stale.lock().unwrap() = stale;
            *prober.live.lock().unwrap() = live;
            k.register_shrinker(prober).unwrap();
            let held: Vec<_> = {
                let a = below.allocator();
                (0..1_000).map(|_| a.allocate(SMALL).unwrap()).collect()
            };
            target.reclaim(1 << 20);
            assert!(prober.calls.load(Ordering::Relaxed) > 0, "reclaim never asked the shrinker");
            assert_eq!(prober.wrong.load(Ordering::Relaxed), 0, "contains misjudged an id");
            k.unregister_shrinker(prober);
            let a = below.allocator();
            for p in held {
                // SAFETY: allocated above with this layout.
                unsafe { a.deallocate(p.cast(), SMALL) };
            }
        }
        other => panic!("unknown case {other}"),
    }
    println!("case {case} done");
}

#[test]
fn a_kmem_moved_after_use_with_groups_stops_with_a_message() {
    let (ok, err) = child("moved_after_use_with_groups");
    assert!(!ok, "the moved Kmem kept running");
    assert!(err.contains("kmemcg: a Kmem was moved after its first use"), "no message, stderr: {err}");
}

#[test]
fn a_kmem_moved_after_plain_use_stops_with_a_message() {
    let (ok, err) = child("moved_after_use_plain");
    assert!(!ok, "the moved Kmem kept running");
    assert!(err.contains("kmemcg: a Kmem was moved after its first use"), "no message, stderr: {err}");
}

#[test]
fn a_kmem_moved_before_its_first_use_works() {
    let (ok, err) = child("moved_before_use");
    assert!(ok, "child failed: {err}");
}

#[test]
fn contains_answers_for_ids_of_freed_groups() {
    let (ok, err) = child("stale_group_ids");
    assert!(ok, "child failed: {err}");
}
