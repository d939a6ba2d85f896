//! Counter layer: hierarchical page counters with Linux `page_counter`
//! semantics, lock-free.
//!
//! A [`PageCounter`] counts pages charged to one group and to each of its
//! ancestors. `try_charge(n)` adds `n` at every level from the counter up
//! to the root; if a level goes over its `max`, it takes back what it added
//! at that level and below and reports the level that refused. There are no
//! locks; the only full barriers are the paired fences between
//! `try_charge` and `set_max` described below.
//!
//! # Orderings
//!
//! | field | written by | ordering | paired with |
//! | --- | --- | --- | --- |
//! | `usage` | charge/uncharge (`fetch_add`/`fetch_sub`) | `Relaxed`, then `fence(SeqCst)` in `try_charge` | the fence in `set_max`: a charger that read the old `max` has its add seen by `set_max`'s re-read of `usage`, which then retries (Dekker) |
//! | `max` | `set_max` (`swap`) | `Relaxed`, then `fence(SeqCst)` | the fence in `try_charge` |
//! | `high`, `soft`, `low`, `min` | their setters (one store each, no turn: nothing reads them together, and group removal resets `min` and `low` under the tree lock, where a turn would wait for a setter that may have been preempted) | `Relaxed` | readers act on a recent value; none guards memory |
//! | `setting` | limit setters (a spin lock: `Acquire` CAS, `Release` store) | `Acquire`/`Release` | the previous setter's writes to `max` (and its rollback) |
//! | `watermark` | charges (`fetch_max`), after every level accepted | `Relaxed` | statistic: a refused charge never raises it; `reset_watermark` races with charges and may lose one peak (tolerated, as in Linux) |
//! | `failcnt` | failed charges | `Relaxed` | statistic |
//! | `stock[slot]` | stock take/refill/drain (`compare_exchange`/`swap`) | `Relaxed` | nothing: the pages are charged either way; RMWs make every page counted exactly once |
//! | `node_pages[node]` | slab grows and frees, large objects (RMWs) | `Relaxed` | statistic |
//!
//! # The charge stock
//!
//! Slab grows charge whole slabs; to keep most of them off the shared
//! counters each counter keeps a per-CPU *stock* of pre-charged pages
//! (memcg's `memcg_stock`): a grow takes from its CPU's stock, and a failed
//! stock refill charges [`STOCK_BATCH`] extra pages in one `try_charge`.
//! Stocked pages are part of `usage`, so `usage` never exceeds `max`: the
//! stock cannot make a group overshoot. What it can do is make a charge
//! fail early, while other CPUs hold stock; so before reporting a failure
//! the caller drains every stock of the counter and retries
//! ([`PageCounter::drain_stock`]). The bound: at most [`STOCK_MAX`] pages
//! per CPU slot, `MAX_CPUS * STOCK_MAX` per counter, are charged without
//! backing slabs. Stocks are drained on limit changes and on removal.

use crossbeam_utils::CachePadded;

use crate::platform::{MAX_CPUS, MAX_NODES};
use crate::sync::{
    AtomicBool, AtomicU32, AtomicUsize, CellArray, Ordering, atomic_bool, atomic_u32, atomic_usize, fence,
    loom_const_fn, repeat, spin_hint,
};

/// Pages a stock refill charges beyond the request.
pub const STOCK_BATCH: usize = 8;
/// The most pages one CPU slot may hold in a counter's stock.
pub const STOCK_MAX: usize = 2 * STOCK_BATCH;
/// Levels of a charge that note in their watermark the usage their own
/// add made (`PageCounter::try_charge_with`); deeper levels note their
/// usage after the whole charge succeeded.
const WATERMARK_LEVELS: usize = 8;

// A stock is a `u32`.
static_assertions::const_assert!(STOCK_MAX <= u32::MAX as usize);

/// A hierarchical page counter.
///
/// Invariants: `usage` of a counter equals the pages charged to it and its
/// descendants and not yet uncharged (including stocked pages); it never
/// exceeds `max` through `try_charge` (a forced `charge` may exceed it,
/// and `try_charge_over` by as much as it is allowed).
pub struct PageCounter {
    /// Pages charged: written on every charge, so on its own cache line.
    usage: CachePadded<AtomicUsize>,
    /// Largest `usage` seen since the last reset.
    watermark: AtomicUsize,
    max: AtomicUsize,
    high: AtomicUsize,
    soft: AtomicUsize,
    low: AtomicUsize,
    min: AtomicUsize,
    /// Charges refused at this level.
    failcnt: AtomicUsize,
    /// Set while a limit setter runs: setters take turns (Linux requires
    /// callers of `page_counter_set_max` to serialise; here the counter
    /// does it), so `set_max`'s rollback can never overwrite a limit
    /// another setter wrote. Held only across a few atomics, never while
    /// calling out, so a shrinker that sets a limit cannot deadlock.
    setting: AtomicBool,
    /// The parent, or null at the root. Fixed at creation; the owner keeps
    /// the parent alive for as long as this counter exists.
    parent: *const PageCounter,
    /// What this counter belongs to (a group, for the cgroup layer), set
    /// once before the counter is shared: how a counter that refused a
    /// charge leads back to its group with the group's own provenance.
    /// Null unless set.
    pub(crate) owner: *const (),
    /// Pre-charged pages per CPU slot, at most [`STOCK_MAX`] each: a `u32`
    /// holds that with room to spare, and half the bytes of a `usize`
    /// keep the counter (and so a group) small enough for two groups to
    /// fit a page.
    stock: CellArray<AtomicU32, MAX_CPUS>,
    /// Pages charged to this counter itself (not its descendants) that
    /// back something on each NUMA node: slabs and large objects; stocked
    /// pages are on none. Noted by the callers that know the node, after
    /// the charge; a statistic.
    node_pages: CellArray<AtomicUsize, MAX_NODES>,
    /// Bytes of live objects charged to this counter's subtree, counted
    /// while the heap tracks bytes (see [`PageCounter::add_bytes`]): a
    /// wrapping, signed count, as an object allocated before tracking
    /// began may be freed after it. A statistic (`Relaxed`).
    bytes: AtomicUsize,
    /// Largest positive `bytes` since [`PageCounter::track_bytes`] or
    /// [`PageCounter::reset_bytes_peak`] (`fetch_max`, so no concurrent
    /// peak is lost).
    bytes_peak: AtomicUsize,
    /// Set once [`PageCounter::track_bytes`] was called on this counter.
    tracks_bytes: AtomicBool,
}

impl core::fmt::Debug for PageCounter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PageCounter")
            .field("usage", &self.usage())
            .field("max", &self.max())
            .field("watermark", &self.watermark())
            .field("failcnt", &self.failcnt())
            .finish()
    }
}

// SAFETY: every field is atomic except `parent`, which is immutable and
// points to a counter that outlives this one (constructor contract).
unsafe impl Sync for PageCounter {}
// SAFETY: as above; nothing is tied to a thread.
unsafe impl Send for PageCounter {}

/// `pub fn $field(&self) -> usize`, a `Relaxed` load, for each field: the
/// limits and statistics, which no decision needs ordered with anything
/// (the charge paths order their own loads; see the table above).
macro_rules! relaxed_getters {
    ($($(#[$doc:meta])* $field:ident,)*) => {
        $(
            $(#[$doc])*
            pub fn $field(&self) -> usize {
                self.$field.load(Ordering::Relaxed)
            }
        )*
    };
}

impl PageCounter {
    loom_const_fn! {
        /// A root counter with no limits.
        pub fn new_root() -> Self {
            // SAFETY: a null parent makes this a root.
            unsafe { Self::with_parent(core::ptr::null()) }
        }
    }

    loom_const_fn! {
        /// A counter below `parent` (null for a root), with no limits.
        ///
        /// # Safety
        ///
        /// A non-null `parent` must stay valid for as long as the new counter
        /// exists (or is used).
        pub unsafe fn with_parent(parent: *const PageCounter) -> Self {
            PageCounter {
                usage: CachePadded::new(atomic_usize(0)),
                watermark: atomic_usize(0),
                max: atomic_usize(usize::MAX),
                high: atomic_usize(usize::MAX),
                soft: atomic_usize(usize::MAX),
                low: atomic_usize(0),
                min: atomic_usize(0),
                failcnt: atomic_usize(0),
                setting: atomic_bool(false),
                parent,
                owner: core::ptr::null(),
                stock: CellArray::new(repeat!(atomic_u32(0); MAX_CPUS)),
                node_pages: CellArray::new(repeat!(atomic_usize(0); MAX_NODES)),
                bytes: atomic_usize(0),
                bytes_peak: atomic_usize(0),
                tracks_bytes: atomic_bool(false),
            }
        }
    }

    #[inline]
    fn parent(&self) -> Option<&PageCounter> {
        // SAFETY: the constructor contract keeps the parent alive.
        unsafe { self.parent.as_ref() }
    }

    /// Pages charged, including stocked pages.
    #[inline]
    pub fn usage(&self) -> usize {
        self.usage.load(Ordering::Relaxed)
    }

    relaxed_getters! {
        /// The hard limit, in pages.
        max,
        /// The throttling threshold, in pages.
        high,
        /// The soft limit, in pages.
        soft,
        /// The soft protection, in pages.
        low,
        /// The hard protection, in pages.
        min,
        /// The largest usage since creation or the last reset.
        watermark,
        /// Charges refused at this level.
        failcnt,
    }

    /// Sets the watermark to the current usage; the usage is untouched.
    pub fn reset_watermark(&self) {
        self.watermark.store(self.usage(), Ordering::Relaxed);
    }

    /// Adds `n` bytes of a live object to this counter and its ancestors,
    /// raising each one's byte peak. `Relaxed`: a statistic, read by tests
    /// after the code they measure (after a join, for other threads).
    pub(crate) fn add_bytes(&self, n: usize) {
        let mut c = Some(self);
        while let Some(pc) = c {
            let now = pc.bytes.fetch_add(n, Ordering::Relaxed).wrapping_add(n);
            if (now as isize) > 0 {
                pc.bytes_peak.fetch_max(now, Ordering::Relaxed);
            }
            c = pc.parent();
        }
    }

    /// Takes `n` bytes of a freed object off this counter and its
    /// ancestors.
    pub(crate) fn sub_bytes(&self, n: usize) {
        let mut c = Some(self);
        while let Some(pc) = c {
            pc.bytes.fetch_sub(n, Ordering::Relaxed);
            c = pc.parent();
        }
    }

    /// Bytes of live objects counted in this subtree (0 if frees of
    /// objects from before tracking outweigh what was counted since).
    pub(crate) fn bytes(&self) -> usize {
        (self.bytes.load(Ordering::Relaxed) as isize).max(0) as usize
    }

    /// The largest [`PageCounter::bytes`] since tracking began or the last
    /// [`PageCounter::reset_bytes_peak`].
    pub(crate) fn bytes_peak(&self) -> usize {
        self.bytes_peak.load(Ordering::Relaxed)
    }

    /// Restarts the byte peak from the current byte count.
    pub(crate) fn reset_bytes_peak(&self) {
        self.bytes_peak.store(self.bytes(), Ordering::Relaxed);
    }

    /// Marks this counter as one whose byte peak a test reads, and
    /// restarts its peak.
    pub(crate) fn track_bytes(&self) {
        self.reset_bytes_peak();
        self.tracks_bytes.store(true, Ordering::Relaxed);
    }

    /// Whether [`PageCounter::track_bytes`] was called on this counter.
    pub(crate) fn tracks_bytes(&self) -> bool {
        self.tracks_bytes.load(Ordering::Relaxed)
    }

    /// Sets `high` (pages).
    pub fn set_high(&self, pages: usize) {
        self.high.store(pages, Ordering::Relaxed);
    }
    /// Sets the soft limit (pages).
    pub fn set_soft(&self, pages: usize) {
        self.soft.store(pages, Ordering::Relaxed);
    }
    /// Sets `low` (pages).
    pub fn set_low(&self, pages: usize) {
        self.low.store(pages, Ordering::Relaxed);
    }
    /// Sets `min` (pages).
    pub fn set_min(&self, pages: usize) {
        self.min.store(pages, Ordering::Relaxed);
    }

    /// What this counter protects of its usage, `(min, low)` in pages:
    /// its usage up to each setting (Linux's `min_usage` and `low_usage`,
    /// computed when asked instead of kept up to date on every charge).
    pub fn protected(&self) -> (usize, usize) {
        let u = self.usage();
        (u.min(self.min()), u.min(self.low()))
    }

    /// Waits for the other limit setters of this counter to finish; the
    /// turn ends when the returned value drops.
    fn setter_turn(&self) -> SetterTurn<'_> {
        while self.setting.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spin_hint();
        }
        SetterTurn(&self.setting)
    }

    #[inline]
    fn note_watermark(&self, usage: usize) {
        if usage > self.watermark.load(Ordering::Relaxed) {
            self.watermark.fetch_max(usage, Ordering::Relaxed);
        }
    }

    /// Charges `n` pages here and at every ancestor, ignoring limits.
    pub fn charge(&self, n: usize) {
        let mut c = Some(self);
        while let Some(k) = c {
            let new = k.usage.fetch_add(n, Ordering::Relaxed) + n;
            k.note_watermark(new);
            c = k.parent();
        }
    }

    /// Charges `n` pages here and at every ancestor, unless that takes a
    /// level over its `max`: then nothing stays charged and the refusing
    /// level is returned (its `failcnt` counts the refusal).
    #[inline]
    pub fn try_charge(&self, n: usize) -> Result<(), &PageCounter> {
        self.try_charge_with(n, 0, true, true, core::ptr::null())
    }

    /// [`PageCounter::try_charge_over`] that stops below `stop`, an
    /// ancestor (null: charges every level): `stop` and its ancestors are
    /// left as they are. Objects charged to groups one by one are charged
    /// so, below the root, whose counter counts their slabs instead.
    #[inline]
    pub fn try_charge_below(&self, n: usize, extra: usize, stop: *const PageCounter) -> Result<(), &PageCounter> {
        self.try_charge_with(n, extra, true, true, stop)
    }

    /// [`PageCounter::try_charge_below`] for pages still to be found (a
    /// large object's run, an in-place growth), counting a refusal in
    /// `failcnt` if `count`: no level notes a watermark, so a charge
    /// given back because the page source had no run never shows in a
    /// peak. Once the pages are had, [`PageCounter::note_charged`].
    pub(crate) fn try_charge_pending(
        &self,
        n: usize,
        extra: usize,
        count: bool,
        stop: *const PageCounter,
    ) -> Result<(), &PageCounter> {
        self.try_charge_with(n, extra, count, false, stop)
    }

    /// Notes each level's usage, below `stop`, in its watermark: after a
    /// [`PageCounter::try_charge_pending`] with overdraft `extra` whose
    /// pages were had, which that usage includes. Capped at what the
    /// level allows, `max + extra`: the usage may also hold another
    /// charge in flight that the level is about to refuse (a review saw
    /// a 1 EiB growth, refused, in a peak this way).
    pub(crate) fn note_charged(&self, stop: *const PageCounter, extra: usize) {
        let mut c = Some(self);
        while let Some(k) = c.filter(|k| !core::ptr::eq(*k, stop)) {
            k.note_watermark(k.usage().min(k.max().saturating_add(extra)));
            c = k.parent();
        }
    }

    /// Takes `n` pages off this counter and every ancestor below `stop`
    /// (see [`PageCounter::try_charge_below`]).
    pub fn uncharge_below(&self, n: usize, stop: *const PageCounter) {
        let mut c = Some(self);
        while let Some(k) = c.filter(|k| !core::ptr::eq(*k, stop)) {
            let old = k.usage.fetch_sub(n, Ordering::Relaxed);
            debug_assert!(old >= n, "page counter underflow: {old} - {n}");
            c = k.parent();
        }
    }

    /// [`PageCounter::try_charge`] whose refusal is not a failure, so
    /// `failcnt` does not count it: an attempt the caller follows with
    /// another way to get its memory (a guard-page sample that falls back
    /// to a slab).
    pub fn try_charge_quiet(&self, n: usize) -> Result<(), &PageCounter> {
        self.try_charge_with(n, 0, false, true, core::ptr::null())
    }

    /// [`PageCounter::try_charge`] letting each level go up to `extra`
    /// pages past its `max` (a bounded overdraft: the allocator's callbacks
    /// charge this way when a `max` refuses them, Linux's `PF_MEMALLOC`).
    #[inline]
    pub fn try_charge_over(&self, n: usize, extra: usize) -> Result<(), &PageCounter> {
        self.try_charge_with(n, extra, true, true, core::ptr::null())
    }

    /// `try_charge` with `extra` pages allowed past each level's `max`,
    /// counting a refusal in `failcnt` if `count`, noting watermarks if
    /// `note`.
    #[inline(always)]
    fn try_charge_with(
        &self,
        n: usize,
        extra: usize,
        count: bool,
        note: bool,
        stop: *const PageCounter,
    ) -> Result<(), &PageCounter> {
        // Written before it is read (below): not zeroed, as this runs on
        // every page charge.
        let mut seen = [core::mem::MaybeUninit::<usize>::uninit(); WATERMARK_LEVELS];
        let mut depth = 0;
        let mut c = Some(self);
        while let Some(k) = c.filter(|k| !core::ptr::eq(*k, stop)) {
            let new = k.usage.fetch_add(n, Ordering::Relaxed).wrapping_add(n);
            // Pairs with the fence in `set_max`: either we see its new max,
            // or it sees our add and retries.
            fence(Ordering::SeqCst);
            if new > k.max.load(Ordering::Relaxed).saturating_add(extra) || new < n {
                k.usage.fetch_sub(n, Ordering::Relaxed);
                if count {
                    k.failcnt.fetch_add(1, Ordering::Relaxed);
                }
                // Roll back the levels below the refusing one.
                let mut u = Some(self);
                while let Some(l) = u.filter(|l| !core::ptr::eq(*l, k)) {
                    l.usage.fetch_sub(n, Ordering::Relaxed);
                    u = l.parent();
                }
                return Err(k);
            }
            c = k.parent();
            if note {
                if c.is_none_or(|p| core::ptr::eq(p, stop)) {
                    // The last level: nothing above it can refuse now.
                    k.note_watermark(new);
                } else if let Some(slot) = seen.get_mut(depth) {
                    slot.write(new);
                }
            }
            depth += 1;
        }
        if !note {
            return Ok(());
        }
        // Every level accepted: only now the levels below the last note
        // their watermarks, so that a charge refused higher up never shows
        // in a lower level's peak. The first `WATERMARK_LEVELS` levels note
        // the usage their own add made, which that level accepted; a
        // deeper one notes its usage now, capped at what it allows.
        let mut c = Some(self);
        for i in 0..depth.saturating_sub(1) {
            let Some(k) = c else { break };
            let new = match seen.get(i) {
                // SAFETY: level `i` is below the last, so the first loop
                // wrote its slot.
                Some(new) => unsafe { new.assume_init() },
                None => k.usage().min(k.max().saturating_add(extra)),
            };
            k.note_watermark(new);
            c = k.parent();
        }
        Ok(())
    }

    /// Takes `n` pages off this counter and every ancestor.
    pub fn uncharge(&self, n: usize) {
        let mut c = Some(self);
        while let Some(k) = c {
            let old = k.usage.fetch_sub(n, Ordering::Relaxed);
            debug_assert!(old >= n, "page counter underflow: {old} - {n}");
            c = k.parent();
        }
    }

    /// Sets the hard limit. Refuses, returning the usage, if the usage is
    /// above `pages`; the caller may reclaim and try again. Concurrent
    /// setters take turns: each call either leaves its own value in place
    /// (`Ok`) or changes nothing (`Err`), and the limit is always the value
    /// of the last call that returned `Ok` (or the initial one).
    pub fn set_max(&self, pages: usize) -> Result<(), usize> {
        let _turn = self.setter_turn();
        loop {
            let usage = self.usage();
            if usage > pages {
                return Err(usage);
            }
            let old = self.max.swap(pages, Ordering::Relaxed);
            // Pairs with the fence in `try_charge`.
            fence(Ordering::SeqCst);
            if self.usage() <= pages {
                return Ok(());
            }
            // A charge slipped in under the old limit: restore and retry.
            self.max.store(old, Ordering::Relaxed);
        }
    }

    /// Charges `n` pages for CPU `slot`, from its stock when it can, else
    /// refilling the stock with [`STOCK_BATCH`] extra pages; without a slot,
    /// a plain `try_charge`.
    pub fn try_charge_stocked(&self, slot: Option<usize>, n: usize) -> Result<(), &PageCounter> {
        let Some(slot) = slot.filter(|&s| s < MAX_CPUS) else {
            return self.try_charge(n);
        };
        let st = &self.stock[slot];
        let mut have = st.load(Ordering::Relaxed);
        // `have as usize`: a stock holds at most STOCK_MAX pages, so `n`
        // fits a `u32` whenever the loop runs.
        while have as usize >= n {
            match st.compare_exchange_weak(have, have - n as u32, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => have = now,
            }
        }
        if self.try_charge(n + STOCK_BATCH).is_ok() {
            self.stock_put(slot, STOCK_BATCH);
            return Ok(());
        }
        self.try_charge(n)
    }

    /// Uncharges `n` pages for CPU `slot`, keeping them in its stock while
    /// it holds less than [`STOCK_MAX`].
    pub fn uncharge_stocked(&self, slot: Option<usize>, n: usize) {
        match slot.filter(|&s| s < MAX_CPUS) {
            Some(slot) => self.stock_put(slot, n),
            None => self.uncharge(n),
        }
    }

    /// Adds `n` charged pages to `slot`'s stock, uncharging any excess over
    /// [`STOCK_MAX`].
    fn stock_put(&self, slot: usize, n: usize) {
        let st = &self.stock[slot];
        let mut have = st.load(Ordering::Relaxed);
        loop {
            let keep = (STOCK_MAX.saturating_sub(have as usize)).min(n);
            // `keep <= STOCK_MAX`, so the sum fits a `u32`.
            match st.compare_exchange_weak(have, have + keep as u32, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    if n > keep {
                        self.uncharge(n - keep);
                    }
                    return;
                }
                Err(now) => have = now,
            }
        }
    }

    /// Uncharges every CPU's stock; returns the pages released.
    pub fn drain_stock(&self) -> usize {
        let mut n = 0;
        for st in &self.stock {
            n += st.swap(0, Ordering::Relaxed) as usize;
        }
        if n > 0 {
            self.uncharge(n);
        }
        n
    }

    /// Notes that `n` pages charged here back something on `node` (slabs,
    /// a large object); `node` is clamped below [`MAX_NODES`].
    pub fn add_node_pages(&self, node: usize, n: usize) {
        self.node_pages[node.min(MAX_NODES - 1)].fetch_add(n, Ordering::Relaxed);
    }

    /// Notes that `n` pages noted with [`PageCounter::add_node_pages`] for
    /// `node` went back.
    pub fn sub_node_pages(&self, node: usize, n: usize) {
        self.node_pages[node.min(MAX_NODES - 1)].fetch_sub(n, Ordering::Relaxed);
    }

    /// Pages charged to this counter itself (not its descendants) backing
    /// something on `node` (0 for a node out of range).
    pub fn node_pages(&self, node: usize) -> usize {
        self.node_pages.get(node).map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// Pages held in stocks (charged, backing nothing).
    pub fn stocked(&self) -> usize {
        self.stock.iter().map(|s| s.load(Ordering::Relaxed) as usize).sum()
    }
}

/// A child's effective protection (Linux `effective_protection`, without
/// `memory_recursiveprot`): `protected` is what it claims of its usage
/// (its usage up to its `min` or `low`), `parent` its parent's effective
/// protection, and `siblings` what the parent's children claim together
/// (itself included). While the children's claims fit the parent's
/// protection each keeps its claim; when they overcommit it, the parent's
/// protection is shared out in proportion to the claims. Either way the
/// result is at most `parent`.
pub(crate) fn effective_protection(protected: usize, parent: usize, siblings: usize) -> usize {
    let e = if siblings > parent {
        // At most `parent` (as `protected <= siblings`), so it fits.
        (protected as u128 * parent as u128 / siblings as u128) as usize
    } else {
        protected
    };
    // Claims read at different times may disagree; the bound holds anyway.
    e.min(parent)
}

/// A limit setter's turn on a counter; see `PageCounter::setting`.
struct SetterTurn<'a>(&'a AtomicBool);

impl Drop for SetterTurn<'_> {
    fn drop(&mut self) {
        // Release: the next setter sees this one's writes (and rollback).
        self.0.store(false, Ordering::Release);
    }
}

mod pressure;

pub use pressure::{PressureCounter, PressureState, Thresholds};

#[cfg(all(test, not(loom)))]
mod tests;
