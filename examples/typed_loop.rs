//! Run with: `cargo run --release --example typed_loop [reap] [account] [N]`
//!
//! Profiling aid: a tight alloc/free loop on a 64-byte typed cache, with an
//! optional `reap()` before it; `account`: an accounted cache, in an
//! entered group; `N` pairs (default 20M); prints ns per pair.

use std::hint::black_box;

use kmemcg::{CacheFlags, Kmem, OsPages};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

fn main() {
    let account = std::env::args().any(|a| a == "account");
    let flags = if account { CacheFlags::ACCOUNT } else { CacheFlags::NONE };
    let cache = KMEM.create_cache::<[u64; 8]>("pair64", flags).unwrap();
    let group = account.then(|| KMEM.root().create_child("typed").unwrap());
    let _in = group.as_ref().map(|g| g.enter());
    black_box(cache.alloc([0; 8]).unwrap());
    if std::env::args().any(|a| a == "reap") {
        KMEM.reap();
    }
    let n = std::env::args().filter_map(|a| a.parse().ok()).next().unwrap_or(20_000_000);
    let t = std::time::Instant::now();
    for i in 0..n {
        black_box(cache.alloc([i as u64; 8]).unwrap());
    }
    println!("{:.2} ns per alloc+free pair", t.elapsed().as_nanos() as f64 / n as f64);
}
