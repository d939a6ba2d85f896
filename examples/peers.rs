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

#[path = "support/workloads.rs"]
mod workloads;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use kmemcg::{Kmem, OsPages};
use workloads::{BATCH, Rng, on_threads};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());
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

fn random<A: GlobalAlloc>(a: &A, steps: usize) -> Duration {
    const LIVE: usize = 10_000;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let plan: Vec<(usize, usize)> = (0..1 << 16)
        .map(|_| {
            let bits = 3 + rng.next() % 10;
            let size = (1usize << bits) + (rng.next() as usize % (1usize << bits));
            ((rng.next() as usize) % LIVE, size.min(4096))
        })
        .collect();
    let mut live: Vec<(*mut u8, usize)> = vec![(std::ptr::null_mut(), 8); LIVE];
    let mut run = |n: usize| {
        for &(slot, size) in plan.iter().cycle().take(n) {
            let (old, old_size) = live[slot];
            // SAFETY: each live block is freed once with its layout.
            unsafe {
                if !old.is_null() {
                    a.dealloc(old, Layout::from_size_align_unchecked(old_size, 8));
                }
                live[slot] = (a.alloc(Layout::from_size_align_unchecked(size, 8)), size);
            }
        }
    };
    run(1 << 16);
    let t = Instant::now();
    run(steps);
    let d = t.elapsed();
    for (p, size) in live {
        if !p.is_null() {
            // SAFETY: as above.
            unsafe { a.dealloc(p, Layout::from_size_align_unchecked(size, 8)) };
        }
    }
    d
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

/// A single-producer single-consumer ring of pointers (no allocation
/// after construction).
struct Ring {
    slots: Vec<AtomicUsize>,
    head: AtomicUsize,
    tail: AtomicUsize,
}

impl Ring {
    fn push(&self, v: usize) {
        let h = self.head.load(Ordering::Relaxed);
        while h - self.tail.load(Ordering::Acquire) == self.slots.len() {
            std::hint::spin_loop();
        }
        self.slots[h % self.slots.len()].store(v, Ordering::Relaxed);
        self.head.store(h + 1, Ordering::Release);
    }
    fn pop(&self) -> usize {
        let t = self.tail.load(Ordering::Relaxed);
        while self.head.load(Ordering::Acquire) == t {
            std::hint::spin_loop();
        }
        let v = self.slots[t % self.slots.len()].load(Ordering::Relaxed);
        self.tail.store(t + 1, Ordering::Release);
        v
    }
}

fn xfree<A: GlobalAlloc + Sync>(a: &'static A, objects: usize) -> Duration {
    let ring = Arc::new(Ring {
        slots: (0..4096).map(|_| AtomicUsize::new(0)).collect(),
        head: AtomicUsize::new(0),
        tail: AtomicUsize::new(0),
    });
    let barrier = Arc::new(Barrier::new(2));
    let consumer = {
        let (ring, barrier) = (ring.clone(), barrier.clone());
        thread::spawn(move || {
            pair(a, 1);
            barrier.wait();
            for _ in 0..objects {
                // SAFETY: each block is freed once with its layout.
                unsafe { a.dealloc(ring.pop() as *mut u8, PAIR) };
            }
        })
    };
    pair(a, 1);
    barrier.wait();
    let t = Instant::now();
    for _ in 0..objects {
        // SAFETY: a valid layout.
        ring.push(unsafe { a.alloc(PAIR) } as usize);
    }
    consumer.join().unwrap();
    t.elapsed()
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
        "xfree" => per(xfree(a, 4_000_000), 4_000_000),
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
    let names = ["kmemcg", "jemalloc", "mimalloc", "system"];
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
                    _ => measure(&SYSTEM, w),
                };
                s[ai][wi].push(ns);
            }
        }
    }
    let med: Vec<Vec<f64>> = s.iter_mut().map(|a| a.iter_mut().map(|v| median(v)).collect()).collect();
    println!("{rounds} interleaved rounds, median ns per step (fat LTO, generic loops)");
    println!("| workload | kmemcg | jemalloc | mimalloc | system | kmemcg / best peer |");
    println!("|---|---|---|---|---|---|");
    for (wi, w) in workloads.iter().enumerate() {
        let best = (1..names.len()).map(|a| med[a][wi]).fold(f64::INFINITY, f64::min);
        println!(
            "| {w} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x |",
            med[0][wi],
            med[1][wi],
            med[2][wi],
            med[3][wi],
            med[0][wi] / best
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
