//! Byte budgets for a test's scope (`Cgroup::track_bytes`,
//! `assert_peak_at_most`): the peak is the bytes the scope's objects held
//! at once, not the pages charged (whole pages, with what the slots'
//! stocks hold), so a budget of a few bytes can be checked.
//!
//! Detection is off explicitly: byte tracking is not kept with it on, so
//! `KMEMCG_DEBUG` (which CI sets for a second run) does not apply here.

use kmemcg::allocator_api2::vec::Vec as AVec;
use kmemcg::{Detection, Kmem, OsPages};

#[global_allocator]
static KMEM: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::OFF);

fn panics(f: impl FnOnce()) -> String {
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_err();
    e.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn one_boxed_u64_peaks_at_its_size_class() {
    let g = KMEM.root().create_child("peak-box").unwrap();
    g.track_bytes();
    {
        let _in = g.enter();
        let b = Box::new(7u64);
        assert_eq!(**std::hint::black_box(&b), 7);
    }
    // Pages charged are whole pages: the object's 8 bytes took one (a
    // whole slab of the class and a stock of pages before objects were
    // charged one by one).
    assert_eq!(g.peak(), 4096, "page peak {}", g.peak());
    assert!((8..=16).contains(&g.peak_bytes()), "byte peak {}", g.peak_bytes());
    assert_eq!(g.object_bytes(), 0);
    g.assert_peak_at_most(64);
    g.assert_empty();
    g.remove().unwrap();
}

#[test]
fn a_growing_vec_peaks_at_its_two_largest_buffers() {
    let g = KMEM.root().create_child("peak-vec").unwrap();
    g.track_bytes();
    {
        let _in = g.enter();
        let mut v = Vec::new();
        for i in 0..1000u64 {
            v.push(i);
        }
        assert_eq!(v.iter().sum::<u64>(), 999 * 1000 / 2);
    }
    // The last move has the 512- and the 1024-element buffers live at once.
    let peak = g.peak_bytes();
    assert!((8000..=16 << 10).contains(&peak), "byte peak {peak}");
    g.assert_peak_at_most(16 << 10);
    let msg = panics(|| g.assert_peak_at_most(4096));
    assert!(msg.contains("objects peaked at") && msg.contains("over its budget of 4096"), "{msg}");
    // The page-level variant sees whole pages: 12 KiB of objects take 3.
    let msg = panics(|| g.assert_page_peak_at_most(8 << 10));
    assert!(msg.contains("over its budget of 8192"), "{msg}");
    g.assert_empty();
    g.remove().unwrap();
}

#[test]
fn a_subtree_counts_its_children_and_a_reset_restarts_the_peak() {
    let parent = KMEM.root().create_child("peak-parent").unwrap();
    parent.track_bytes();
    let child = parent.create_child("peak-child").unwrap();
    let mut kept: AVec<u8, _> = AVec::with_capacity_in(100, child.allocator());
    kept.push(1);
    let big: AVec<u8, _> = AVec::with_capacity_in(100_000, child.allocator());
    // A large object counts its whole pages (25 of 4 KiB), a small one
    // its size class.
    let pages = 100_000usize.div_ceil(4096) * 4096;
    assert!((pages + 100..=pages + 128).contains(&parent.object_bytes()), "{}", parent.object_bytes());
    assert_eq!(child.object_bytes(), parent.object_bytes());
    drop(big);
    assert!(parent.object_bytes() < 4096 && parent.peak_bytes() > 100_000);
    parent.reset_peak();
    assert_eq!(parent.peak_bytes(), parent.object_bytes());
    parent.assert_peak_at_most(4096);
    drop(kept);
    assert_eq!(parent.object_bytes(), 0);
    child.remove().unwrap();
    parent.remove().unwrap();
}

/// Hostile use of byte tracking: objects from before `track_bytes` freed
/// after it (the count reads 0, never a wrapped huge value), `track_bytes`
/// called again from two threads while a third allocates and frees in the
/// group, and `track_bytes` on a removed group.
#[test]
fn byte_tracking_survives_older_objects_repeats_races_and_removal() {
    let g = KMEM.root().create_child("peak-hostile").unwrap();
    let old: AVec<u8, _> = AVec::with_capacity_in(1000, g.allocator());
    g.track_bytes();
    drop(old);
    assert_eq!(g.object_bytes(), 0, "a free of an older object wrapped the count");
    // The peak restarts from what was counted when tracking began: the
    // older object if the allocator already counted bytes (another test's
    // `track_bytes` turned counting on for the whole allocator), else 0.
    assert!(g.peak_bytes() <= 1024, "peak {}", g.peak_bytes());
    let h = KMEM.root().create_child("peak-race").unwrap();
    h.track_bytes();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..200 {
                    h.track_bytes();
                }
            });
        }
        s.spawn(|| {
            let _in = h.enter();
            for i in 0..10_000u64 {
                drop(std::hint::black_box(Box::new(i)));
            }
        });
    });
    assert_eq!(h.object_bytes(), 0, "every object freed, so nothing counted");
    assert!(h.peak_bytes() <= 64, "peak {}", h.peak_bytes());
    h.assert_empty();
    h.remove().unwrap();
    g.remove().unwrap();
    g.track_bytes();
    assert_eq!(g.object_bytes(), 0);
}
