//! Giving idle memory back without being asked: Bonwick's reap run by the
//! allocator itself, once per interval of time (a platform clock) or of
//! slow-path operations (no clock), as jemalloc's decay purges what stayed
//! unused for a while.
//!
//! The fast paths do nothing for it. Magazine refills and spills (the slow
//! paths) count themselves in a word that lost updates only make slower to
//! fill; every 256th looks at the clock, and the first to find an interval
//! over runs [`Kmem::reap`], whose working-set rule returns only what
//! stayed unused since the previous reap: depot magazines, the magazines
//! of idle CPU slots, empty slabs, and the page source's retained memory
//! (`OsPages` chunks). A program that stops allocating altogether keeps
//! what it holds until its next slow path (or a `reap()` call).

use lock_api::RawMutex;

use super::Kmem;
use crate::platform::{PageSource, Platform};
use crate::sync::{AtomicBool, AtomicUsize, Ordering, Stat, atomic_bool, atomic_usize, loom_const_fn};

/// When a [`Kmem`] returns idle memory by itself; see
/// [`Kmem::set_decay`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Decay {
    ms: usize,
    ops: usize,
}

impl Decay {
    /// Never: only `reap()` and `shrink()` give memory back.
    pub const OFF: Decay = Decay { ms: 0, ops: 0 };
    /// The default: a reap once a second on a platform with a clock
    /// (`Threads` has one), else once per 2^20 slow-path operations.
    pub const DEFAULT: Decay = Decay { ms: 1000, ops: 1 << 20 };

    /// A reap once `ms` milliseconds have passed (on a platform with a
    /// clock), or, without a clock, once per `ops` slow-path operations
    /// (0: never).
    pub const fn new(ms: usize, ops: usize) -> Decay {
        Decay { ms, ops }
    }
}

/// A `Kmem`'s decay state.
pub(crate) struct Decayer {
    ms: AtomicUsize,
    ops: AtomicUsize,
    /// Slow paths seen (a heuristic count: racing updates may be lost).
    ticks: AtomicUsize,
    /// The clock (ms) or tick count at the last decay reap.
    last: AtomicUsize,
    running: AtomicBool,
    /// Decay reaps run, and the pages they gave back (statistics).
    reaps: Stat,
    pages: Stat,
}

impl Decayer {
    loom_const_fn! {
        pub(crate) fn new(d: Decay) -> Self {
            Decayer {
                ms: atomic_usize(d.ms),
                ops: atomic_usize(d.ops),
                ticks: atomic_usize(0),
                last: atomic_usize(0),
                running: atomic_bool(false),
                reaps: Stat::new(),
                pages: Stat::new(),
            }
        }
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Sets when this allocator returns idle memory by itself (the default
    /// is [`Decay::DEFAULT`]; [`Decay::OFF`] leaves it to `reap()`).
    pub fn set_decay(&self, d: Decay) {
        self.decay.ms.store(d.ms, Ordering::Relaxed);
        self.decay.ops.store(d.ops, Ordering::Relaxed);
    }

    /// Decay reaps run so far and the pages they gave back.
    pub fn decay_stats(&self) -> (usize, usize) {
        (self.decay.reaps.get(), self.decay.pages.get())
    }

    /// Counts one slow path; every 256th checks whether a decay reap is due.
    #[inline]
    pub(crate) fn decay_tick(&self) {
        // Under loom the count's two atomic accesses on every slow path
        // would multiply the interleavings every model explores, for a
        // heuristic that decides no safety question: models call `reap`
        // themselves.
        if cfg!(loom) {
            return;
        }
        self.sample_tick();
        let t = self.decay.ticks.load(Ordering::Relaxed).wrapping_add(1);
        self.decay.ticks.store(t, Ordering::Relaxed);
        if t.is_multiple_of(256) {
            self.decay_check(t);
        }
    }

    /// Runs a reap if an interval has passed since the last one, and no
    /// other context is running one. Not in interrupt context, a shrinker
    /// or an atomic scope (a reap takes the tree lock).
    #[cold]
    #[inline(never)]
    fn decay_check(&self, ticks: usize) {
        let (ms, ops) = (self.decay.ms.load(Ordering::Relaxed), self.decay.ops.load(Ordering::Relaxed));
        let (now, interval) = match self.platform.now_ms() {
            Some(now) if ms != 0 => (now as usize, ms),
            _ if ops != 0 => (ticks, ops),
            _ => return,
        };
        let last = self.decay.last.load(Ordering::Relaxed);
        if last == 0 {
            // The first look starts the first interval.
            self.decay.last.store(now.max(1), Ordering::Relaxed);
            return;
        }
        if now.wrapping_sub(last) < interval || self.platform.in_interrupt() {
            return;
        }
        // The no-reclaim mark: set already (a shrinker), or an atomic
        // scope, no reap; else it keeps allocations made during the reap
        // from starting another.
        if self.platform.current_group().addr() & crate::cgroup::ATOMIC != 0
            || crate::cgroup::set_no_reclaim(&self.platform, true)
        {
            return;
        }
        if self.decay.running.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            self.decay.last.store(now.max(1), Ordering::Relaxed);
            // Not `reap`: the quarantine and the retired sampled runs stay
            // (a use after free a second later is still seen).
            self.settle();
            let pages = self.reap_slots_and_slabs();
            self.decay.reaps.add(1);
            self.decay.pages.add(pages);
            self.decay.running.store(false, Ordering::Release);
        }
        crate::cgroup::set_no_reclaim(&self.platform, false);
    }
}
