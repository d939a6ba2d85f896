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
//! * `threads8-pair`, `threads100-pair`: the same on 8 and on 100 threads
//!   (more threads than kmemcg's 64 CPU slots: the slotless path and slot
//!   rotation); the aggregate throughput ratio is 100 x t8 / (8 x t100).
//! * `xfree`: a producer allocates 64-byte blocks, a consumer frees them
//!   (through a lock-free ring that does not allocate); time per object.
//! * `realloc-grow`: 8 B grown to 1 MiB by doubling, then freed.

#[path = "../examples/support/workloads.rs"]
mod workloads;

use std::alloc::{Layout, System};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kmemcg::{DefaultRawMutex, Kmem, OsPages, Rseq};
use mimalloc::MiMalloc;
use talc::TalcLock;
use talc::source::GlobalAllocSource;
use tikv_jemallocator::Jemalloc;
use workloads::{Alloc, Rng, batch_phase, pair, xfree_run};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());
/// kmemcg on per-CPU slots through rseq (`Rseq`; `Threads`' slots where
/// rseq is missing).
static KMEM_RSEQ: Kmem<OsPages, DefaultRawMutex, Rseq> = Kmem::with_platform(OsPages::new(), Rseq::new());
static TALC: TalcLock<spin::mutex::SpinMutex<()>, GlobalAllocSource<System>> =
    TalcLock::new(GlobalAllocSource::new(System));

const SIZES: [usize; 5] = [64, 128, 256, 512, 1024];

fn allocators() -> [(&'static str, Alloc); 6] {
    [
        ("kmemcg", &KMEM),
        ("kmemcg-rseq", &KMEM_RSEQ),
        ("jemalloc", &Jemalloc),
        ("mimalloc", &MiMalloc),
        ("system", &System),
        ("talc", &TALC),
    ]
}

fn pair_64(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair-64");
    let layout = Layout::from_size_align(64, 8).unwrap();
    for (name, a) in allocators() {
        g.bench_function(name, |b| b.iter(|| pair(a, layout)));
    }
    g.finish();
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
/// returns the wall time of the parallel part only (from the first
/// thread's start to the last one's end, each thread reading the clock).
fn pairs_on_threads(a: Alloc, threads: usize, iters: u64) -> Duration {
    let layout = Layout::from_size_align(64, 8).unwrap();
    // Claim each thread's slot before timing.
    workloads::on_threads(
        threads,
        || pair(a, layout),
        || {
            for _ in 0..iters {
                pair(a, layout);
            }
        },
    )
}

fn threads_pair(c: &mut Criterion) {
    for (group, threads) in [("threads1-pair", 1), ("threads2-pair", 2), ("threads8-pair", 8), ("threads100-pair", 100)]
    {
        let mut g = c.benchmark_group(group);
        if threads > 2 {
            // Each sample spawns its threads: fewer, longer samples.
            g.sample_size(20).measurement_time(Duration::from_secs(6));
        }
        for (name, a) in allocators() {
            g.bench_function(name, |b| b.iter_custom(|iters| pairs_on_threads(a, threads, iters)));
        }
        g.finish();
    }
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
        g.bench_function(name, |b| b.iter(|| workloads::realloc_grow(a)));
    }
    g.finish();
}

criterion_group!(benches, pair_64, random, threads_pair, xfree, realloc_grow, batch);
criterion_main!(benches);
