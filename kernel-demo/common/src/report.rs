//! The per-CPU lines after the SMP workload: `cpu N: magazine refills and
//! spills M, slow-path hits H, irq allocations I`, and their check.

use crate::arch::Arch;
use crate::kprintln;

/// What a CPU's timer handler did, counted by the kernel.
#[derive(Clone, Copy, Debug, Default)]
pub struct IrqCounts {
    /// Allocations made in interrupt context.
    pub allocations: usize,
    /// Those that failed (must stay 0).
    pub failures: usize,
}

/// Prints one line per CPU `0..n` (`Kmem::slot_stats` and `irq(i)`) and
/// checks that every CPU refilled or spilled its magazines (magazine hits
/// take the fast path, which counts nothing) and allocated in interrupt
/// context without a failure.
pub fn cpu_lines<A: Arch>(n: usize, irq: impl Fn(usize) -> IrqCounts) -> Result<(), &'static str> {
    let mut ok = true;
    for i in 0..n {
        let stats = A::heap().slot_stats(kmemcg::slot_for_cpu(i));
        let c = irq(i);
        kprintln!(A;
            "cpu {i}: magazine refills and spills {}, slow-path hits {}, irq allocations {}",
            stats.misses,
            stats.hits,
            c.allocations
        );
        ok &= stats.misses > 0 && c.allocations > 0 && c.failures == 0;
    }
    if ok {
        Ok(())
    } else {
        Err("a CPU never used its magazines, had no interrupt-context allocations, or a failed one")
    }
}
