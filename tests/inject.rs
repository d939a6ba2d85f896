//! Fault injection per group and the per-scope leak and budget checks, as
//! a test suite uses them: drive an error path of the code under test,
//! with exact counts, and assert that it leaks nothing.

use kmemcg::allocator_api2::vec::Vec as AVec;
use kmemcg::{CacheFlags, Error, FailRule, FaultInjection, Kmem, OsPages};

#[global_allocator]
static KMEM: Kmem = Kmem::new(OsPages::new());

#[test]
fn the_nth_typed_allocation_fails_once_and_is_counted() {
    let g = KMEM.root().create_child("inject-nth").unwrap();
    let c = KMEM.create_cache::<[u64; 6]>("inject-objs", CacheFlags::ACCOUNT).unwrap();
    g.inject_faults(FaultInjection::new(FailRule::Nth(3))).unwrap();
    let mut got = Vec::new();
    for i in 0..6 {
        got.push(c.alloc_in(&g, [i; 6]).map(|b| b[0]));
    }
    assert_eq!(got, [Ok(0), Ok(1), Err(Error::Injected), Ok(3), Ok(4), Ok(5)]);
    assert_eq!(g.injected_failures(), 1);
    assert_eq!(g.stat().injected, 1);
    assert!(g.stat().to_string().contains("injected 1\n"));
    // Other groups and the root are not affected.
    assert!(c.alloc([9; 6]).is_ok());
    g.assert_empty();
    g.remove().unwrap();
}

#[test]
fn every_nth_allocation_of_a_group_allocator_fails_and_try_reserve_reports_it() {
    let g = KMEM.root().create_child("inject-every").unwrap();
    g.inject_faults(FaultInjection::new(FailRule::EveryNth(2))).unwrap();
    let mut results = Vec::new();
    for _ in 0..6 {
        let mut v: AVec<u8, _> = AVec::new_in(g.allocator());
        results.push(v.try_reserve(100).is_ok());
    }
    assert_eq!(results, [true, false, true, false, true, false]);
    assert_eq!(g.injected_failures(), 3);
    // Global allocations in the group are not failed unless asked for.
    {
        let _in = g.enter();
        let v: Vec<u64> = (0..100).collect();
        assert_eq!(v.len(), 100);
    }
    assert_eq!(g.injected_failures(), 3);
    g.stop_injecting();
    let mut v: AVec<u8, _> = AVec::new_in(g.allocator());
    assert!(v.try_reserve(100).is_ok());
    drop(v);
    g.assert_empty();
    g.remove().unwrap();
}

/// A std collection's error path through `#[global_allocator]`, when the
/// rule asks for global allocations too: `try_reserve` gets the failure,
/// and the code under test leaks nothing.
#[test]
fn a_std_collection_sees_injected_failures_through_the_global_allocator() {
    let g = KMEM.root().create_child("inject-global").unwrap();
    g.inject_faults(FaultInjection::new(FailRule::Nth(1)).including_global()).unwrap();
    let outcome = {
        let _in = g.enter();
        let mut v: Vec<u64> = Vec::new();
        let first = v.try_reserve(1000).is_err();
        let second = v.try_reserve(1000).is_ok();
        v.extend(0..1000);
        (first, second, v.iter().sum::<u64>())
    };
    assert_eq!(outcome, (true, true, 499_500));
    assert_eq!(g.injected_failures(), 1);
    g.assert_empty();
    g.remove().unwrap();
}

/// The same seed gives the same failures; about the asked share fail.
#[test]
fn probability_failures_repeat_with_the_seed() {
    let run = |name: &str| {
        let g = KMEM.root().create_child(name).unwrap();
        g.inject_faults(FaultInjection::new(FailRule::Probability { per_million: 250_000, seed: 42 })).unwrap();
        let pattern: Vec<bool> = (0..400)
            .map(|_| {
                let mut v: AVec<u8, _> = AVec::new_in(g.allocator());
                v.try_reserve(64).is_ok()
            })
            .collect();
        assert_eq!(g.injected_failures(), pattern.iter().filter(|ok| !**ok).count());
        g.remove().unwrap();
        pattern
    };
    let a = run("inject-p1");
    let b = run("inject-p2");
    assert_eq!(a, b);
    let failed = a.iter().filter(|ok| !**ok).count();
    assert!((50..150).contains(&failed), "{failed} of 400 failed at 25%");
}

#[test]
fn injection_bad_input_and_a_removed_group() {
    let g = KMEM.root().create_child("inject-removed").unwrap();
    g.remove().unwrap();
    assert_eq!(g.inject_faults(FaultInjection::new(FailRule::Nth(1))), Err(Error::Removed));
    // N = 0 arms nothing.
    let h = KMEM.root().create_child("inject-zero").unwrap();
    h.inject_faults(FaultInjection::new(FailRule::EveryNth(0))).unwrap();
    let mut v: AVec<u8, _> = AVec::new_in(h.allocator());
    assert!(v.try_reserve(10).is_ok());
    drop(v);
    h.remove().unwrap();
}

/// The leak check names what a scope left behind, per cache, and passes
/// once it is freed; the budget check names the peak.
#[test]
fn leak_and_budget_checks_name_what_a_scope_holds() {
    let g = KMEM.root().create_child("leaky").unwrap();
    let leaked = {
        let _in = g.enter();
        let kept = Box::new([7u8; 40]);
        let big = vec![1u8; 100_000];
        let _gone: Vec<u32> = (0..10_000).collect();
        (kept, big)
    };
    // Escaped, or a release build may elide both allocations.
    std::hint::black_box(&leaked);
    // With guard-page sampling on (KMEMCG_DEBUG=1: one allocation in 256,
    // counted across this binary's tests running at once, so which one is
    // not fixed) the box may be the sample: it then lives on a page of its
    // own, ending at its guard page, and the report counts it with the
    // large blocks, in no cache (this test failed once that way in CI).
    let sampled = KMEM.detection().guard_every() != 0 && (&raw const *leaked.0).addr().wrapping_add(40) % 4096 == 0;
    let st = g.check_empty().unwrap_err();
    let text = st.to_string();
    // The 40-byte box (in the 40-byte class, or a larger one with
    // KMEMCG_DEBUG's trailer) is the one object left.
    let rows: Vec<_> = st.caches().filter(|r| r.1 > 0).map(|(name, objects, _)| (name.to_owned(), objects)).collect();
    assert_eq!(rows.len(), usize::from(!sampled), "{text}");
    assert!(sampled || (rows[0].0.starts_with("kmalloc-") && rows[0].1 == 1), "{text}");
    assert!(st.large > 100_000 + if sampled { 4096 } else { 0 }, "{text}");
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.assert_empty())).unwrap_err();
    let msg = panic.downcast_ref::<String>().unwrap();
    assert!(msg.contains("group leaky is not empty"), "{msg}");
    assert!(sampled || msg.contains(&format!("slab {} 1 ", rows[0].0)), "{msg}");
    drop(leaked);
    g.assert_empty();
    g.assert_peak_at_most(1 << 20);
    let over = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.assert_peak_at_most(4096))).unwrap_err();
    assert!(over.downcast_ref::<String>().unwrap().contains("over its budget of 4096"));
    g.remove().unwrap();
}

/// Any number of groups can hold rules at once (there were 8 slots), each
/// counting its own failures.
#[test]
fn a_hundred_groups_armed_at_once_each_fail_their_own_nth() {
    let c = KMEM.create_cache::<u64>("inject-many", CacheFlags::ACCOUNT).unwrap();
    let groups: Vec<_> = (0..100).map(|i| KMEM.root().create_child(&format!("inject-many-{i}")).unwrap()).collect();
    for (i, g) in groups.iter().enumerate() {
        g.inject_faults(FaultInjection::new(FailRule::Nth(1 + i % 3))).unwrap();
    }
    for (i, g) in groups.iter().enumerate() {
        // The allocations (1st, 2nd, 3rd) that failed.
        let failed_at: Vec<usize> = (1..=3).filter(|_| c.alloc_in(g, 0).is_err()).collect();
        assert_eq!(failed_at, [1 + i % 3], "group {i}");
        assert_eq!(g.injected_failures(), 1, "group {i}");
    }
    for g in groups {
        g.assert_empty();
        g.remove().unwrap();
    }
}

/// Handles cross `catch_unwind` without `AssertUnwindSafe`: a failed leak
/// check is caught, and the allocator, the group and the cache go on.
#[test]
fn a_failed_leak_check_is_caught_without_assert_unwind_safe() {
    fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>(_: &T) {}
    let g = KMEM.root().create_child("unwind").unwrap();
    let c = KMEM.create_cache::<u64>("unwind-objs", CacheFlags::ACCOUNT).unwrap();
    unwind_safe(&KMEM);
    unwind_safe(&g);
    unwind_safe(&c);
    let leak = c.alloc_in(&g, 7).unwrap();
    assert!(std::panic::catch_unwind(|| g.assert_empty()).is_err(), "one object is live");
    assert_eq!(*leak, 7);
    drop(leak);
    g.assert_empty();
    let again = c.alloc_in(&g, 8).unwrap();
    drop(again);
    g.remove().unwrap();
}
