//! Magazine layer: per-CPU magazines and per-node depots (Bonwick & Adams,
//! "Magazines and Vmem", USENIX 2001; Linux SLUB's sheaves and barns).
//!
//! Every cache keeps, per CPU slot, a *loaded* and a *previous* magazine (a
//! stack of free objects), and per node a *depot* of full and empty
//! magazines. Allocation pops from `loaded`; when it is empty it swaps with
//! `previous`, then trades with the depot, then refills a whole magazine
//! from the slot's node-local slabs in one lock hold. Free mirrors it, and
//! when the depot holds [`DEPOT_FULL_MAX`] full magazines it flushes one to
//! the slabs instead of growing. A free of an object from another node goes
//! straight back to its home node's slabs.
//!
//! # The slot protocol
//!
//! A slot's magazines are touched with plain loads and stores, by the
//! context the [`Platform`] says holds the slot, bracketed by a handshake
//! with *drainers* (reap, `drain`, and later group removal) that must empty
//! another CPU's magazines:
//!
//! | holder | drainer |
//! | --- | --- |
//! | `state = HELD` (Relaxed) | take `drainers` lock |
//! | light fence | `word += DRAIN` (Relaxed read-modify-write) |
//! | read `word` (Acquire); if it counts a drain: `state = USED`, use the shared path | heavy fence |
//! | ... magazines ... | wait for `state != HELD` (Acquire), a few reads |
//! | `state = USED` (Release) | ... magazines ... ; `word -= DRAIN` (Release) |
//!
//! A holder still `HELD` after those few reads may have been preempted
//! inside its operation (or be in a slow path that holds the slot across
//! a refill): the drainer takes its count back (`word -= DRAIN`; a holder
//! that saw it meanwhile only took the shared path once), waits a bounded
//! while (a few yields of the CPU) for the hold to end, and starts over
//! from the count, reading twice as many times each round; after four
//! rounds it keeps the count up and waits for the hold in flight, so no
//! holder starves it.
//!
//! This is Dekker's pattern: each side stores its mark, fences, and reads
//! the other's, so they cannot both proceed. The drainer's mark is a count
//! in `Slots::word`, the word that also holds the allocation paths' mode
//! bits (`cgroup::mode`): one load after the holder's mark tells a fast
//! path both whether a drain runs and whether the mode is plain, and a
//! holder that finds mode bits but no drain may go on under its hold (the
//! grouped paths do). Every holder, of any slot, backs off while a drain
//! runs; drains are short and rare, and the count is withdrawn while a
//! drain waits for a holder preempted in its operation (that wait lasts
//! until the scheduler runs the holder again: `examples/drain_cost.rs`). The word is only written by
//! read-modify-writes, so a holder's `Acquire` load that reads a later
//! value than a drain's end still synchronises with it. With an asymmetric platform
//! (Linux `membarrier`) the holder's fence is a compiler fence and the
//! drainer's `heavy_barrier` makes it a full one on every CPU, so the fast
//! path has no atomic read-modify-write and no hardware fence; otherwise
//! both sides use `fence(SeqCst)`. The fast paths get their slot from
//! [`Platform::try_enter`], which hands one out only on an asymmetric
//! platform, so they use the compiler fence without asking; everything
//! else enters through `enter` and asks. A slot nobody holds is *stolen*
//! through the platform instead.
//!
//! Where slots are locks ([`Platform::slots_are_locks`]: `NoCpus`, and
//! `PerCpu` without `Cpu::BARRIER`, whose slots are try-locks taken with
//! interrupts masked) the lock is the handshake: the holder marks and
//! checks nothing, and a drainer always *steals*, waiting out the hold in
//! progress (a few instructions) until `steal` takes the lock. Only the
//! `USED` mark for reap remains, a plain store.
//!
//! # The fast paths
//!
//! A hit touches the slot's handshake line, the cache's `CpuMags` for the
//! slot (the loaded magazine's top, floor and ceiling; no other busy slot
//! shares its line) and one round of the loaded magazine, with no call
//! and no stack frame: a `GlobalAlloc` hit, the size-class lookup
//! included, is 26 instructions to allocate and 25 to free under
//! callgrind (`__rust_alloc` and `__rust_dealloc` in `scripts/icount.sh`'s
//! `box` case; jemalloc's, in an earlier count: 33 and 36). Every other case (no slot yet, an
//! empty or full magazine, a remote-node free, a drain racing) goes out
//! of line. Loom checks the protocol with full fences on both sides
//! (`src/tests/loom_magazine.rs`).
//!
//! On the `Rseq` platform (Linux x86_64; [`Platform::rseq_fast`]) a hit
//! holds no slot at all: the pop and the push are restartable sequences
//! of their own (`cpu_mags::rseq_ops`) that read the CPU's id, check that
//! CPU's slot lock is free with no drainer waiting, and commit with the
//! store of the magazine's count; the kernel restarts them if the thread
//! is preempted, migrated or signalled first. Slow paths and drains hold
//! the lock as on any platform where slots are locks. Loom and Miri
//! cannot run these sequences; `tests/rseq.rs` races them against drains
//! and forced migrations instead.
//!
//! Accounting equation per cache: objects out of the slabs = objects in
//! loaded/previous magazines + objects in depot magazines + live objects.

use core::mem::{align_of, offset_of, size_of};
use core::ptr::NonNull;

use crossbeam_utils::CachePadded;
use lock_api::{Mutex, RawMutex};

use crate::counter::PageCounter;
use crate::platform::{MAX_CPUS, MAX_NODES, PageSource, Platform};
use crate::slab::{Cache, CacheStats, Geometry, GrowError, Pages};
use crate::sync::{
    AtomicBool, AtomicPtr, AtomicUsize, CellArray, Ordering, UnsafeCell, atomic_bool, atomic_null, atomic_usize, fence,
    formed_address, loom_const_fn, repeat,
};

mod cpu_mags;
mod depot;
mod drain;
mod refill;
mod slots;
mod stock;

use cpu_mags::{CpuMags, Spilled};
use depot::Depot;
pub(crate) use drain::{drain_many, reap_slots};
pub use slots::SlotStats;
pub(crate) use slots::{DRAINS, Hold, Slots};
pub(crate) use stock::{Stock, Stocks};

static_assertions::const_assert!(MAX_CPUS <= usize::BITS as usize);
// One shift of the slot (none on `Threads`, whose fast-path word is the
// slot times 32) indexes a cache's per-slot magazines, the slot's
// handshake state and its byte stock alike (see `SlotSync`): their strides
// must stay equal. (Loom's atomics are larger; its models do not count
// instructions.)
#[cfg(all(target_pointer_width = "64", not(loom)))]
static_assertions::const_assert!(size_of::<CpuMags>() == 32 && size_of::<slots::SlotSync>() == 32);

/// Rounds in the largest magazine: 4 under loom and in the crate's own
/// tests under Miri, so models and unit tests reach the slow paths often;
/// 64 in a user's program under Miri, where every slow path's interpreted
/// work (and its Stacked Borrows retags) is what their test run waits on.
pub(crate) const MAG_MAX: usize = if cfg!(any(loom, all(miri, test))) { 4 } else { 64 };
/// The most full magazines a depot keeps per node before frees flush to
/// slabs (fewer for large objects: see [`depot_full_max`]).
pub(crate) const DEPOT_FULL_MAX: usize = if cfg!(any(loom, miri)) { 1 } else { 16 };
/// Bytes of free objects a depot may hold per node and cache.
const DEPOT_BYTES: usize = 32 << 10;

/// Full magazines a depot of `rounds`-round magazines of `size`-byte objects
/// keeps: about [`DEPOT_BYTES`] worth, at least 2, at most [`DEPOT_FULL_MAX`].
pub(crate) const fn depot_full_max(size: usize, rounds: usize) -> usize {
    let n = DEPOT_BYTES / (size * rounds);
    let n = if n < 2 { 2 } else { n };
    if n > DEPOT_FULL_MAX { DEPOT_FULL_MAX } else { n }
}

/// A stack of free objects of one cache.
#[repr(C)]
pub(crate) struct Magazine {
    next: *mut Magazine,
    count: usize,
    rounds: [*mut u8; MAG_MAX],
}

/// Geometry of the internal cache magazines live in.
pub(crate) const MAGAZINE_GEOMETRY: Geometry = match Geometry::new(size_of::<Magazine>(), align_of::<Magazine>()) {
    Some(g) => g,
    None => panic!("magazine does not fit a slab"),
};

/// Rounds per magazine for objects of `size` bytes: fewer for larger
/// objects, bounding what a CPU can hold (2 magazines) to about 32 KiB.
pub(crate) const fn rounds_for(size: usize) -> usize {
    let r = if size <= 256 {
        64
    } else if size <= 1024 {
        32
    } else if size <= 4096 {
        8
    } else {
        4
    };
    if r > MAG_MAX { MAG_MAX } else { r }
}

/// What a cache operation needs from the layers around it: the page
/// source, the platform, the slot handshakes and the internal cache that
/// magazines live in. `Kmem` implements it; loom models build a small one.
pub(crate) trait Env<R: RawMutex> {
    /// The page source.
    type Src: PageSource;
    /// The platform.
    type Plat: Platform;
    fn src(&self) -> &Self::Src;
    fn plat(&self) -> &Self::Plat;
    fn slots(&self) -> &Slots;
    fn mags(&self) -> &Cache<R>;
    /// The counter of the root group, charged by [`Acct::Root`] caches.
    fn root_counter(&self) -> &PageCounter;
    /// Called first on every slow path, before anything that slabs,
    /// groups or descriptors point back to is touched: `Kmem` stops the
    /// program there if it was moved after its first use (see
    /// `Kmem::settle`).
    #[inline(always)]
    fn settle(&self) {}
    /// Gives back to their caches the objects freed by their users but
    /// held back from them (the heap's detection quarantine), so that
    /// reclaim and cache destruction that follow can empty their slabs.
    /// Called with no allocator lock held, never in atomic context.
    fn flush_deferred(&self) {}
    /// Waits (a bounded while) until objects another thread took out of
    /// the deferral to give back are back in their caches, and that thread
    /// is done with their caches: what [`Env::flush_deferred`] found
    /// missing may be on its way. Whether it saw none left.
    fn settle_deferred(&self) -> bool {
        true
    }
    /// Whether no object is on its way back from the deferral now (no
    /// wait): a cache destroyed before may be retired only then, for a
    /// thread giving one back may still be inside its cache after the
    /// object's slab went.
    fn deferred_settled(&self) -> bool {
        true
    }
}

/// Who a cache charges for its slabs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acct {
    /// Nobody: allocator metadata and caches created without accounting.
    None,
    /// The root group (the size classes and accounted typed caches used
    /// outside any group).
    Root,
}

/// What [`MagCache::alloc_fast_charged`] did.
pub(crate) enum ChargedPop {
    /// Charged, and an object from the loaded magazine.
    Hit(NonNull<u8>),
    /// Charged, but the loaded magazine was empty: the charge is the
    /// caller's to use or give back.
    Charged,
    /// Nothing done (no slot, or the stock could not charge).
    Uncharged,
}

/// What [`MagCache::free_fast_charged`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChargedPush {
    /// Uncharged and pushed: done.
    Pushed,
    /// Uncharged, but not pushed: the object is the caller's to free.
    Uncharged,
    /// The stock could not take the bytes: nothing done, and the caller
    /// still holds this slot.
    Refused(usize),
    /// Nothing done: no slot.
    NoSlot,
}

/// Magazine counters of a cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MagazineStats {
    /// Rounds per magazine.
    pub rounds: usize,
    /// Full magazines in the depots.
    pub depot_full: usize,
    /// Empty magazines in the depots.
    pub depot_empty: usize,
}

/// A slab cache with per-CPU magazines in front of it.
///
/// `repr(C)` with the slab cache first: a slab header's cache pointer is
/// then also a pointer to its `MagCache`, which is how a free finds the
/// (group's) cache that owns an object.
#[repr(C)]
pub(crate) struct MagCache<R: RawMutex> {
    pub(crate) cache: Cache<R>,
    /// Who is charged for this cache's slabs.
    pub(crate) acct: Acct,
    rounds: usize,
    /// Full magazines each depot keeps before frees flush to slabs.
    depot_max: usize,
    /// Bit `s` is set while slot `s` may hold magazines of this cache, so
    /// drains skip the others. Set by the holder on its slow path, before
    /// it installs a magazine; cleared by a drainer once it has the slot
    /// (after its handshake or steal, in `empty_slot`), just before it
    /// takes the magazines: no magazine can be installed meanwhile, and
    /// one installed after the drain sets the bit again.
    used_slots: AtomicUsize,
    /// Bit `s` is set when slot `s` took a slow path on this cache since
    /// the last reap (set with `used_slots`; taken whole by `reap`): a
    /// reap drains a held slot's magazines of a cache it left alone, as
    /// Bonwick's reap returns what a working-set interval did not use.
    /// Only a hint: a drain is safe whenever it runs.
    active_slots: AtomicUsize,
    /// Set for good the first time a slot takes a slow path on this cache
    /// (in `note_slot`, before its fence): until then no slot or depot
    /// holds a magazine of it, and with no slabs either it holds nothing
    /// at all, so shrink, reap and drains pass it by ([`MagCache::idle`])
    /// instead of locking each of its nodes (the 43 size classes of an
    /// allocator that uses a few).
    touched: AtomicBool,
    /// A link for the owner's list of caches waiting to be freed (unused
    /// by this layer).
    pub(crate) retired_next: AtomicPtr<MagCache<R>>,
    /// The charged cache that serves groups' objects of this cache, once
    /// the owner made it (unused by this layer): beside the cache, so an
    /// accounted hit finds it with one load from the cache it already has.
    pub(crate) charged: AtomicPtr<MagCache<R>>,
    cpus: CellArray<UnsafeCell<CpuMags>, MAX_CPUS>,
    depots: CellArray<CachePadded<Mutex<R, Depot>>, MAX_NODES>,
}

// Unwind safe as the `Kmem` around it is (see there): its cells are
// touched only under the slot protocol and its locks, by code that calls
// no user code part way through an update.
impl<R: RawMutex> core::panic::RefUnwindSafe for MagCache<R> {}

// SAFETY: a slot's `CpuMags` is touched only by the context holding the
// slot (platform contract), by a drainer that completed the handshake, or
// (on `Rseq`) by an rseq section that found the slot's lock free and is
// restarted by the kernel before its commit if anything else could have
// run on that CPU (see `cpu_mags::rseq_ops`); everything else is behind
// locks. Magazine pointers are owned by exactly
// one of: a slot, a depot, a drainer.
unsafe impl<R: RawMutex + Sync> Sync for MagCache<R> {}
// SAFETY: as above; nothing is tied to the creating thread.
unsafe impl<R: RawMutex + Send> Send for MagCache<R> {}

impl<R: RawMutex> MagCache<R> {
    /// Slab geometry of the internal cache charged caches live in.
    pub(crate) const GEOMETRY: Geometry = match Geometry::new(size_of::<Self>(), align_of::<Self>()) {
        Some(g) => g,
        None => panic!("MagCache does not fit a slab"),
    };

    loom_const_fn! {
        /// A cache of `geo` objects with empty magazines.
        pub(crate) fn new(geo: Geometry, acct: Acct) -> Self {
            MagCache {
                cache: Cache::new(geo),
                acct,
                rounds: rounds_for(geo.size),
                depot_max: depot_full_max(geo.size, rounds_for(geo.size)),
                used_slots: atomic_usize(0),
                active_slots: atomic_usize(0),
                touched: atomic_bool(false),
                retired_next: atomic_null(),
                charged: atomic_null(),
                cpus: CellArray::new(repeat!(UnsafeCell::new(CpuMags::EMPTY); MAX_CPUS)),
                depots: CellArray::new(repeat!(CachePadded::new(Mutex::const_new(R::INIT, Depot::new())); MAX_NODES)),
            }
        }
    }

    /// Records that `slot` may hold magazines of this cache (slow path).
    /// The fence once paired with a dead-cache flag that group removal set
    /// (found by loom: without it a magazine could outlive the removal's
    /// drain); charged caches are shared since and never die with a group.
    /// It is kept, on slow paths only: the marks are ordered before
    /// whatever the slow path does next.
    #[inline]
    fn note_slot(&self, slot: usize) {
        let bit = 1usize << slot;
        if self.used_slots.load(Ordering::Relaxed) & bit == 0 {
            self.used_slots.fetch_or(bit, Ordering::Relaxed);
        }
        if self.active_slots.load(Ordering::Relaxed) & bit == 0 {
            self.active_slots.fetch_or(bit, Ordering::Relaxed);
        }
        if !self.touched.load(Ordering::Relaxed) {
            self.touched.store(true, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
    }

    /// Whether the cache holds nothing: never had a magazine (see
    /// `touched`) and has no slab, so no object, full or empty magazine
    /// or empty slab of it exists. A snapshot, set before `note_slot`'s
    /// fence as the slot bits are.
    #[inline]
    pub(crate) fn idle(&self) -> bool {
        !self.touched.load(Ordering::Relaxed) && self.cache.nslabs() == 0
    }

    /// The counter this cache's slabs are charged to, if any.
    #[inline]
    pub(crate) fn counter<'a, E: Env<R>>(&'a self, cx: &'a E) -> Option<&'a PageCounter> {
        match self.acct {
            Acct::None => None,
            Acct::Root => Some(cx.root_counter()),
        }
    }

    /// The page supply of this cache: its source and the counter charged.
    #[inline]
    pub(crate) fn pages<'a, E: Env<R>>(&'a self, cx: &'a E, slot: Option<usize>) -> Pages<'a, E::Src> {
        let counter = self.counter(cx);
        Pages { src: cx.src(), counter, slot, owner: (self as *const Self).cast(), overdraft: 0 }
    }

    /// One object: from this CPU's loaded magazine when it holds a slot
    /// and the magazine has one, else through [`MagCache::alloc_slow`].
    /// The fast path returns a plain pointer, so a hit costs no error
    /// plumbing.
    #[inline(always)]
    pub(crate) fn alloc<E: Env<R>>(&self, cx: &E) -> Result<NonNull<u8>, GrowError> {
        match self.alloc_fast(cx) {
            Some(p) => Ok(p),
            None => self.alloc_slow(cx),
        }
    }

    /// The magazines of `slot`, `&self.cpus[slot]`, with the address
    /// formed in a register of its own (see [`formed_address`]): the fast
    /// paths' loads of `top` read the last operation's store of it. On a
    /// platform of one slot ([`Platform::one_slot`]) the compiler's own
    /// address, a constant offset.
    ///
    /// # Safety
    ///
    /// `slot < MAX_CPUS`.
    #[inline(always)]
    unsafe fn mags_of<E: Env<R>>(&self, cx: &E, slot: usize) -> &UnsafeCell<CpuMags> {
        if cx.plat().one_slot() {
            // SAFETY: `slot < MAX_CPUS` (caller).
            return unsafe { self.cpus.get_unchecked(slot) };
        }
        // SAFETY: forwarded.
        unsafe { self.mags_formed(slot) }
    }

    /// [`MagCache::mags_of`]'s formed address.
    ///
    /// # Safety
    ///
    /// `slot < MAX_CPUS`.
    #[inline(always)]
    unsafe fn mags_formed(&self, slot: usize) -> &UnsafeCell<CpuMags> {
        // Within `self`: `slot < MAX_CPUS` (caller).
        let p = formed_address!(self, slot * size_of::<UnsafeCell<CpuMags>>(), offset_of!(Self, cpus));
        // SAFETY: element `slot` (< MAX_CPUS, caller) of the array at
        // `cpus`, as `self.cpus.get_unchecked(slot)`.
        unsafe { &*p.cast::<UnsafeCell<CpuMags>>() }
    }

    /// A pop from the loaded magazine, or `None` for any other case.
    #[inline(always)]
    pub(crate) fn alloc_fast<E: Env<R>>(&self, cx: &E) -> Option<NonNull<u8>> {
        #[cfg(all(
            feature = "std",
            target_arch = "x86_64",
            target_os = "linux",
            target_env = "gnu",
            not(miri),
            not(loom)
        ))]
        if let Some(f) = cx.plat().rseq_fast() {
            // SAFETY: `f` is `Rseq`'s (only it returns one), whose slots
            // index `cpus` as every platform's do.
            return NonNull::new(unsafe { cpu_mags::rseq_ops::pop(f, self.cpus.as_ptr().cast()) });
        }
        let slot = cx.slots().try_hold(cx.plat())?;
        // SAFETY: we hold `slot`.
        unsafe { self.pop_held(cx, slot) }
    }

    /// A pop from the loaded magazine of `slot`, which the caller holds;
    /// ends the hold.
    ///
    /// # Safety
    ///
    /// The caller holds `slot` (from the slot handshake, with no drain in
    /// progress), and gives the hold up here.
    #[inline(always)]
    pub(crate) unsafe fn pop_held<E: Env<R>>(&self, cx: &E, slot: usize) -> Option<NonNull<u8>> {
        // SAFETY: the platform contract keeps slots below MAX_CPUS.
        let r = unsafe { self.mags_of(cx, slot) }.with_mut(|m| {
            // SAFETY: we hold the slot, so its magazines are ours.
            unsafe { (*m).pop() }
        });
        cx.slots().unhold(cx.plat(), slot);
        r
    }

    /// [`MagCache::alloc_fast`] for an object charged one by one: under the
    /// same hold of the slot, `charge(slot)` first (the slot's byte stock),
    /// then the pop.
    #[inline(always)]
    pub(crate) fn alloc_fast_charged<E: Env<R>>(&self, cx: &E, charge: impl FnOnce(usize) -> bool) -> ChargedPop {
        let Some(slot) = cx.slots().try_hold(cx.plat()) else { return ChargedPop::Uncharged };
        // SAFETY: we hold `slot`.
        unsafe { self.alloc_charged_held(cx, slot, charge) }
    }

    /// [`MagCache::alloc_fast_charged`] under the caller's hold of `slot`,
    /// which it ends.
    ///
    /// # Safety
    ///
    /// As for [`MagCache::pop_held`].
    #[inline(always)]
    pub(crate) unsafe fn alloc_charged_held<E: Env<R>>(
        &self,
        cx: &E,
        slot: usize,
        charge: impl FnOnce(usize) -> bool,
    ) -> ChargedPop {
        let r = if !charge(slot) {
            ChargedPop::Uncharged
        } else {
            // SAFETY: the platform contract keeps slots below MAX_CPUS.
            match unsafe { self.mags_of(cx, slot) }.with_mut(|m| {
                // SAFETY: we hold the slot, so its magazines are ours.
                unsafe { (*m).pop() }
            }) {
                Some(p) => ChargedPop::Hit(p),
                None => ChargedPop::Charged,
            }
        };
        cx.slots().unhold(cx.plat(), slot);
        r
    }

    /// [`MagCache::free_fast`] for an object charged one by one: under the
    /// same hold of the slot, `uncharge(slot)` first (into the slot's byte
    /// stock, `false` if it cannot take it there), then the push. Whatever
    /// it does not finish is the caller's, out of line.
    ///
    /// # Safety
    ///
    /// As for [`MagCache::free`]. On [`ChargedPush::Refused`] the caller
    /// holds the slot, and ends the hold with [`MagCache::push_held`].
    #[inline(always)]
    pub(crate) unsafe fn free_fast_charged<E: Env<R>>(
        &self,
        cx: &E,
        ptr: NonNull<u8>,
        uncharge: impl FnOnce(usize) -> bool,
    ) -> ChargedPush {
        let Some(slot) = cx.slots().try_hold(cx.plat()) else { return ChargedPush::NoSlot };
        // SAFETY: forwarded; we hold `slot`.
        unsafe { self.free_charged_held(cx, slot, ptr, uncharge) }
    }

    /// [`MagCache::free_fast_charged`] under the caller's hold of `slot`
    /// (never [`ChargedPush::NoSlot`]).
    ///
    /// # Safety
    ///
    /// As for [`MagCache::free_fast_charged`]; the caller holds `slot`
    /// (from the slot handshake, with no drain in progress).
    #[inline(always)]
    pub(crate) unsafe fn free_charged_held<E: Env<R>>(
        &self,
        cx: &E,
        slot: usize,
        ptr: NonNull<u8>,
        uncharge: impl FnOnce(usize) -> bool,
    ) -> ChargedPush {
        if !uncharge(slot) {
            return ChargedPush::Refused(slot);
        }
        // SAFETY: forwarded; we hold `slot`.
        if unsafe { self.push_held(cx, slot, ptr) } { ChargedPush::Pushed } else { ChargedPush::Uncharged }
    }

    /// Pushes `ptr` onto the loaded magazine of `slot`, which the caller
    /// holds, if it has room and `ptr` is of the slot's node; ends the
    /// hold. Whether it pushed.
    ///
    /// # Safety
    ///
    /// As for [`MagCache::free`]; the caller holds `slot` (from the slot
    /// handshake), and gives the hold up here.
    #[inline(always)]
    pub(crate) unsafe fn push_held<E: Env<R>>(&self, cx: &E, slot: usize, ptr: NonNull<u8>) -> bool {
        // SAFETY: `ptr` is a live object of this cache.
        let local = cx.plat().nodes() <= 1 || unsafe { self.cache.node_of(ptr.as_ptr()) } == cx.plat().node_of(slot);
        // SAFETY: the platform contract keeps slots below MAX_CPUS.
        let pushed = local
            && unsafe { self.mags_of(cx, slot) }.with_mut(|m| {
                // SAFETY: we hold the slot, so its magazines are ours.
                unsafe { (*m).push(ptr) }
            });
        cx.slots().unhold(cx.plat(), slot);
        pushed
    }

    /// Everything but a hit in the loaded magazine: swap, depot, refill,
    /// or the shared path when no slot is held.
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_slow<E: Env<R>>(&self, cx: &E) -> Result<NonNull<u8>, GrowError> {
        cx.settle();
        let Some(slot) = cx.slots().hold(cx.plat()) else {
            return self.cache.alloc(&self.pages(cx, None), 0);
        };
        let r = self.cpus[slot].with_mut(|m| {
            // SAFETY: we hold the slot, so its magazines are ours.
            unsafe {
                let m = &mut *m;
                if let Some(p) = m.pop() {
                    // A hit: on a symmetric platform, where the fast path
                    // takes no slot, the usual case.
                    cx.slots().note(slot, true);
                    Ok(p)
                } else {
                    cx.slots().note(slot, false);
                    self.note_slot(slot);
                    let mut s = m.spill();
                    let r = self.alloc_refill(cx, slot, &mut s);
                    m.load(s, self.rounds);
                    r
                }
            }
        });
        cx.slots().unhold(cx.plat(), slot);
        r
    }

    /// Pops one round off `m.loaded`, which the caller made non-empty (on
    /// a slow path: the magazine's own count).
    ///
    /// # Safety
    ///
    /// `m.loaded` is a live magazine with at least one round.
    #[inline(always)]
    unsafe fn pop(m: &mut Spilled) -> Result<NonNull<u8>, GrowError> {
        // SAFETY: per the contract.
        unsafe {
            let l = m.loaded;
            (*l).count -= 1;
            Ok(NonNull::new_unchecked((*l).rounds[(*l).count]))
        }
    }

    /// Frees `ptr`: into this CPU's magazines when it holds a slot and the
    /// object is node-local, else straight to its slab.
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of this cache, allocated with `cx.src()`.
    #[inline(always)]
    pub(crate) unsafe fn free<E: Env<R>>(&self, cx: &E, ptr: NonNull<u8>) {
        // SAFETY: forwarded.
        if !unsafe { self.free_fast(cx, ptr) } {
            // SAFETY: forwarded.
            unsafe { self.free_slow(cx, ptr) }
        }
    }

    /// A push onto the loaded magazine; `false` for any other case, which
    /// leaves everything as it was.
    ///
    /// # Safety
    ///
    /// As for [`MagCache::free`].
    #[inline(always)]
    pub(crate) unsafe fn free_fast<E: Env<R>>(&self, cx: &E, ptr: NonNull<u8>) -> bool {
        #[cfg(all(
            feature = "std",
            target_arch = "x86_64",
            target_os = "linux",
            target_env = "gnu",
            not(miri),
            not(loom)
        ))]
        if let Some(f) = cx.plat().rseq_fast()
            && cx.plat().nodes() <= 1
        {
            // SAFETY: as in `alloc_fast`; `ptr` is a live object of this
            // cache, freed (so free) once pushed.
            return unsafe { cpu_mags::rseq_ops::push(f, self.cpus.as_ptr().cast(), ptr.as_ptr()) };
        }
        let Some(slot) = cx.slots().try_hold(cx.plat()) else { return false };
        // SAFETY: `ptr` is a live object of this cache.
        let local = cx.plat().nodes() <= 1 || unsafe { self.cache.node_of(ptr.as_ptr()) } == cx.plat().node_of(slot);
        // SAFETY: the platform contract keeps slots below MAX_CPUS.
        let hit = local
            && unsafe { self.mags_of(cx, slot) }.with_mut(|m| {
                // SAFETY: we hold the slot, so its magazines are ours.
                unsafe { (*m).push(ptr) }
            });
        cx.slots().unhold(cx.plat(), slot);
        hit
    }

    /// Everything but a push onto the loaded magazine: spill to the
    /// depot or slabs, a remote node's object, or no slot.
    ///
    /// # Safety
    ///
    /// As for [`MagCache::free`].
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn free_slow<E: Env<R>>(&self, cx: &E, ptr: NonNull<u8>) {
        cx.settle();
        if let Some(slot) = cx.slots().hold(cx.plat()) {
            // SAFETY: `ptr` is a live object of this cache.
            let local =
                cx.plat().nodes() <= 1 || unsafe { self.cache.node_of(ptr.as_ptr()) } == cx.plat().node_of(slot);
            if local {
                // SAFETY: the platform contract keeps slots below MAX_CPUS.
                unsafe { self.cpus.get_unchecked(slot) }.with_mut(|m| {
                    // SAFETY: we hold the slot; the invariant of `CpuMags`
                    // holds between operations.
                    unsafe {
                        let m = &mut *m;
                        // A push succeeds here on a symmetric platform (the
                        // fast path takes no slot), or when a drain emptied
                        // the magazine since the fast path looked.
                        let hit = m.push(ptr);
                        cx.slots().note(slot, hit);
                        if !hit {
                            self.note_slot(slot);
                            let mut s = m.spill();
                            self.free_spill(cx, slot, &mut s, ptr);
                            m.load(s, self.rounds);
                        }
                    }
                });
                cx.slots().unhold(cx.plat(), slot);
                return;
            }
            cx.slots().unhold(cx.plat(), slot);
        }
        // SAFETY: forwarded.
        unsafe { self.cache.free(&self.pages(cx, None), ptr) };
    }

    /// `loaded` is full (or missing): swap, trade with the depot, grow a
    /// magazine, or flush one to the slabs.
    ///
    /// # Safety
    ///
    /// The caller holds `slot`, `m` is its magazines of this cache
    /// ([`CpuMags::spill`]), and `ptr` is a live object of this cache.
    unsafe fn free_spill<E: Env<R>>(&self, cx: &E, slot: usize, m: &mut Spilled, ptr: NonNull<u8>) {
        let node = cx.plat().node_of(slot).min(MAX_NODES - 1);
        // SAFETY: as in `alloc_refill`; `ptr` is a live object of ours.
        unsafe {
            if !m.previous.is_null() && (*m.previous).count == 0 {
                core::mem::swap(&mut m.loaded, &mut m.previous);
            } else {
                let mut depot = self.depots[node].lock();
                let fresh = match depot.empty.pop() {
                    Some(e) => Some(e),
                    None if depot.full.len < self.depot_max || m.previous.is_null() => {
                        drop(depot);
                        let e = Self::new_magazine(cx, node);
                        depot = self.depots[node].lock();
                        e
                    }
                    None => None,
                };
                match fresh {
                    Some(e) => {
                        if !m.previous.is_null() {
                            depot.full.push(m.previous);
                        }
                        m.previous = m.loaded;
                        m.loaded = e;
                    }
                    None if !m.previous.is_null() => {
                        // The depot is full of full magazines: flush one.
                        drop(depot);
                        let p = m.previous;
                        self.cache.free_bulk(&self.pages(cx, Some(slot)), &(&(*p).rounds)[..(*p).count]);
                        (*p).count = 0;
                        core::mem::swap(&mut m.loaded, &mut m.previous);
                    }
                    None => {
                        drop(depot);
                        self.cache.free(&self.pages(cx, Some(slot)), ptr);
                        return;
                    }
                }
            }
            if m.loaded.is_null() {
                self.cache.free(&self.pages(cx, Some(slot)), ptr);
                return;
            }
            let l = m.loaded;
            (*l).rounds[(*l).count] = ptr.as_ptr();
            (*l).count += 1;
        }
    }

    /// Frees every depot magazine of this cache.
    fn empty_depots<E: Env<R>>(&self, cx: &E) -> usize {
        if !self.touched.load(Ordering::Relaxed) {
            return 0;
        }
        (0..MAX_NODES).map(|node| self.trim_depot(cx, node, usize::MAX, usize::MAX)).sum()
    }

    /// Slab counters and magazine counters.
    pub(crate) fn stats(&self) -> (CacheStats, MagazineStats) {
        let mut ms = MagazineStats { rounds: self.rounds, ..MagazineStats::default() };
        for d in &self.depots {
            let d = d.lock();
            ms.depot_full += d.full.len;
            ms.depot_empty += d.empty.len;
        }
        (self.cache.stats(), ms)
    }
}

#[cfg(all(test, not(loom)))]
mod formed_tests {
    use super::*;
    use crate::platform::DefaultRawMutex;

    /// The formed address of each slot's magazines is the array's own.
    #[test]
    fn every_slot_s_magazines_are_found_where_the_array_has_them() {
        let c = MagCache::<DefaultRawMutex>::new(Geometry::smallest(64, 8).unwrap(), Acct::None);
        for slot in 0..MAX_CPUS {
            // SAFETY: `slot < MAX_CPUS`.
            let formed = unsafe { c.mags_formed(slot) };
            assert!(core::ptr::eq(formed, &c.cpus[slot]), "slot {slot}");
        }
    }
}
