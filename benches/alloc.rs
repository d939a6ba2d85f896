//! Allocation benchmarks, generic over `GlobalAlloc`: kmemcg beside
//! `System`, mimalloc, jemalloc and talc (an arena allocator) in one run.
//!
//! Run with: `cargo bench --bench alloc` (a subset: `-- pair-64`), then
//! `python3 scripts/bench_table.py` for the table of medians and ratios.
//!
//! * `pair-64`: allocate and free one 64-byte block.
//! * `batch-alloc/N`, `batch-free/N`: allocate 1M objects of N bytes, then
//!   free them all; each phase is timed on its own.
//! * `random`: a live set of 10k slots; each step frees a random slot and
//!   refills it with a log-uniform size in 8..=4096 (fixed seed).
//! * `threads1-pair`, `threads2-pair`: `pair-64` on one and on two threads
//!   at once (time per pair per thread; scaling = 2 x t1 / t2).
//! * `xfree`: a producer allocates 64-byte blocks, a consumer frees them
//!   (through a lock-free ring that does not allocate); time per object.
//! * `realloc-grow`: 8 B grown to 1 MiB by doubling, then freed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kmemcg::{Kmem, OsPages};
use mimalloc::MiMalloc;
use talc::TalcLock;
use talc::source::GlobalAllocSource;
use tikv_jemallocator::Jemalloc;

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());
static TALC: TalcLock<spin::mutex::SpinMutex<()>, GlobalAllocSource<System>> =
    TalcLock::new(GlobalAllocSource::new(System));

const BATCH: usize = 1_000_000;
const SIZES: [usize; 5] = [64, 128, 256, 512, 1024];

type Alloc = &'static (dyn GlobalAlloc + Sync);

fn allocators() -> [(&'static str, Alloc); 5] {
    [("kmemcg", &KMEM), ("jemalloc", &Jemalloc), ("mimalloc", &MiMalloc), ("system", &System), ("talc", &TALC)]
}

fn pair(a: Alloc, layout: Layout) {
    // SAFETY: valid layout; the block is freed at once.
    unsafe {
        let p = a.alloc(black_box(layout));
        black_box(p);
        a.dealloc(p, layout);
    }
}

fn pair_64(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair-64");
    let layout = Layout::from_size_align(64, 8).unwrap();
    for (name, a) in allocators() {
        g.bench_function(name, |b| b.iter(|| pair(a, layout)));
    }
    g.finish();
}

/// Times `iters` rounds of one phase of the batch workload.
fn batch_phase(a: Alloc, size: usize, iters: u64, time_alloc: bool) -> Duration {
    let layout = Layout::from_size_align(size, 8).unwrap();
    let mut ptrs = Vec::with_capacity(BATCH);
    let mut total = Duration::ZERO;
    for _ in 0..iters {
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

fn batch(c: &mut Criterion) {
    for (phase, time_alloc) in [("batch-alloc", true), ("batch-free", false)] {
        let mut g = c.benchmark_group(phase);
        g.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
        for size in SIZES {
            for (name, a) in allocators() {
                g.bench_with_input(BenchmarkId::new(name, size), &size, |b, &size| {
                    b.iter_custom(|iters| batch_phase(a, size, iters, time_alloc))
                });
            }
        }
        g.finish();
    }
}

/// xorshift64: a fixed, allocation-free sequence.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const LIVE: usize = 10_000;
const STEPS: usize = 1 << 16;

fn random(c: &mut Criterion) {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    // Log-uniform sizes in 8..=4096, and the slot each step replaces.
    let steps: Vec<(usize, usize)> = (0..STEPS)
        .map(|_| {
            let bits = 3 + rng.next() % 10;
            let size = (1usize << bits) + (rng.next() as usize % (1usize << bits));
            ((rng.next() as usize) % LIVE, size.min(4096))
        })
        .collect();
    let mut g = c.benchmark_group("random");
    for (name, a) in allocators() {
        g.bench_function(name, |b| {
            let mut live: Vec<(*mut u8, usize)> = vec![(std::ptr::null_mut(), 8); LIVE];
            let mut i = 0;
            b.iter(|| {
                let (slot, size) = steps[i % STEPS];
                i += 1;
                let (old, old_size) = live[slot];
                // SAFETY: each live block is freed once with its layout.
                unsafe {
                    if !old.is_null() {
                        a.dealloc(old, Layout::from_size_align_unchecked(old_size, 8));
                    }
                    live[slot] = (a.alloc(Layout::from_size_align_unchecked(size, 8)), size);
                }
            });
            for (p, size) in live {
                if !p.is_null() {
                    // SAFETY: as above.
                    unsafe { a.dealloc(p, Layout::from_size_align_unchecked(size, 8)) };
                }
            }
        });
    }
    g.finish();
}

/// Runs `pair-64` on `threads` threads at once, `iters` pairs each, and
/// returns the wall time of the parallel part only.
fn pairs_on_threads(a: Alloc, threads: usize, iters: u64) -> Duration {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let layout = Layout::from_size_align(64, 8).unwrap();
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let barrier = barrier.clone();
            thread::spawn(move || {
                pair(a, layout); // claim this thread's slot before timing
                barrier.wait();
                for _ in 0..iters {
                    pair(a, layout);
                }
                barrier.wait();
            })
        })
        .collect();
    barrier.wait();
    let t = Instant::now();
    barrier.wait();
    let d = t.elapsed();
    for h in hs {
        h.join().unwrap();
    }
    d
}

fn threads_pair(c: &mut Criterion) {
    for (group, threads) in [("threads1-pair", 1), ("threads2-pair", 2)] {
        let mut g = c.benchmark_group(group);
        for (name, a) in allocators() {
            g.bench_function(name, |b| b.iter_custom(|iters| pairs_on_threads(a, threads, iters)));
        }
        g.finish();
    }
}

/// A single-producer single-consumer ring of pointers that never allocates
/// after construction.
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

fn xfree_run(a: Alloc, objects: u64) -> Duration {
    let ring = Arc::new(Ring {
        slots: (0..4096).map(|_| AtomicUsize::new(0)).collect(),
        head: AtomicUsize::new(0),
        tail: AtomicUsize::new(0),
    });
    let layout = Layout::from_size_align(64, 8).unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let consumer = {
        let (ring, barrier) = (ring.clone(), barrier.clone());
        thread::spawn(move || {
            pair(a, layout);
            barrier.wait();
            for _ in 0..objects {
                // SAFETY: each block is freed once with its layout.
                unsafe { a.dealloc(ring.pop() as *mut u8, layout) };
            }
        })
    };
    pair(a, layout);
    barrier.wait();
    let t = Instant::now();
    for _ in 0..objects {
        // SAFETY: valid layout.
        ring.push(unsafe { a.alloc(layout) } as usize);
    }
    consumer.join().unwrap();
    t.elapsed()
}

fn xfree(c: &mut Criterion) {
    let mut g = c.benchmark_group("xfree");
    for (name, a) in allocators() {
        // Threads are spawned per sample: `iters` objects flow through one
        // producer/consumer pair (5M objects over the default sampling).
        g.bench_function(name, |b| b.iter_custom(|iters| xfree_run(a, iters)));
    }
    g.finish();
}

fn realloc_grow(c: &mut Criterion) {
    let mut g = c.benchmark_group("realloc-grow");
    for (name, a) in allocators() {
        g.bench_function(name, |b| {
            b.iter(|| {
                // SAFETY: every realloc passes the block's current layout.
                unsafe {
                    let mut size = 8;
                    let mut p = a.alloc(Layout::from_size_align_unchecked(size, 8));
                    while size < (1 << 20) {
                        p = a.realloc(p, Layout::from_size_align_unchecked(size, 8), size * 2);
                        size *= 2;
                    }
                    a.dealloc(black_box(p), Layout::from_size_align_unchecked(size, 8));
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, pair_64, random, threads_pair, xfree, realloc_grow, batch);
criterion_main!(benches);
