//! This kernel as the shared part sees it: `kernel_common::Arch`.

use core::fmt;

use super::cpu::Hw;
use super::{Heap, KMEM, KMEM_NUMA, NumaHeap, serial, time};

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
