//! Run with: `cargo run --release --example pair_loop`
//!
//! A tight alloc/free loop of 64-byte blocks, for profiling the fast path
//! (`perf record`, `valgrind --tool=callgrind`); prints ns per pair.
//! `pair_loop N group` runs it inside an entered group (the accounted
//! `GlobalAlloc` path).

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::time::Instant;

use kmemcg::{Kmem, OsPages};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(50_000_000);
    // No decay: under valgrind the loop runs tens of times slower, so a
    // reap once a second of wall time would come tens of times as often
    // per pair as in a real run, and instruction counts would depend on
    // the machine's speed.
    KMEM.set_decay(kmemcg::Decay::OFF);
    let group =
        (std::env::args().nth(2).as_deref() == Some("group")).then(|| KMEM.root().create_child("pairs").unwrap());
    let _in = group.as_ref().map(|g| g.enter());
    let layout = Layout::from_size_align(64, 8).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: valid layout; freed at once.
        unsafe {
            let p = KMEM.alloc(black_box(layout));
            KMEM.dealloc(black_box(p), layout);
        }
    }
    println!("{:.2} ns per alloc+free pair", t.elapsed().as_nanos() as f64 / n as f64);
}
