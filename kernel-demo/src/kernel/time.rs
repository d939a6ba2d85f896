//! Time: the TSC, calibrated once against the PIT (channel 2, the one
//! whose output port 0x61 shows), and busy-wait delays.

use core::arch::asm;
use core::sync::atomic::{AtomicU64, Ordering};

use super::port::{inb, outb};

/// The PIT's input clock, Hz.
const PIT_HZ: u64 = 1_193_182;

/// TSC ticks per second; 0 until [`calibrate`].
static TSC_HZ: AtomicU64 = AtomicU64::new(0);

/// Reads the time-stamp counter (after earlier instructions complete).
#[inline(always)]
pub fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: `lfence; rdtsc` reads a counter and touches no memory.
    unsafe { asm!("lfence", "rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) };
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Measures the TSC against 10 ms of PIT channel 2 (mode 0, gate on,
/// speaker off) and returns its frequency in Hz.
pub fn calibrate() -> u64 {
    const MS: u64 = 10;
    let latch = PIT_HZ * MS / 1000;
    // SAFETY: port 0x61 bits 0-1 (channel 2 gate, speaker data) and the
    // PIT's channel 2 and mode ports; nothing else in this kernel uses
    // channel 2 or the speaker.
    unsafe {
        outb(0x61, (inb(0x61) & !0x02) | 0x01);
        outb(0x43, 0xB0); // channel 2, low then high byte, mode 0, binary
        outb(0x42, latch as u8);
        outb(0x42, (latch >> 8) as u8);
    }
    let t0 = rdtsc();
    // SAFETY: reading port 0x61 has no side effect; bit 5 is channel 2's
    // output, which goes high at the end of the count.
    while unsafe { inb(0x61) } & 0x20 == 0 {
        core::hint::spin_loop();
    }
    let hz = (rdtsc() - t0) * (1000 / MS);
    TSC_HZ.store(hz, Ordering::Relaxed);
    hz
}

/// TSC ticks per second (after [`calibrate`]).
pub fn tsc_hz() -> u64 {
    TSC_HZ.load(Ordering::Relaxed)
}

/// TSC ticks in `us` microseconds.
pub fn us_to_tsc(us: u64) -> u64 {
    tsc_hz() / 1000 * us / 1000
}

/// Spins for `us` microseconds.
pub fn delay_us(us: u64) {
    let end = rdtsc() + us_to_tsc(us);
    while rdtsc() < end {
        core::hint::spin_loop();
    }
}
