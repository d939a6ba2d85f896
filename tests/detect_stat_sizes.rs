//! A review's finding (detection): `Cgroup::stat`'s leak rows read each
//! live-looking slot's header (tag, then size) while other threads
//! allocate and free. An allocation stored the `ALIVE` tag *before* the
//! size, and a free stored its owner word (the cache's address, where the
//! size was) *before* the `FREED` tag, all `Relaxed`: a scan between the
//! two stores paired a live tag with the owner word, and the report named
//! a "leak" whose requested size was a cache's address (within
//! milliseconds here). Now the size goes before the tag, the tag before
//! the owner word, and the scan reads the size between two reads of the
//! tag (seqlock-style).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, Ordering};

use kmemcg::{Detection, Kmem, OsPages};

#[test]
fn leak_rows_only_name_requested_sizes() {
    let k: &'static Kmem =
        Box::leak(Box::new(Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(0).quarantine(0))));
    let l = Layout::from_size_align(24, 8).unwrap();
    // One object that stays live, so the cache has a slab to scan.
    // SAFETY: a valid layout; freed at the end.
    let keep = unsafe { k.alloc(l) };
    static STOP: AtomicBool = AtomicBool::new(false);
    let t = std::thread::spawn(move || {
        while !STOP.load(Ordering::Relaxed) {
            for _ in 0..1000 {
                // SAFETY: a valid layout, freed once.
                unsafe {
                    let p = k.alloc(l);
                    k.dealloc(p, l);
                }
            }
        }
    });
    let start = std::time::Instant::now();
    let mut bad = None;
    let mut scans = 0u64;
    while start.elapsed() < std::time::Duration::from_secs(3) && bad.is_none() {
        let st = k.root().stat();
        scans += 1;
        bad = st.leaks().find(|&(_, bytes, _)| bytes != 24 && bytes != 0).map(|(c, b, n)| (c.to_owned(), b, n));
    }
    STOP.store(true, Ordering::Relaxed);
    t.join().unwrap();
    // SAFETY: allocated above with this layout.
    unsafe { k.dealloc(keep, l) };
    assert_eq!(bad, None, "a leak row with a size nobody asked for (after {scans} scans)");
}
