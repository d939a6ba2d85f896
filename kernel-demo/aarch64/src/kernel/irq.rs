//! GICv2 (distributor + CPU interface), the per-CPU generic timer, and the
//! IRQ handler that allocates in interrupt context.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::arch::asm;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::cpu::{self, PerCpuBlock};

/// GIC distributor registers.
const GICD_CTLR: usize = 0x000;
const GICD_ISENABLER: usize = 0x100;
const GICD_IPRIORITYR: usize = 0x400;
/// GIC CPU interface registers.
const GICC_CTLR: usize = 0x000;
const GICC_PMR: usize = 0x004;
const GICC_BPR: usize = 0x008;
const GICC_IAR: usize = 0x00C;
const GICC_EOIR: usize = 0x010;
/// Interrupt IDs 1020-1023 are special (1023: spurious).
const SPECIAL_INTID: u32 = 1020;

static GICD: AtomicUsize = AtomicUsize::new(0x0800_0000);
static GICC: AtomicUsize = AtomicUsize::new(0x0801_0000);
/// The timer's interrupt ID (a PPI: 16 + the device tree's number).
static TIMER_INTID: AtomicU32 = AtomicU32::new(27);
/// Counter ticks between timer interrupts.
static TIMER_INTERVAL: AtomicU64 = AtomicU64::new(0);

/// Writes a 32-bit GIC register.
///
/// # Safety
///
/// `base + off` must be a GIC register that accepts the write.
unsafe fn write32(base: usize, off: usize, v: u32) {
    // SAFETY: forwarded from the caller; device memory, mapped.
    unsafe { write_volatile((base + off) as *mut u32, v) }
}

/// Reads a 32-bit GIC register.
///
/// # Safety
///
/// `base + off` must be a readable GIC register.
unsafe fn read32(base: usize, off: usize) -> u32 {
    // SAFETY: forwarded from the caller; device memory, mapped.
    unsafe { read_volatile((base + off) as *const u32) }
}

/// Sets the GIC's addresses and the timer's interrupt ID (from the device
/// tree), and the timer period; before [`init_distributor`].
pub fn configure(gicd: usize, gicc: usize, timer_intid: u32, hz: u64) {
    GICD.store(gicd, Ordering::Relaxed);
    GICC.store(gicc, Ordering::Relaxed);
    TIMER_INTID.store(timer_intid, Ordering::Relaxed);
    TIMER_INTERVAL.store((cpu::ticks_per_second() / hz).max(1), Ordering::Relaxed);
}

/// Enables the distributor (boot CPU, once).
pub fn init_distributor() {
    // SAFETY: GICD_CTLR of the distributor the device tree names; bit 0
    // forwards (group 0) interrupts to the CPU interfaces.
    unsafe { write32(GICD.load(Ordering::Relaxed), GICD_CTLR, 1) };
}

/// This CPU's part: its banked timer PPI enabled with a middle priority,
/// its CPU interface on, the timer armed. Interrupts stay masked.
pub fn init_this_cpu() {
    let (d, c) = (GICD.load(Ordering::Relaxed), GICC.load(Ordering::Relaxed));
    let intid = TIMER_INTID.load(Ordering::Relaxed) as usize;
    // SAFETY: the banked (per-CPU) priority byte and enable bit of a PPI,
    // then the CPU interface's priority mask, binary point and enable.
    unsafe {
        write_volatile((d + GICD_IPRIORITYR + intid) as *mut u8, 0x80);
        write32(d, GICD_ISENABLER + intid / 32 * 4, 1 << (intid % 32));
        write32(c, GICC_PMR, 0xF0);
        write32(c, GICC_BPR, 0);
        write32(c, GICC_CTLR, 1);
    }
    timer_arm();
}

/// Loads the virtual timer with one period and enables it, unmasked.
fn timer_arm() {
    let interval = TIMER_INTERVAL.load(Ordering::Relaxed);
    // SAFETY: the EL1 virtual timer registers of this CPU; ENABLE = 1,
    // IMASK = 0.
    unsafe {
        asm!("msr cntv_tval_el0, {}", "msr cntv_ctl_el0, {}", "isb", in(reg) interval, in(reg) 1u64, options(nomem, nostack))
    };
}

/// From now on this CPU's timer handler allocates (and frees) on every
/// tick.
pub fn start_allocating() {
    cpu::this().allocating.store(true, Ordering::Relaxed);
}

/// From now on this CPU's timer handler allocates nothing (the timer
/// keeps ticking, so `wfi` waits still wake). Called on the CPU itself: no
/// handler of its own is running then, so none holds an allocation.
pub fn stop_allocating() {
    cpu::this().allocating.store(false, Ordering::Relaxed);
}

/// Called by `irq_entry` (boot.rs) with IRQs masked, on the interrupted
/// code's stack.
pub extern "C" fn irq_handler() {
    let me = cpu::this();
    me.irq_depth.fetch_add(1, Ordering::Relaxed);
    let c = GICC.load(Ordering::Relaxed);
    // SAFETY: acknowledges the highest-priority pending interrupt.
    let iar = unsafe { read32(c, GICC_IAR) };
    let intid = iar & 0x3ff;
    if intid == TIMER_INTID.load(Ordering::Relaxed) {
        timer_arm(); // a new period: deasserts the level-triggered PPI
        tick(me);
    }
    if intid < SPECIAL_INTID {
        // SAFETY: ends the interrupt just acknowledged.
        unsafe { write32(c, GICC_EOIR, iar) };
    }
    me.irq_depth.fetch_sub(1, Ordering::Relaxed);
}

/// The timer's work while the workload runs ([`start_allocating`]): a
/// `Box` and a small `Vec`, allocated and freed in interrupt context
/// (charged to the root, never reclaiming).
fn tick(me: &PerCpuBlock) {
    let n = me.ticks.fetch_add(1, Ordering::Relaxed);
    if !me.allocating.load(Ordering::Relaxed) {
        return;
    }
    let b = Box::new([n as u64; 4]);
    let mut v: Vec<u32> = Vec::with_capacity(8);
    v.extend((0..8).map(|i| i + n as u32));
    core::hint::black_box((&b, &v));
    drop((b, v));
    me.irq_allocs.fetch_add(2, Ordering::Relaxed);
}
