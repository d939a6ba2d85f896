//! The vector table at address 0 and the reset handler.
//!
//! On reset a Cortex-M loads the main stack pointer from word 0 of the
//! table and jumps to word 1 (the table's address is `VTOR`, 0 at reset).
//! The reset handler is assembly, so that no Rust code runs before
//! `.data` and `.bss` hold their initial values: it gives the FPU full
//! access (the `eabihf` target passes floats in FPU registers, which
//! fault while it is off), copies `.data` from its load address, zeroes
//! `.bss`, and calls [`super::mcu_main`].

use core::arch::{asm, global_asm};

use super::semihosting::println;

global_asm!(
    ".section .text.reset, \"ax\"",
    ".global reset",
    ".type reset, %function",
    ".thumb_func",
    "reset:",
    // CPACR (0xE000ED88): CP10 and CP11 full access.
    "    ldr r0, =0xE000ED88",
    "    ldr r1, [r0]",
    "    orr r1, r1, #0xF00000",
    "    str r1, [r0]",
    "    dsb",
    "    isb",
    // .data: word by word from its load address (the linker script
    // aligns both ends to 4).
    "    ldr r0, =__data_start",
    "    ldr r1, =__data_end",
    "    ldr r2, =__data_load",
    "2:  cmp r0, r1",
    "    bhs 3f",
    "    ldr r3, [r2], #4",
    "    str r3, [r0], #4",
    "    b 2b",
    // .bss: zeroed, word by word.
    "3:  ldr r0, =__bss_start",
    "    ldr r1, =__bss_end",
    "    movs r2, #0",
    "4:  cmp r0, r1",
    "    bhs 5f",
    "    str r2, [r0], #4",
    "    b 4b",
    "5:  bl mcu_main",
    "    udf #0",
    ".size reset, . - reset",
);

unsafe extern "C" {
    /// The reset handler above.
    fn reset();
    /// The top of RAM: the initial main stack pointer (linker script).
    static __stack_top: u8;
}

/// An exception handler.
type Handler = unsafe extern "C" fn();

/// The vector table: the initial stack pointer, then the system
/// exceptions 1 (reset) to 15 (SysTick). No external interrupts are used.
#[repr(C)]
pub struct Vectors {
    stack_top: *const u8,
    exceptions: [Option<Handler>; 15],
}

// SAFETY: read only by the hardware; it holds addresses, never written.
unsafe impl Sync for Vectors {}

/// The table, placed at address 0 by the linker script.
#[unsafe(link_section = ".vector_table")]
#[used]
static VECTORS: Vectors = Vectors {
    stack_top: &raw const __stack_top,
    exceptions: [
        Some(reset), // 1 reset
        Some(fault), // 2 NMI
        Some(fault), // 3 HardFault
        Some(fault), // 4 MemManage
        Some(fault), // 5 BusFault
        Some(fault), // 6 UsageFault
        None,        // 7-10 reserved
        None,
        None,
        None,
        Some(fault),               // 11 SVCall
        Some(fault),               // 12 DebugMonitor
        None,                      // 13 reserved
        Some(fault),               // 14 PendSV
        Some(super::cpu::systick), // 15 SysTick
    ],
};

/// The Configurable Fault Status Register.
const CFSR: *const u32 = 0xE000_ED28 as *const u32;

/// Every exception but reset and SysTick: reports which, then fails.
unsafe extern "C" fn fault() {
    let ipsr: usize;
    // SAFETY: reads the exception number; touches no memory.
    unsafe { asm!("mrs {}, IPSR", out(reg) ipsr, options(nomem, nostack, preserves_flags)) };
    // SAFETY: the Configurable Fault Status Register, a 32-bit register of
    // the System Control Block, always mapped; reading it changes nothing.
    let cfsr = unsafe { core::ptr::read_volatile(CFSR) };
    println!("exception {} (CFSR {cfsr:#x})", ipsr & 0x1ff);
    super::fail("unexpected exception");
}
