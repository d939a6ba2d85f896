//! COM1 (a 16550 UART at port 0x3F8): output only, polled, one line at a
//! time across CPUs.

use core::fmt::{self, Write as _};
use core::sync::atomic::{AtomicUsize, Ordering};

use kmemcg::Cpu as _;

use super::cpu::{self, Hw};
use super::port::{inb, outb};

const COM1: u16 = 0x3F8;

/// Who holds the console: 0 for nobody, else the holder's CPU index + 1.
static OWNER: AtomicUsize = AtomicUsize::new(0);

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

/// Writes one line with interrupts masked, holding the console against
/// other CPUs. A CPU that already holds it (a panic or an exception in
/// the middle of a line) writes without waiting. Allocates nothing.
pub fn print_line(args: fmt::Arguments<'_>) {
    let me = cpu::index() + 1;
    let saved = Hw::irq_save();
    let nested = OWNER.load(Ordering::Relaxed) == me;
    if !nested {
        while OWNER.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed).is_err() {
            core::hint::spin_loop();
        }
    }
    let _ = Serial.write_fmt(args);
    let _ = Serial.write_str("\n");
    if !nested {
        OWNER.store(0, Ordering::Release);
    }
    // SAFETY: saved above on this CPU.
    unsafe { Hw::irq_restore(saved) };
}

/// `println!` to the serial console; allocates nothing, safe from any CPU.
macro_rules! kprintln {
    ($($arg:tt)*) => {
        $crate::kernel::serial::print_line(format_args!($($arg)*))
    };
}
pub(crate) use kprintln;
