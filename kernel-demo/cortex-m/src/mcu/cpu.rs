//! The one core as kmemcg sees it ([`Mcu`]: index 0, `PRIMASK` as the
//! interrupt mask, `IPSR` for interrupt context), and the SysTick timer,
//! whose handler allocates and frees in interrupt context.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::alloc::Layout;
use core::arch::asm;
use core::ptr::write_volatile;
use core::sync::atomic::{AtomicUsize, Ordering};

/// SysTick control and status: `ENABLE` (bit 0), `TICKINT` (bit 1),
/// `CLKSOURCE` (bit 2: the processor clock).
const SYST_CSR: *mut u32 = 0xE000_E010 as *mut u32;
/// SysTick reload value.
const SYST_RVR: *mut u32 = 0xE000_E014 as *mut u32;
/// SysTick current value (a write clears it).
const SYST_CVR: *mut u32 = 0xE000_E018 as *mut u32;
/// The processor clock of the MPS2 AN386 image, Hz.
const CPU_HZ: u32 = 25_000_000;

/// Interrupt-context allocations the SysTick handler made.
pub static IRQ_ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Interrupt-context allocations that failed (must stay 0).
pub static IRQ_FAILURES: AtomicUsize = AtomicUsize::new(0);
/// SysTick interrupts taken.
pub static TICKS: AtomicUsize = AtomicUsize::new(0);

/// The core, for [`kmemcg::PerCpu`] and [`kmemcg::IrqSpinLock`].
pub struct Mcu;

// SAFETY: (1) one core: index 0, always; (2) `irq_save` sets PRIMASK
// (`cpsid i`, every configurable-priority exception masked) and returns
// its previous value, which `irq_restore` puts back, so nesting restores
// the outer state; (3) every exception handler runs with IPSR holding its
// exception number, and thread mode with 0; (4) one node; (5) no barrier;
// (6) register accesses only.
unsafe impl kmemcg::Cpu for Mcu {
    #[inline(always)]
    fn id() -> usize {
        0
    }

    #[inline(always)]
    fn irq_save() -> usize {
        let primask: usize;
        // SAFETY: reads PRIMASK and masks interrupts; privileged thread
        // mode or a handler (this program never leaves privileged mode).
        // No `nomem`: memory accesses must not move across the mask.
        unsafe { asm!("mrs {}, PRIMASK", "cpsid i", out(reg) primask, options(nostack, preserves_flags)) };
        primask
    }

    #[inline(always)]
    unsafe fn irq_restore(saved: usize) {
        if saved & 1 == 0 {
            // SAFETY: interrupts were enabled at the matching `irq_save`.
            // A compiler barrier, like `irq_save`.
            unsafe { asm!("cpsie i", options(nostack, preserves_flags)) };
        }
    }

    #[inline(always)]
    fn in_interrupt() -> bool {
        let ipsr: usize;
        // SAFETY: reads the exception number; touches no memory.
        unsafe { asm!("mrs {}, IPSR", out(reg) ipsr, options(nomem, nostack, preserves_flags)) };
        ipsr & 0x1ff != 0
    }
}

/// Starts SysTick at `hz` interrupts per second.
pub fn start_systick(hz: u32) {
    // SAFETY: the SysTick registers of the System Control Space, always
    // mapped; nothing else in this program touches them.
    unsafe {
        write_volatile(SYST_RVR, CPU_HZ / hz - 1);
        write_volatile(SYST_CVR, 0);
        write_volatile(SYST_CSR, 0b111);
    }
}

/// Stops SysTick.
pub fn stop_systick() {
    // SAFETY: as in `start_systick`.
    unsafe { write_volatile(SYST_CSR, 0) };
}

/// Sleeps until the next interrupt.
pub fn wait_for_interrupt() {
    // SAFETY: waits for an interrupt; touches no memory.
    unsafe { asm!("wfi", options(nomem, nostack, preserves_flags)) };
}

/// The SysTick handler: a `Box<[u8; 64]>` and a small `Vec`, allocated,
/// checked and freed in interrupt context (atomic allocations: the
/// platform reports `in_interrupt`), counted.
pub unsafe extern "C" fn systick() {
    TICKS.fetch_add(1, Ordering::Relaxed);
    match irq_allocations() {
        Ok(n) => IRQ_ALLOCS.fetch_add(n, Ordering::Relaxed),
        Err(()) => IRQ_FAILURES.fetch_add(1, Ordering::Relaxed),
    };
}

/// The two objects the handler allocates: a 64-byte block and a `Vec` of
/// 12 `u32`s (48 bytes); `None` if either allocation failed. No panics.
pub fn irq_objects() -> Option<(Box<[u8; 64]>, Vec<u32>)> {
    let layout = Layout::new::<[u8; 64]>();
    // SAFETY: a 64-byte layout; on success the block is owned by the Box
    // below, which frees it with the same layout.
    let p = unsafe { alloc::alloc::alloc(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is a fresh block for `[u8; 64]` from the global
    // allocator; writing the array initialises it before the Box owns it.
    let block: Box<[u8; 64]> = unsafe {
        p.cast::<[u8; 64]>().write([0x5A; 64]);
        Box::from_raw(p.cast())
    };
    let mut v: Vec<u32> = Vec::new();
    v.try_reserve_exact(12).ok()?;
    v.extend(0..12);
    Some((block, v))
}

/// Allocates, checks and frees the handler's two objects; returns how
/// many it allocated.
fn irq_allocations() -> Result<usize, ()> {
    let (mut block, v) = irq_objects().ok_or(())?;
    block[63] = 0xA5;
    let ok = block[0] == 0x5A && block[63] == 0xA5 && v.iter().sum::<u32>() == 66;
    drop((block, v));
    if ok { Ok(2) } else { Err(()) }
}
