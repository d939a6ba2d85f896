//! `Cgroup::stat` with detection on reads the headers of live objects (for
//! its leak rows) while another thread allocates and frees: found by a
//! review as a data race under Miri (plain reads racing the header
//! writes of an allocation); the headers are now written and read
//! atomically where aligned. Run under Miri to check it:
//! `cargo +nightly miri test --test detect_stat_race`.

use kmemcg::allocator_api2::boxed::Box as ABox;
use kmemcg::{Detection, Kmem, OsPages};

#[test]
fn stat_reads_headers_while_another_thread_allocates() {
    let k: &'static Kmem =
        Box::leak(Box::new(Kmem::new(OsPages::new()).with_detection(Detection::OFF.redzones(true).guard_pages(0))));
    let keep = ABox::new_in([7u64; 3], k);
    let t = std::thread::spawn(move || {
        for i in 0..20u64 {
            drop(ABox::new_in([i; 3], k));
        }
    });
    let mut seen = 0;
    for _ in 0..20 {
        seen = std::hint::black_box(k.root().stat()).leaks().count();
    }
    t.join().unwrap();
    assert!(seen >= 1, "the live object is a leak row");
    drop(keep);
}
