//! Run with: `cargo run --release --example typed_loop [reap]`
//!
//! Profiling aid: a tight alloc/free loop on a 64-byte typed cache, with an
//! optional `reap()` before it; prints ns per pair.

use std::hint::black_box;

use kmemcg::{CacheFlags, Kmem, OsPages};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

fn main() {
    let cache = KMEM.create_cache::<[u64; 8]>("pair64", CacheFlags::NONE).unwrap();
    black_box(cache.alloc([0; 8]).unwrap());
    if std::env::args().any(|a| a == "reap") {
        KMEM.reap();
    }
    let n = 20_000_000;
    let t = std::time::Instant::now();
    for i in 0..n {
        black_box(cache.alloc([i as u64; 8]).unwrap());
    }
    println!("{:.2} ns per alloc+free pair", t.elapsed().as_nanos() as f64 / n as f64);
}
