//! This kernel as the shared part sees it: `kernel_common::Arch` and
//! `kernel_common::smp::Smp` (the team barrier of `sync.rs`, the timer
//! handler's allocations of `irq.rs`).

use core::fmt::{self, Write as _};
use core::sync::atomic::Ordering;

use kernel_common::report::IrqCounts;
use kernel_common::smp::Smp;

use super::cpu::{self, CPUS, Hw};
use super::serial::Serial;
use super::{Heap, KMEM, KMEM_NUMA, NumaHeap};
use super::{irq, sync};

/// How long a CPU waits for its first interrupt-context allocation, s.
const IRQ_WAIT_S: u64 = 10;

/// The aarch64 kernel.
pub struct Aarch64;

impl kernel_common::Arch for Aarch64 {
    type Cpu = Hw;

    fn print_line(args: fmt::Arguments<'_>) {
        Serial::locked(|s| {
            let _ = s.write_fmt(args);
            let _ = s.write_str("\n");
        });
    }

    fn heap() -> &'static Heap {
        &KMEM
    }

    fn numa_heap() -> &'static NumaHeap {
        &KMEM_NUMA
    }

    fn ticks() -> u64 {
        cpu::ticks()
    }

    fn ticks_per_second() -> u64 {
        cpu::ticks_per_second()
    }
}

impl Smp for Aarch64 {
    fn start_others() {
        sync::team().barrier.wait();
    }

    fn wait_start() {
        sync::team().barrier.wait();
    }

    fn done() {
        sync::team().barrier.wait();
    }

    fn wait_done(_n: usize) {
        sync::team().barrier.wait();
    }

    fn irq_work_start() {
        cpu::irq_enable();
        irq::start_allocating();
    }

    fn irq_work_stop() -> Result<(), &'static str> {
        // The timer must have allocated on this CPU at least once.
        let deadline = cpu::ticks() + IRQ_WAIT_S * cpu::ticks_per_second();
        let mut r = Ok(());
        while cpu::this().irq_allocs.load(Ordering::Relaxed) == 0 {
            if cpu::ticks() > deadline {
                r = Err("no allocation in interrupt context within 10 s");
                break;
            }
            cpu::wait_for_interrupt();
        }
        irq::stop_allocating();
        r
    }

    fn irq_counts(i: usize) -> IrqCounts {
        IrqCounts { allocations: CPUS.get(i).map_or(0, |b| b.irq_allocs.load(Ordering::Relaxed)), failures: 0 }
    }
}
