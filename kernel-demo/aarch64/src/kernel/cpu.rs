//! Per-CPU blocks (found through `TPIDR_EL1`), the `kmemcg::Cpu`
//! implementation, the generic counter, and PSCI calls.

use core::arch::asm;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

/// CPUs this kernel can run (each gets a block and a stack).
pub const MAX_CPUS: usize = kernel_common::MAX_CPUS;

/// Bytes of stack per CPU (interrupt handlers run on it too).
pub const STACK_SIZE: usize = 64 * 1024;

/// One CPU's state; `TPIDR_EL1` holds its address.
#[repr(C, align(64))]
pub struct PerCpuBlock {
    /// The CPU's index (0 = boot CPU); fixed.
    pub id: usize,
    /// Interrupt handlers running on this CPU (nesting depth).
    pub irq_depth: AtomicUsize,
    /// Allocations made by this CPU's interrupt handlers.
    pub irq_allocs: AtomicUsize,
    /// Timer interrupts taken.
    pub ticks: AtomicUsize,
    /// Whether the timer handler allocates: set and cleared by the CPU
    /// itself around the workload (`irq::start_allocating`,
    /// `stop_allocating`), read by that handler on the same CPU.
    pub allocating: AtomicBool,
    /// Set once the CPU runs Rust code with its interrupts set up.
    pub online: AtomicBool,
}

impl PerCpuBlock {
    const fn new(id: usize) -> Self {
        PerCpuBlock {
            id,
            irq_depth: AtomicUsize::new(0),
            irq_allocs: AtomicUsize::new(0),
            ticks: AtomicUsize::new(0),
            allocating: AtomicBool::new(false),
            online: AtomicBool::new(false),
        }
    }
}

/// The per-CPU blocks; the boot code points each CPU's `TPIDR_EL1` at
/// `CPUS[index]` before it runs Rust.
pub static CPUS: [PerCpuBlock; MAX_CPUS] = {
    let mut blocks = [const { PerCpuBlock::new(0) }; MAX_CPUS];
    let mut i = 0;
    while i < MAX_CPUS {
        blocks[i].id = i;
        i += 1;
    }
    blocks
};

/// The calling CPU's block.
#[inline(always)]
pub fn this() -> &'static PerCpuBlock {
    let p: usize;
    // SAFETY: reads TPIDR_EL1, which the boot code set before any Rust
    // code ran on this CPU and nothing changes afterwards.
    unsafe { asm!("mrs {}, tpidr_el1", out(reg) p, options(nomem, nostack, preserves_flags)) };
    // SAFETY: TPIDR_EL1 holds the address of an element of `CPUS`, a
    // `static`.
    unsafe { &*(p as *const PerCpuBlock) }
}

/// The calling CPU's index.
#[inline(always)]
pub fn id() -> usize {
    this().id
}

/// This kernel's per-CPU blocks, as [`Hw`] reads them.
pub struct Blocks;

// SAFETY: (1) `index` reads this CPU's block through TPIDR_EL1, set once
// per CPU at boot to `CPUS[i]` with a distinct `i < MAX_CPUS` (8), before
// the CPU runs Rust; this kernel never migrates code between CPUs; (2)
// every interrupt handler runs inside `irq::irq_handler`, which raises
// `irq_depth` before anything else and lowers it last; only the CPU
// itself writes it; (3) register and atomic reads only; (4) the kernel
// runs at EL1.
unsafe impl kernel_common::cpu::CpuBlock for Blocks {
    #[inline(always)]
    fn index() -> usize {
        id()
    }

    #[inline(always)]
    fn irq_depth() -> usize {
        this().irq_depth.load(Ordering::Relaxed)
    }
}

/// kmemcg's view of the CPUs: index from the per-CPU block, DAIF for
/// masking, interrupt context from the per-CPU nesting counter.
pub type Hw = kernel_common::cpu::Hw<Blocks>;

/// Masks IRQs on this CPU; returns the DAIF value to restore.
#[inline(always)]
pub fn irq_save() -> usize {
    <Hw as kmemcg::Cpu>::irq_save()
}

/// Restores DAIF from [`irq_save`].
///
/// # Safety
///
/// `saved` came from [`irq_save`] on this CPU, restored in reverse order.
#[inline(always)]
pub unsafe fn irq_restore(saved: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { <Hw as kmemcg::Cpu>::irq_restore(saved) }
}

/// Unmasks IRQs on this CPU.
pub fn irq_enable() {
    // SAFETY: EL1; clears DAIF.I. A compiler barrier (no `nomem`).
    unsafe { asm!("msr daifclr, #2", options(nostack)) };
}

/// The virtual counter (`CNTVCT_EL0`), after an `isb` so it is not read
/// early.
#[inline(always)]
pub fn ticks() -> u64 {
    let t: u64;
    // SAFETY: reads a counter register; no memory effects.
    unsafe { asm!("isb", "mrs {}, cntvct_el0", out(reg) t, options(nomem, nostack, preserves_flags)) };
    t
}

/// The counter frequency in Hz (`CNTFRQ_EL0`).
pub fn ticks_per_second() -> u64 {
    let f: u64;
    // SAFETY: reads a register; no memory effects.
    unsafe { asm!("mrs {}, cntfrq_el0", out(reg) f, options(nomem, nostack, preserves_flags)) };
    f
}

/// Waits for an interrupt (or an event); returns at once if one is pending.
#[inline(always)]
pub fn wait_for_interrupt() {
    // SAFETY: `wfi` only pauses the CPU.
    unsafe { asm!("wfi", options(nomem, nostack, preserves_flags)) };
}

/// How PSCI calls reach the firmware (the device tree's `/psci` `method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Conduit {
    /// `hvc #0`: QEMU without EL2/EL3 emulation implements PSCI itself.
    Hvc = 0,
    /// `smc #0`.
    Smc = 1,
}

static CONDUIT: AtomicU8 = AtomicU8::new(Conduit::Hvc as u8);

/// Sets the PSCI conduit.
pub fn set_conduit(c: Conduit) {
    CONDUIT.store(c as u8, Ordering::Relaxed);
}

/// PSCI 0.2 `CPU_ON` (SMC64).
const PSCI_CPU_ON: u64 = 0xC400_0003;
/// PSCI 0.2 `SYSTEM_OFF`.
const PSCI_SYSTEM_OFF: u64 = 0x8400_0008;

/// A PSCI call; returns `x0`.
fn psci(function: u64, a1: u64, a2: u64, a3: u64) -> i64 {
    let ret: i64;
    if CONDUIT.load(Ordering::Relaxed) == Conduit::Smc as u8 {
        // SAFETY: an SMC Calling Convention call: arguments in x0-x3,
        // result in x0; x1-x17 may be clobbered (SMCCC 1.0).
        unsafe {
            asm!("smc #0", inlateout("x0") function as i64 => ret, inlateout("x1") a1 => _,
                inlateout("x2") a2 => _, inlateout("x3") a3 => _, out("x4") _, out("x5") _, out("x6") _,
                out("x7") _, out("x8") _, out("x9") _, out("x10") _, out("x11") _, out("x12") _,
                out("x13") _, out("x14") _, out("x15") _, out("x16") _, out("x17") _, options(nostack))
        };
    } else {
        // SAFETY: as above, through the hypervisor conduit.
        unsafe {
            asm!("hvc #0", inlateout("x0") function as i64 => ret, inlateout("x1") a1 => _,
                inlateout("x2") a2 => _, inlateout("x3") a3 => _, out("x4") _, out("x5") _, out("x6") _,
                out("x7") _, out("x8") _, out("x9") _, out("x10") _, out("x11") _, out("x12") _,
                out("x13") _, out("x14") _, out("x15") _, out("x16") _, out("x17") _, options(nostack))
        };
    }
    ret
}

/// Starts the CPU with affinity `mpidr` at `entry` with `x0` = `context`;
/// returns the PSCI status (0: success).
pub fn cpu_on(mpidr: u64, entry: usize, context: u64) -> i64 {
    psci(PSCI_CPU_ON, mpidr, entry as u64, context)
}

/// Powers the machine off (QEMU exits with status 0); returns only if
/// PSCI refuses.
pub fn system_off() {
    psci(PSCI_SYSTEM_OFF, 0, 0, 0);
}
