//! The per-slot handshake shared by every cache of a `Kmem`: how a slot
//! holder and a drainer agree on who may touch the slot's magazines (see
//! the protocol table in the `magazine` module docs).

use crossbeam_utils::CachePadded;

use crate::platform::{MAX_CPUS, Platform};
use crate::sync::{
    AtomicBool, AtomicU8, AtomicUsize, CellArray, Ordering, atomic_bool, atomic_u8, atomic_usize, compiler_fence,
    fence, loom_const_fn, repeat, spin_hint, wait_step,
};

/// [`Slots::word`]: one drain in progress. Below it, the mode bits.
pub(crate) const DRAIN: usize = 1 << 8;
/// [`Slots::word`]: the mode bits (`cgroup::mode`), which the layers
/// above set and read (`Slots::set_mode`, `Slots::mode`).
pub(crate) const MODE_BITS: usize = DRAIN - 1;
/// [`Slots::word`]: the count of drains in progress.
pub(crate) const DRAINS: usize = !MODE_BITS;

/// `SlotSync::state`: nobody used the slot since the last reap.
const IDLE: u8 = 0;
/// `SlotSync::state`: a holder is using the slot's magazines now.
const HELD: u8 = 1;
/// `SlotSync::state`: used since the last reap, not now.
const USED: u8 = 2;

/// The handshake state of one slot, shared by every cache of a `Kmem`.
///
/// 32 bytes, as a cache's per-slot magazines (`CpuMags`) are: one shift of
/// the slot indexes both arrays on the fast path (with 128-byte entries it
/// took two shifts and a move), and on `Threads` none, its fast-path word
/// being the slot times 32 already (`revoke::armed`). Two slots share a cache line, `2k` with
/// `2k + 1`, as their magazines do, and [`slot_for_cpu`] keeps CPUs that
/// run at once apart the same way.
///
/// [`slot_for_cpu`]: crate::slot_for_cpu
#[repr(C, align(32))]
pub(crate) struct SlotSync {
    /// `HELD` while the holder uses the slot's magazines; the holder leaves
    /// `USED` behind, and a reap turns `USED` into `IDLE`, so a slot still
    /// `IDLE` at the next reap went unused for a whole interval.
    state: AtomicU8,
    /// Serialises drainers of this slot.
    drainers: AtomicBool,
    /// Slow-path holds of this slot that a magazine served, and those that
    /// went to a depot or the slabs (refills and spills); written by the
    /// holder only (`Relaxed` load and store), read by reports.
    hits: AtomicUsize,
    misses: AtomicUsize,
    /// What `Platform::mask` returned to the drainer that has
    /// `drainers`, for its `unmask` in `end_drain` (written and read
    /// by that drainer only).
    masked: AtomicUsize,
}

/// What [`Slots::try_hold_checked`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// No fast hold: the platform would first have to claim a slot (the
    /// caller's slow path does).
    None,
    /// The slot, held, and the word showed no bit of the mask.
    Clear(usize),
    /// The slot, held, and the word the handshake read, which showed a
    /// bit of the mask. Going on under the hold is only allowed if the
    /// word shows no drain ([`DRAINS`]).
    Flagged(usize, usize),
}

/// What one CPU slot's slow paths did; see `Kmem::slot_stats`.
///
/// On a platform without an asymmetric barrier (e.g.
/// [`crate::PerCpu`] without `Cpu::BARRIER`) every operation that gets a
/// slot takes the slow path, so `hits` are all its magazine hits; with
/// one, the fast paths' hits are not counted and `misses` are the
/// operations that reached a depot or the slabs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotStats {
    /// Slow-path operations a loaded or previous magazine served.
    pub hits: usize,
    /// Operations that went to a depot or the slabs (magazine refills,
    /// spills and flushes).
    pub misses: usize,
}

/// How many times a drainer that counted itself reads a held slot's state,
/// in its first round, before it withdraws its count to wait for the hold
/// to end without it (see `Slots::begin_drain`); each further round reads
/// twice as many. (Under loom, where each read is a step of the model,
/// two.)
#[cfg(not(loom))]
const HOLDER_SPINS: usize = 64;
#[cfg(loom)]
const HOLDER_SPINS: usize = 2;

/// How many times `Slots::begin_drain` withdraws its count before it keeps
/// it up and waits for the hold in flight, however long: a holder whose
/// holds keep outlasting the window (slow paths that hold the slot across
/// a refill, back to back) cannot starve the drainer. (Under loom, one:
/// both branches in one model.)
#[cfg(not(loom))]
const WITHDRAWALS: u32 = 4;
#[cfg(loom)]
const WITHDRAWALS: u32 = 1;

/// The most steps of `sync::wait_step` (64 pauses, then yields of the
/// CPU) a drainer waits for a hold to end with its count withdrawn,
/// before it counts again. Few yields: against holds back to back the
/// wait never sees the slot free and runs to its end, and on a loaded
/// machine each yield may cost a scheduler slice (a review measured
/// 256 yields per round taking 12 s for 20 such drains beside 8 busy
/// threads). (Under loom, two.)
#[cfg(not(loom))]
const WITHDRAWN_STEPS: usize = 64 + 16;
#[cfg(loom)]
const WITHDRAWN_STEPS: usize = 2;

/// The handshake states of all slots.
pub(crate) struct Slots {
    sync: CellArray<SlotSync, MAX_CPUS>,
    /// The allocation paths' word: the mode bits below [`DRAIN`] (see
    /// `cgroup::mode`; the layers above own them), and from `DRAIN` up
    /// the count of drains in progress, which a holder reads after
    /// marking its slot `HELD` (Dekker with the drainer's count and
    /// barrier): one load tells a fast path both "plain mode" and "no
    /// drain". Here, beside the handshake it serves, on a line of its
    /// own: holders write their `SlotSync` on every operation, this word
    /// changes only with a mode bit or a drain.
    word: CachePadded<AtomicUsize>,
}

impl Slots {
    loom_const_fn! {
        /// Nobody holds or drains any slot.
        pub(crate) fn new() -> Self {
            Slots {
                sync: CellArray::new(repeat!(
                    SlotSync {
                        state: atomic_u8(IDLE),
                        drainers: atomic_bool(false),
                        hits: atomic_usize(0),
                        misses: atomic_usize(0),
                        masked: atomic_usize(0),
                    };
                    MAX_CPUS
                )),
                word: CachePadded::new(atomic_usize(0)),
            }
        }
    }

    loom_const_fn! {
        /// Starts with mode bits `bits` (before the allocator is shared).
        pub(crate) fn set_initial_mode(&mut self, bits: usize) {
            self.word = CachePadded::new(atomic_usize(bits & MODE_BITS));
        }
    }

    /// The mode bits (see `cgroup::mode`); 0: the plain paths. With them
    /// comes the count of drains in progress (unmasked: a mask costs an
    /// instruction where its complement is no immediate, as on aarch64),
    /// which a test of the mode can only send to a slower path: every
    /// test is of bits, and a drain bit set makes the plain paths' tests
    /// fail and the others' pass unchanged. `Relaxed`:
    /// `GROUPS` clear means no group but the root was ever created, so
    /// every object of a class is in its base cache and the fast paths
    /// skip the group lookups; a group created concurrently is not
    /// current on this thread yet, and its caches hold no object this
    /// thread frees without having synchronised with its creation. A path
    /// that acts on a bit other than `GROUPS` reads
    /// [`Slots::mode_acquire`] first.
    #[inline(always)]
    pub(crate) fn mode(&self) -> usize {
        self.word.load(Ordering::Relaxed)
    }

    /// [`Slots::mode`] with `Acquire`: what was written before a bit was
    /// set with [`Slots::set_mode`] is visible.
    #[inline]
    pub(crate) fn mode_acquire(&self) -> usize {
        self.word.load(Ordering::Acquire)
    }

    /// Sets (`on`) or clears mode bits, `Release`; read-modify-writes, so
    /// the drain count between them is kept (and so is every release
    /// sequence a holder's `Acquire` load relies on, see `end_drain`).
    pub(crate) fn set_mode(&self, bits: usize, on: bool) {
        debug_assert!(bits & DRAINS == 0);
        if on {
            self.word.fetch_or(bits, Ordering::Release);
        } else {
            self.word.fetch_and(!bits, Ordering::Release);
        }
    }

    /// Counts a slow-path operation on `slot`, which the caller holds: a
    /// magazine `hit`, or a miss that went to a depot or the slabs.
    #[inline(always)]
    pub(super) fn note(&self, slot: usize, hit: bool) {
        // SAFETY: the platform contract keeps slots below MAX_CPUS.
        let s = unsafe { self.sync.get_unchecked(slot) };
        let n = if hit { &s.hits } else { &s.misses };
        // Only the holder writes: no read-modify-write needed.
        n.store(n.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// What slot `slot`'s slow paths did so far.
    pub(crate) fn stats(&self, slot: usize) -> SlotStats {
        match self.sync.get(slot) {
            Some(s) => SlotStats { hits: s.hits.load(Ordering::Relaxed), misses: s.misses.load(Ordering::Relaxed) },
            None => SlotStats::default(),
        }
    }

    /// The holder's side: the caller's slot, or `None` for the shared path.
    #[inline(always)]
    pub(crate) fn hold<P: Platform>(&self, plat: &P) -> Option<usize> {
        // SAFETY: the allocator holds one slot at a time: the caller holds
        // none, and `unhold` (or the handshake's refusal) exits this one.
        self.handshake(plat, unsafe { plat.enter() }?, false)
    }

    /// [`Slots::hold`] for the fast paths: `None` also where the platform
    /// would first have to claim a slot, which the slow path then does,
    /// and on a platform that is not asymmetric. A slot from `try_enter`
    /// comes with an asymmetric platform (contract point 3), so the
    /// holder's fence is a compiler fence without asking; except under
    /// Miri, where `Threads` hands out slots without membarrier (see
    /// `threads.rs`), and under loom, where a model's platform may hand
    /// them out while symmetric (`loom_checked_holds_race_a_drain_and_a_mode_bit`),
    /// and the handshake asks.
    #[inline(always)]
    pub(super) fn try_hold<P: Platform>(&self, plat: &P) -> Option<usize> {
        // SAFETY: as in `hold`.
        self.handshake(plat, unsafe { plat.try_enter() }?, !cfg!(any(miri, loom)))
    }

    /// [`Slots::try_hold`] for a fast path that also asks about the mode
    /// bits: the handshake, whose one load of the word answers both "a
    /// drain in progress" and "a mode bit in `mask`" (`mask` includes
    /// [`DRAINS`]). On [`Hold::Flagged`] the caller holds the slot and
    /// either goes on under the hold, which it may only do if the word
    /// shows no drain, or ends it with [`Slots::unhold`].
    #[inline(always)]
    pub(crate) fn try_hold_checked<P: Platform>(&self, plat: &P, mask: usize) -> Hold {
        debug_assert!(mask & DRAINS == DRAINS);
        // SAFETY: as in `hold`.
        let Some(slot) = (unsafe { plat.try_enter() }) else { return Hold::None };
        // Where slots are locks the entry excluded drainers (see
        // `handshake`): the word tells the mode alone.
        if !plat.slots_are_locks() {
            // SAFETY: the platform contract keeps slots below MAX_CPUS.
            unsafe { self.sync.get_unchecked(slot) }.state.store(HELD, Ordering::Relaxed);
            // Orders the store above before the load below (Dekker), as in
            // `try_hold`'s handshake.
            if cfg!(any(miri, loom)) && !plat.asymmetric() {
                fence(Ordering::SeqCst);
            }
            compiler_fence(Ordering::SeqCst);
        }
        // Acquire: if a drain just finished, see what it did to the slot.
        let w = self.word.load(Ordering::Acquire);
        if w & mask != 0 { Hold::Flagged(slot, w) } else { Hold::Clear(slot) }
    }

    /// The holder's handshake on `slot`, which the caller entered;
    /// `asym`: the platform is known to be asymmetric.
    #[inline(always)]
    pub(super) fn handshake<P: Platform>(&self, plat: &P, slot: usize, asym: bool) -> Option<usize> {
        // Where slots are locks, a drainer takes the slot's lock itself
        // (`begin_drain`), which excludes this hold: nothing to mark or
        // check.
        if plat.slots_are_locks() {
            return Some(slot);
        }
        // SAFETY: the platform contract keeps slots below MAX_CPUS.
        let s = unsafe { self.sync.get_unchecked(slot) };
        s.state.store(HELD, Ordering::Relaxed);
        // Orders the store above before the load below (Dekker): a
        // compiler fence when the drainer's heavy barrier does the rest.
        if !asym && !plat.asymmetric() {
            fence(Ordering::SeqCst);
        }
        compiler_fence(Ordering::SeqCst);
        // Acquire: if a drain just finished, see what it did to the slot.
        if self.word.load(Ordering::Acquire) & DRAINS != 0 {
            s.state.store(USED, Ordering::Release);
            // SAFETY: the caller entered `slot` and hands its hold over.
            unsafe { plat.exit(slot) };
            return None;
        }
        Some(slot)
    }

    /// Ends the holder's use of `slot`.
    #[inline(always)]
    pub(crate) fn unhold<P: Platform>(&self, plat: &P, slot: usize) {
        // SAFETY: the platform contract keeps slots below MAX_CPUS.
        let state = &unsafe { self.sync.get_unchecked(slot) }.state;
        if plat.slots_are_locks() {
            // Only reap's mark of use: the lock's release in `exit`
            // publishes our magazine writes.
            state.store(USED, Ordering::Relaxed);
        } else {
            // Release: a drainer that sees `USED` sees our magazine writes.
            state.store(USED, Ordering::Release);
        }
        // SAFETY: `slot` is the caller's, from `hold` or `try_hold`.
        unsafe { plat.exit(slot) };
    }

    /// The drainer's side: exclusive access to `slot`'s magazines until
    /// `end_drain`. Waits only for other drainers of the slot and for a
    /// holder's current operation (yielding the CPU once that takes more
    /// than a few reads), never on an allocation path.
    pub(super) fn begin_drain<P: Platform>(&self, plat: &P, slot: usize) -> bool {
        let s = &self.sync[slot];
        self.take_drain(plat, slot, true);
        // SAFETY: a drain: the slot's per-CPU state is what it empties, and
        // `end_drain` gives a stolen slot back.
        if unsafe { plat.steal(slot) } {
            return true;
        }
        if plat.slots_are_locks() {
            // The holder's handshake checks nothing: wait out its hold (a
            // few instructions, with interrupts masked in a kernel) and
            // take the lock (contract point 7).
            loop {
                spin_hint();
                // SAFETY: as above.
                if unsafe { plat.steal(slot) } {
                    return true;
                }
            }
        }
        // Counted in the word every holder reads: holders of every slot
        // take the shared path until the drain ends (one word to read is
        // what keeps the fast path at one load for its mode and its
        // drains), so the count should not stay up while the drain waits
        // for a holder that was preempted in its operation.
        let mut round = 0;
        loop {
            self.word.fetch_add(DRAIN, Ordering::Relaxed);
            if plat.asymmetric() {
                plat.heavy_barrier();
            } else {
                fence(Ordering::SeqCst);
            }
            if round == WITHDRAWALS {
                // Enough rounds lost to long holds: keep the count up, so
                // that no new hold starts, and wait for the one in flight
                // (yielding): at most one more hold, whatever its length.
                let mut i = 0;
                while s.state.load(Ordering::Acquire) == HELD {
                    wait_step(i);
                    i += 1;
                }
                return false;
            }
            // With the count up no new hold starts; an operation in
            // flight ends within a few instructions, a slow path's hold
            // (a refill that takes locks) within microseconds, which a
            // window doubling each round (64 to 512 reads, a few to tens
            // of microseconds) may or may not outlast: holds longer than
            // the last window are waited for in the final round.
            for _ in 0..HOLDER_SPINS << round {
                if s.state.load(Ordering::Acquire) != HELD {
                    return false;
                }
                spin_hint();
            }
            // Still held: the holder may have been preempted in its
            // operation, and may wait for this very CPU. Withdraw the
            // count (as `try_begin_drain` does: a holder that saw it took
            // the shared path for one operation, nothing else changed),
            // so that the other slots' fast paths run meanwhile; wait a
            // while for the hold to end, yielding (`wait_step`); count
            // again. The wait is bounded: holds back to back (with gaps
            // of nanoseconds) may never show it a free slot, and the next
            // round's longer window catches one of them in flight.
            // (`examples/drain_cost.rs`: with the count kept up through
            // the wait, two threads on two CPUs took 6.8x their time
            // without drains while a third shrank every millisecond.)
            self.word.fetch_sub(DRAIN, Ordering::Relaxed);
            for i in 0..WITHDRAWN_STEPS {
                if s.state.load(Ordering::Acquire) != HELD {
                    break;
                }
                wait_step(i);
            }
            round += 1;
        }
    }

    /// [`Slots::begin_drain`] that waits for nobody: `None` when another
    /// drainer has the slot or its holder is in an operation now (which
    /// may last a scheduling round when the holder was preempted in it),
    /// else exclusive access until `end_drain`, as `begin_drain` gives
    /// (`Some(stolen)`). For reaps, which run inside allocations (decay)
    /// and give back what nobody uses: a slot held at this instant is in
    /// use, and the next reap finds it.
    pub(crate) fn try_begin_drain<P: Platform>(&self, plat: &P, slot: usize) -> Option<bool> {
        let s = &self.sync[slot];
        if !self.take_drain(plat, slot, false) {
            return None;
        }
        // SAFETY: as in `begin_drain`.
        if unsafe { plat.try_steal(slot) } {
            return Some(true);
        }
        if !plat.slots_are_locks() {
            self.word.fetch_add(DRAIN, Ordering::Relaxed);
            // A barrier the platform could not run (a refused membarrier)
            // gives the drain up, as a held slot does.
            let barrier = if plat.asymmetric() {
                plat.try_heavy_barrier()
            } else {
                fence(Ordering::SeqCst);
                true
            };
            if barrier && s.state.load(Ordering::Acquire) != HELD {
                return Some(false);
            }
            // Held (or not known): withdraw. A holder that saw the count
            // meanwhile took the shared path for one operation; nothing
            // else changed.
            self.word.fetch_sub(DRAIN, Ordering::Relaxed);
        }
        self.release_drain(plat, slot);
        None
    }

    /// Exclusive access to `slot`'s magazines if nobody holds the slot
    /// (the platform's `steal`), with no handshake: for a reap's drain of
    /// orphaned slots. `end_drain(.., true)` ends it.
    pub(crate) fn try_steal<P: Platform>(&self, plat: &P, slot: usize) -> bool {
        if !self.take_drain(plat, slot, false) {
            return false;
        }
        // SAFETY: as in `begin_drain`.
        if unsafe { plat.try_steal(slot) } {
            return true;
        }
        self.release_drain(plat, slot);
        false
    }

    /// For a reap: which slots went unused since the previous call; marks
    /// every slot unused for the next one.
    pub(crate) fn reap_idle_mask(&self) -> [bool; MAX_CPUS] {
        let mut idle = [false; MAX_CPUS];
        for (slot, s) in self.sync.iter().enumerate() {
            idle[slot] = match s.state.compare_exchange(USED, IDLE, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => false,
                Err(now) => now == IDLE,
            };
        }
        idle
    }

    pub(crate) fn end_drain<P: Platform>(&self, plat: &P, slot: usize, stolen: bool) {
        if stolen {
            // SAFETY: `begin_drain` stole it (`stolen`).
            unsafe { plat.unsteal(slot) };
        } else {
            // Release: the next holder sees the emptied slot (its `Acquire`
            // load reads this or a later read-modify-write of the word,
            // which continues this release sequence: the word is only
            // ever written by read-modify-writes).
            self.word.fetch_sub(DRAIN, Ordering::Release);
        }
        self.release_drain(plat, slot);
    }

    /// Takes `slot`'s drain flag (`wait`: waiting, yielding, for another
    /// drainer of the slot to finish; else `false` at once), with the
    /// platform's mask ([`Platform::mask`]) from before the
    /// take until [`Slots::release_drain`]: a drainer preempted with the
    /// flag would hang a context that waits for it with interrupts masked
    /// on its CPU.
    fn take_drain<P: Platform>(&self, plat: &P, slot: usize, wait: bool) -> bool {
        let s = &self.sync[slot];
        let saved = plat.mask();
        let mut i = 0;
        while s.drainers.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            if !wait {
                // SAFETY: this context's mask, the last it took.
                unsafe { plat.unmask(saved) };
                return false;
            }
            wait_step(i);
            i += 1;
        }
        s.masked.store(saved, Ordering::Relaxed);
        true
    }

    /// Gives back the drain flag of `slot` that [`Slots::take_drain`] took,
    /// then the platform's mask.
    fn release_drain<P: Platform>(&self, plat: &P, slot: usize) {
        let s = &self.sync[slot];
        let saved = s.masked.load(Ordering::Relaxed);
        s.drainers.store(false, Ordering::Release);
        // SAFETY: `take_drain` took this mask on this context (which the
        // mask kept from moving), and the drain's own (its locks') were all
        // given back since: drains end before the locks around them.
        unsafe { plat.unmask(saved) };
    }
}

#[cfg(all(test, feature = "std", not(loom), not(miri)))]
mod tests {
    use crate::sync::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use super::Slots;
    use crate::platform::Platform;

    /// One slot, handed to whoever asks, with symmetric fences: the
    /// handshake and the drainer's count, nothing else.
    struct OneSlot;

    // SAFETY: the test's one holder thread is the only context that enters
    // slot 0, and the drainer never enters; no group is ever set.
    unsafe impl Platform for OneSlot {
        fn current_group(&self) -> *const () {
            core::ptr::null()
        }
        unsafe fn set_current_group(&self, _token: *const ()) -> *const () {
            core::ptr::null()
        }
        unsafe fn enter(&self) -> Option<usize> {
            Some(0)
        }
        unsafe fn exit(&self, _slot: usize) {}
    }

    /// A review's finding: a drainer that withdrew its count after a fixed
    /// number of reads lost every round to a holder whose holds (5 us, as
    /// a slow path's refill under the hold) outlasted them back to back,
    /// and waited until that holder stopped. The window now doubles and
    /// the count stays up after a few rounds: each drain waits for at
    /// most the hold in flight then. The holder stops on its own after
    /// `LIMIT`, which only a starved drainer would reach: the 20 drains
    /// take about 20 ms on a quiet machine (the first version that
    /// withdrew took 1.5 to 3.5 s here, and up to 2 s for one drain in
    /// the review's test; a drain that waits for a preempted holder on a
    /// loaded machine may take a scheduling round or more, hence the
    /// generous bound).
    #[test]
    fn a_drain_is_not_starved_by_long_back_to_back_holds() {
        const LIMIT: Duration = Duration::from_secs(120);
        let slots = Slots::new();
        let done = AtomicBool::new(false);
        let stopped_by_clock = std::thread::scope(|s| {
            let holder = s.spawn(|| {
                let start = Instant::now();
                for n in 0usize.. {
                    if n % 1024 == 0 && (done.load(Ordering::Relaxed) || start.elapsed() > LIMIT) {
                        return !done.load(Ordering::Relaxed);
                    }
                    if let Some(slot) = slots.hold(&OneSlot) {
                        // The clock is read inside the hold: back to back.
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_micros(5) {}
                        slots.unhold(&OneSlot, slot);
                    }
                }
                false
            });
            // Let the holder get going first.
            std::thread::sleep(Duration::from_millis(10));
            for _ in 0..20 {
                let stolen = slots.begin_drain(&OneSlot, 0);
                slots.end_drain(&OneSlot, 0, stolen);
            }
            done.store(true, Ordering::Relaxed);
            holder.join().unwrap()
        });
        assert!(!stopped_by_clock, "a drain waited until the holder stopped");
    }
}
