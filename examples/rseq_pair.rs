//! `Threads` (the default platform) against `Rseq` (per-CPU slots through
//! restartable sequences) on one thread: a 64-byte alloc+free pair, nine
//! interleaved rounds of 5M pairs each, medians. Twice: inlined into the
//! loop (a generic `GlobalAlloc`) and through `&dyn GlobalAlloc`, where
//! each entry point is a function of its own, as `#[global_allocator]`'s
//! `__rust_alloc` is. Times are noisy on a shared machine: compare the
//! two columns of one run.
//!
//! Run with: `cargo run --release --example rseq_pair`

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::time::Instant;

use kmemcg::{DefaultRawMutex, Kmem, OsPages, Rseq};

static THREADS: Kmem<OsPages> = Kmem::new(OsPages::new());
static RSEQ: Kmem<OsPages, DefaultRawMutex, Rseq> = Kmem::with_platform(OsPages::new(), Rseq::new());

/// ns per pair of `n` pairs on `a`.
fn run<G: GlobalAlloc + ?Sized>(a: &G, n: usize) -> f64 {
    let l = Layout::from_size_align(64, 8).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: a valid layout; the block is freed once, with it.
        unsafe {
            let p = a.alloc(black_box(l));
            black_box(p);
            a.dealloc(p, l);
        }
    }
    t.elapsed().as_secs_f64() * 1e9 / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n = 5_000_000;
    let dyn_threads: &(dyn GlobalAlloc + Sync) = black_box(&THREADS);
    let dyn_rseq: &(dyn GlobalAlloc + Sync) = black_box(&RSEQ);
    let mut t = [vec![], vec![], vec![], vec![]];
    for _ in 0..9 {
        t[0].push(run(&THREADS, n));
        t[1].push(run(&RSEQ, n));
        t[2].push(run(dyn_threads, n));
        t[3].push(run(dyn_rseq, n));
    }
    let [a, b, c, d] = t.map(median);
    println!("rseq per-CPU slots in use: {}", Rseq::new().per_cpu());
    println!("| 64-byte pair, ns | Threads | Rseq | Rseq / Threads |");
    println!("| --- | ---: | ---: | ---: |");
    println!("| inlined | {a:.2} | {b:.2} | {:.3} |", b / a);
    println!("| through `&dyn GlobalAlloc` | {c:.2} | {d:.2} | {:.3} |", d / c);
}
