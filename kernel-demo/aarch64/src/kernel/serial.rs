//! The PL011 UART of QEMU `virt` (0x0900_0000): output only, polled, one
//! line at a time under a spin lock so CPUs do not interleave.

use core::fmt;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicBool, Ordering};

use super::cpu;

/// The UART's base address (fixed on `virt`; needed before the device
/// tree is read).
const PL011: usize = 0x0900_0000;
/// Data register.
const DR: usize = 0x00;
/// Flag register; bit 5: transmit FIFO full.
const FR: usize = 0x18;
const FR_TXFF: u32 = 1 << 5;

/// Held while a CPU prints a line.
static LOCK: AtomicBool = AtomicBool::new(false);

/// The serial console; a unit value, since the UART is the only state.
pub struct Serial;

impl Serial {
    fn write_byte(b: u8) {
        // SAFETY: the PL011's flag and data registers, identity mapped as
        // device memory; QEMU's PL011 transmits without programming.
        unsafe {
            while read_volatile((PL011 + FR) as *const u32) & FR_TXFF != 0 {
                core::hint::spin_loop();
            }
            write_volatile((PL011 + DR) as *mut u32, b as u32);
        }
    }

    /// Runs `f` holding the console (IRQs masked). After about a second
    /// of waiting it goes ahead anyway, so a CPU that faulted while
    /// printing cannot silence the others.
    pub fn locked(f: impl FnOnce(&mut Serial)) {
        let saved = cpu::irq_save();
        let deadline = cpu::ticks() + cpu::ticks_per_second();
        let mut owned = true;
        while LOCK.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            if cpu::ticks() > deadline {
                owned = false;
                break;
            }
            core::hint::spin_loop();
        }
        f(&mut Serial);
        if owned {
            LOCK.store(false, Ordering::Release);
        }
        // SAFETY: saved above on this CPU.
        unsafe { cpu::irq_restore(saved) };
    }
}

impl fmt::Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.bytes().for_each(Serial::write_byte);
        Ok(())
    }
}

/// `println!` to the serial console, one whole line at a time; allocates
/// nothing.
macro_rules! kprintln {
    ($($arg:tt)*) => {{
        $crate::kernel::serial::Serial::locked(|s| {
            use core::fmt::Write as _;
            let _ = writeln!(s, $($arg)*);
        });
    }};
}
pub(crate) use kprintln;
