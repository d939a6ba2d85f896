//! Per-CPU state reached through the GS base, the [`kmemcg::Cpu`]
//! implementation ([`Hw`]), and a small spin lock that masks interrupts.
//!
//! Every CPU points `IA32_GS_BASE` at its own [`CpuLocal`] block, first
//! thing after it reaches long mode, so `gs:[0]` is its index (0 for the
//! bootstrap CPU, 1.. for the others in the order they were started) and
//! `gs:[8]` its interrupt nesting depth. Nothing in this kernel reloads
//! the GS selector afterwards, which would reset the base.

use core::arch::asm;
use core::mem::offset_of;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use kmemcg::Cpu as _;

/// CPUs this kernel can run (stacks and blocks are static).
pub const MAX_SMP: usize = kernel_common::MAX_CPUS;

/// `IA32_GS_BASE`.
const MSR_GS_BASE: u32 = 0xC000_0101;

/// One CPU's block; `gs:[0]` on that CPU.
#[repr(C, align(64))]
pub struct CpuLocal {
    /// This CPU's index; read through `gs:[0]` by [`index`].
    index: usize,
    /// Interrupt nesting depth: raised by interrupt handlers while they
    /// run; read through GS by `Blocks::irq_depth`. Only its own CPU
    /// touches it.
    irq_depth: AtomicUsize,
    /// Allocations the timer handler made on this CPU.
    pub irq_allocs: AtomicUsize,
    /// Allocations the timer handler could not make (must stay 0).
    pub irq_failures: AtomicUsize,
    /// Timer interrupts taken.
    pub ticks: AtomicUsize,
    /// Whether the timer handler allocates: set and cleared by the CPU
    /// itself around the workload (`kernel_common::smp::Smp` in
    /// `arch.rs`), read by that handler on the same CPU.
    pub allocating: AtomicBool,
    /// The local APIC ID.
    pub apic_id: AtomicU32,
    /// Set by the CPU once its IDT and local APIC are ready.
    pub online: AtomicBool,
}

impl CpuLocal {
    const fn new(index: usize) -> Self {
        CpuLocal {
            index,
            irq_depth: AtomicUsize::new(0),
            irq_allocs: AtomicUsize::new(0),
            irq_failures: AtomicUsize::new(0),
            ticks: AtomicUsize::new(0),
            allocating: AtomicBool::new(false),
            apic_id: AtomicU32::new(0),
            online: AtomicBool::new(false),
        }
    }

    /// Marks the start of an interrupt handler on this CPU.
    pub fn irq_enter(&self) {
        self.irq_depth.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks the end of an interrupt handler on this CPU.
    pub fn irq_exit(&self) {
        self.irq_depth.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The blocks, block `i` for CPU index `i`.
static CPUS: [CpuLocal; MAX_SMP] = {
    let mut blocks = [const { CpuLocal::new(0) }; MAX_SMP];
    let mut i = 0;
    while i < MAX_SMP {
        blocks[i].index = i;
        i += 1;
    }
    blocks
};

/// Writes model-specific register `msr`.
///
/// # Safety
///
/// Ring 0; the caller must know what the register does.
unsafe fn wrmsr(msr: u32, value: u64) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("wrmsr", in("ecx") msr, in("eax") value as u32, in("edx") (value >> 32) as u32, options(nostack, preserves_flags))
    };
}

/// Reads model-specific register `msr`.
///
/// # Safety
///
/// Ring 0; `msr` must exist on this CPU.
pub unsafe fn rdmsr(msr: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: forwarded from the caller; `rdmsr` touches no memory.
    unsafe { asm!("rdmsr", in("ecx") msr, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) };
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Makes the calling CPU CPU `index`: points its GS base at block `index`.
///
/// # Safety
///
/// Once per CPU, before anything reads per-CPU state (the allocator
/// included), with a different `index` on every CPU.
pub unsafe fn set_this_cpu(index: usize, apic_id: u32) {
    let block = &CPUS[index];
    block.apic_id.store(apic_id, Ordering::Relaxed);
    // SAFETY: the block is a static that lives forever; from now on GS
    // points at it on this CPU only (caller contract).
    unsafe { wrmsr(MSR_GS_BASE, block as *const CpuLocal as u64) };
}

/// The calling CPU's index.
#[inline(always)]
pub fn index() -> usize {
    let i: usize;
    // SAFETY: GS points at this CPU's block (`set_this_cpu` runs first on
    // every CPU), whose first field is the index, never written again.
    unsafe {
        asm!("mov {}, qword ptr gs:[{off}]", out(reg) i, off = const offset_of!(CpuLocal, index),
             options(nostack, preserves_flags, readonly, pure))
    };
    i
}

/// The calling CPU's block.
pub fn this() -> &'static CpuLocal {
    &CPUS[index() % MAX_SMP]
}

/// CPU `i`'s block.
pub fn get(i: usize) -> Option<&'static CpuLocal> {
    CPUS.get(i)
}

/// This kernel's per-CPU blocks, as [`Hw`] reads them.
pub struct Blocks;

// SAFETY: (1) `index` reads the index of the block GS points at: each
// CPU points at its own block before it first allocates, indices are
// below `MAX_SMP` (8) and never change; (2) every interrupt handler that
// allocates (the timer's) raises the depth `irq_depth` reads before it
// allocates (`CpuLocal::irq_enter`); the other handlers neither allocate
// nor free; only the CPU itself writes its depth; (3) GS reads only;
// (4) the kernel runs in ring 0.
unsafe impl kernel_common::cpu::CpuBlock for Blocks {
    #[inline(always)]
    fn index() -> usize {
        index()
    }

    #[inline(always)]
    fn irq_depth() -> usize {
        let depth: usize;
        // SAFETY: GS points at this CPU's block; the depth field is only
        // written by this CPU, so a plain read sees its current value.
        unsafe {
            asm!("mov {}, qword ptr gs:[{off}]", out(reg) depth, off = const offset_of!(CpuLocal, irq_depth),
                 options(nostack, preserves_flags, readonly))
        };
        depth
    }
}

/// The hardware as kmemcg's per-CPU platform sees it.
pub type Hw = kernel_common::cpu::Hw<Blocks>;

/// Waits, halted, until `done()` holds; interrupts (the wake IPI, the
/// timer) end each halt. Returns with the interrupt flag as it was.
pub fn wait_until(done: impl Fn() -> bool) {
    let saved = Hw::irq_save();
    while !done() {
        // SAFETY: ring 0. `sti` takes effect after `hlt` begins, so an
        // interrupt that became pending after the check above (masked)
        // wakes the halt instead of being lost; `cli` masks again before
        // the next check.
        unsafe { asm!("sti", "hlt", "cli", options(nostack)) };
    }
    // SAFETY: saved above on this CPU.
    unsafe { Hw::irq_restore(saved) };
}

/// Enables interrupts on this CPU.
pub fn enable_interrupts() {
    // SAFETY: ring 0; the IDT is loaded before any CPU enables interrupts.
    // A compiler barrier (no `nomem`), like `kmemcg::arch`.
    unsafe { asm!("sti", options(nostack)) };
}

/// Disables interrupts on this CPU.
pub fn disable_interrupts() {
    // SAFETY: ring 0; a compiler barrier (no `nomem`).
    unsafe { asm!("cli", options(nostack)) };
}
