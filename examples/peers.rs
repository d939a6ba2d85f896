//! Run with: `cargo run --profile bench --example peers -- [rounds] [workloads]`
//! (`workloads`: a comma-separated subset of the names below; all by
//! default).
//!
//! kmemcg against its peers (jemalloc, mimalloc, the system allocator) as
//! a user's program meets them: every workload is a function generic over
//! the allocator, monomorphised and inlined for each (the `bench` profile
//! builds with fat LTO), not called through `&dyn GlobalAlloc`. Rounds
//! interleave the allocators (the machine is shared and noisy); the table
//! gives each one's median ns per step and kmemcg's ratio to the best
//! peer. Workloads (the same as `examples/profile.rs`'s):
//!
//! * `pair`: a 64-byte alloc+free;
//! * `random`: a live set of 10k log-uniform 8..4096-byte blocks, a step
//!   frees one and allocates one;
//! * `batch-alloc/64`, `batch-free/N`: 1M objects of N bytes, one phase
//!   timed (ns per object);
//! * `xfree`: a producer thread allocates 64-byte blocks, a consumer frees
//!   them (ns per object);
//! * `threads/T`: `pair` on T threads at once, the steps shared among
//!   them (ns per pair of the aggregate). Scaling, printed after the
//!   table, is `threads/1` time over `threads/2` time (2.0 is perfect on
//!   two CPUs), and `threads/8` over `threads/100`.
//!
//! `kmemcg-rseq` is the same allocator on the opt-in `Rseq` platform
//! (per-CPU slots through restartable sequences): a column of its own,
//! never counted as a peer.

#[path = "support/workloads.rs"]
mod workloads;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::{Duration, Instant};

use kmemcg::{DefaultRawMutex, Kmem, OsPages, Rseq};
use workloads::{BATCH, on_threads, random, xfree_run};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());
/// The same allocator on `Rseq`'s per-CPU slots (per-thread slots where
/// rseq is missing), not a peer: a column beside `kmemcg`, not in "best".
static KMEM_RSEQ: Kmem<OsPages, DefaultRawMutex, Rseq> = Kmem::with_platform(OsPages::new(), Rseq::new());
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
static SYSTEM: System = System;

const PAIR: Layout = match Layout::from_size_align(64, 8) {
    Ok(l) => l,
    Err(_) => panic!("layout"),
};

/// `steps` 64-byte pairs.
fn pair<A: GlobalAlloc>(a: &A, steps: usize) {
    for _ in 0..steps {
        // SAFETY: a valid layout; the block is freed at once.
        unsafe {
            let p = a.alloc(black_box(PAIR));
            a.dealloc(black_box(p), PAIR);
        }
    }
}

/// One batch round of `size`-byte objects; the time of the alloc phase
/// or of the free phase.
fn batch<A: GlobalAlloc>(a: &A, size: usize, time_alloc: bool) -> Duration {
    let layout = Layout::from_size_align(size, 8).unwrap();
    let mut ptrs = Vec::with_capacity(BATCH);
    let t = Instant::now();
    for _ in 0..BATCH {
        // SAFETY: a valid layout.
        ptrs.push(unsafe { a.alloc(layout) });
    }
    let alloc = t.elapsed();
    let t = Instant::now();
    for p in ptrs.drain(..) {
        // SAFETY: each block is freed once with its layout.
        unsafe { a.dealloc(black_box(p), layout) };
    }
    if time_alloc { alloc } else { t.elapsed() }
}

const WORKLOADS: [&str; 11] = [
    "pair",
    "random",
    "batch-alloc/64",
    "batch-free/64",
    "batch-free/256",
    "batch-free/512",
    "xfree",
    "threads/1",
    "threads/2",
    "threads/8",
    "threads/100",
];

/// ns per step of workload `w` on `a`.
fn measure<A: GlobalAlloc + Sync>(a: &'static A, w: &str) -> f64 {
    const PAIRS: usize = 20_000_000;
    const THREAD_PAIRS: usize = 8_000_000;
    let per = |d: Duration, n: usize| d.as_secs_f64() * 1e9 / n as f64;
    match w {
        "pair" => {
            let t = Instant::now();
            pair(a, PAIRS);
            per(t.elapsed(), PAIRS)
        }
        "random" => per(random(a, 4_000_000), 4_000_000),
        "batch-alloc/64" => per(batch(a, 64, true), BATCH),
        w if w.starts_with("batch-free/") => per(batch(a, w[11..].parse().unwrap(), false), BATCH),
        "xfree" => per(xfree_run(a, 4_000_000), 4_000_000),
        w if w.starts_with("threads/") => {
            let threads: usize = w[8..].parse().unwrap();
            let each = THREAD_PAIRS / threads;
            per(on_threads(threads, || pair(a, 1), || pair(a, each)), each * threads)
        }
        _ => unreachable!(),
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let names = ["kmemcg", "jemalloc", "mimalloc", "system", "kmemcg-rseq"];
    const PEERS: std::ops::Range<usize> = 1..4;
    let only: Option<Vec<String>> = std::env::args().nth(2).map(|a| a.split(',').map(str::to_owned).collect());
    let workloads: Vec<&str> =
        WORKLOADS.iter().copied().filter(|w| only.as_ref().is_none_or(|o| o.iter().any(|x| x == w))).collect();
    // [allocator][workload] -> samples
    let mut s = vec![vec![Vec::new(); workloads.len()]; names.len()];
    for _ in 0..rounds {
        for (wi, w) in workloads.iter().enumerate() {
            // Rotate who goes first, so none always runs on a warm or cold
            // machine.
            for k in 0..names.len() {
                let ai = (k + wi) % names.len();
                let ns = match ai {
                    0 => measure(&KMEM, w),
                    1 => measure(&JEMALLOC, w),
                    2 => measure(&MIMALLOC, w),
                    3 => measure(&SYSTEM, w),
                    _ => measure(&KMEM_RSEQ, w),
                };
                s[ai][wi].push(ns);
            }
        }
    }
    let med: Vec<Vec<f64>> = s.iter_mut().map(|a| a.iter_mut().map(|v| median(v)).collect()).collect();
    println!("{rounds} interleaved rounds, median ns per step (fat LTO, generic loops)");
    println!(
        "| workload | kmemcg | jemalloc | mimalloc | system | kmemcg-rseq | kmemcg / best peer | kmemcg-rseq / best peer |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (wi, w) in workloads.iter().enumerate() {
        let best = PEERS.map(|a| med[a][wi]).fold(f64::INFINITY, f64::min);
        println!(
            "| {w} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x | {:.2}x |",
            med[0][wi],
            med[1][wi],
            med[2][wi],
            med[3][wi],
            med[4][wi],
            med[0][wi] / best,
            med[4][wi] / best
        );
    }
    let idx = |w: &str| workloads.iter().position(|x| *x == w);
    for (ai, name) in names.iter().enumerate() {
        if let (Some(t1), Some(t2)) = (idx("threads/1"), idx("threads/2")) {
            println!("{name}: two-thread scaling {:.2}", med[ai][t1] / med[ai][t2]);
        }
        if let (Some(t8), Some(t100)) = (idx("threads/8"), idx("threads/100")) {
            println!("{name}: 100 threads / 8 threads {:.2}", med[ai][t8] / med[ai][t100]);
        }
    }
}
