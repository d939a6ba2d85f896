//! Masking local interrupts, for kernels implementing [`crate::Cpu`]:
//! `irq_save` masks maskable interrupts on the calling CPU and returns the
//! previous state, `irq_restore` puts it back. Only for code running in
//! the kernel's privilege level (ring 0, EL1): in user space the
//! instructions fault.
//!
//! Other architectures write the same two functions in their `Cpu`
//! implementation; on RISC-V (S-mode), for instance, `csrrci {0},
//! sstatus, 2` saves `sstatus` and clears `SIE`, and `csrs sstatus, {0}`
//! after masking `{0}` to bit 1 sets it back if it was set.

/// x86_64: saves RFLAGS and clears IF (`pushfq; pop; cli`).
///
/// # Safety
///
/// Ring 0 only.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn irq_save() -> usize {
    let flags: usize;
    // SAFETY: ring 0 (caller); reads RFLAGS through the stack and clears
    // IF. No `nomem`: the compiler must not move memory accesses across
    // the point where interrupts are masked.
    unsafe { core::arch::asm!("pushfq", "pop {}", "cli", out(reg) flags) };
    flags
}

/// x86_64: sets IF again if it was set in `flags` (from [`irq_save`]).
///
/// # Safety
///
/// Ring 0 only; `flags` came from `irq_save` on this CPU.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn irq_restore(flags: usize) {
    const IF: usize = 1 << 9;
    if flags & IF != 0 {
        // SAFETY: ring 0 (caller); interrupts were enabled before the
        // matching `irq_save`. A compiler barrier, like `irq_save`.
        unsafe { core::arch::asm!("sti") };
    }
}

/// aarch64: saves DAIF and masks IRQs (`mrs daif; msr daifset, #2`).
///
/// # Safety
///
/// EL1 (or higher) only.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub unsafe fn irq_save() -> usize {
    let daif: usize;
    // SAFETY: EL1 (caller); reads DAIF and sets the I bit. A compiler
    // barrier (no `nomem`).
    unsafe { core::arch::asm!("mrs {}, daif", "msr daifset, #2", out(reg) daif) };
    daif
}

/// aarch64: writes DAIF back (from [`irq_save`]).
///
/// # Safety
///
/// EL1 (or higher) only; `daif` came from `irq_save` on this CPU.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub unsafe fn irq_restore(daif: usize) {
    // SAFETY: EL1 (caller); restores the saved mask bits.
    unsafe { core::arch::asm!("msr daif, {}", in(reg) daif) };
}
