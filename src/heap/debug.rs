//! Memory-error detection, for test suites and debugging: red zones,
//! poison with a quarantine, double and foreign frees.
//!
//! Chosen per `Kmem` when it is built ([`Kmem::with_detection`]) or, with
//! `std`, from the `KMEMCG_DEBUG` environment variable, read once at the
//! first allocation ([`Detection::from_env_value`] gives its syntax). Off,
//! it costs nothing on the fast paths: they test the mode word,
//! which they test anyway, and the detection paths hang off its non-zero
//! branch (the mode bits, `Slots::mode`).
//!
//! # Object layout
//!
//! With red zones or poison on, a request of `size` bytes aligned to
//! `align` is served from the class (or page run) of `padded(size, align)
//! = front(align) + size + W` bytes, `front(align) = max(4 words,
//! align)`: every object has a *slot* of at least that many bytes, and
//! the object starts `front` bytes into it:
//!
//! ```text
//! live:  | tag ALIVE | size | front red zone 0xbb ... | object (size) | rear red zone 0xbb ... |
//! freed: | tag FREED | owner | link | front | poison 0x6b ...                                    |
//! ```
//!
//! * a free checks the tag (`FREED` or `CLEAN`: a double free; anything
//!   but `ALIVE`: the header was overwritten), the front red zone (an
//!   underflow, reported as the object's own), the size stored at
//!   allocation (a free with another size, even within the class), and
//!   every rear red-zone byte (an overflow, even by one byte, even inside
//!   the class's slack);
//! * a freed object (size-class or page run) is poisoned and waits in a
//!   FIFO quarantine of bounded bytes (per CPU slot, then globally, as
//!   Linux's KASAN keeps it), linked through its header, before it goes
//!   back to its cache; its poison is checked once, when it leaves the
//!   quarantine (then marked `CLEAN`), when the program exits (`std`),
//!   or, for one that skipped the quarantine, when it is handed out again
//!   (a write after free);
//! * tags mix in the slot's address and size, so a tag left in memory by
//!   an earlier use of the same pages in another layout does not pass for
//!   one of this slot.
//!
//! Detection keeps the size-class and page paths as they are underneath:
//! objects still come from magazines and slabs, charges and limits work
//! as without it (slots are larger). Sampling alone ([`Detection::sampled`])
//! leaves every object but the sampled ones as it is: the allocation and
//! free paths only count down to the next sample and, while sampled
//! objects live, test whether a freed block ends at a page boundary.
//!
//! One file per detector: [`settings`] (what is on, and the
//! `KMEMCG_DEBUG` syntax), [`redzone`] (trailers, tags, the checked
//! allocation and free paths), [`quarantine`] (poison and the FIFO of
//! freed objects), [`hooks`] (the quarantine checked at exit, guard-page
//! faults reported), [`header`] (the words at the start of a checked
//! slot), [`guard`] (sampled guard-page objects), `sites` (allocation and
//! free sites) and `symbols` (their names, found when a report prints
//! them), [`leaks`] (the requested sizes of what a cache still holds) and
//! [`report`] (finding changed bytes and naming caches in reports).

mod guard;
mod header;
#[cfg(all(feature = "std", not(loom)))]
mod hooks;
mod leaks;
mod quarantine;
mod redzone;
mod report;
mod settings;
#[cfg(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu"))]
mod sites;
#[cfg(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu"))]
mod symbols;

use crossbeam_utils::CachePadded;
use lock_api::{Mutex, RawMutex};

use super::Kmem;
use crate::cgroup::mode;
use crate::platform::{MAX_CPUS, PAGE_SIZE, PageSource, Platform};
use crate::sync::{AtomicUsize, Ordering, Stat, atomic_usize, loom_const_fn, repeat};

pub use guard::GUARDED_MAX;
use guard::RETIRED_MAX;
pub(crate) use leaks::LeakSizes;
use quarantine::{Fifo, Quarantine};
pub use settings::Detection;
use settings::env_detection;

const W: usize = size_of::<usize>();
/// The header words at the start of a slot: the tag, then the size (live)
/// or owner (freed), then the quarantine link (freed).
const HEAD: usize = 3 * W;
/// Where a freed slot's poison starts: after the header and the word
/// recording where the object started (`front`).
const POISON_FROM: usize = HEAD + W;
/// The red zone's byte (SLUB's `SLUB_RED_ACTIVE`).
const RED: u8 = 0xbb;
/// A freed object's byte (SLUB's `POISON_FREE`).
const POISON: u8 = 0x6b;
/// Tag of a live object ("kmalive!" on 64-bit).
const ALIVE: usize = 0x6b6d_616c_6976_6521_u64 as usize;
/// Tag of a freed object ("kmfreed!").
const FREED: usize = 0x6b6d_6672_6565_6421_u64 as usize;
/// Tag of a freed object let out of the quarantine, its poison checked
/// ("kmclean!").
const CLEAN: usize = 0x6b6d_636c_6561_6e21_u64 as usize;

/// Where the object starts in its slot: after the header and at least a
/// word of front red zone, at its alignment.
#[inline]
const fn front(align: usize) -> usize {
    if align > HEAD + W { align } else { HEAD + W }
}

/// The largest alignment whose objects get a header and red zones: one
/// aligned more is served as without detection (not checked, not
/// poisoned). Its front red zone would be the whole alignment (a request
/// aligned to 1 GiB filled a gigabyte of red zone, which the fuzzer
/// found as memory running out), and such alignments are for page tables
/// and DMA buffers, not for the objects red zones guard.
const CHECKED_ALIGN_MAX: usize = PAGE_SIZE;

/// The slot bytes an object of `size` bytes aligned to `align` needs with
/// red zones or poison on: `front(align)`, the object and a word of rear
/// red zone at least.
#[inline]
const fn padded(size: usize, align: usize) -> Option<usize> {
    match size.checked_add(front(align) + W) {
        Some(n) if n <= isize::MAX as usize => Some(n),
        _ => None,
    }
}

/// The detection state of a `Kmem`: its settings (fixed before the first
/// object; atomics because the environment is read at run time) and the
/// quarantine.
pub(crate) struct Detector<R: RawMutex> {
    /// `REDZONE | POISONED | SITES` while on (`SITES` alone with
    /// sampling alone).
    flags: AtomicUsize,
    quarantine_max: AtomicUsize,
    guard_every: AtomicUsize,
    /// Size-class allocations left until the next sample (0 or 1: the
    /// next one is).
    sampled: AtomicUsize,
    /// The platform clock's millisecond in which the slow-path countdown
    /// last armed a sample (`usize::MAX`: never), so that it arms at most
    /// one per millisecond (see `Kmem::sample_tick_slow`).
    armed_ms: AtomicUsize,
    /// Sampled objects live (so frees look the table up only when some
    /// are).
    guarded_live: AtomicUsize,
    /// A summary of the live samples' guard pages, one bit per hash of a
    /// page (`Kmem::may_be_sampled`): a free that ends at a page boundary
    /// takes the table's lock only if its bit is set.
    guard_bits: [AtomicUsize; guard::GUARD_WORDS],
    quarantine: Mutex<R, Quarantine>,
    /// Per-CPU quarantines (by platform slot), each bounded by a share of
    /// the global bound; a full one moves whole into the global one, so
    /// the global lock is taken once per batch.
    locals: [CachePadded<Mutex<R, Fifo>>; MAX_CPUS],
    /// Quarantined objects and retired sampled runs a thread has taken
    /// out of the quarantine and not yet given back to their caches: still
    /// charged, in no list (see `Kmem::settle_quarantine`).
    in_transit: AtomicUsize,
    /// Frees checked (a statistic).
    frees_checked: Stat,
    /// Set by the first reader of `KMEMCG_DEBUG` to warn about a word it
    /// did not understand, so the warning is printed once.
    warned: AtomicUsize,
    /// 0 until the first poisoned free or sample; then the allocator's
    /// address if it is registered for the process hooks (`std`: the
    /// quarantine checked at exit, guard-page faults reported), else 1.
    #[cfg_attr(not(all(feature = "std", not(loom))), allow(dead_code))] // no hooks there
    hooked: AtomicUsize,
}

impl<R: RawMutex> Drop for Detector<R> {
    fn drop(&mut self) {
        #[cfg(all(feature = "std", not(loom)))]
        hooks::unregister(self.hooked.load(Ordering::Relaxed));
    }
}

const REDZONE: usize = 1;
const POISONED: usize = 2;
/// Sites recorded (only with `REDZONE` or `POISONED`, or sampling: then
/// the sampled objects' sites).
const SITES: usize = 4;

/// Writes the allocation site recorded for the checked object in slot
/// `slot` (from [`LeakSizes::iter_slots`]) to `w`, for a leak report's
/// row: nothing unless sites are recorded (`std` on glibc targets).
pub(crate) fn write_leak_site(w: &mut impl core::fmt::Write, slot: usize) -> core::fmt::Result {
    #[cfg(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu"))]
    return sites::write_alloc(w, slot);
    #[cfg(not(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu")))]
    {
        let _ = (w, slot);
        Ok(())
    }
}

/// The mode bits detection `d` starts with. Red zones or poison:
/// `DEBUG | ARMED` for good (every object is checked). Sampling alone:
/// `ARMED` (the first allocation is a sample), and `DEBUG` only while a
/// sampled object lives (set and cleared under the table's lock, see
/// `Kmem::alloc_guarded`), so that a free while none lives takes the
/// plain path and pays nothing for sampling.
const fn mode_of(d: Detection) -> usize {
    if d.redzone || d.poison {
        mode::DEBUG | mode::ARMED
    } else if d.is_on() {
        mode::ARMED
    } else {
        0
    }
}

/// The flags word of `d`.
const fn flags_of(d: Detection) -> usize {
    let checks = d.redzone || d.poison;
    (if d.redzone { REDZONE } else { 0 })
        | (if d.poison { POISONED } else { 0 })
        | (if d.sites && (checks || d.guard_every != 0) { SITES } else { 0 })
}

impl<R: RawMutex> Detector<R> {
    loom_const_fn! {
        /// A detector doing `d`.
        pub(crate) fn new(d: Detection) -> Self {
            Detector {
                flags: atomic_usize(flags_of(d)),
                quarantine_max: atomic_usize(d.quarantine),
                guard_every: atomic_usize(d.guard_every),
                sampled: atomic_usize(0),
                armed_ms: atomic_usize(usize::MAX),
                guarded_live: atomic_usize(0),
                guard_bits: repeat!(atomic_usize(0); guard::GUARD_WORDS),
                quarantine: Mutex::const_new(R::INIT, Quarantine {
                    fifo: Fifo::EMPTY,
                    guarded: [(core::ptr::null_mut(), core::ptr::null_mut()); GUARDED_MAX],
                    retired: [(core::ptr::null_mut(), core::ptr::null_mut()); RETIRED_MAX],
                    retired_n: 0,
                }),
                locals: repeat!(CachePadded::new(Mutex::const_new(R::INIT, Fifo::EMPTY)); MAX_CPUS),
                in_transit: atomic_usize(0),
                frees_checked: Stat::new(),
                warned: atomic_usize(0),
                hooked: atomic_usize(0),
            }
        }
    }

    fn set(&self, d: Detection) {
        self.flags.store(flags_of(d), Ordering::Relaxed);
        self.quarantine_max.store(d.quarantine, Ordering::Relaxed);
        self.guard_every.store(d.guard_every, Ordering::Relaxed);
    }

    fn get(&self) -> Detection {
        let f = self.flags.load(Ordering::Relaxed);
        Detection {
            redzone: f & REDZONE != 0,
            poison: f & POISONED != 0,
            sites: f & SITES != 0,
            quarantine: self.quarantine_max.load(Ordering::Relaxed),
            guard_every: self.guard_every.load(Ordering::Relaxed),
        }
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    crate::sync::loom_const_fn! {
        /// This allocator with memory-error detection `d`, for a `static`:
        /// `Kmem::new(OsPages::new()).with_detection(Detection::ALL)`
        /// (which replaces the `KMEMCG_DEBUG` environment variable for this
        /// allocator). See [`Detection`] and the README's "Catching memory
        /// bugs in tests".
        pub fn with_detection(mut self, d: Detection) -> Self {
            // The old detector holds no resources (atomics and an unlocked,
            // empty quarantine): forgotten, as a `const fn` cannot drop.
            core::mem::forget(core::mem::replace(self.detect.get_mut(), Detector::new(d)));
            self.slots.set_initial_mode(mode_of(d));
            self
        }
    }

    /// The detection this allocator does (after reading `KMEMCG_DEBUG`,
    /// if it was to).
    pub fn detection(&self) -> Detection {
        self.resolve_mode();
        self.detect.get()
    }

    /// The mode word with `Acquire`, once the environment is read.
    #[inline]
    pub(crate) fn resolve_mode(&self) -> usize {
        let m = self.slots.mode_acquire();
        if m & mode::ENV == 0 {
            return m;
        }
        self.read_env();
        self.slots.mode_acquire()
    }

    /// Reads `KMEMCG_DEBUG` (with `std`) and clears the `ENV` bit. Runs
    /// before the first object is handed out; racing first allocations
    /// read the same variable and store the same settings.
    #[cold]
    fn read_env(&self) {
        let d = env_detection(&self.detect.warned);
        self.detect.set(d);
        self.slots.set_mode(mode_of(d), true);
        self.slots.set_mode(mode::ENV, false);
    }
}
