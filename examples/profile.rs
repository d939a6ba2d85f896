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
//! them; ns per object).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kmemcg::{Kmem, OsPages};
use mimalloc::MiMalloc;
use tikv_jemallocator::Jemalloc;

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

type Alloc = &'static (dyn GlobalAlloc + Sync);

/// xorshift64: the same fixed sequence as the bench.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

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

fn random(a: Alloc, steps: usize) -> Duration {
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
    // One pass to fill the live set, untimed.
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

fn batch(a: Alloc, size: usize, rounds: usize, time_alloc: bool) -> Duration {
    const BATCH: usize = 1_000_000;
    let layout = Layout::from_size_align(size, 8).unwrap();
    let mut ptrs = Vec::with_capacity(BATCH);
    let mut total = Duration::ZERO;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..BATCH {
            // SAFETY: valid layout.
            ptrs.push(unsafe { a.alloc(layout) });
        }
        if time_alloc {
            total += t.elapsed();
        }
        let t = Instant::now();
        for p in ptrs.drain(..) {
            // SAFETY: each block is freed once with its layout.
            unsafe { a.dealloc(black_box(p), layout) };
        }
        if !time_alloc {
            total += t.elapsed();
        }
    }
    total
}

/// A single-producer single-consumer ring that never allocates.
struct Ring {
    slots: Vec<AtomicUsize>,
    head: AtomicUsize,
    tail: AtomicUsize,
}

fn xfree(a: Alloc, objects: usize) -> Duration {
    let ring = Ring {
        slots: (0..4096).map(|_| AtomicUsize::new(0)).collect(),
        head: AtomicUsize::new(0),
        tail: AtomicUsize::new(0),
    };
    let layout = Layout::from_size_align(64, 8).unwrap();
    let t = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for _ in 0..objects {
                let t = ring.tail.load(Ordering::Relaxed);
                while ring.head.load(Ordering::Acquire) == t {
                    std::hint::spin_loop();
                }
                let p = ring.slots[t % 4096].load(Ordering::Relaxed);
                ring.tail.store(t + 1, Ordering::Release);
                // SAFETY: each block is freed once with its layout.
                unsafe { a.dealloc(p as *mut u8, layout) };
            }
        });
        for _ in 0..objects {
            // SAFETY: valid layout.
            let p = unsafe { a.alloc(layout) } as usize;
            let h = ring.head.load(Ordering::Relaxed);
            while h - ring.tail.load(Ordering::Acquire) == 4096 {
                std::hint::spin_loop();
            }
            ring.slots[h % 4096].store(p, Ordering::Relaxed);
            ring.head.store(h + 1, Ordering::Release);
        }
    });
    t.elapsed()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage =
        "usage: profile <kmemcg|jemalloc|mimalloc|system> <pair|random|xfree|batch-alloc/N|batch-free/N> [steps]";
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
        None if work == "xfree" => xfree(a, steps).as_secs_f64() / steps as f64,
        Some((phase, n)) if phase.starts_with("batch-") => {
            let Ok(size) = n.parse() else {
                eprintln!("{usage}");
                std::process::exit(2);
            };
            let rounds = (steps / 1_000_000).max(1);
            batch(a, size, rounds, phase == "batch-alloc").as_secs_f64() / (rounds * 1_000_000) as f64
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    println!("{name} {work}: {:.2} ns per step", per_step * 1e9);
}
