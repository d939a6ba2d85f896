//! Timing, never asserted: 64-byte alloc+free pairs with the per-CPU
//! platform against `NoCpus` (one CPU), and every CPU at once against
//! one. TCG emulates the CPUs on the host's cores, so the numbers say
//! more about the emulation than about the hardware.

use core::alloc::{GlobalAlloc, Layout};
use core::hint::black_box;
use core::sync::atomic::{AtomicU64, Ordering};

use super::cpu::{self, MAX_SMP};
use super::serial::kprintln;
use super::{KMEM, KMEM_NOCPUS, smp, time};

/// Pairs per measurement.
const PAIRS: u64 = 50_000;
/// One-CPU measurements taken of each allocator (the fastest counts:
/// the host's scheduler only ever adds time).
const TRIES: usize = 3;
/// Pairs run before measuring.
const WARMUP: u64 = 2_000;

/// Each CPU's start and end TSC in the all-CPU run.
static STARTS: [AtomicU64; MAX_SMP] = [const { AtomicU64::new(0) }; MAX_SMP];
static ENDS: [AtomicU64; MAX_SMP] = [const { AtomicU64::new(0) }; MAX_SMP];

/// TSC ticks for `n` 64-byte alloc+free pairs on `a` (also the loop the
/// instruction counts of `icount` run).
pub(super) fn pairs<A: GlobalAlloc>(a: &A, n: u64) -> Result<u64, &'static str> {
    let layout = Layout::new::<[u8; 64]>();
    let t0 = time::rdtsc();
    for _ in 0..n {
        // SAFETY: a non-zero layout; the block is freed right away with it.
        let p = unsafe { a.alloc(layout) };
        if p.is_null() {
            return Err("bench: allocation failed");
        }
        // SAFETY: allocated just above with `layout`.
        unsafe { a.dealloc(black_box(p), layout) };
    }
    Ok(time::rdtsc() - t0)
}

/// This CPU's part of the all-CPU run (interrupts on, timers off).
pub fn all_cpus_part(me: usize) -> Result<(), &'static str> {
    pairs(&KMEM, WARMUP)?;
    cpu::enable_interrupts();
    STARTS[me].store(time::rdtsc(), Ordering::Relaxed);
    let r = pairs(&KMEM, PAIRS);
    ENDS[me].store(time::rdtsc(), Ordering::Relaxed);
    cpu::disable_interrupts();
    r.map(drop)
}

/// Runs the benchmark (BSP; the other CPUs wait for `phase::BENCH`) and
/// prints it.
pub fn run(ncpus: usize) -> Result<(), &'static str> {
    pairs(&KMEM, WARMUP)?;
    pairs(&&KMEM_NOCPUS, WARMUP)?;
    cpu::enable_interrupts();
    let (mut percpu, mut nocpus) = (u64::MAX, u64::MAX);
    for _ in 0..TRIES {
        percpu = percpu.min(pairs(&KMEM, PAIRS)?);
        nocpus = nocpus.min(pairs(&&KMEM_NOCPUS, PAIRS)?);
    }
    cpu::disable_interrupts();

    smp::set_phase(smp::phase::BENCH);
    let mine = all_cpus_part(0);
    smp::arrive(smp::phase::BENCH);
    smp::wait_arrivals(smp::phase::BENCH, ncpus);
    mine?;
    let start = STARTS[..ncpus].iter().map(|t| t.load(Ordering::Relaxed)).min().unwrap_or(0);
    let end = ENDS[..ncpus].iter().map(|t| t.load(Ordering::Relaxed)).max().unwrap_or(0);
    let span = end.saturating_sub(start).max(1);

    let ns = |ticks: u64| ticks as f64 * 1e9 / time::tsc_hz().max(1) as f64 / PAIRS as f64;
    kprintln!(
        "bench: 1 cpu, {PAIRS} pairs of 64 B (best of {TRIES}): PerCpu {:.0} ns/pair, NoCpus {:.0} ns/pair; {ncpus} cpus: {} pairs in {:.1} ms",
        ns(percpu),
        ns(nocpus),
        PAIRS * ncpus as u64,
        span as f64 * 1e3 / time::tsc_hz().max(1) as f64
    );
    let per_cpu = STARTS[..ncpus]
        .iter()
        .zip(&ENDS[..ncpus])
        .map(|(s, e)| ns(e.load(Ordering::Relaxed).saturating_sub(s.load(Ordering::Relaxed))));
    let (slowest, fastest) = per_cpu.fold((0f64, f64::MAX), |(hi, lo), t| (hi.max(t), lo.min(t)));
    kprintln!("bench: {ncpus} cpus at once: {fastest:.0} to {slowest:.0} ns/pair per CPU");
    let time_ratio = percpu as f64 / nocpus.max(1) as f64;
    let throughput = (ncpus as f64 * PAIRS as f64 / span as f64) / (PAIRS as f64 / percpu.max(1) as f64);
    kprintln!(
        "bench: percpu/nocpus 1-cpu pair time ratio {time_ratio:.2}, {ncpus}-cpu aggregate/1-cpu throughput {throughput:.2}"
    );
    Ok(())
}
