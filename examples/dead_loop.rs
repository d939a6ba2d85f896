//! Run with: `cargo run --release --example dead_loop -- [size] [n] [alive|dead]`
//!
//! What `benches/dead.rs` does for one size, once, for profilers
//! (`valgrind --tool=callgrind --toggle-collect='*free_all*'`): allocate
//! `n` objects of `size` bytes inside a group, remove the group (unless
//! `alive`), then free them all in `free_all`; prints ns per free.

use std::alloc::{GlobalAlloc, Layout};
use std::time::Instant;

use kmemcg::{Kmem, OsPages};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

/// Frees every block: the part the bench times.
#[inline(never)]
fn free_all(ptrs: Vec<*mut u8>, layout: Layout) {
    for p in ptrs {
        // SAFETY: each block is freed once with its layout.
        unsafe { KMEM.dealloc(p, layout) };
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let dead = args.next().as_deref() != Some("alive");
    let g = KMEM.root().create_child("dead-loop").unwrap();
    let layout = Layout::from_size_align(size, 8).unwrap();
    let ptrs: Vec<*mut u8> = {
        let _in = g.enter();
        // SAFETY: valid layout.
        (0..n).map(|_| unsafe { KMEM.alloc(layout) }).collect()
    };
    if dead {
        g.remove().unwrap();
    }
    let t = Instant::now();
    free_all(ptrs, layout);
    let d = t.elapsed();
    if !dead {
        g.remove().unwrap();
    }
    println!("{size} B {}: {:.1} ns per free", if dead { "dead" } else { "alive" }, d.as_nanos() as f64 / n as f64);
}
