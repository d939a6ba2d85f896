//! Pressure counters: per-group thresholds for resources that are not
//! slabs (socket buffers, page cache, DMA pools), after Linux's `tcp_mem`
//! and seed 003's per-container version.
//!
//! A [`PressureCounter`] counts bytes at its level and every ancestor
//! level, like a page counter, and reports the state a charge leaves the
//! group in: below `min` nobody is under pressure; above `pressure` the
//! group enters pressure (callers should shrink, as TCP shrinks its
//! windows) and stays there until its usage falls below `min` (or to 0);
//! a charge that would pass `max` at any level is refused and rolled back.
//! No lock: the check is as cheap as the counter.

use crate::sync::{AtomicBool, AtomicUsize, Ordering, Stat, atomic_bool, atomic_usize, fence, loom_const_fn};

/// Levels of a charge whose peak and pressure state see the usage their
/// own add made (`PressureCounter::charge`); farther ones see their usage
/// once the whole charge is in.
const SEEN_LEVELS: usize = 8;

/// The three thresholds of a pressure resource, in bytes:
/// `min <= pressure <= max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Below this, the group leaves pressure.
    pub min: usize,
    /// Above this, the group enters pressure.
    pub pressure: usize,
    /// Charges past this are refused.
    pub max: usize,
}

impl Thresholds {
    /// No thresholds at all.
    pub const UNLIMITED: Thresholds = Thresholds { min: usize::MAX, pressure: usize::MAX, max: usize::MAX };

    /// Whether `min <= pressure <= max`.
    pub const fn is_ordered(&self) -> bool {
        self.min <= self.pressure && self.pressure <= self.max
    }
}

/// What a charge left the group in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PressureState {
    /// Not under pressure.
    Normal,
    /// Under pressure: shrink what you hold (the charge went through).
    UnderPressure,
    /// Refused: the charge would pass `max` at this or an ancestor level;
    /// nothing was charged.
    Refused,
}

/// A hierarchical byte counter with `tcp_mem`-style thresholds.
///
/// | field | ordering | paired with |
/// | --- | --- | --- |
/// | `usage` | `Relaxed` compare-and-swap within `max`, from the top level down, then `fence(SeqCst)` in `charge`; `Relaxed` RMW in `uncharge` | the fence in `set_thresholds` (as `try_charge`/`set_max`) |
/// | `own` | `Relaxed` add once `charge` is accepted; `Relaxed` compare-and-swap in `uncharge`, before any `usage` goes down | nothing: it bounds what an `uncharge` may take, so no `usage` goes below zero |
/// | `max` | `Relaxed` store, then `fence(SeqCst)` | the fence in `charge` |
/// | `min`, `pressure` | `Relaxed` | advisory: a stale value shifts a pressure transition by one charge |
/// | `under` | `Relaxed` swap | one `entered` event per transition; no memory is guarded by it |
pub struct PressureCounter {
    usage: AtomicUsize,
    /// Bytes charged through this level itself and not yet given back:
    /// what its `uncharge` may take (its `usage` also holds what levels
    /// below charged, which only they give back).
    own: AtomicUsize,
    min: AtomicUsize,
    pressure: AtomicUsize,
    max: AtomicUsize,
    /// Largest usage an accepted charge left (never above `max`: it is
    /// noted only after the check passes).
    watermark: AtomicUsize,
    under: AtomicBool,
    /// Times this level entered pressure.
    pub(crate) entered: Stat,
    /// Charges refused at this level.
    pub(crate) refused: Stat,
    /// The same resource one level up, or null. Fixed at creation; the
    /// owner keeps it alive as long as this counter.
    parent: *const PressureCounter,
}

// SAFETY: all state is atomic; `parent` is immutable and outlives us.
unsafe impl Sync for PressureCounter {}
// SAFETY: as above.
unsafe impl Send for PressureCounter {}

impl PressureCounter {
    loom_const_fn! {
        /// A counter with no thresholds below `parent` (null: none).
        ///
        /// # Safety
        ///
        /// A non-null `parent` must outlive the new counter.
        pub unsafe fn new(parent: *const PressureCounter) -> Self {
            PressureCounter {
                usage: atomic_usize(0),
                own: atomic_usize(0),
                min: atomic_usize(usize::MAX),
                pressure: atomic_usize(usize::MAX),
                max: atomic_usize(usize::MAX),
                watermark: atomic_usize(0),
                under: atomic_bool(false),
                entered: Stat::new(),
                refused: Stat::new(),
                parent,
            }
        }
    }

    fn parent(&self) -> Option<&PressureCounter> {
        // SAFETY: the constructor contract keeps the parent alive.
        unsafe { self.parent.as_ref() }
    }

    /// Bytes charged here and below.
    pub fn usage(&self) -> usize {
        self.usage.load(Ordering::Relaxed)
    }

    /// The largest usage an accepted charge left. A concurrent reader of
    /// `usage` may briefly see more (a refused charge adds before it checks
    /// and rolls back); this never exceeds `max`.
    pub fn peak(&self) -> usize {
        self.watermark.load(Ordering::Relaxed)
    }

    /// The thresholds.
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            min: self.min.load(Ordering::Relaxed),
            pressure: self.pressure.load(Ordering::Relaxed),
            max: self.max.load(Ordering::Relaxed),
        }
    }

    /// Whether this level is under pressure.
    pub fn under_pressure(&self) -> bool {
        self.under.load(Ordering::Relaxed)
    }

    /// Sets the thresholds: refused (with the usage) when they are not
    /// ordered or `max` is below the usage.
    pub fn set_thresholds(&self, t: Thresholds) -> Result<(), usize> {
        if !t.is_ordered() {
            return Err(self.usage());
        }
        loop {
            let usage = self.usage();
            if usage > t.max {
                return Err(usage);
            }
            let old = self.max.swap(t.max, Ordering::Relaxed);
            // Pairs with the fence in `charge` (Dekker, as `set_max`).
            fence(Ordering::SeqCst);
            if self.usage() <= t.max {
                break;
            }
            self.max.store(old, Ordering::Relaxed);
        }
        // Only once `max` is in: a refused re-tune changes nothing.
        self.min.store(t.min, Ordering::Relaxed);
        self.pressure.store(t.pressure, Ordering::Relaxed);
        Ok(())
    }

    /// Charges `bytes` here and at every ancestor; refused and rolled back
    /// if a level would pass its `max`.
    pub fn charge(&self, bytes: usize) -> PressureState {
        // From the top level down, each level added to only if it stays
        // within its max (a compare-and-swap): a refused charge leaves no
        // trace at the levels below the refusing one, and this level (the
        // last) is never rolled back, so an uncharge of this resource never
        // sees bytes that a refused charge takes back. Depth is the number
        // of same-named resources up the tree: small, walked once per level.
        let depth = self.levels();
        let mut seen = [0usize; SEEN_LEVELS];
        for i in (0..depth).rev() {
            let k = self.up(i);
            let Some(new) = k.add_within_max(bytes) else {
                k.refused.add(1);
                // Take back what the levels above accepted.
                for j in i + 1..depth {
                    self.up(j).usage.fetch_sub(bytes, Ordering::Relaxed);
                }
                return PressureState::Refused;
            };
            if let Some(slot) = seen.get_mut(i) {
                *slot = new;
            }
        }
        // Every level accepted: only now do peaks and pressure states see
        // the charge, so a refused one moves neither. The nearest
        // `SEEN_LEVELS` levels use the usage their own add made; a farther
        // one its usage now, capped at its max.
        let mut state = PressureState::Normal;
        for i in (0..depth).rev() {
            let k = self.up(i);
            let new = match seen.get(i) {
                Some(&new) => new,
                None => k.usage().min(k.max.load(Ordering::Relaxed)),
            };
            if new > k.watermark.load(Ordering::Relaxed) {
                k.watermark.fetch_max(new, Ordering::Relaxed);
            }
            if new > k.pressure.load(Ordering::Relaxed) {
                if !k.under.swap(true, Ordering::Relaxed) {
                    k.entered.add(1);
                }
                state = PressureState::UnderPressure;
            } else if k.under.load(Ordering::Relaxed) {
                if new < k.min.load(Ordering::Relaxed) || new == 0 {
                    k.under.store(false, Ordering::Relaxed);
                } else {
                    state = PressureState::UnderPressure;
                }
            }
        }
        // Accepted: this level's own bytes, which its `uncharge` may take.
        self.own.fetch_add(bytes, Ordering::Relaxed);
        state
    }

    /// Adds `bytes` to this level's usage if that keeps it within `max`;
    /// the new usage, or `None` (nothing added).
    fn add_within_max(&self, bytes: usize) -> Option<usize> {
        let mut old = self.usage.load(Ordering::Relaxed);
        loop {
            let new = old.checked_add(bytes)?;
            if new > self.max.load(Ordering::Relaxed) {
                return None;
            }
            match self.usage.compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => old = now,
            }
        }
        // Pairs with the fence in `set_thresholds`: either it sees this add
        // and refuses a max below it, or this sees its new max (Dekker).
        fence(Ordering::SeqCst);
        let new = old + bytes;
        if new > self.max.load(Ordering::Relaxed) {
            self.usage.fetch_sub(bytes, Ordering::Relaxed);
            return None;
        }
        Some(new)
    }

    /// Levels from this one up: this resource and the same-named ones of
    /// its ancestors.
    fn levels(&self) -> usize {
        let mut n = 0;
        let mut c = Some(self);
        while let Some(k) = c {
            n += 1;
            c = k.parent();
        }
        n
    }

    /// The level `i` steps above this one (`i < self.levels()`).
    fn up(&self, i: usize) -> &PressureCounter {
        let mut k = self;
        for _ in 0..i {
            match k.parent() {
                Some(p) => k = p,
                None => break,
            }
        }
        k
    }

    /// Gives back every byte charged through this level (its `own`), from
    /// it and its ancestors: what a resource still holds when its group
    /// goes, which no handle can give back any more.
    pub(crate) fn give_back_own(&self) {
        let own = self.own.load(Ordering::Relaxed);
        if own != 0 {
            // Nothing else changes `own` now (no handle is left), so the
            // uncharge takes exactly it.
            let r = self.uncharge(own);
            debug_assert!(r.is_ok(), "a resource's own bytes are its to give back");
        }
    }

    /// Takes `bytes` off this level and every ancestor; a level that falls
    /// below its `min` leaves pressure. More than was charged through this
    /// level itself (bytes charged below it are theirs to give back) is
    /// refused with what was, and nothing changes.
    pub fn uncharge(&self, bytes: usize) -> Result<(), usize> {
        // This level's own bytes first, by compare-and-swap: more than it
        // charged is refused and changes nothing. Every level from here up
        // holds at least those bytes in its usage (a level's usage is its
        // own bytes and those of the levels below), so the `fetch_sub`s
        // cannot go below zero (a charge in flight between two levels can
        // make one transiently short, never lastingly). A parent giving
        // back its child's bytes used to be accepted, and the child's
        // later uncharge wrapped the parent's usage.
        let mut own = self.own.load(Ordering::Relaxed);
        loop {
            if own < bytes {
                return Err(own);
            }
            match self.own.compare_exchange_weak(own, own - bytes, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => own = now,
            }
        }
        let mut c = Some(self);
        while let Some(k) = c {
            let new = k.usage.fetch_sub(bytes, Ordering::Relaxed).wrapping_sub(bytes);
            k.leave_pressure(new);
            c = k.parent();
        }
        Ok(())
    }

    /// Leaves pressure once usage `new` is below `min` (or zero).
    fn leave_pressure(&self, new: usize) {
        if (new < self.min.load(Ordering::Relaxed) || new == 0) && self.under.load(Ordering::Relaxed) {
            self.under.store(false, Ordering::Relaxed);
        }
    }

    /// The state of this level now.
    pub fn state(&self) -> PressureState {
        let mut c = Some(self);
        while let Some(k) = c {
            if k.under_pressure() {
                return PressureState::UnderPressure;
            }
            c = k.parent();
        }
        PressureState::Normal
    }
}
