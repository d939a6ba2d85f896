//! Large objects at the edges (found by a review): a request no page
//! source can ever serve called the out-of-memory handler (asking it for
//! 2^48 pages); growth in place of a removed group's object charged that
//! group, which takes no new charges, under its old `max`; growth in place
//! to a size no run can hold was charged (and counted as refused) up to
//! every ancestor before the page source said no.

use core::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

use allocator_api2::alloc::Allocator;
use kmemcg::{Kmem, OomSite, OsPages, ShrinkControl, Shrinker};

static K: Kmem = Kmem::new(OsPages::new());
static SCANS: AtomicUsize = AtomicUsize::new(0);
static OOMS: AtomicUsize = AtomicUsize::new(0);

struct Cache;
impl Shrinker for Cache {
    fn count(&self, _: &ShrinkControl) -> usize {
        1000
    }
    fn scan(&self, _: &ShrinkControl, nr: usize) -> usize {
        SCANS.fetch_add(1, Ordering::Relaxed);
        nr
    }
}
static CACHE: Cache = Cache;

fn oom(_: &Kmem, _pages: usize) -> bool {
    OOMS.fetch_add(1, Ordering::Relaxed);
    false
}

/// Both cases share `K`'s handler and shrinker: one test.
#[test]
fn impossible_requests_and_growth_of_removed_groups_objects() {
    K.register_shrinker(&CACHE).unwrap();
    K.set_oom_handler(Some(oom));
    // 2^60 bytes (2^48 pages) and an alignment of 2^60: above any run a
    // page source can hand out. Refused at once: no charge, no reclaim,
    // no handler.
    let g = K.root().create_child("impossible").unwrap();
    for l in [Layout::from_size_align(1 << 60, 8).unwrap(), Layout::from_size_align(8, 1 << 60).unwrap()] {
        assert!((&K).allocate(l).is_err());
        // SAFETY: a non-zero size.
        assert!(unsafe { K.alloc(l) }.is_null());
        assert!(g.allocator().allocate(l).is_err());
    }
    assert_eq!(OOMS.load(Ordering::Relaxed), 0, "the out-of-memory handler was called for an impossible request");
    assert_eq!(SCANS.load(Ordering::Relaxed), 0);
    // Reported as beyond every order.
    let r = K.last_oom().unwrap();
    assert_eq!((r.site, r.order), (OomSite::Large { size: 8 }, kmemcg::MAX_ORDER));
    let st = g.stat();
    assert_eq!((st.usage, st.peak, st.failcnt, st.events.max, st.events.oom), (0, 0, 0, 0, 0));
    g.remove().unwrap();
    K.set_oom_handler(None);

    // A large object of a removed group grows by moving, charged to the
    // nearest online ancestor; the removed group takes nothing more.
    let parent = K.root().create_child("parent").unwrap();
    let child = parent.create_child("child").unwrap();
    child.set_max(1 << 20).unwrap();
    let l = Layout::from_size_align(100_000, 8).unwrap();
    let p = child.allocator().allocate(l).unwrap().cast::<u8>();
    // SAFETY: 100,000 bytes of ours.
    unsafe { p.as_ptr().write_bytes(0x5a, 100_000) };
    child.remove().unwrap();
    let before = child.usage();
    let pa = parent.allocator();
    let mut cur = (p, l);
    for size in [400_000, 2_000_000] {
        let nl = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: `cur` is live, of layout `cur.1`, which `nl` is larger
        // than.
        let q = unsafe { pa.grow(cur.0, cur.1, nl) }.unwrap().cast::<u8>();
        assert!(child.usage() <= before, "the removed group took a new charge: {} -> {}", before, child.usage());
        // SAFETY: the first 100,000 bytes came over from the old block.
        assert!(unsafe { core::slice::from_raw_parts(q.as_ptr(), 100_000) }.iter().all(|&b| b == 0x5a));
        cur = (q, nl);
    }
    assert!(parent.usage() >= 2_000_000, "the parent is charged: {}", parent.usage());
    // SAFETY: live, of layout `cur.1`.
    unsafe { pa.deallocate(cur.0, cur.1) };
    // (With detection on, freed objects wait in its quarantine, charged.)
    K.shrink();
    assert_eq!((child.usage(), parent.usage()), (0, 0));
    parent.remove().unwrap();
}

#[test]
fn impossible_growth_in_place_charges_nothing() {
    // A review's repro: the same request as a new allocation was refused
    // before any charge; as the growth of a live large object it was
    // charged to its group and every ancestor, seen in their usage by
    // other threads and counted in the parent's `failcnt` and max events.
    // A `Kmem` of its own: the other test reads `K`'s last report.
    let k: &'static Kmem = Box::leak(Box::new(Kmem::new(OsPages::new())));
    let p = k.root().create_child("limited-parent").unwrap();
    p.set_max(256 << 20).unwrap();
    let g = p.create_child("grower").unwrap();
    let a = g.allocator();
    let small = Layout::from_size_align(64 << 10, 8).unwrap();
    let huge = Layout::from_size_align(isize::MAX as usize - 4095 - (1 << 20), 8).unwrap();
    let b = a.allocate(small).unwrap();
    assert!(a.allocate(huge).is_err());
    // SAFETY: `b` is live, of layout `small`, which `huge` is larger than.
    assert!(unsafe { a.grow(b.cast(), small, huge) }.is_err());
    let st = p.stat();
    assert_eq!((st.failcnt, st.events.max), (0, 0), "an impossible growth in place was charged");
    assert!(p.peak() < 1 << 20, "an impossible growth in place showed in a peak: {}", p.peak());
    // Unlimited up to the root: no refusal to count, but no charge either.
    let free = k.root().create_child("unlimited").unwrap();
    let b2 = free.allocator().allocate(small).unwrap();
    let root_peak = k.root().peak();
    // SAFETY: as above.
    assert!(unsafe { free.allocator().grow(b2.cast(), small, huge) }.is_err());
    assert!(k.root().peak() <= root_peak.max(1 << 30), "the root's peak took the growth: {}", k.root().peak());
    // SAFETY: live, of layout `small` (a failed growth keeps the block).
    unsafe {
        a.deallocate(b.cast(), small);
        free.allocator().deallocate(b2.cast(), small);
    }
}
