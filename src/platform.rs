//! Platform layer: where pages come from.
//!
//! A [`PageSource`] hands out *runs* of `2^order` pages, naturally aligned
//! (a run of order `k` starts at a multiple of `PAGE_SIZE << k`) and tagged
//! with the NUMA node they live on. Two sources ship with the crate:
//!
//! * [`Region`]: memory handed in by the caller (a static array, or the
//!   physical ranges of a boot memory map), one or more regions per node,
//!   managed by a per-node buddy allocator. Regions may be added at any time;
//!   adjacent regions of one node merge, so runs may straddle their seam.
//! * `OsPages` (feature `std`): pages from the OS with `mmap`, pooled in
//!   4 MiB chunks managed by the same buddy allocator; a chunk whose pages are
//!   all free goes back to the OS (one spare is kept), and runs larger than a
//!   chunk, or any run once the pool has its most chunks
//!   (`OsPages::with_max_chunks`), are mapped and unmapped directly. A
//!   lock-free bitmap of the pages it has mapped answers `ownership` in
//!   O(1) for both.
//!
//! This layer knows nothing of slabs or groups.

pub mod arch;
mod buddy;
mod cpu;
#[cfg(all(feature = "std", not(loom)))]
mod numa;
#[cfg(feature = "std")]
mod os;
mod percpu;
mod region;
#[cfg(feature = "std")]
pub(crate) mod revoke;
#[cfg(all(feature = "std", not(loom)))]
pub(crate) mod rseq;
#[cfg(all(feature = "std", not(loom)))]
mod threads;
#[cfg(all(feature = "std", loom))]
mod threads_model;

#[cfg(all(feature = "std", not(loom)))]
#[cfg_attr(miri, allow(unused_imports))] // the rseq sections are not built under Miri
pub(crate) use cpu::RseqFast;
pub use cpu::{MAX_CPUS, NoCpus, Platform, cpu_for_slot, slot_for_cpu};
pub use percpu::{Cpu, IrqSpinLock, PerCpu};
#[cfg(all(feature = "std", not(loom)))]
pub use rseq::Rseq;
#[cfg(all(feature = "std", not(loom)))]
pub use threads::{NumaThreads, Threads};
/// Under loom, `Threads` is a model build with the same API (see its
/// module).
#[cfg(all(feature = "std", loom))]
pub use threads_model::Threads;
/// Under loom, the model `Threads` (one node), with the same API.
#[cfg(all(feature = "std", loom))]
pub type NumaThreads = Threads;
/// Under loom, the model `Threads`: `Rseq` falls back to `Threads`
/// wherever rseq is missing, and loom has none.
#[cfg(all(feature = "std", loom))]
pub type Rseq = Threads;

/// The platform `Kmem::new` uses: per-thread slots with `std`, one slot for
/// one context without.
#[cfg(feature = "std")]
pub type DefaultPlatform = Threads;
/// The platform `Kmem::new` uses: per-thread slots with `std`, one slot for
/// one context without.
#[cfg(not(feature = "std"))]
pub type DefaultPlatform = NoCpus;

/// The page source `Kmem` names by default: `OsPages` with `std`, so
/// `Kmem` alone is `Kmem<OsPages>`.
#[cfg(feature = "std")]
pub type DefaultSource = OsPages;
/// The page source `Kmem` names by default: [`Region`] without `std`.
#[cfg(not(feature = "std"))]
pub type DefaultSource = Region;

pub(crate) use buddy::for_each_block;

/// Stops the program on a misuse that would otherwise be undefined
/// behaviour (a `Kmem` moved after its first use): writes `msg` to
/// standard error (without allocating) and aborts; without `std` (and
/// under loom), panics with it, since `core` cannot abort.
#[cold]
#[inline(never)]
pub(crate) fn fatal(msg: &str) -> ! {
    #[cfg(all(feature = "std", not(loom)))]
    // SAFETY: writing a valid buffer to fd 2 and aborting touch no memory of
    // ours; neither allocates.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::write(2, b"\n".as_ptr().cast(), 1);
        libc::abort();
    }
    #[cfg(not(all(feature = "std", not(loom))))]
    panic!("{}", msg);
}

/// Stops the program on heap misuse in hardened mode: writes `msg` to
/// standard error (without allocating) and aborts; without `std`, panics
/// with it. Outside hardened mode it returns (debug builds count the bad
/// free and ignore it).
#[cold]
#[inline(never)]
pub(crate) fn hardened_abort(msg: &str) {
    if cfg!(feature = "hardened") {
        fatal(msg);
    }
}

/// Stops the program on a memory error the debug checks found (always,
/// whatever the features): writes the message to standard error piece by
/// piece (without allocating or locking) and aborts; without `std`, panics
/// with it (the kernel's panic handler prints it).
#[cold]
#[inline(never)]
pub(crate) fn report_abort(args: core::fmt::Arguments<'_>) -> ! {
    #[cfg(all(feature = "std", not(loom)))]
    {
        /// Standard error, unbuffered.
        struct Stderr;
        impl core::fmt::Write for Stderr {
            fn write_str(&mut self, s: &str) -> core::fmt::Result {
                // SAFETY: a valid buffer written to fd 2; touches no memory
                // of ours and does not allocate.
                unsafe { libc::write(2, s.as_ptr().cast(), s.len()) };
                Ok(())
            }
        }
        let _ = core::fmt::Write::write_fmt(&mut Stderr, format_args!("{args}\n"));
        // SAFETY: abort ends the process; nothing runs after it.
        unsafe { libc::abort() }
    }
    #[cfg(not(all(feature = "std", not(loom))))]
    panic!("{}", args);
}

#[cfg(feature = "std")]
pub use os::OsPages;
pub use region::{FIRST_REGION_PAGES, Region, RegionError};

use core::ptr::NonNull;

/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 12;
/// The page size every layer of kmemcg works in: 4 KiB.
pub const PAGE_SIZE: usize = 1 << PAGE_SHIFT;
/// How many NUMA nodes a page source and a cache can tell apart.
pub const MAX_NODES: usize = 4;
/// Runs have orders `0..MAX_ORDER`: at most `2^(MAX_ORDER-1)` pages (512
/// GiB; 2 GiB on 32-bit targets, so a run's size always fits a `usize`).
pub const MAX_ORDER: u32 = if usize::BITS < 64 { 20 } else { 28 };

/// The default lock: a spin lock whose waiters yield the CPU after a short
/// spin, with `std` ([`YieldingRawMutex`](crate::YieldingRawMutex):
/// a preempted holder then gets the CPU back at once; a waiter that has
/// spun out is handed the lock next, so none starves), and a spinning
/// mutex from `spin` without. A kernel supplies its own
/// [`lock_api::RawMutex`] that also disables interrupts, so that allocation
/// from an interrupt handler cannot deadlock against the code it interrupted.
#[cfg(all(feature = "std", not(loom)))]
pub type DefaultRawMutex = crate::sync::YieldingRawMutex;
/// The default lock: a spinning mutex from `spin` (with `std`, one whose
/// waiters yield the CPU). A kernel supplies its own
/// [`lock_api::RawMutex`] that also disables interrupts, so that allocation
/// from an interrupt handler cannot deadlock against the code it interrupted.
#[cfg(all(not(feature = "std"), not(loom)))]
pub type DefaultRawMutex = spin::mutex::SpinMutex<()>;
/// The default lock under `--cfg loom`: one loom can see.
#[cfg(loom)]
pub type DefaultRawMutex = crate::sync::LoomRawMutex;

/// A run of `2^order` pages returned by [`PageSource::alloc_pages`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRun {
    /// First byte of the run; aligned to `PAGE_SIZE << order`.
    pub addr: NonNull<u8>,
    /// log2 of the number of pages.
    pub order: u32,
    /// The NUMA node the pages live on (`< MAX_NODES`).
    pub node: usize,
}

/// What a page source can say about an address, for the debug and hardened
/// checks of frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The address lies in memory this source manages.
    Owned,
    /// The address is certainly not this source's.
    Foreign,
    /// The source cannot tell cheaply (a source of the user's may answer
    /// this; the crate's own never do).
    Unknown,
}

/// Counters of a page source, in pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Pages currently handed out to callers of `alloc_pages`.
    pub pages_in_use: usize,
    /// Pages the source holds from its backing store (handed in regions, or
    /// mapped from the OS, including its own metadata and free pages).
    pub pages_reserved: usize,
}

/// A supplier of naturally aligned page runs.
///
/// # Safety
///
/// An implementation must guarantee that:
/// 1. `alloc_pages(order, node)` returns `None` or a run of exactly
///    `PAGE_SIZE << order` bytes, aligned to that size, readable and writable,
///    overlapping no other live run, and valid until freed;
/// 2. the run's `node` is below [`MAX_NODES`];
/// 3. `free_pages` accepts any naturally aligned `2^k`-page piece of a live
///    run (so a caller may return the tail of a run it over-allocated), each
///    page at most once;
/// 4. it never allocates through the global allocator, never calls back into
///    the allocator that uses it, and never panics: it runs under the
///    allocator's locks and on allocation paths (no re-entrancy);
/// 5. all methods may be called from several threads at once;
/// 6. `claim_pages` returns `true` only if every page it was asked for was
///    free in this source and now belongs to the caller, to be given back
///    through `free_pages` in naturally aligned pieces like any run's.
pub unsafe trait PageSource: Sync {
    /// A run of `2^order` pages, preferably on `node`; `None` when exhausted
    /// or when `order >= MAX_ORDER`.
    fn alloc_pages(&self, order: u32, node: usize) -> Option<PageRun>;

    /// Gives back `2^order` pages at `addr`.
    ///
    /// # Safety
    ///
    /// `addr` and `order` must describe a naturally aligned piece of a run
    /// that this source returned and that has not been freed, and nothing may
    /// use those pages afterwards.
    unsafe fn free_pages(&self, addr: NonNull<u8>, order: u32);

    /// Gives back several runs of `2^order` pages at once (the empty slabs
    /// of one magazine flush), so a source can take its lock once. The
    /// default frees them one by one.
    ///
    /// # Safety
    ///
    /// Each of `runs` as for [`PageSource::free_pages`], all distinct.
    unsafe fn free_pages_bulk(&self, runs: &[NonNull<u8>], order: u32) {
        for &r in runs {
            // SAFETY: per the contract, for each run.
            unsafe { self.free_pages(r, order) };
        }
    }

    /// Whether `addr` lies in memory this source manages.
    fn ownership(&self, addr: usize) -> Ownership;

    /// Current counters.
    fn stats(&self) -> SourceStats;

    /// Gives back memory the source keeps cached (e.g. free OS chunks);
    /// returns the pages released. Called by `Kmem::reap`.
    fn trim(&self) -> usize {
        0
    }

    /// For a source that serves a fixed amount of memory (it never maps
    /// more by itself, as a [`Region`] does not), the pages it manages
    /// now, free or handed out; `None` (the default) for one that grows on
    /// demand, as `OsPages` does. A `Kmem` sizes its slabs from it at its
    /// first use (see the slab layer's *Geometry*): `None` keeps the
    /// largest slabs.
    fn fixed_pages(&self) -> Option<usize> {
        None
    }

    /// Writes into `out[k]` how many free runs of order `k` the source
    /// holds right now (summed over nodes), for a report of why an
    /// allocation failed; returns `false` (the default) if it cannot tell,
    /// leaving `out` unspecified. It takes the source's locks, so it is
    /// never called with an allocator lock held.
    fn free_runs(&self, _out: &mut [usize; MAX_ORDER as usize]) -> bool {
        false
    }

    /// A pointer to `ptr`'s address carrying this source's own provenance
    /// (the zone or mapping it lies in), for the allocator's writes to its
    /// metadata next to an object a caller handed back: under Miri's
    /// aliasing models a pointer derived from the caller's may not write
    /// there. The default returns `ptr`; `Region` and `OsPages` look the
    /// address up under `cfg(miri)` only, so other builds pay nothing.
    #[inline(always)]
    fn rebase(&self, ptr: NonNull<u8>) -> NonNull<u8> {
        ptr
    }

    /// Makes the `pages` pages at `at` (inside a live run of this source)
    /// inaccessible (`off`) or accessible again, for detection's guard
    /// pages; returns whether it could. The default cannot (a `Region`
    /// has no page tables to change), and then detection does not sample.
    ///
    /// # Safety
    ///
    /// The pages lie in a run of this source that the caller owns (a live
    /// run it got from `alloc_pages` and has not freed), and nothing else
    /// touches them while they are off; the caller turns them back on
    /// before it frees the run.
    unsafe fn protect(&self, _at: NonNull<u8>, _pages: usize, _off: bool) -> bool {
        false
    }

    /// Whether a large object that `realloc` moves because it grows may be
    /// placed with free room after it (see `heap::large`). The room goes
    /// back to the source at once, but every such object then starts its
    /// own larger block, so a fixed amount of memory fragments sooner: the
    /// default says no, and `OsPages`, which maps more memory when a run
    /// cannot be found, says yes.
    fn room_to_grow(&self) -> bool {
        false
    }

    /// Takes the `pages` pages that start at `at` — the end of a live run of
    /// this source — if all of them are free, so the run can grow in place
    /// (`realloc` of a large object). Returns whether it took them; the
    /// default never does. Safe for any address: `Region` and `OsPages`
    /// refuse one off a page boundary or outside their memory, and pages
    /// claimed at a page that ends no run of the caller's are the caller's
    /// from then on (a leak if it never frees them, not a fault).
    fn claim_pages(&self, _at: NonNull<u8>, _pages: usize) -> bool {
        false
    }
}

// SAFETY: forwarding every method to `S` keeps each of S's guarantees.
unsafe impl<S: PageSource> PageSource for &S {
    #[inline]
    fn alloc_pages(&self, order: u32, node: usize) -> Option<PageRun> {
        (**self).alloc_pages(order, node)
    }
    #[inline]
    unsafe fn free_pages(&self, addr: NonNull<u8>, order: u32) {
        // SAFETY: the caller upholds `free_pages`'s contract for `S`.
        unsafe { (**self).free_pages(addr, order) }
    }
    #[inline]
    unsafe fn free_pages_bulk(&self, runs: &[NonNull<u8>], order: u32) {
        // SAFETY: the caller upholds `free_pages_bulk`'s contract for `S`.
        unsafe { (**self).free_pages_bulk(runs, order) }
    }
    fn ownership(&self, addr: usize) -> Ownership {
        (**self).ownership(addr)
    }
    fn stats(&self) -> SourceStats {
        (**self).stats()
    }
    fn trim(&self) -> usize {
        (**self).trim()
    }
    fn fixed_pages(&self) -> Option<usize> {
        (**self).fixed_pages()
    }
    fn free_runs(&self, out: &mut [usize; MAX_ORDER as usize]) -> bool {
        (**self).free_runs(out)
    }
    fn claim_pages(&self, at: NonNull<u8>, pages: usize) -> bool {
        (**self).claim_pages(at, pages)
    }
    fn room_to_grow(&self) -> bool {
        (**self).room_to_grow()
    }
    unsafe fn protect(&self, at: NonNull<u8>, pages: usize, off: bool) -> bool {
        // SAFETY: the caller upholds `protect`'s contract for `S`.
        unsafe { (**self).protect(at, pages, off) }
    }
    #[inline(always)]
    fn rebase(&self, ptr: NonNull<u8>) -> NonNull<u8> {
        (**self).rebase(ptr)
    }
}

/// The smallest order whose run holds `pages` pages (`pages >= 1`), or
/// `None` if no order below [`MAX_ORDER`] does.
#[inline]
pub const fn order_for_pages(pages: usize) -> Option<u32> {
    if pages == 0 {
        return Some(0);
    }
    let order = usize::BITS - (pages - 1).leading_zeros();
    if pages == 1 {
        Some(0)
    } else if order < MAX_ORDER {
        Some(order)
    } else {
        None
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
