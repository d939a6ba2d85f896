//! A review's finding (detection): decay's reap (once a second by
//! default, run from any slow path) emptied the whole quarantine and freed
//! every retired sampled run, with no memory pressure at all. The README
//! promises a FIFO quarantine of bounded *bytes* ("a write after free
//! aborts when the object leaves the quarantine") and that "a freed
//! sampled object's pages stay inaccessible while its run waits to be
//! reused for a later sample (up to 16 runs), so a use after free faults
//! too": after a second of ordinary allocation neither held (the freed
//! object was back in a magazine marked checked, a later write after free
//! went unseen; the sampled run's pages were back in the page source,
//! accessible). Decay's reaps now leave both; `Kmem::reap`, `shrink` and
//! reclaim still give them back.

use std::alloc::{GlobalAlloc, Layout};
use std::time::Duration;

use kmemcg::{Detection, Kmem, OsPages};

/// Allocations that are never sampled (size not a multiple of the
/// alignment) and go through enough magazine refills for decay to look
/// at the clock (every 256th slow path); kept live so that they do not
/// push anything out of the quarantine themselves.
fn churn(k: &Kmem) -> Vec<*mut u8> {
    let l = Layout::from_size_align(12, 8).unwrap();
    // SAFETY: a valid layout; freed by `unchurn`.
    (0..200_000).map(|_| unsafe { k.alloc(l) }).collect()
}

fn unchurn(k: &Kmem, v: Vec<*mut u8>) {
    let l = Layout::from_size_align(12, 8).unwrap();
    for p in v {
        // SAFETY: allocated by `churn` with this layout.
        unsafe { k.dealloc(p, l) };
    }
}

#[test]
fn a_quarantined_object_stays_quarantined_without_memory_pressure() {
    let k: &'static Kmem = Box::leak(Box::new(Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(0))));
    let l = Layout::from_size_align(64, 8).unwrap();
    // Decay's first look at the clock starts its first interval.
    let v0 = churn(k);
    // SAFETY: a valid layout, freed once.
    unsafe {
        let p = k.alloc(l);
        k.dealloc(p, l);
    }
    assert_eq!(k.stats().quarantined.0, 1);
    std::thread::sleep(Duration::from_millis(1100));
    let v = churn(k);
    let q = k.stats().quarantined;
    unchurn(k, v);
    unchurn(k, v0);
    assert_eq!(q.0, 1, "the freed object left the 1 MiB quarantine after 64 bytes of frees (decay flushed it)");
}

#[test]
fn a_freed_sampled_run_stays_inaccessible_without_memory_pressure() {
    let k: &'static Kmem = Box::leak(Box::new(Kmem::new(OsPages::new()).with_detection(Detection::sampled(1))));
    let l = Layout::from_size_align(64, 8).unwrap();
    // Decay's first look at the clock starts its first interval.
    let v0 = churn(k);
    // SAFETY: a valid layout, freed once.
    unsafe {
        let p = k.alloc(l);
        assert!((p.addr() + 64).is_multiple_of(4096), "sampled");
        k.dealloc(p, l);
    }
    assert_eq!(k.stats().large_objects, 1, "the freed sample's run is retired, inaccessible");
    std::thread::sleep(Duration::from_millis(1100));
    let v = churn(k);
    let n = k.stats().large_objects;
    unchurn(k, v);
    unchurn(k, v0);
    assert_eq!(n, 1, "the retired run was freed (its pages accessible again) by decay, one second later");
}
