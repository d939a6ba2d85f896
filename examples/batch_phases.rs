//! Run with: `cargo run --profile bench --example batch_phases -- <allocator> <size> [rounds]`
//!
//! The batch workload of `examples/peers.rs` (1M objects of `size` bytes
//! allocated, then freed in the same order) with each phase in a function
//! of its own, generic over the allocator and inlined into it as a
//! user's loop would be, so that callgrind can count one phase alone:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='*free_all*' target/release/examples/batch_phases kmemcg 64
//! ```
//!
//! (instructions over `rounds` x 1M is the cost of one free, or of one
//! allocation with `*alloc_all*`). Allocators: `kmemcg`, `kmemcg-group`
//! (the same inside a group: objects charged one by one, through the
//! CPU's byte stock), `jemalloc`, `mimalloc`, `system`. `rounds` defaults
//! to 3.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;

use kmemcg::{Kmem, OsPages};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

const BATCH: usize = 1_000_000;

#[inline(never)]
fn alloc_all<A: GlobalAlloc>(a: &A, ptrs: &mut Vec<*mut u8>, layout: Layout) {
    for _ in 0..BATCH {
        // SAFETY: a valid layout of non-zero size.
        ptrs.push(unsafe { a.alloc(layout) });
    }
}

#[inline(never)]
fn free_all<A: GlobalAlloc>(a: &A, ptrs: &mut Vec<*mut u8>, layout: Layout) {
    for p in ptrs.drain(..) {
        // SAFETY: each block is freed once with its layout.
        unsafe { a.dealloc(black_box(p), layout) };
    }
}

fn rounds<A: GlobalAlloc>(a: &A, size: usize, n: usize) {
    let layout = Layout::from_size_align(size, 8).unwrap();
    let mut ptrs = Vec::with_capacity(BATCH);
    for _ in 0..n {
        alloc_all(a, &mut ptrs, layout);
        assert!(ptrs.iter().all(|p| !p.is_null()), "allocation failed");
        free_all(a, &mut ptrs, layout);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: batch_phases <kmemcg|kmemcg-group|jemalloc|mimalloc|system> <size> [rounds]";
    let (Some(which), Some(size)) = (args.get(1), args.get(2).and_then(|s| s.parse::<usize>().ok())) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let n = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    match which.as_str() {
        "kmemcg" => rounds(&KMEM, size, n),
        "kmemcg-group" => {
            let g = KMEM.root().create_child("batch").unwrap();
            let _in = g.enter();
            rounds(&KMEM, size, n);
        }
        "jemalloc" => rounds(&tikv_jemallocator::Jemalloc, size, n),
        "mimalloc" => rounds(&mimalloc::MiMalloc, size, n),
        "system" => rounds(&System, size, n),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}
