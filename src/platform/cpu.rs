//! CPU and node identity: which per-CPU slot the caller may use, and
//! which group it allocates for.

use crate::sync::{AtomicBool, AtomicPtr, Ordering, atomic_bool, atomic_null, spin_hint};

/// Per-CPU slots a `Kmem` keeps magazines for: 64, or 32 on 32-bit
/// targets (a slot mask is one `usize`); 2 under loom, 8 under Miri (a
/// user's test run there has a thread per test and the harness's).
pub const MAX_CPUS: usize = if cfg!(loom) {
    2
} else if cfg!(miri) {
    8
} else if usize::BITS < 64 {
    32
} else {
    64
};

/// The slot for the `i`-th CPU (or claimer) of a platform, `i` below
/// [`MAX_CPUS`]: 0, 2, 4, … for the first half, then 1, 3, 5, ….
///
/// The magazine layer keeps slot `s`'s entry of each cache at `s` in an
/// array, two slots to a cache line (`2k` with `2k + 1`: indexing by the
/// slot itself is what keeps the fast path a shift and a load), and writes
/// it on every operation. Slots in use at once should not share a line,
/// or the line moves between their CPUs on each allocation (a 2x slower
/// cross-thread free, measured). A platform that numbers its CPUs through
/// this function keeps the first `MAX_CPUS / 2` of them on lines of their
/// own; [`NoCpus`] has one slot, `Threads` claims slots in this order,
/// `PerCpu` and `Rseq` give CPU `i` this slot. A permutation of
/// `0..MAX_CPUS`, undone by [`cpu_for_slot`]; an `i` of [`MAX_CPUS`] or
/// more may alias a CPU below it (`slot_for_cpu(64)` is 2 with 64 slots), so a
/// platform checks `i < MAX_CPUS` first, as `PerCpu` does (such a CPU gets
/// no slot).
#[inline(always)]
#[allow(clippy::modulo_one)] // `HALF` is 1 under loom (two slots)
pub const fn slot_for_cpu(i: usize) -> usize {
    (i % HALF) * 2 + i / HALF
}

/// The CPU (or claim order) `i` whose slot is `slot`: the inverse of
/// [`slot_for_cpu`] on `0..MAX_CPUS`.
#[inline(always)]
pub const fn cpu_for_slot(slot: usize) -> usize {
    (slot % 2) * HALF + slot / 2
}

/// Half the slots (1 when there are fewer than two).
const HALF: usize = if MAX_CPUS > 1 { MAX_CPUS / 2 } else { 1 };

static_assertions::const_assert!(MAX_CPUS.is_multiple_of(2) || MAX_CPUS == 1);

/// Tells the allocator which per-CPU slot the calling context owns.
///
/// The magazine layer keeps one pair of magazines per slot and cache and
/// touches them with plain loads and stores; the platform's job is to make
/// sure only one context uses a slot at a time. A platform with a slot
/// per CPU should give CPU `i` slot [`slot_for_cpu`]`(i)`, so that CPUs
/// running at once write separate cache lines (slots `2k` and `2k + 1`
/// share one).
///
/// # Safety
///
/// An implementation must guarantee that:
/// 1. `enter` and `try_enter` return `None` or a slot below [`MAX_CPUS`] that no other
///    context holds until the caller's matching `exit`; the caller is not
///    re-entered in between (an interrupt handler that allocates must be
///    masked by `enter`, or get another slot);
/// 2. `node_of` returns a value below [`crate::MAX_NODES`], the same for a
///    slot for as long as it is held;
/// 3. if `asymmetric()` ever returns `true`, it returns `true` from before
///    the first slot is handed out, and `heavy_barrier` then acts as a full
///    memory barrier on every context that holds a slot (Linux `membarrier`
///    semantics), or waits until no context holds one and synchronizes
///    with every holder before and after it (a platform whose slots are
///    try-locks, as [`NoCpus`]'s), so slot holders may use compiler fences
///    only; `try_heavy_barrier` returns `true` only after such a barrier
///    ran (`false` lets the caller give its drain up); `try_enter`
///    returns a slot only once `asymmetric()` is true (under Miri the
///    fast paths make the full fence themselves, so there it may return
///    one either way, as `Threads` does);
/// 4. `steal(slot)` returns `true` only for a slot no context holds, and
///    then no `enter` returns it until `unsteal(slot)`; so does
///    `try_steal(slot)`, which returns at once (`false`) where a context
///    holds the slot;
/// 5. nothing here allocates, panics, or calls back into the allocator;
/// 6. `current_group` returns the last token the calling context (thread,
///    task) passed to `set_current_group`, unchanged (the same pointer,
///    with its provenance), or null if it never did; or, in a context
///    where the platform keeps no token (`PerCpu` on a CPU without a
///    slot), `set_current_group` hands the token it was given straight
///    back and `current_group` returns null: such a context charges the
///    root, and runs no callback of the allocator (it cannot be marked as
///    running one);
/// 7. if `slots_are_locks()` returns `true`, it always does, `asymmetric()`
///    is `true`, a context holds a slot from an acquiring read-modify-write
///    in `enter` or `try_enter` (for [`crate::Rseq`], an rseq critical
///    section whose commit stores the lock, which only a context running
///    on the slot's CPU can make; its `steal` follows its compare-and-swap
///    with a barrier that restarts such sections, see its module) to a
///    releasing store in `exit`, and
///    `heavy_barrier` takes and releases every slot's lock in turn (the
///    same way), and `steal(slot)` takes the slot's lock (the same way)
///    whenever no context holds it: a drain waits for a held slot by
///    calling `steal` until it succeeds, so holders and drainers are
///    ordered by those locks alone;
/// 8. `rseq_fast` returns `None` (the default, and all an implementation
///    outside this crate can return).
pub unsafe trait Platform: Sync {
    /// The calling context's current group token (null: the root group).
    /// A token is opaque to the platform: it only stores it.
    fn current_group(&self) -> *const ();
    /// Makes `token` the calling context's current group; returns the
    /// previous token.
    ///
    /// # Safety
    ///
    /// A token holds a reference on the group it names, and the allocator
    /// follows it on every allocation, so the caller must:
    /// 1. pass null, or a token this platform returned (from
    ///    `current_group` or `set_current_group`) whose reference the
    ///    caller owns and hands over: a kernel's context switch passes the
    ///    token it saved for the incoming task, saved when that task was
    ///    switched out (see [`crate::PerCpu`]), and a platform that wraps
    ///    another forwards the allocator's own calls;
    /// 2. take over the reference of the token it gets back (keep it, for
    ///    the task switched out, and pass it back later), never drop it.
    ///
    /// The allocator makes its own calls through this contract.
    unsafe fn set_current_group(&self, token: *const ()) -> *const ();

    /// Makes `new` the calling context's current group token if the
    /// token is still `current`; returns whether it did. The allocator
    /// uses it to change a token's marks (the low bits, see
    /// `cgroup::marks`), never its group.
    ///
    /// The default reads the token and sets it, which is exact on a
    /// platform whose token only the calling context changes (a thread's,
    /// a CPU's, where an interrupt restores what it changed before it
    /// returns). A platform whose contexts share one token word must
    /// override it with a compare-and-swap, as [`crate::NoCpus`] does:
    /// otherwise another context's swap between the read and the write
    /// is undone, and a group's reference is lost or released twice.
    ///
    /// # Safety
    ///
    /// `new` names the group `current` names, with the same reference
    /// (they differ in their marks only).
    unsafe fn retag_current_group(&self, current: *const (), new: *const ()) -> bool {
        if self.current_group() != current {
            return false;
        }
        // SAFETY: per the contract, `new` carries the reference the
        // current token (`current`) holds, and what comes back is that
        // token, whose reference `new` now holds.
        unsafe { self.set_current_group(new) };
        true
    }

    /// The calling context's slot, held until [`Platform::exit`]; `None`
    /// sends the operation to the shared (locked) path.
    ///
    /// The allocator holds one slot at a time and calls `enter` (and
    /// `try_enter`) only outside a hold, so between holds a context's slot
    /// is not in use: `enter` may hand it another slot than last time,
    /// take its slot away, or make it wait for one (`Threads` does all
    /// three to share slots among more threads than [`MAX_CPUS`]).
    ///
    /// # Safety
    ///
    /// Only the allocator (or a platform forwarding the allocator's calls)
    /// calls it: the calling context holds no slot of this platform, and
    /// releases the one it gets with `exit` before it enters again; while
    /// it holds it, nothing else on this context uses the platform's slots.
    unsafe fn enter(&self) -> Option<usize>;
    /// [`Platform::enter`] for the allocator's fast paths, which order
    /// their half of the slot handshake with a compiler fence only: it
    /// returns a slot only while [`Platform::asymmetric`] is true (so a
    /// drainer's heavy barrier completes the fence), and may return `None`
    /// wherever `enter` would first do work (claim a slot, or account for
    /// the slot's use); the caller then takes its slow path, which calls
    /// `enter`. A slot it returns is held exactly as one from `enter`,
    /// until `exit`.
    ///
    /// # Safety
    ///
    /// As for [`Platform::enter`].
    #[inline(always)]
    unsafe fn try_enter(&self) -> Option<usize> {
        // SAFETY: forwarded.
        if self.asymmetric() { unsafe { self.enter() } } else { None }
    }
    /// Ends the hold of `slot` taken by `enter`.
    ///
    /// # Safety
    ///
    /// `slot` was returned to the calling context by `enter` or
    /// `try_enter`, and not exited since.
    unsafe fn exit(&self, slot: usize);
    /// The NUMA node of `slot`.
    fn node_of(&self, _slot: usize) -> usize {
        0
    }
    /// Number of nodes in use; 1 lets frees skip the home-node check.
    /// More than [`crate::MAX_NODES`] counts as that many.
    fn nodes(&self) -> usize {
        1
    }
    /// Whether [`Platform::heavy_barrier`] is an asymmetric barrier.
    fn asymmetric(&self) -> bool {
        false
    }
    /// Whether every slot is a lock (contract point 7): the allocator's
    /// slot handshake then marks nothing of its own while a slot is held.
    fn slots_are_locks(&self) -> bool {
        false
    }
    /// Whether `enter` and `try_enter` only ever return slot 0, as
    /// [`NoCpus`]'s do (a constant). A hint for code generation, which no safety
    /// argument relies on: the magazine layer then leaves the offset (0)
    /// of the slot's magazines to the compiler to fold away, where
    /// elsewhere it forms their address in a register of its own (one
    /// instruction an access, for faster store forwarding on x86_64). The
    /// slot's byte stock (grouped paths) is formed either way.
    #[inline(always)]
    fn one_slot(&self) -> bool {
        false
    }
    /// A full barrier on every slot holder (only when `asymmetric`).
    fn heavy_barrier(&self) {}
    /// [`Platform::heavy_barrier`] for a drain that may be skipped (a
    /// reap, which gives back what nobody uses): `false` when the barrier
    /// could not be run, and that drain is then given up instead of going
    /// on. `true` only once a full barrier ran, as `heavy_barrier`
    /// guarantees. The default runs `heavy_barrier`.
    fn try_heavy_barrier(&self) -> bool {
        self.heavy_barrier();
        true
    }
    /// Takes a slot that nobody holds, to drain it; see the contract.
    ///
    /// # Safety
    ///
    /// Only the allocator's drains call it: while the caller has the slot,
    /// it may touch the slot's per-CPU state of this platform's allocator,
    /// and it gives the slot back with `unsteal`.
    unsafe fn steal(&self, _slot: usize) -> bool {
        false
    }
    /// [`Platform::steal`] for a reap, which waits for nobody: `false` at
    /// once where a context holds the slot. The default is `steal`, for
    /// platforms whose `steal` never waits.
    ///
    /// # Safety
    ///
    /// As for [`Platform::steal`].
    unsafe fn try_steal(&self, slot: usize) -> bool {
        // SAFETY: forwarded.
        unsafe { self.steal(slot) }
    }
    /// Gives back a slot taken by `steal` or `try_steal`.
    ///
    /// # Safety
    ///
    /// The caller took `slot` with `steal` or `try_steal` (which returned
    /// `true`) and has not given it back since.
    unsafe fn unsteal(&self, _slot: usize) {}
    /// Keeps other contexts off the calling CPU while the allocator holds
    /// a flag that other contexts wait for, until [`Platform::unmask`]
    /// with the value returned: a slot's drain flag, from before a drain
    /// takes it until after it lets it go (the drain of one slot's
    /// magazines and byte stock: bounded work), and a `Kmem`'s first use,
    /// while it fits its caches to the page source. A context that waits
    /// for such a flag (group removal, reclaim, `shrink`) may do so under
    /// the allocator's locks; where those mask interrupts
    /// ([`crate::PerCpu`] with [`crate::IrqSpinLock`]), a holder preempted
    /// with the flag would hang such a waiter on its CPU for good.
    /// `PerCpu` masks local interrupts. The default does nothing, for
    /// platforms whose waiters yield or can be preempted (threads).
    #[inline(always)]
    fn mask(&self) -> usize {
        0
    }
    /// Ends what [`Platform::mask`] began.
    ///
    /// # Safety
    ///
    /// `saved` is what `mask` returned to the calling context, and
    /// the masks it took since were all ended (in reverse order).
    #[inline(always)]
    unsafe fn unmask(&self, _saved: usize) {}
    /// Whether the caller runs in interrupt context: its allocations are
    /// then *atomic* (no reclaim, no shrinkers, no tree lock) and charged
    /// to the root.
    #[inline(always)]
    fn in_interrupt(&self) -> bool {
        false
    }
    /// A monotonic clock in milliseconds that advances, if the platform
    /// has one: the allocator's decay ([`crate::Decay`]) then returns idle
    /// memory after a time (without one, after a count of slow-path
    /// operations), and guard-page sampling alone arms at most one sample
    /// a millisecond (a clock that stood still would stop it after the
    /// first). Called at most once per 256 slow paths by decay, and by
    /// sampling once per sampling period (about `n / 32` slow paths at one
    /// allocation in `n`, `n >= 256`); must not allocate or block.
    fn now_ms(&self) -> Option<u64> {
        None
    }
    /// Delays the calling task by about `ns` nanoseconds: the `high`
    /// throttle, for a task whose group stays above its `high` after the
    /// task reclaimed from it (see `Cgroup::set_high`). Called only from a
    /// task's own context: never in interrupt context (see
    /// [`Platform::in_interrupt`]), in an atomic scope, or from a shrinker
    /// or an event hook; never with an allocator lock or slot held; with
    /// `ns` at most `HIGH_DELAY_MAX_NS` (100 ms). A sleep, or a yield for
    /// as long. The default does nothing: no throttling.
    fn throttle(&self, _ns: u64) {}
    /// Where the slots are CPUs held through restartable sequences (only
    /// [`crate::Rseq`]'s, whose module docs give the protocol): what the
    /// magazine layer's fast paths need to pop and push inside an rseq
    /// critical section of their own, which checks the CPU's lock and
    /// commits with the magazine's count. `None`, the default, elsewhere;
    /// no other implementation can return anything else ([`RseqFast`]
    /// cannot be built outside this crate).
    #[doc(hidden)]
    #[inline(always)]
    fn rseq_fast(&self) -> Option<RseqFast> {
        None
    }
}

/// What [`Platform::rseq_fast`] hands the magazine layer: glibc's rseq
/// offset and the address of the platform's lock state (its `limit`, then
/// the per-CPU locks). Built only by `Rseq`.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
// Its fields are read only where the fast paths' sections are built.
#[cfg_attr(
    not(all(feature = "std", target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri), not(loom))),
    allow(dead_code)
)]
pub struct RseqFast {
    /// `__rseq_offset`: this thread's `struct rseq` from the thread
    /// pointer.
    pub(crate) off: isize,
    /// `Rseq`'s `STATE`.
    pub(crate) state: *const u8,
}

/// A platform for one context (a single-threaded kernel or program): one
/// CPU slot, taken with a compare-and-swap (a try-lock: a second context that
/// finds it taken, an interrupt handler say, takes the shared, locked
/// path), and a current group per thread with `std`, one for the whole
/// program without. The default without `std`; kernels with several CPUs
/// supply their own ([`crate::PerCpu`]).
///
/// Its magazines serve allocations as any platform's do, on the fast path
/// (it is *asymmetric*: its heavy barrier takes and gives back the slot,
/// so a drain waits for the one holder to finish its operation, and the
/// next holder sees the drain).
///
/// The current group token: an allocation reads it and uses its group
/// without a reference of its own, so only the context that swaps the
/// token may allocate with it. With `std`, safe code can share a
/// `NoCpus` among threads, so each thread keeps its own token, as
/// `Threads` does (one thread's guard drop once released the group another
/// thread was allocating in). Without `std` there is one token, an atomic:
/// a kernel that runs several contexts on one `NoCpus` (made so by its own
/// `unsafe` code) must enter groups from one of them only, with interrupt
/// handlers restoring what they change, or use a per-CPU platform. The
/// token's references stay exact whatever the contexts do: swaps are
/// atomic, and the allocator changes a token's marks (atomic scopes,
/// callbacks) by compare-and-swap ([`Platform::retag_current_group`]).
#[derive(Debug, Default)]
pub struct NoCpus {
    /// The token without `std` (with it, `NOCPUS_GROUP`).
    #[cfg_attr(feature = "std", allow(dead_code))]
    current: AtomicPtr<()>,
    /// Whether slot 0 is held (by the context, or stolen by a drain):
    /// taken by CAS with `Acquire`, given back with `Release`, so
    /// each holder adopts the magazines the previous one left.
    busy: AtomicBool,
}

impl NoCpus {
    /// The platform.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        NoCpus { current: atomic_null(), busy: atomic_bool(false) }
    }

    /// The platform (loom: not `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        NoCpus { current: atomic_null(), busy: atomic_bool(false) }
    }
}

#[cfg(all(feature = "std", not(loom)))]
std::thread_local! {
    /// This thread's token for every `NoCpus` (with `std`).
    static NOCPUS_GROUP: core::cell::Cell<*const ()> = const { core::cell::Cell::new(core::ptr::null()) };
}

#[cfg(all(feature = "std", loom))]
crate::sync::model_thread_local! {
    /// This model thread's token for every `NoCpus` (with `std`).
    static NOCPUS_GROUP: core::cell::Cell<*const ()> = core::cell::Cell::new(core::ptr::null());
}

// SAFETY: (1) slot 0 is handed out only by the CAS that found `busy`
// false, and `exit` frees it: one holder at a time, whichever context;
// (2) node 0 is valid; (3) always asymmetric, and `heavy_barrier` takes
// `busy` and gives it back: it returns only after the holder (if any) has
// left (its writes before `exit`'s `Release` are visible to our
// `Acquire`), and every later holder's `Acquire` CAS sees what the caller
// wrote before (our `Release`), which is what a barrier on every holder
// gives the slot handshake; (4) `steal` takes `busy` by CAS, so no `enter`
// returns the slot until `unsteal` frees it; (5) only atomics, and a spin
// bounded by one operation of the holder; (6) with `std`, a per-thread
// cell; without, one global context, whose token is the atomic.
unsafe impl Platform for NoCpus {
    #[cfg(feature = "std")]
    fn current_group(&self) -> *const () {
        NOCPUS_GROUP.try_with(core::cell::Cell::get).unwrap_or(core::ptr::null())
    }
    #[cfg(feature = "std")]
    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        NOCPUS_GROUP.try_with(|g| g.replace(token)).unwrap_or(core::ptr::null())
    }
    #[cfg(not(feature = "std"))]
    fn current_group(&self) -> *const () {
        self.current.load(Ordering::Relaxed)
    }
    #[cfg(not(feature = "std"))]
    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        self.current.swap(token.cast_mut(), Ordering::Relaxed)
    }
    /// Without `std`, a compare-and-swap: every context shares the one
    /// token, so another may swap it between a read and a write.
    #[cfg(not(feature = "std"))]
    unsafe fn retag_current_group(&self, current: *const (), new: *const ()) -> bool {
        self.current.compare_exchange(current.cast_mut(), new.cast_mut(), Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
    #[inline(always)]
    unsafe fn enter(&self) -> Option<usize> {
        // Acquire: the previous holder's magazine writes. A CAS, which
        // writes only when it takes the slot: with a swap (which writes
        // `true` again over a taken slot) a loom 0.7 model of two threads
        // entering and exiting ended with the slot taken.
        self.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok().map(|_| 0)
    }
    #[inline(always)]
    unsafe fn exit(&self, _slot: usize) {
        // Release: the next holder (or drain) sees our magazine writes.
        self.busy.store(false, Ordering::Release);
    }
    #[inline(always)]
    fn asymmetric(&self) -> bool {
        true
    }
    #[inline(always)]
    fn slots_are_locks(&self) -> bool {
        true
    }
    #[inline(always)]
    fn one_slot(&self) -> bool {
        true
    }
    fn heavy_barrier(&self) {
        while self.busy.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            spin_hint();
        }
        self.busy.store(false, Ordering::Release);
    }
    unsafe fn steal(&self, _slot: usize) -> bool {
        self.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }
    unsafe fn unsteal(&self, _slot: usize) {
        self.busy.store(false, Ordering::Release);
    }
}
