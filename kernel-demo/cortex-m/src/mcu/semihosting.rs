//! Arm semihosting (`bkpt 0xab`; QEMU `-semihosting-config
//! enable=on,target=native`): console output one line at a time, and the
//! exit status.

use core::arch::asm;
use core::fmt::{self, Write as _};

/// `SYS_WRITE0`: writes a NUL-terminated string to the console.
const SYS_WRITE0: usize = 0x04;
/// `SYS_EXIT`: on A32/T32, only a reason code (no status).
const SYS_EXIT: usize = 0x18;
/// `SYS_EXIT_EXTENDED`: a reason code and a status.
const SYS_EXIT_EXTENDED: usize = 0x20;
/// `ADP_Stopped_ApplicationExit`.
const APPLICATION_EXIT: usize = 0x2_0026;

/// One semihosting call.
///
/// # Safety
///
/// `arg` must be what operation `op` expects (a pointer to its parameter
/// block, or to a string for `SYS_WRITE0`), valid for the call.
unsafe fn call(op: usize, arg: usize) -> usize {
    let r: usize;
    // SAFETY: the semihosting trap: r0 = operation, r1 = argument, result
    // in r0; the host reads the memory `arg` points to (the caller's
    // contract). Without a debugger or QEMU semihosting it traps as a
    // debug event (a HardFault), which the fault handler reports.
    unsafe { asm!("bkpt #0xab", inout("r0") op => r, in("r1") arg, options(nostack, preserves_flags)) };
    r
}

/// A line being written: flushed to the console when full and at its end.
struct Line {
    buf: [u8; 128],
    len: usize,
}

impl Line {
    fn flush(&mut self) {
        if self.len == 0 {
            return;
        }
        self.buf[self.len] = 0;
        // SAFETY: `buf` holds a NUL-terminated string (`len` < its length)
        // that lives across the call.
        unsafe { call(SYS_WRITE0, self.buf.as_ptr() as usize) };
        self.len = 0;
    }
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for &b in s.as_bytes() {
            // One byte kept for the NUL.
            if self.len == self.buf.len() - 1 {
                self.flush();
            }
            self.buf[self.len] = if b == 0 { b'?' } else { b };
            self.len += 1;
        }
        Ok(())
    }
}

/// Writes `args` and a newline. Allocates nothing; the buffer is on the
/// caller's stack, so a handler may print too (lines may then interleave).
pub fn print_line(args: fmt::Arguments<'_>) {
    let mut line = Line { buf: [0; 128], len: 0 };
    let _ = line.write_fmt(args);
    let _ = line.write_str("\n");
    line.flush();
}

/// Writes `args`, a multi-line text, each line after `prefix`, without
/// allocating (a report such as a group's stat).
pub fn print_lines(prefix: &str, args: fmt::Arguments<'_>) {
    /// Starts each line with the prefix, ends it on the console.
    struct Prefixed<'a> {
        line: Line,
        prefix: &'a str,
        at_start: bool,
    }
    impl fmt::Write for Prefixed<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            for (i, part) in s.split('\n').enumerate() {
                if i > 0 {
                    self.line.write_str("\n")?;
                    self.line.flush();
                    self.at_start = true;
                }
                if !part.is_empty() {
                    if self.at_start {
                        self.line.write_str(self.prefix)?;
                        self.at_start = false;
                    }
                    self.line.write_str(part)?;
                }
            }
            Ok(())
        }
    }
    let mut w = Prefixed { line: Line { buf: [0; 128], len: 0 }, prefix, at_start: true };
    let _ = w.write_fmt(args);
    if !w.at_start {
        let _ = w.line.write_str("\n");
    }
    w.line.flush();
}

/// `println!` over semihosting.
macro_rules! println {
    ($($arg:tt)*) => {
        $crate::mcu::semihosting::print_line(format_args!($($arg)*))
    };
}
pub(crate) use println;

/// Ends the program with `status` (QEMU exits with it).
pub fn exit(status: u32) -> ! {
    let block = [APPLICATION_EXIT, status as usize];
    // SAFETY: `SYS_EXIT_EXTENDED` reads the two-word block, which lives
    // across the call.
    unsafe { call(SYS_EXIT_EXTENDED, block.as_ptr() as usize) };
    // A host without the extended call: status 0 is the application
    // exit, anything else another reason (an error to QEMU).
    let reason = if status == 0 { APPLICATION_EXIT } else { 0x2_0023 };
    // SAFETY: `SYS_EXIT` on A32/T32 takes the reason itself.
    unsafe { call(SYS_EXIT, reason) };
    loop {
        // SAFETY: waits for an interrupt; touches no memory.
        unsafe { asm!("wfi", options(nomem, nostack, preserves_flags)) };
    }
}
