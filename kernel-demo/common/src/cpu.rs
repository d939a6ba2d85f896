//! The kernels' [`kmemcg::Cpu`]: [`Hw`], over what each architecture
//! gives ([`CpuBlock`]: this CPU's index and its interrupt nesting
//! depth, both from its per-CPU block), with interrupt masking from
//! `kmemcg::arch`, the same code on x86_64 (`pushfq; cli` / `sti`) and
//! aarch64 (DAIF).

use core::marker::PhantomData;

/// What an architecture's per-CPU block tells [`Hw`].
///
/// # Safety
///
/// (1) [`CpuBlock::index`] is the calling CPU's index, below
/// [`crate::MAX_CPUS`], fixed for the CPU's life and distinct between
/// CPUs, and it is valid from before the CPU first allocates; (2) every
/// interrupt handler that allocates or frees raises the depth
/// [`CpuBlock::irq_depth`] reads before it does, and lowers it after;
/// only the CPU's own code changes it; (3) neither allocates, panics or
/// blocks; (4) the kernel runs in ring 0 (x86_64) or at EL1 (aarch64),
/// where `kmemcg::arch`'s masking is allowed.
pub unsafe trait CpuBlock: 'static {
    /// The calling CPU's index.
    fn index() -> usize;

    /// Interrupt handlers running on the calling CPU now.
    fn irq_depth() -> usize;
}

/// The hardware as kmemcg's per-CPU platform sees it, over the per-CPU
/// blocks `B`. One node; no all-CPU barrier (`BARRIER` stays false).
pub struct Hw<B>(PhantomData<B>);

// SAFETY: (1) `id` is `B::index`, a distinct fixed index per CPU below
// `MAX_CPUS` (8, below kmemcg's 64), valid before the first allocation
// (`CpuBlock` (1)); (2) `kmemcg::arch::irq_save`/`irq_restore` save the
// interrupt state, mask, and write it back, which nests, and the kernel
// runs where they are allowed (`CpuBlock` (4)); (3) `in_interrupt` reads
// the depth every allocating handler raises first (`CpuBlock` (2)); (4)
// one node; (5) `BARRIER` is false; (6) nothing here allocates or panics
// (`CpuBlock` (3)).
unsafe impl<B: CpuBlock> kmemcg::Cpu for Hw<B> {
    #[inline(always)]
    fn id() -> usize {
        B::index()
    }

    #[inline(always)]
    fn irq_save() -> usize {
        // SAFETY: ring 0 or EL1 (`CpuBlock` (4)).
        unsafe { kmemcg::arch::irq_save() }
    }

    #[inline(always)]
    unsafe fn irq_restore(saved: usize) {
        // SAFETY: ring 0 or EL1; `saved` came from `irq_save` on this CPU
        // (the caller's contract).
        unsafe { kmemcg::arch::irq_restore(saved) }
    }

    #[inline(always)]
    fn in_interrupt() -> bool {
        B::irq_depth() != 0
    }
}
