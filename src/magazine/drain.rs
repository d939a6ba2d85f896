//! Draining: emptying magazines into slabs, from a slot's owner or from
//! another thread through the slot handshake (reap, shrink, group removal).

use lock_api::RawMutex;

use core::ptr::NonNull;

use super::{Env, MagCache, Magazine};
use crate::platform::{MAX_CPUS, MAX_NODES};
use crate::slab::Pages;
use crate::sync::Ordering;

impl<R: RawMutex> MagCache<R> {
    /// Empties magazine `mag` into the slabs and frees it.
    ///
    /// # Safety
    ///
    /// `mag` is a live magazine of this cache owned by the caller.
    pub(super) unsafe fn discard<E: Env<R>>(&self, cx: &E, mag: *mut Magazine) -> usize {
        // SAFETY: per the contract its rounds are live free objects of
        // this cache, and the magazine is an object of `cx.mags()`.
        unsafe {
            let n = (*mag).count;
            self.cache.free_bulk(&self.pages(cx, None), &(&(*mag).rounds)[..n]);
            cx.mags().free(&Pages::plain(cx.src()), NonNull::new_unchecked(mag as *mut u8));
            n
        }
    }

    /// Takes both magazines of `slot`, leaving it empty. The caller has
    /// exclusive access through the handshake or a steal.
    pub(super) fn take_slot(&self, slot: usize) -> (*mut Magazine, *mut Magazine) {
        self.cpus[slot].with_mut(|m| {
            // SAFETY: per the caller, the slot is ours.
            let m = unsafe { &mut *m };
            // SAFETY: the invariant of `CpuMags` holds between operations.
            let s = unsafe { m.spill() };
            (s.loaded, s.previous)
        })
    }

    /// Empties this cache's magazines of `slot`, which the caller drains
    /// (exclusive access through the handshake or a steal); returns the
    /// objects flushed.
    fn empty_slot<E: Env<R>>(&self, cx: &E, slot: usize) -> usize {
        // Cleared before taking: see `used_slots`.
        self.used_slots.fetch_and(!(1usize << slot), Ordering::Relaxed);
        let taken = self.take_slot(slot);
        self.discard_pair(cx, taken)
    }

    /// Discards two magazines taken from a slot; returns objects flushed.
    pub(super) fn discard_pair<E: Env<R>>(&self, cx: &E, taken: (*mut Magazine, *mut Magazine)) -> usize {
        let mut n = 0;
        for mag in [taken.0, taken.1] {
            if !mag.is_null() {
                // SAFETY: taken from the slot, so ours.
                n += unsafe { self.discard(cx, mag) };
            }
        }
        n
    }

    /// Empties every magazine of this cache (all slots and depots) into
    /// the slabs. Returns the objects flushed.
    #[cfg(loom)]
    pub(crate) fn drain<E: Env<R>>(&self, cx: &E) -> usize {
        drain_many(cx, |f| f(self), None)
    }

    /// The depot part of Bonwick's working-set reap: give back the depot
    /// magazines unused since the last reap (the slots' part is
    /// [`reap_slots`]). Returns objects flushed.
    pub(crate) fn reap_depots<E: Env<R>>(&self, cx: &E) -> usize {
        let mut n = 0;
        for node in 0..MAX_NODES {
            let (full, empty) = {
                let mut d = self.depots[node].lock();
                (d.full.take_unused(), d.empty.take_unused())
            };
            n += self.trim_depot(cx, node, full, empty);
        }
        n
    }

    /// Frees up to `full` full and `empty` empty depot magazines of `node`.
    pub(super) fn trim_depot<E: Env<R>>(&self, cx: &E, node: usize, full: usize, empty: usize) -> usize {
        let mut n = 0;
        for (count, full) in [(full, true), (empty, false)] {
            for _ in 0..count {
                let mut depot = self.depots[node].lock();
                let Some(m) = (if full { depot.full.pop() } else { depot.empty.pop() }) else { break };
                drop(depot);
                // SAFETY: popped from the depot, so ours.
                n += unsafe { self.discard(cx, m) };
            }
        }
        n
    }
}

/// The slots' part of Bonwick's working-set reap, for every cache `each`
/// yields, with at most one handshake per slot and none that waits: a
/// slot's magazines of a cache go back when nobody holds the slot
/// (stolen), when the slot went unused for a whole interval (`idle`, see
/// [`Slots::reap_idle_mask`](super::Slots::reap_idle_mask)), or when the
/// slot took no slow path on that cache since the last reap (its working
/// set left the cache alone). A slot held at this instant, or drained by
/// someone else, is passed over: reaps run inside allocations (decay),
/// where waiting for a preempted holder stalled the allocating thread for
/// seconds, one scheduling round per cache and slot. Each slot then
/// starts a new interval. Returns objects flushed.
pub(crate) fn reap_slots<E: Env<R>, R: RawMutex>(
    cx: &E,
    each: impl Fn(&mut dyn FnMut(&MagCache<R>)),
    idle: &[bool; MAX_CPUS],
) -> usize {
    let mut used = 0usize;
    each(&mut |c| used |= c.used_slots.load(Ordering::Relaxed));
    let mut n = 0;
    for slot in (0..MAX_CPUS).filter(|s| used & (1 << s) != 0) {
        let bit = 1usize << slot;
        let cold_in = |c: &MagCache<R>| {
            c.used_slots.load(Ordering::Relaxed) & bit != 0 && c.active_slots.load(Ordering::Relaxed) & bit == 0
        };
        let mut cold = idle[slot];
        if !cold {
            each(&mut |c| cold |= cold_in(c));
        }
        let stolen = if cold {
            cx.slots().try_begin_drain(cx.plat(), slot)
        } else {
            cx.slots().try_steal(cx.plat(), slot).then_some(true)
        };
        if let Some(stolen) = stolen {
            each(&mut |c| {
                if c.used_slots.load(Ordering::Relaxed) & bit != 0 && (stolen || idle[slot] || cold_in(c)) {
                    n += c.empty_slot(cx, slot);
                }
            });
            cx.slots().end_drain(cx.plat(), slot, stolen);
        }
        each(&mut |c| {
            if c.active_slots.load(Ordering::Relaxed) & bit != 0 {
                c.active_slots.fetch_and(!bit, Ordering::Relaxed);
            }
        });
    }
    n
}

/// Empties the magazines of every cache `each` yields, on every slot and
/// in every depot, with one handshake per slot that any of them used (and
/// at most the slots in `mask`, if given). Returns the objects flushed.
pub(crate) fn drain_many<E: Env<R>, R: RawMutex>(
    cx: &E,
    each: impl Fn(&mut dyn FnMut(&MagCache<R>)),
    mask: Option<u64>,
) -> usize {
    let mut used = 0u64;
    each(&mut |c| used |= c.used_slots.load(Ordering::Relaxed) as u64);
    let mut n = drain_slots(cx, &each, used & mask.unwrap_or(u64::MAX));
    each(&mut |c| n += c.empty_depots(cx));
    n
}

/// Drains the slots in `slots` for every cache `each` yields: one
/// handshake (or steal) per slot.
pub(super) fn drain_slots<E: Env<R>, R: RawMutex>(
    cx: &E,
    each: impl Fn(&mut dyn FnMut(&MagCache<R>)),
    slots: u64,
) -> usize {
    let mut n = 0;
    for slot in (0..MAX_CPUS).filter(|s| slots & (1 << s) != 0) {
        let bit = 1u64 << slot;
        let stolen = cx.slots().begin_drain(cx.plat(), slot);
        each(&mut |c| {
            if c.used_slots.load(Ordering::Relaxed) as u64 & bit != 0 {
                n += c.empty_slot(cx, slot);
            }
        });
        cx.slots().end_drain(cx.plat(), slot, stolen);
    }
    n
}
