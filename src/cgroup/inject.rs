//! Fault injection per group (Linux's `failslab`, scoped to a group): fail
//! the Nth allocation, every Nth, or a seeded random share of them, so a
//! test can drive the error paths of the code it runs in the group.
//!
//! The allocation paths consult a group's rule only while the tree's mode
//! word has `INJECT` (set the first time any group arms a rule), so
//! injection costs nothing until it is used. Every group carries its own
//! rule (a few words), so any number of groups can be armed at once.

use crate::sync::{AtomicBool, AtomicUsize, Ordering, Stat, atomic_bool, atomic_usize, loom_const_fn};

/// When a group's allocations fail; see [`FaultInjection`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FailRule {
    /// Only the Nth allocation after arming (1: the next one).
    Nth(usize),
    /// Every Nth allocation (the Nth, 2Nth, ...).
    EveryNth(usize),
    /// Each allocation with this probability, in parts per million, drawn
    /// from a generator seeded with `seed` (the same seed and the same
    /// allocations give the same failures).
    Probability {
        /// Failures per million allocations.
        per_million: u32,
        /// The generator's seed.
        seed: u64,
    },
}

/// A fault-injection rule for a group ([`crate::Cgroup::inject_faults`]).
///
/// It applies to the allocations that can report failure: typed caches
/// ([`crate::KmemCache::alloc`] and `alloc_in`, which give
/// [`crate::Error::Injected`]) and group allocator handles
/// ([`crate::Cgroup::allocator`], so `try_reserve` and the `Allocator`
/// methods of collections built on one). Allocations through
/// `#[global_allocator]` and `&Kmem` in the group count and fail only with
/// [`FaultInjection::including_global`]: a null from `GlobalAlloc` makes
/// most Rust code abort (`handle_alloc_error`), so ask for it only for code
/// that uses `try_reserve` and the like on global collections.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FaultInjection {
    rule: FailRule,
    global: bool,
}

impl FaultInjection {
    /// Injects failures by `rule`.
    pub const fn new(rule: FailRule) -> Self {
        FaultInjection { rule, global: false }
    }

    /// Also fails allocations through `GlobalAlloc` and `&Kmem` made while
    /// the group is current (see above).
    pub const fn including_global(mut self) -> Self {
        self.global = true;
        self
    }

    /// The rule.
    pub const fn rule(&self) -> FailRule {
        self.rule
    }
}

const OFF: usize = 0;
const NTH: usize = 1;
const EVERY: usize = 2;
const PROB: usize = 3;

/// A group's armed rule and its counts.
pub(crate) struct Inject {
    /// `OFF`, `NTH`, `EVERY` or `PROB`; `Release` when armed, after the
    /// other fields.
    rule: AtomicUsize,
    /// N, or the probability per million.
    n: AtomicUsize,
    /// Allocations counted since the rule was armed.
    seen: AtomicUsize,
    /// The generator's state (xorshift).
    rng: AtomicUsize,
    /// Whether global allocations count too.
    global: AtomicBool,
    /// Failures injected (a statistic).
    injected: Stat,
}

impl Inject {
    loom_const_fn! {
        /// No rule.
        pub(crate) fn new() -> Self {
            Inject {
                rule: atomic_usize(OFF),
                n: atomic_usize(0),
                seen: atomic_usize(0),
                rng: atomic_usize(0),
                global: atomic_bool(false),
                injected: Stat::new(),
            }
        }
    }

    /// Arms `f` (`None`: disarms). The allocation counter starts again.
    pub(crate) fn set(&self, f: Option<FaultInjection>) {
        let Some(f) = f else {
            self.rule.store(OFF, Ordering::Release);
            return;
        };
        let (rule, n, seed) = match f.rule {
            FailRule::Nth(n) => (NTH, n, 0),
            FailRule::EveryNth(n) => (EVERY, n, 0),
            FailRule::Probability { per_million, seed } => (PROB, per_million as usize, seed),
        };
        self.rule.store(OFF, Ordering::Relaxed);
        self.n.store(n, Ordering::Relaxed);
        self.seen.store(0, Ordering::Relaxed);
        // Fold the seed to a word; xorshift needs a non-zero state.
        let s = (seed ^ (seed >> 32)) as usize;
        self.rng.store(if s == 0 { 0x9e37_79b9 } else { s }, Ordering::Relaxed);
        self.global.store(f.global, Ordering::Relaxed);
        self.rule.store(if n == 0 { OFF } else { rule }, Ordering::Release);
    }

    /// Whether this allocation fails; `handle`: it comes through a path
    /// that reports failure (not `GlobalAlloc`).
    pub(crate) fn fails(&self, handle: bool) -> bool {
        let rule = self.rule.load(Ordering::Acquire);
        if rule == OFF || (!handle && !self.global.load(Ordering::Relaxed)) {
            return false;
        }
        let n = self.n.load(Ordering::Relaxed);
        let k = self.seen.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let fail = match rule {
            NTH => k == n,
            EVERY => k.is_multiple_of(n),
            _ => {
                // One step of the generator per allocation, shared by the
                // group's threads.
                let mut x = self.rng.load(Ordering::Relaxed);
                loop {
                    match self.rng.compare_exchange_weak(x, xorshift(x), Ordering::Relaxed, Ordering::Relaxed) {
                        Ok(_) => break,
                        Err(now) => x = now,
                    }
                }
                xorshift(x) % 1_000_000 < n
            }
        };
        if fail {
            self.injected.add(1);
        }
        fail
    }

    /// Failures injected so far.
    pub(crate) fn injected(&self) -> usize {
        self.injected.get()
    }
}

/// One step of a xorshift generator on a word.
fn xorshift(mut x: usize) -> usize {
    if usize::BITS == 64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    } else {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
    }
    x
}
