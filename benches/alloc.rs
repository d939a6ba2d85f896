//! Allocation benchmarks, generic over `GlobalAlloc`, with `System` and
//! mimalloc beside kmemcg in the same run.
//!
//! Run with: `cargo bench --bench alloc`
//!
//! * `pair-64`: allocate and free one 64-byte block.
//! * `batch-alloc/N`, `batch-free/N`: allocate 1M objects of N bytes, then
//!   free them all; each phase is timed on its own (`iter_custom`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kmemcg::{Kmem, OsPages};
use mimalloc::MiMalloc;

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

const BATCH: usize = 1_000_000;
const SIZES: [usize; 5] = [64, 128, 256, 512, 1024];

fn allocators() -> [(&'static str, &'static dyn GlobalAlloc); 3] {
    [("kmemcg", &KMEM), ("system", &System), ("mimalloc", &MiMalloc)]
}

fn pair_64(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair-64");
    let layout = Layout::from_size_align(64, 8).unwrap();
    for (name, a) in allocators() {
        g.bench_function(name, |b| {
            b.iter(|| {
                // SAFETY: valid layout; the block is freed at once.
                unsafe {
                    let p = a.alloc(black_box(layout));
                    black_box(p);
                    a.dealloc(p, layout);
                }
            })
        });
    }
    g.finish();
}

/// Times `iters` rounds of one phase of the batch workload.
fn batch_phase(a: &dyn GlobalAlloc, size: usize, iters: u64, time_alloc: bool) -> Duration {
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

criterion_group!(benches, pair_64, batch);
criterion_main!(benches);
