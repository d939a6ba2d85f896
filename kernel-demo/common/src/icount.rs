//! The arithmetic and the report lines of the kernels' `icount` mode
//! (`scripts/kernel-icount.sh`): guest instructions per 64-byte alloc+free
//! pair under QEMU `-icount shift=0`, where a kernel's counter advances
//! with executed instructions.
//!
//! The kernel keeps what is its own: the calibration loop of known length
//! (two instructions a round, in its assembly) and the timed pair loop
//! (its bench's). Each count is `(ticks(2n) - ticks(n)) / n`, so the
//! timing's fixed cost cancels.

use crate::arch::Arch;
use crate::kprintln;

/// Counter ticks per instruction: `spin(r)` runs `r` rounds of a
/// two-instruction loop and returns the ticks they took.
pub fn ticks_per_insn(spin: impl Fn(u64) -> u64, rounds: u64) -> Result<f64, &'static str> {
    let ticks_per_insn = spin(2 * rounds).saturating_sub(spin(rounds)) as f64 / (2 * rounds) as f64;
    if ticks_per_insn <= 0.0 {
        return Err("icount: the counter did not advance");
    }
    Ok(ticks_per_insn)
}

/// Instructions per pair: `ticks(n)` runs `n` pairs and returns the ticks
/// they took; `warmup` pairs first (the magazines loaded), then `pairs`
/// and `2 * pairs`.
pub fn per_pair(
    mut ticks: impl FnMut(u64) -> Result<u64, &'static str>,
    warmup: u64,
    pairs: u64,
    ticks_per_insn: f64,
) -> Result<f64, &'static str> {
    ticks(warmup)?;
    let one = ticks(pairs)?;
    let two = ticks(2 * pairs)?;
    Ok(two.saturating_sub(one) as f64 / ticks_per_insn / pairs as f64)
}

/// Prints the counts the script reads: the calibration (`counter`: what
/// the kernel's counter is called), one line per platform, then `done`.
pub fn report<A: Arch>(counter: &str, ticks_per_insn: f64, percpu: f64, nocpus: f64) {
    kprintln!(A; "icount: {ticks_per_insn:.4} {counter} ticks per instruction");
    kprintln!(A; "icount: percpu {percpu:.2} instructions per 64-byte alloc+free pair");
    kprintln!(A; "icount: nocpus {nocpus:.2} instructions per 64-byte alloc+free pair");
    kprintln!(A; "icount: done");
}
