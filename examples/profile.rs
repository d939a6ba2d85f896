//! Run with: `cargo run --release --example profile -- <allocator> <workload> [steps]`
//!
//! One workload of `benches/alloc.rs` on one allocator, in a process of its
//! own, for profilers (`perf record`, `valgrind --tool=callgrind`) and for
//! quick interleaved runs: prints ns per step. Allocators: `kmemcg`,
//! `jemalloc`, `mimalloc`, `system`. Workloads: `pair` (64-byte
//! alloc+free), `random` (the live set of 10k log-uniform 8..4096-byte
//! slots; a step frees one and allocates one), `batch-alloc/N` and
//! `batch-free/N` (1M objects of N bytes, one phase timed), `xfree` (a
//! producer thread allocates 64-byte blocks, a consumer thread frees
//! them; ns per object), `threads/T` (`pair` on T threads at once, the
//! steps shared among them; ns per pair of the aggregate), `realloc-grow` (8 B grown to 1 MiB by doubling,
//! then freed; ns per realloc).

#[path = "support/workloads.rs"]
mod workloads;

use std::alloc::{Layout, System};
use std::hint::black_box;
use std::time::{Duration, Instant};

use kmemcg::{Kmem, OsPages};
use mimalloc::MiMalloc;
use tikv_jemallocator::Jemalloc;
use workloads::{Alloc, BATCH, REALLOC_GROW_STEPS, batch_phase, random, realloc_grow, xfree_run};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

fn pair(a: Alloc, steps: usize) -> Duration {
    let layout = Layout::from_size_align(64, 8).unwrap();
    let t = Instant::now();
    for _ in 0..steps {
        // SAFETY: valid layout; freed at once.
        unsafe {
            let p = a.alloc(black_box(layout));
            a.dealloc(black_box(p), layout);
        }
    }
    t.elapsed()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: profile <kmemcg|jemalloc|mimalloc|system> <pair|random|xfree|realloc-grow|threads/T|batch-alloc/N|batch-free/N> [steps]";
    let (Some(name), Some(work)) = (args.get(1), args.get(2)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let a: Alloc = match name.as_str() {
        "kmemcg" => &KMEM,
        "jemalloc" => &Jemalloc,
        "mimalloc" => &MiMalloc,
        "system" => &System,
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let steps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20_000_000);
    let per_step = match work.split_once('/') {
        None if work == "pair" => pair(a, steps).as_secs_f64() / steps as f64,
        None if work == "random" => random(a, steps).as_secs_f64() / steps as f64,
        None if work == "xfree" => xfree_run(a, steps as u64).as_secs_f64() / steps as f64,
        None if work == "realloc-grow" => {
            let rounds = (steps / REALLOC_GROW_STEPS).max(1);
            let t = Instant::now();
            for _ in 0..rounds {
                realloc_grow(a);
            }
            t.elapsed().as_secs_f64() / (rounds * REALLOC_GROW_STEPS) as f64
        }
        Some(("threads", n)) => {
            let Ok(threads) = n.parse::<usize>() else {
                eprintln!("{usage}");
                std::process::exit(2);
            };
            let each = steps / threads;
            let d = workloads::on_threads(
                threads,
                || {
                    pair(a, 1);
                },
                || {
                    pair(a, each);
                },
            );
            d.as_secs_f64() / (each * threads) as f64
        }
        Some((phase, n)) if phase.starts_with("batch-") => {
            let Ok(size) = n.parse() else {
                eprintln!("{usage}");
                std::process::exit(2);
            };
            let rounds = (steps / BATCH).max(1);
            batch_phase(a, size, rounds as u64, phase == "batch-alloc").as_secs_f64() / (rounds * BATCH) as f64
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    println!("{name} {work}: {:.2} ns per step", per_step * 1e9);
}
