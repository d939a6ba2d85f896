//! This kernel as the shared part sees it: `kernel_common::Arch`.

use core::fmt::{self, Write as _};

use super::cpu::{self, Hw};
use super::serial::Serial;
use super::{Heap, KMEM, KMEM_NUMA, NumaHeap};

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
