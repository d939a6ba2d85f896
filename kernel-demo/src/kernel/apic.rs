//! The local APIC in xAPIC mode (MMIO at 0xFEE00000, identity mapped by
//! the boot stub): enabling it, EOI, inter-processor interrupts and the
//! timer.

use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU32, Ordering};

use kmemcg::Cpu as _;

use super::cpu::{Hw, rdmsr};
use super::port::outb;
use super::time;
use super::vectors::{PIC_VECTOR_BASE, SPURIOUS_VECTOR, TIMER_VECTOR, WAKE_VECTOR};

/// Where the local APIC's registers are mapped.
const BASE: usize = 0xFEE0_0000;
/// `IA32_APIC_BASE`: bit 11 global enable, bits 12.. the base.
const MSR_APIC_BASE: u32 = 0x1B;

const ID: usize = 0x20;
const TPR: usize = 0x80;
const EOI: usize = 0xB0;
const SVR: usize = 0xF0;
const ICR_LOW: usize = 0x300;
const ICR_HIGH: usize = 0x310;
const LVT_TIMER: usize = 0x320;
const TIMER_INITIAL: usize = 0x380;
const TIMER_CURRENT: usize = 0x390;
const TIMER_DIVIDE: usize = 0x3E0;

/// ICR delivery-status bit: the previous IPI is still being sent.
const ICR_PENDING: u32 = 1 << 12;
/// LVT mask bit.
const MASKED: u32 = 1 << 16;
/// LVT timer mode: periodic.
const PERIODIC: u32 = 1 << 17;
/// Divide configuration value for "divide by 16".
const DIVIDE_16: u32 = 0b0011;

/// Timer counts (at divide 16) per millisecond; measured by the BSP.
static TICKS_PER_MS: AtomicU32 = AtomicU32::new(0);

fn read(reg: usize) -> u32 {
    // SAFETY: `BASE + reg` is a local APIC register (identity mapped,
    // checked by `init`); reading it has no side effect.
    unsafe { read_volatile((BASE + reg) as *const u32) }
}

fn write(reg: usize, value: u32) {
    // SAFETY: `BASE + reg` is a local APIC register of this CPU; each
    // caller writes a value the register's documentation allows.
    unsafe { write_volatile((BASE + reg) as *mut u32, value) };
}

/// Enables this CPU's local APIC: spurious vector, task priority 0.
pub fn init() -> Result<(), &'static str> {
    // SAFETY: `IA32_APIC_BASE` exists on every x86_64 CPU.
    let msr = unsafe { rdmsr(MSR_APIC_BASE) };
    if msr & (1 << 11) == 0 || (msr & 0xF_FFFF_F000) as usize != BASE {
        return Err("the local APIC is disabled or not at 0xFEE00000");
    }
    write(TPR, 0);
    write(SVR, 0x100 | u32::from(SPURIOUS_VECTOR));
    write(LVT_TIMER, MASKED);
    Ok(())
}

/// Remaps the legacy 8259 PICs to vectors `PIC_VECTOR_BASE..+16` (away
/// from the exceptions, where the BIOS leaves them) and masks every line:
/// interrupts come from the local APICs only. A spurious IRQ 7 or 15 may
/// still arrive; its gate just returns.
pub fn disable_pic() {
    // SAFETY: the standard ICW1-4 sequence on both PICs' ports, then all
    // lines masked; nothing in this kernel uses the PICs.
    unsafe {
        outb(0x20, 0x11);
        outb(0xA0, 0x11);
        outb(0x21, PIC_VECTOR_BASE);
        outb(0xA1, PIC_VECTOR_BASE + 8);
        outb(0x21, 0x04);
        outb(0xA1, 0x02);
        outb(0x21, 0x01);
        outb(0xA1, 0x01);
        outb(0x21, 0xFF);
        outb(0xA1, 0xFF);
    }
}

/// This CPU's APIC ID.
pub fn id() -> u32 {
    read(ID) >> 24
}

/// Signals the end of the interrupt being handled.
pub fn eoi() {
    write(EOI, 0);
}

/// Sends interrupt command `low` to APIC `dest` (0 with a shorthand) and
/// waits until it is delivered.
fn send(dest: u32, low: u32) {
    let saved = Hw::irq_save();
    write(ICR_HIGH, dest << 24);
    write(ICR_LOW, low);
    while read(ICR_LOW) & ICR_PENDING != 0 {
        core::hint::spin_loop();
    }
    // SAFETY: saved above on this CPU.
    unsafe { Hw::irq_restore(saved) };
}

/// INIT (assert, level) to `apic_id`: the CPU waits for a STARTUP.
pub fn send_init(apic_id: u32) {
    send(apic_id, 0x0000_4500);
}

/// STARTUP to `apic_id`: it starts in real mode at `page * 4096`.
pub fn send_startup(apic_id: u32, page: u8) {
    send(apic_id, 0x0000_4600 | u32::from(page));
}

/// The wake IPI to every other CPU (shorthand "all excluding self").
pub fn wake_others() {
    send(0, 0x000C_0000 | u32::from(WAKE_VECTOR));
}

/// Measures the timer against the TSC (which must be calibrated): counts
/// per millisecond at divide 16.
pub fn calibrate_timer() -> u32 {
    write(TIMER_DIVIDE, DIVIDE_16);
    write(LVT_TIMER, MASKED | u32::from(TIMER_VECTOR));
    write(TIMER_INITIAL, u32::MAX);
    time::delay_us(10_000);
    let per_ms = (u32::MAX - read(TIMER_CURRENT)) / 10;
    write(TIMER_INITIAL, 0);
    TICKS_PER_MS.store(per_ms.max(1), Ordering::Relaxed);
    per_ms
}

/// Starts this CPU's timer, periodic, every `us` microseconds.
pub fn start_timer(us: u32) {
    let count = (u64::from(TICKS_PER_MS.load(Ordering::Relaxed)) * u64::from(us) / 1000).max(1);
    write(TIMER_DIVIDE, DIVIDE_16);
    write(LVT_TIMER, PERIODIC | u32::from(TIMER_VECTOR));
    write(TIMER_INITIAL, count.min(u64::from(u32::MAX)) as u32);
}

/// Stops this CPU's timer (an interrupt already pending is still taken).
pub fn stop_timer() {
    write(LVT_TIMER, MASKED | u32::from(TIMER_VECTOR));
    write(TIMER_INITIAL, 0);
}
