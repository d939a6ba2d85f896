//! Detection with every allocation sampled onto a guard page, as the
//! global allocator: ordinary code that shrinks and grows its blocks in
//! place runs clean. Issue 26, item 5: `KMEMCG_DEBUG=1` and a
//! `String::shrink_to_fit` loop died within 5,000 iterations (SIGSEGV in
//! `resize_checked`, which read the slab header and trailer a sampled
//! object does not have); a crash here takes the test binary down.
//!
//! Without the test harness (`harness = false`): its own long-lived
//! blocks would fill the table of sampled objects ([`kmemcg::GUARDED_MAX`])
//! before the loop runs.

use kmemcg::{Detection, Kmem, OsPages};

/// Every allocation sampled while the table has room (`guard=1`).
#[global_allocator]
static KMEM: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(1));

/// Whether `p..p + len` ends at a page boundary (a sampled block).
fn at_page_end(p: *const u8, len: usize) -> bool {
    (p.addr() + len).is_multiple_of(4096)
}

fn main() {
    shrink_to_fit_loops_run_clean_with_every_object_sampled();
    println!("detect_sampled: ok");
}

fn shrink_to_fit_loops_run_clean_with_every_object_sampled() {
    assert_eq!(KMEM.detection().guard_every(), 1);
    let mut sampled = 0usize;
    let mut x: u32 = 0x9e37_79b9;
    for i in 0..100_000usize {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        // A capacity of 1..=200 bytes and a length a few bytes short of it
        // (often the same size class with the trailer added), or far short.
        let cap = 1 + (x as usize % 200);
        let len = if i % 4 == 0 { cap / 3 } else { cap.saturating_sub((x >> 8) as usize % 8) };
        let mut s = String::with_capacity(cap);
        sampled += usize::from(at_page_end(s.as_ptr(), s.capacity()));
        s.extend(std::iter::repeat_n('k', len));
        s.shrink_to_fit();
        assert_eq!(s.len(), len);
        assert!(s.bytes().all(|b| b == b'k'));
        let mut v: Vec<u8> = Vec::with_capacity(cap);
        v.extend((0..len).map(|j| j as u8));
        v.shrink_to_fit();
        v.reserve_exact(cap - len);
        v.shrink_to_fit();
        assert!(v.iter().enumerate().all(|(j, &b)| b == j as u8));
    }
    assert_eq!(sampled, 100_000, "every block sampled");
}
