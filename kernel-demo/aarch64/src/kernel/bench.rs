//! Timing, printed and never asserted (TCG times are emulated): 64-byte
//! alloc+free pairs timed with `CNTVCT_EL0`, on one CPU with the per-CPU
//! platform against a `NoCpus` heap, then on every CPU at once against
//! one CPU.

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicU64, Ordering};

use super::cpu;
use super::cpu::MAX_CPUS;
use super::serial::kprintln;
use super::sync::Barrier;
use super::{KMEM, SOLO};

/// Counter values around one CPU's timed loop.
struct Span {
    start: AtomicU64,
    end: AtomicU64,
}

/// Each CPU's last span, for the runs on every CPU at once.
static SPANS: [Span; MAX_CPUS] = [const { Span { start: AtomicU64::new(0), end: AtomicU64::new(0) } }; MAX_CPUS];

/// The CPUs timing together: how many, and the barrier that keeps them in
/// step (the self-test's).
pub struct Team<'a> {
    pub n: usize,
    pub barrier: &'a Barrier,
}

/// Timed pairs per CPU and run.
const PAIRS: usize = 20_000;
/// Untimed pairs first (magazines loaded).
const WARMUP: usize = 1000;
/// Timed runs of each kind; the shortest counts (TCG timing is noisy).
const RUNS: usize = 3;

/// Counter ticks for `n` alloc+free pairs of 64 bytes on `heap`, with
/// IRQs masked (no timer interrupt inside the loop); also the start. The
/// loop `icount` counts the instructions of, too.
pub(super) fn pairs<A: GlobalAlloc>(heap: &A, n: usize) -> (u64, u64) {
    let layout = Layout::from_size_align(64, 8).expect("a valid layout");
    let saved = cpu::irq_save();
    let start = cpu::ticks();
    for _ in 0..n {
        // SAFETY: a non-zero-size layout; the block is freed at once with
        // the same layout (or not at all if the allocation failed).
        unsafe {
            let p = heap.alloc(layout);
            if !p.is_null() {
                core::hint::black_box(p).write(1);
                heap.dealloc(p, layout);
            }
        }
    }
    let end = cpu::ticks();
    // SAFETY: saved above on this CPU.
    unsafe { cpu::irq_restore(saved) };
    (start, end)
}

/// The best (shortest) of `RUNS` timings of `PAIRS` pairs on `heap`.
fn best_alone<A: GlobalAlloc>(heap: &A) -> u64 {
    pairs(heap, WARMUP);
    (0..RUNS).map(|_| pairs(heap, PAIRS)).map(|(s, e)| e - s).min().unwrap_or(u64::MAX)
}

/// Every CPU runs `PAIRS` pairs on `heap` at once, `RUNS` times; the
/// shortest span from the first CPU's start to the last CPU's end.
fn best_together<A: GlobalAlloc>(sh: &Team<'_>, me: usize, heap: &A) -> u64 {
    let mut best = u64::MAX;
    for _ in 0..RUNS {
        // Also keeps this run's stores from overtaking the last run's reads.
        sh.barrier.wait();
        let (s, e) = pairs(heap, PAIRS);
        SPANS[me].start.store(s, Ordering::Relaxed);
        SPANS[me].end.store(e, Ordering::Relaxed);
        sh.barrier.wait();
        let r = &SPANS[..sh.n];
        let first = r.iter().map(|r| r.start.load(Ordering::Relaxed)).min().unwrap_or(0);
        let last = r.iter().map(|r| r.end.load(Ordering::Relaxed)).max().unwrap_or(0);
        best = best.min(last - first);
    }
    best
}

/// Every CPU takes part, in step; CPU 0 prints.
pub fn run(sh: &Team<'_>, me: usize) {
    let n = sh.n;
    let freq = cpu::ticks_per_second() as f64;
    let per_pair_ns = |ticks: u64| ticks as f64 * 1e9 / freq / PAIRS as f64;

    // One CPU, the others idle (asleep between timer ticks).
    sh.barrier.wait();
    let (mut one_percpu, mut one_solo) = (0, 0);
    if me == 0 {
        one_percpu = best_alone(&KMEM);
        one_solo = best_alone(&SOLO);
    }
    // Every CPU at once: per-CPU platform, then NoCpus.
    let spans = [best_together(sh, me, &KMEM), best_together(sh, me, &SOLO)];
    if me != 0 {
        return;
    }
    kprintln!("bench: 64-byte alloc+free pairs, best of {RUNS} runs of {PAIRS} per CPU, counter at {} MHz", freq / 1e6);
    kprintln!(
        "bench: 1 CPU: per-CPU platform {:.1} ns/pair, NoCpus {:.1} ns/pair: NoCpus takes {:.2}x as long",
        per_pair_ns(one_percpu),
        per_pair_ns(one_solo),
        one_solo as f64 / one_percpu.max(1) as f64
    );
    let rate = |pairs: usize, ticks: u64| pairs as f64 * freq / ticks.max(1) as f64 / 1e6;
    let (one_pc, one_so) = (rate(PAIRS, one_percpu), rate(PAIRS, one_solo));
    let (all_pc, all_so) = (rate(n * PAIRS, spans[0]), rate(n * PAIRS, spans[1]));
    kprintln!(
        "bench: {n} CPUs at once: per-CPU platform {all_pc:.2} Mpairs/s aggregate = {:.2}x one CPU ({one_pc:.2}); NoCpus {all_so:.2} Mpairs/s = {:.2}x one CPU ({one_so:.2}); per-CPU / NoCpus at {n} CPUs: {:.2}x",
        all_pc / one_pc,
        all_so / one_so,
        all_pc / all_so
    );
}
