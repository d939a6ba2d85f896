//! COM1 (a 16550 UART at port 0x3F8): output only, polled.

use core::arch::asm;
use core::fmt;

const COM1: u16 = 0x3F8;

/// Writes `value` to I/O port `port`.
///
/// # Safety
///
/// Writing to an I/O port can reprogram any device; the caller must know
/// what the port is and that the write is harmless to the rest of the
/// system.
unsafe fn outb(port: u16, value: u8) {
    // SAFETY: forwarded from the caller; `out` touches no memory.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags)) };
}

/// Reads a byte from I/O port `port`.
///
/// # Safety
///
/// As for [`outb`]: reading some ports has side effects.
unsafe fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: forwarded from the caller; `in` touches no memory.
    unsafe { asm!("in al, dx", out("al") value, in("dx") port, options(nomem, nostack, preserves_flags)) };
    value
}

/// The serial console; a unit value, since the UART is the only state.
pub struct Serial;

impl Serial {
    /// Programs COM1 for 115200 baud, 8N1, FIFOs on, interrupts off.
    pub fn init() {
        // SAFETY: the standard 16550 programming sequence on COM1's own
        // registers; nothing else in this kernel uses those ports.
        unsafe {
            outb(COM1 + 1, 0x00); // no interrupts
            outb(COM1 + 3, 0x80); // DLAB on: set the divisor
            outb(COM1, 0x01); // divisor 1: 115200 baud
            outb(COM1 + 1, 0x00);
            outb(COM1 + 3, 0x03); // DLAB off, 8 bits, no parity, 1 stop bit
            outb(COM1 + 2, 0xC7); // FIFOs on and cleared, 14-byte threshold
            outb(COM1 + 4, 0x03); // DTR, RTS
        }
    }

    fn write_byte(b: u8) {
        // SAFETY: polling COM1's line status register, then writing its
        // transmit register; both are side-effect free for the rest of the
        // system.
        unsafe {
            while inb(COM1 + 5) & 0x20 == 0 {
                core::hint::spin_loop();
            }
            outb(COM1, b);
        }
    }
}

impl fmt::Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.bytes().for_each(Serial::write_byte);
        Ok(())
    }
}

/// `println!` to the serial console; allocates nothing.
macro_rules! kprintln {
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
        let _ = writeln!($crate::kernel::serial::Serial, $($arg)*);
    }};
}
pub(crate) use kprintln;
