//! A typed cache dropped while another thread's quarantine eviction has
//! some of its freed objects on their way back to it (found by a review).
//! Cache destruction flushed the quarantine, but objects another thread
//! had taken out were in no list: their slabs were still there, the cache
//! was taken as leaked, and its descriptor and slabs were never freed.
//!
//! Now destruction waits (a bounded while) for objects in transit, and a
//! cache that still has slabs after that wait stays dead until a later
//! `shrink` (or `reap`) finds its slabs gone and retires it.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::time::Duration;

use kmemcg::{CacheFlags, DefaultRawMutex, Detection, Kmem, OsPages};

#[path = "support/hooked.rs"]
mod hooked;
use hooked::Hooked;

thread_local! {
    /// Marks the evicting thread: each `enter` of it sleeps a millisecond
    /// first (an eviction's give-back that takes its time).
    static SLOW: Cell<bool> = const { Cell::new(false) };
}

fn maybe_sleep() -> bool {
    if SLOW.with(Cell::get) {
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

type SKmem = Kmem<OsPages, DefaultRawMutex, Hooked>;

/// Active objects of the descriptor cache (one per typed cache not yet
/// retired), from `slabinfo`.
fn descriptors(k: &SKmem) -> usize {
    let info = k.slabinfo().to_string();
    let row = info.lines().find(|l| l.starts_with("kmem_cache ")).expect("the descriptors' row");
    row.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_cache_dropped_while_its_objects_are_evicted_is_freed() {
    let k: &'static SKmem = Box::leak(Box::new(
        Kmem::with_platform(OsPages::new(), Hooked::new(maybe_sleep))
            .with_detection(Detection::ALL.quarantine(64 << 10).guard_pages(0)),
    ));
    k.shrink();
    assert_eq!(descriptors(k), 0);
    let c = k.create_cache::<[u8; 48]>("in-transit", CacheFlags::NONE).unwrap();
    assert_eq!(descriptors(k), 1);
    // Freed, they wait in the quarantine, oldest first.
    let objs: Vec<_> = (0..600).map(|i| c.alloc([i as u8; 48]).unwrap()).collect();
    drop(objs);
    // Another thread's frees push them out of the quarantine (each
    // moves an eighth of it to the shared one, which then gives back its
    // oldest beyond 64 KiB), and the give-back takes a millisecond an
    // object.
    let evictor = std::thread::spawn(move || {
        let l = Layout::new::<[u8; 48]>();
        // SAFETY: a non-zero size.
        let ps: Vec<_> = (0..1000).map(|_| unsafe { k.alloc(l) }).collect();
        assert!(ps.iter().all(|p| !p.is_null()));
        SLOW.with(|s| s.set(true));
        for p in ps {
            // SAFETY: allocated above with `l`.
            unsafe { k.dealloc(p, l) };
        }
        SLOW.with(|s| s.set(false));
    });
    // Until an eviction took objects out (the quarantine holds fewer than
    // it did): they are being given back, one a millisecond.
    let mut most = 0;
    loop {
        let held = k.stats().quarantined.0;
        most = most.max(held);
        if held + 10 < most || evictor.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(!evictor.is_finished(), "the eviction was seen under way");
    drop(c);
    evictor.join().unwrap();
    // What the destruction could not wait for is back now: the next
    // shrink retires the cache.
    k.shrink();
    assert_eq!(descriptors(k), 0, "the dropped cache's descriptor is freed");
    assert!(!k.slabinfo().to_string().contains("in-transit"));
    // Its name is free, and a new cache of it works.
    let c = k.create_cache::<[u8; 48]>("in-transit", CacheFlags::NONE).unwrap();
    assert_eq!(*c.alloc([7; 48]).unwrap(), [7; 48]);
}
