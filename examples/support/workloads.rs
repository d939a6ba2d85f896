//! Workloads shared by `examples/profile.rs`, `benches/alloc.rs` and
//! `benches/memory.rs`; owned by the examples, included with `#[path]`
//! (each includer uses part of it).

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// An allocator under test.
pub type Alloc = &'static (dyn GlobalAlloc + Sync);

/// Objects per `batch` phase.
pub const BATCH: usize = 1_000_000;

/// One 64-byte alloc+free pair.
pub fn pair<A: GlobalAlloc + ?Sized>(a: &A, layout: Layout) {
    // SAFETY: valid layout; the block is freed at once.
    unsafe {
        let p = a.alloc(black_box(layout));
        black_box(p);
        a.dealloc(p, layout);
    }
}

/// Runs `work` on `threads` threads at once, each after its own `setup`
/// (untimed), and returns the wall time from the first thread's start to
/// the last one's end. Each thread reads the clock itself: a coordinator
/// timing between two barriers reads it late whenever it is descheduled
/// after the first, which more runnable threads than CPUs make likely.
pub fn on_threads(threads: usize, setup: impl Fn() + Sync, work: impl Fn() + Sync) -> std::time::Duration {
    use std::sync::Barrier;
    use std::time::Instant;
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    setup();
                    barrier.wait();
                    let t = Instant::now();
                    work();
                    (t, Instant::now())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let start = spans.iter().map(|s| s.0).min().unwrap();
    let end = spans.iter().map(|s| s.1).max().unwrap();
    end - start
}

/// Reallocs in one `realloc_grow` round: 8 B to 1 MiB by doubling.
pub const REALLOC_GROW_STEPS: usize = 17;

/// One round of `realloc-grow`: an 8-byte block grown to 1 MiB by
/// doubling (`REALLOC_GROW_STEPS` reallocs), then freed.
pub fn realloc_grow(a: Alloc) {
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
}

/// Times `iters` rounds of one phase of the batch workload.
pub fn batch_phase(a: Alloc, size: usize, iters: u64, time_alloc: bool) -> Duration {
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

/// xorshift64: a fixed, allocation-free sequence.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A single-producer single-consumer ring of pointers that never allocates
/// after construction.
pub struct Ring {
    slots: Vec<AtomicUsize>,
    head: AtomicUsize,
    tail: AtomicUsize,
}

impl Ring {
    pub fn push(&self, v: usize) {
        let h = self.head.load(Ordering::Relaxed);
        while h - self.tail.load(Ordering::Acquire) == self.slots.len() {
            std::hint::spin_loop();
        }
        self.slots[h % self.slots.len()].store(v, Ordering::Relaxed);
        self.head.store(h + 1, Ordering::Release);
    }
    pub fn pop(&self) -> usize {
        let t = self.tail.load(Ordering::Relaxed);
        while self.head.load(Ordering::Acquire) == t {
            std::hint::spin_loop();
        }
        let v = self.slots[t % self.slots.len()].load(Ordering::Relaxed);
        self.tail.store(t + 1, Ordering::Release);
        v
    }
}

pub fn xfree_run<A: GlobalAlloc + Sync + ?Sized>(a: &'static A, objects: u64) -> Duration {
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

/// The `random` workload: a live set of 10k log-uniform 8..4096-byte
/// blocks (fixed seed); a step frees one and allocates one. Returns the
/// time of `steps` steps after an untimed pass that fills the live set.
pub fn random<A: GlobalAlloc + ?Sized>(a: &A, steps: usize) -> Duration {
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
