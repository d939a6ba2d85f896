//! Threads that hold slots at once get slots whose magazines sit on
//! different cache lines: `Threads` claims slots in `slot_for_cpu` order
//! (0, 2, 4, …), and a cache keeps two slots' magazines to a line (`2k`
//! with `2k + 1`). Claiming in plain order would give the first two
//! threads slots 0 and 1, one line, written by both on every operation.
//!
//! A test binary of its own, with one test: slots are claimed
//! process-wide, so no other test may claim one first.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Barrier;

use kmemcg::{Kmem, MAX_CPUS, OsPages};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

/// Enough pairs of a size that each thread misses its magazines (a slow
/// path, which `slot_stats` counts) many times.
fn churn() {
    let layout = Layout::from_size_align(256, 8).unwrap();
    for _ in 0..50 {
        let blocks: Vec<*mut u8> = (0..200)
            .map(|_| {
                // SAFETY: a valid non-zero layout.
                let p = unsafe { KMEM.alloc(layout) };
                assert!(!p.is_null());
                p
            })
            .collect();
        for p in blocks {
            // SAFETY: allocated above with this layout, freed once.
            unsafe { KMEM.dealloc(p, layout) };
        }
    }
}

#[test]
fn threads_holding_slots_at_once_get_slots_on_different_lines() {
    const THREADS: usize = 4;
    let start = Barrier::new(THREADS);
    let done = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                start.wait();
                churn();
                // Keep the slot until every thread has claimed one.
                done.wait();
            });
        }
    });
    let used: Vec<usize> = (0..MAX_CPUS).filter(|&s| KMEM.slot_stats(s).misses > 0).collect();
    assert!(used.len() >= 2, "too few slots used to tell: {used:?}");
    for (i, a) in used.iter().enumerate() {
        for b in &used[..i] {
            assert_ne!(a / 2, b / 2, "slots {a} and {b} share a line: {used:?}");
        }
    }
}
