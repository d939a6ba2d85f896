//! Guest instructions per 64-byte alloc+free pair, for
//! `scripts/kernel-icount.sh`: the kernel booted with `icount` on its
//! command line, on one CPU, under `qemu-system-x86_64 -icount shift=0`.
//!
//! Under `-icount`, QEMU's TCG counts the instructions the guest executes
//! and derives the virtual clock from them (`shift=0`: one nanosecond per
//! instruction), and the TSC is that clock (`rdtsc` returns the
//! accelerator's elapsed ticks, which with icount are the icount clock).
//! So TSC differences count instructions, exactly and the same on every
//! run. This module does not take that on trust: it times a loop of known
//! length first (two instructions per round) and prints the ticks per
//! instruction it found, which the script checks.
//!
//! Each count is `(ticks(2n) - ticks(n)) / n` over the bench's own loop
//! ([`super::bench::pairs`]: alloc, null check, dealloc), so the timing's
//! fixed cost cancels, and the loop's own instructions count, as in the
//! host's `examples/icount.rs`. Interrupts are enabled (the PICs masked,
//! no timer running), so `irq_restore` takes its `sti` as the kernel's
//! own allocations do.

use core::arch::asm;

use kernel_common::icount;

use super::arch::X86_64;
use super::{KMEM, KMEM_NOCPUS, apic, bench, cpu, time};

/// Pairs in the shorter measured run (the longer one has twice as many).
const PAIRS: u64 = 20_000;
/// Pairs run first, so the magazines are loaded.
const WARMUP: u64 = 1_000;
/// Rounds of the calibration loop (the longer run has twice as many).
const ROUNDS: u64 = 100_000;

/// TSC ticks for `rounds` rounds of a two-instruction loop.
fn spin(rounds: u64) -> u64 {
    let t0 = time::rdtsc();
    // SAFETY: a register countdown; touches no memory and no flags that
    // matter to the compiler (`dec` sets flags, so no `preserves_flags`).
    unsafe { asm!("2:", "dec {n}", "jnz 2b", n = inout(reg) rounds.max(1) => _, options(nomem, nostack)) };
    time::rdtsc() - t0
}

/// TSC ticks per instruction, from a loop of known length.
pub fn ticks_per_insn() -> Result<f64, &'static str> {
    icount::ticks_per_insn(spin, ROUNDS)
}

/// TSC ticks per instruction, then instructions per pair with `PerCpu`
/// and with `NoCpus`.
fn measure() -> Result<(f64, f64, f64), &'static str> {
    let tpi = ticks_per_insn()?;
    let percpu = icount::per_pair(|n| bench::pairs(&KMEM, n), WARMUP, PAIRS, tpi)?;
    let nocpus = icount::per_pair(|n| bench::pairs(&&KMEM_NOCPUS, n), WARMUP, PAIRS, tpi)?;
    Ok((tpi, percpu, nocpus))
}

/// Measures and prints the counts: one line per platform, then `done`.
pub fn run() -> Result<(), &'static str> {
    apic::disable_pic();
    cpu::enable_interrupts();
    let r = measure();
    cpu::disable_interrupts();
    let (ticks_per_insn, percpu, nocpus) = r?;
    icount::report::<X86_64>("TSC", ticks_per_insn, percpu, nocpus);
    Ok(())
}
