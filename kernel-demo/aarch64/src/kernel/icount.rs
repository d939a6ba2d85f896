//! Guest instructions per 64-byte alloc+free pair, for
//! `scripts/kernel-icount.sh`: the kernel booted with `icount` in its
//! device tree's `bootargs` (QEMU's `-append`), on one CPU, under
//! `qemu-system-aarch64 -icount shift=0`.
//!
//! Under `-icount`, QEMU's TCG counts the instructions the guest executes
//! and derives the virtual clock from them (`shift=0`: one nanosecond per
//! instruction), and `CNTVCT_EL0` is that clock divided by the counter's
//! period (16 ns at the 62.5 MHz QEMU gives a Cortex-A57): one tick per
//! 16 instructions, the same on every run. This module does not take that
//! on trust: it times a loop of known length first (two instructions per
//! round) and prints the ticks per instruction it found, which the script
//! checks.
//!
//! Each count is `(ticks(2n) - ticks(n)) / n` over the bench's own loop
//! ([`super::bench::pairs`]: alloc, null check, a store to the block,
//! dealloc, with IRQs masked around it), so the timing's fixed cost
//! cancels, and the loop's own instructions count, as in the host's
//! `examples/icount.rs`. With a tick of 16 instructions, a count is exact
//! to 16 / `PAIRS` instructions.

use core::arch::asm;

use kernel_common::icount;

use super::arch::Aarch64;
use super::{KMEM, SOLO, bench, cpu};

/// Pairs in the shorter measured run (the longer one has twice as many).
const PAIRS: u64 = 100_000;
/// Pairs run first, so the magazines are loaded.
const WARMUP: u64 = 1_000;
/// Rounds of the calibration loop (the longer run has twice as many).
const ROUNDS: u64 = 1_000_000;

/// Counter ticks for `rounds` rounds of a two-instruction loop.
fn spin(rounds: u64) -> u64 {
    let t0 = cpu::ticks();
    // SAFETY: a register countdown; touches no memory.
    unsafe { asm!("2:", "subs {n}, {n}, #1", "b.ne 2b", n = inout(reg) rounds.max(1) => _, options(nomem, nostack)) };
    cpu::ticks() - t0
}

/// Counter ticks per instruction, from a loop of known length.
pub fn ticks_per_insn() -> Result<f64, &'static str> {
    icount::ticks_per_insn(spin, ROUNDS)
}

/// Instructions per pair on `heap`, given `ticks_per_insn`.
fn per_pair<A: core::alloc::GlobalAlloc>(heap: &A, ticks_per_insn: f64) -> Result<f64, &'static str> {
    let ticks = |n: u64| {
        let (start, end) = bench::pairs(heap, n as usize);
        Ok(end - start)
    };
    icount::per_pair(ticks, WARMUP, PAIRS, ticks_per_insn)
}

/// Measures and prints the counts: one line per platform, then `done`.
pub fn run() -> Result<(), &'static str> {
    let ticks_per_insn = ticks_per_insn()?;
    let percpu = per_pair(&KMEM, ticks_per_insn)?;
    let nocpus = per_pair(&SOLO, ticks_per_insn)?;
    icount::report::<Aarch64>("counter", ticks_per_insn, percpu, nocpus);
    Ok(())
}
