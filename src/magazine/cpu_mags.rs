//! One slot's magazines of one cache, the struct the fast paths touch.

use core::mem::size_of;
use core::ptr::{self, NonNull};

use super::Magazine;
use crate::platform::MAX_CPUS;
use crate::sync::{at, at_mut};

/// One slot's magazines of one cache. Either pointer may be null.
///
/// The fast paths touch this struct and one round of `loaded`, nothing
/// else: `loaded`'s fill level lives here, not in the magazine, while it
/// is loaded, and `cap` is 0 when nothing is loaded, so a pop checks
/// `count != 0` and a push `count < cap` without a null check.
///
/// 32 bytes, two to a cache line, and the fast paths write `count`: two
/// busy slots on one line would bounce it between their CPUs on every
/// operation (seen as a 2x slower `xfree`). So slot `s` lives at
/// [`cpu_index`]`(s)`, which puts slots 0..31 on 32 different lines and
/// pairs each with a slot from 32..63. (One line per slot would double
/// every cache's size.)
///
/// Invariant: `loaded` null ⇒ `count == cap == 0`; else `cap` is the
/// cache's rounds, `count <= cap`, `loaded.rounds[..count]` are free
/// objects of the cache and `loaded.count` is stale. The slow paths call
/// [`CpuMags::spill_count`] first and [`CpuMags::reload`] last, and in
/// between work on the magazines' own counts.
#[repr(C, align(32))]
pub(super) struct CpuMags {
    pub(super) count: usize,
    pub(super) cap: usize,
    pub(super) loaded: *mut Magazine,
    pub(super) previous: *mut Magazine,
}

static_assertions::const_assert_eq!(size_of::<CpuMags>(), 32);

/// Where slot `slot`'s `CpuMags` sit in a cache's array: the low slots
/// spread over every other entry, so neighbours never share a line.
#[inline(always)]
pub(super) const fn cpu_index(slot: usize) -> usize {
    const HALF: usize = if MAX_CPUS > 1 { MAX_CPUS / 2 } else { 1 };
    (slot % HALF) * 2 + slot / HALF
}

static_assertions::const_assert!(MAX_CPUS.is_multiple_of(2) || MAX_CPUS == 1);

impl CpuMags {
    pub(super) const EMPTY: CpuMags = CpuMags { count: 0, cap: 0, loaded: ptr::null_mut(), previous: ptr::null_mut() };

    /// A round off the loaded magazine, if it has one.
    ///
    /// # Safety
    ///
    /// The invariant of the type holds; the caller owns the slot.
    #[inline(always)]
    pub(super) unsafe fn pop(&mut self) -> Option<NonNull<u8>> {
        if self.count == 0 {
            return None;
        }
        self.count -= 1;
        // SAFETY: `count > 0` means `loaded` is a live magazine whose first
        // `count` rounds are free objects (the invariant).
        unsafe { Some(NonNull::new_unchecked(*at(&(*self.loaded).rounds, self.count))) }
    }

    /// Pushes `p` onto the loaded magazine if it has room.
    ///
    /// # Safety
    ///
    /// As for [`CpuMags::pop`].
    #[inline(always)]
    pub(super) unsafe fn push(&mut self, p: NonNull<u8>) -> bool {
        if self.count >= self.cap {
            return false;
        }
        // SAFETY: `count < cap` means `loaded` is live with room at
        // `count` (`cap` is its rounds, at most MAG_MAX).
        unsafe { *at_mut(&mut (*self.loaded).rounds, self.count) = p.as_ptr() };
        self.count += 1;
        true
    }

    /// Writes `count` back into `loaded`, so the magazine's own count is
    /// current for a slow path or a drainer.
    ///
    /// # Safety
    ///
    /// The invariant of the type holds; the caller owns the slot.
    #[inline]
    pub(super) unsafe fn spill_count(&mut self) {
        if !self.loaded.is_null() {
            // SAFETY: a non-null `loaded` is a live magazine of the slot.
            unsafe { (*self.loaded).count = self.count };
        }
    }

    /// Takes `loaded`'s count back after a slow path changed magazines.
    ///
    /// # Safety
    ///
    /// `loaded` is null or a live magazine with a current count of at
    /// most `rounds`, the cache's rounds per magazine.
    #[inline]
    pub(super) unsafe fn reload(&mut self, rounds: usize) {
        if self.loaded.is_null() {
            self.count = 0;
            self.cap = 0;
        } else {
            // SAFETY: per the contract.
            self.count = unsafe { (*self.loaded).count };
            self.cap = rounds;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// `cpu_index` is a permutation of the slots that keeps each of the
    /// first half of the slots on a cache line of its own.
    #[test]
    fn cpu_index_spreads_neighbouring_slots() {
        let mut seen = [false; MAX_CPUS];
        for slot in 0..MAX_CPUS {
            let i = cpu_index(slot);
            assert!(i < MAX_CPUS && !seen[i], "slot {slot} -> {i}");
            seen[i] = true;
        }
        let line = |slot: usize| cpu_index(slot) * size_of::<CpuMags>() / 64;
        for a in 0..MAX_CPUS / 2 {
            for b in 0..a {
                assert_ne!(line(a), line(b), "slots {a} and {b} share a line");
            }
        }
    }
}
