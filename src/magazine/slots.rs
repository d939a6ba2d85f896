//! The per-slot handshake shared by every cache of a `Kmem`: how a slot
//! holder and a drainer agree on who may touch the slot's magazines (see
//! the protocol table in the `magazine` module docs).

use crate::platform::{MAX_CPUS, Platform};
use crate::sync::{
    AtomicBool, AtomicU8, AtomicUsize, CellArray, Ordering, atomic_bool, atomic_u8, atomic_usize, compiler_fence,
    fence, loom_const_fn, repeat, spin_hint,
};

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
    /// Set by a drainer that wants the slot's magazines.
    drain: AtomicBool,
    /// Serialises drainers of this slot.
    drainers: AtomicBool,
    /// Slow-path holds of this slot that a magazine served, and those that
    /// went to a depot or the slabs (refills and spills); written by the
    /// holder only (`Relaxed` load and store), read by reports.
    hits: AtomicUsize,
    misses: AtomicUsize,
}

/// The handshake states of all slots.
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

pub(crate) struct Slots {
    sync: CellArray<SlotSync, MAX_CPUS>,
}

impl Slots {
    loom_const_fn! {
        /// Nobody holds or drains any slot.
        pub(crate) fn new() -> Self {
            Slots {
                sync: CellArray::new(repeat!(
                    SlotSync {
                        state: atomic_u8(IDLE),
                        drain: atomic_bool(false),
                        drainers: atomic_bool(false),
                        hits: atomic_usize(0),
                        misses: atomic_usize(0),
                    };
                    MAX_CPUS
                )),
            }
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
    /// `threads.rs`), and the handshake asks.
    #[inline(always)]
    pub(super) fn try_hold<P: Platform>(&self, plat: &P) -> Option<usize> {
        // SAFETY: as in `hold`.
        self.handshake(plat, unsafe { plat.try_enter() }?, !cfg!(miri))
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
        if s.drain.load(Ordering::Acquire) {
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
    /// `end_drain`. Spins only against other drainers and a holder's
    /// current operation, never on an allocation path.
    pub(super) fn begin_drain<P: Platform>(&self, plat: &P, slot: usize) -> bool {
        let s = &self.sync[slot];
        while s.drainers.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spin_hint();
        }
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
        s.drain.store(true, Ordering::Relaxed);
        if plat.asymmetric() {
            plat.heavy_barrier();
        } else {
            fence(Ordering::SeqCst);
        }
        while s.state.load(Ordering::Acquire) == HELD {
            spin_hint();
        }
        false
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
        if s.drainers.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return None;
        }
        // SAFETY: as in `begin_drain`.
        if unsafe { plat.try_steal(slot) } {
            return Some(true);
        }
        if !plat.slots_are_locks() {
            s.drain.store(true, Ordering::Relaxed);
            if plat.asymmetric() {
                plat.heavy_barrier();
            } else {
                fence(Ordering::SeqCst);
            }
            if s.state.load(Ordering::Acquire) != HELD {
                return Some(false);
            }
            // Held: withdraw. A holder that saw the flag meanwhile took
            // the shared path for one operation; nothing else changed.
            s.drain.store(false, Ordering::Relaxed);
        }
        s.drainers.store(false, Ordering::Release);
        None
    }

    /// Exclusive access to `slot`'s magazines if nobody holds the slot
    /// (the platform's `steal`), with no handshake: for a reap's drain of
    /// orphaned slots. `end_drain(.., true)` ends it.
    pub(crate) fn try_steal<P: Platform>(&self, plat: &P, slot: usize) -> bool {
        let s = &self.sync[slot];
        if s.drainers.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        // SAFETY: as in `begin_drain`.
        if unsafe { plat.try_steal(slot) } {
            return true;
        }
        s.drainers.store(false, Ordering::Release);
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
        let s = &self.sync[slot];
        if stolen {
            // SAFETY: `begin_drain` stole it (`stolen`).
            unsafe { plat.unsteal(slot) };
        } else {
            // Release: the next holder sees the emptied slot.
            s.drain.store(false, Ordering::Release);
        }
        s.drainers.store(false, Ordering::Release);
    }
}
