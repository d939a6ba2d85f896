//! x86 I/O ports.

use core::arch::asm;

/// Writes `value` to I/O port `port`.
///
/// # Safety
///
/// Writing to an I/O port can reprogram any device; the caller must know
/// what the port is and that the write is harmless to the rest of the
/// system.
pub unsafe fn outb(port: u16, value: u8) {
    // SAFETY: forwarded from the caller; `out` touches no memory.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags)) };
}

/// Reads a byte from I/O port `port`.
///
/// # Safety
///
/// As for [`outb`]: reading some ports has side effects.
pub unsafe fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: forwarded from the caller; `in` touches no memory.
    unsafe { asm!("in al, dx", out("al") value, in("dx") port, options(nomem, nostack, preserves_flags)) };
    value
}
