//! This kernel as the shared part sees it: `kernel_common::Arch` and
//! `kernel_common::smp::Smp` (the phases of `smp.rs`, the local APIC
//! timer).

use core::fmt;
use core::sync::atomic::Ordering;

use kernel_common::report::IrqCounts;
use kernel_common::smp::Smp;

use super::cpu::{self, Hw};
use super::smp::{self as boot_smp, phase};
use super::{Heap, KMEM, KMEM_NUMA, NumaHeap, apic, serial, time};

/// The local APIC timer's period during the workload, µs.
const TIMER_US: u32 = 500;
/// Interrupt-context allocations each CPU waits for before it stops its
/// timer (so every CPU shows some).
const MIN_IRQ_ALLOCS: usize = 20;
/// How long a CPU waits for them, µs.
const IRQ_WAIT_US: u64 = 5_000_000;

/// The x86_64 kernel.
pub struct X86_64;

impl kernel_common::Arch for X86_64 {
    type Cpu = Hw;

    fn print_line(args: fmt::Arguments<'_>) {
        serial::print_line(args);
    }

    fn heap() -> &'static Heap {
        &KMEM
    }

    fn numa_heap() -> &'static NumaHeap {
        &KMEM_NUMA
    }

    fn ticks() -> u64 {
        time::rdtsc()
    }

    fn ticks_per_second() -> u64 {
        time::tsc_hz()
    }
}

impl Smp for X86_64 {
    fn start_others() {
        boot_smp::set_phase(phase::WORK);
    }

    fn wait_start() {
        boot_smp::wait_phase(phase::WORK);
    }

    fn done() {
        boot_smp::arrive(phase::WORK);
    }

    fn wait_done(n: usize) {
        boot_smp::arrive(phase::WORK);
        boot_smp::wait_arrivals(phase::WORK, n);
    }

    fn irq_work_start() {
        cpu::this().allocating.store(true, Ordering::Relaxed);
        apic::start_timer(TIMER_US);
        cpu::enable_interrupts();
    }

    fn irq_work_stop() -> Result<(), &'static str> {
        let deadline = time::rdtsc() + time::us_to_tsc(IRQ_WAIT_US);
        let block = cpu::this();
        cpu::wait_until(|| block.irq_allocs.load(Ordering::Relaxed) >= MIN_IRQ_ALLOCS || time::rdtsc() > deadline);
        // First: a tick already pending when the timer stops allocates
        // nothing when it is taken later (this CPU's handler is not
        // running now, so none holds an allocation).
        block.allocating.store(false, Ordering::Relaxed);
        apic::stop_timer();
        cpu::disable_interrupts();
        Ok(())
    }

    fn irq_counts(i: usize) -> IrqCounts {
        cpu::get(i).map_or_else(IrqCounts::default, |block| IrqCounts {
            allocations: block.irq_allocs.load(Ordering::Relaxed),
            failures: block.irq_failures.load(Ordering::Relaxed),
        })
    }
}
