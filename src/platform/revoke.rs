//! The fast-path word of `Threads` and how other threads make a holder
//! count (see `threads.rs`, *Counting only under contention*): a holder
//! publishes the address of its per-thread word, and a thread turned away
//! for want of a slot switches every armed word to counting. Its own
//! module, over `crate::sync`, so that loom models
//! (`src/tests/loom_revoke.rs`) run the protocol itself; `Threads` keeps one static [`Revoker`]
//! and the words in its thread-locals.
//!
//! # After `fork`
//!
//! A child of a multithreaded process inherits the parent's `owner[s]`
//! pointers to the words of threads that do not exist in it (and their
//! slots, which stay claimed: no thread of the child holds one). The
//! memory of a dead thread's word may be reused for anything, so a
//! revoker must not write there: `Threads` registers a `pthread_atfork`
//! child handler that calls [`Revoker::after_fork`], which withdraws every
//! word but the forking thread's (the child's only thread) and frees the
//! `revoking` flags a thread of the parent may have held at the fork.
//!
//! # The word
//!
//! | value | meaning | written by |
//! | --- | --- | --- |
//! | [`armed`]`(s)`, `s < MAX_CPUS` | armed: the fast path holds slot `s` without counting | the holder ([`Revoker::arm`]) |
//! | [`counting`]`(s, ticks)` | counting: `ticks` more fast-path holds, each counted down | the holder; a revoker, from `s` only |
//! | [`NONE`] | no fast path (no slot, or no membarrier) | the holder |
//!
//! # Atomics
//!
//! | atomic | written by | ordering | paired with |
//! | --- | --- | --- | --- |
//! | `contended` | a thread turned away (raise, then revoke), a holder finding no demand (lower) | `SeqCst` swap to raise, then a `SeqCst` fence in `revoke_all`; `Relaxed` loads | a holder's publication and arming store, a `SeqCst` fence, and its second look at the flag (Dekker: the holder sees the flag or the revoker sees the word published and armed) |
//! | the word | its holder (arm, count, clear), revokers (armed → counting, by CAS) | `Relaxed`, ordered by the two fences | `contended`, as above; the word only ever names its holder's own slot or none |
//! | `revoking[s]` | revokers and the holder withdrawing `owner[s]` (CAS false → true, store false) | `Acquire` CAS, `Release` store | each other: a revoker that takes it after a withdrawal sees `owner[s]` null |
//! | `owner[s]` | the holder (publish after its claim; withdraw under `revoking[s]`) | `Relaxed`, ordered by the two fences | `contended`, as above; the pointer is followed only under `revoking[s]` |

#![cfg_attr(loom, allow(dead_code))]

use crossbeam_utils::CachePadded;

use super::cpu::MAX_CPUS;
use crate::sync::{
    AtomicBool, AtomicPtr, AtomicUsize, Ordering, atomic_bool, atomic_null, fence, loom_const_fn, repeat, spin_hint,
};

/// The word of a thread without a fast path.
pub(crate) const NONE: usize = usize::MAX;
/// A counting word is `(ticks + 1) << TICK_SHIFT | armed(slot)`.
const TICK_SHIFT: u32 = 16;
/// An armed word is the slot shifted by this: 32, the stride of the
/// magazine layer's per-slot arrays, so the fast path's `slot * 32`
/// is the word itself (see [`fast_hold`]).
const SLOT_SHIFT: u32 = 5;
/// Armed words are below this.
const ARMED_END: usize = MAX_CPUS << SLOT_SHIFT;
/// Counted holds a counting word grants between two calls of the
/// holder's slow path: bounds how stale its operation count gets.
pub(crate) const FAST_TICKS: usize = 4096;

static_assertions::const_assert!(ARMED_END <= 1 << TICK_SHIFT && (FAST_TICKS + 1) < usize::MAX >> TICK_SHIFT);

/// The armed word of a holder of `slot`.
#[inline(always)]
pub(crate) const fn armed(slot: usize) -> usize {
    slot << SLOT_SHIFT
}

/// The word of a holder of `slot` with `ticks` counted holds left.
#[inline(always)]
pub(crate) const fn counting(slot: usize, ticks: usize) -> usize {
    ((ticks + 1) << TICK_SHIFT) | armed(slot)
}

/// The slot of an armed word `v`, else `None`.
#[inline(always)]
pub(crate) fn armed_slot(v: usize) -> Option<usize> {
    if v < ARMED_END { Some(v >> SLOT_SHIFT) } else { None }
}

/// The fast path's hold for `word`, its holder's: the slot while armed,
/// a counted hold while ticks last, else `None`. Only the word's holder
/// calls it.
#[inline(always)]
pub(crate) fn fast_hold(word: &AtomicUsize) -> Option<usize> {
    // Relaxed: the word only ever names its holder's own slot, or none.
    let v = word.load(Ordering::Relaxed);
    let a = if v < ARMED_END { v } else { counted(word, v)? };
    // Told to the compiler after both paths meet, `slot * 32`, the
    // magazine layer's offset of the slot's entries, folds into `a`
    // itself: no shift on the fast path.
    // SAFETY: `a` is `armed(s)`, `s < MAX_CPUS`: an armed word (only `arm`
    // stores one; revokers only count it) or what `counted` returns.
    unsafe { core::hint::assert_unchecked(a % (1 << SLOT_SHIFT) == 0 && a < ARMED_END) };
    Some(a >> SLOT_SHIFT)
}

/// The holds a counting word `v` (not [`NONE`]) granted out of
/// [`FAST_TICKS`].
#[inline(always)]
pub(crate) const fn ticks_used(v: usize) -> usize {
    FAST_TICKS - ((v >> TICK_SHIFT) - 1)
}

/// The fast path's hold for its word `v`, which was not armed: a counted
/// hold while ticks last (the word counted down), as the slot's armed
/// word ([`armed`]), else `None`. Inline, but off the armed path: a call
/// there would make every allocation entry point set up a stack frame.
///
/// Only the word's holder calls it (nobody else writes a counting word).
#[inline(always)]
fn counted(word: &AtomicUsize, v: usize) -> Option<usize> {
    off_the_armed_path();
    if v == NONE || v >> TICK_SHIFT <= 1 {
        return None;
    }
    word.store(v - (1 << TICK_SHIFT), Ordering::Relaxed);
    Some(v & ((1 << TICK_SHIFT) - 1))
}

/// Called where a counting or absent word sends the fast path: a call
/// of a cold function tells LLVM the branch is unlikely
/// (`core::hint::cold_path`, stable only after the crate's
/// `rust-version`), so the armed path runs straight through. Laid out
/// between the word's test and the pop, the counted path had cost every
/// allocation through `GlobalAlloc` a taken jump.
#[cold]
fn off_the_armed_path() {}

/// Who may be revoked, and whether slots are short.
pub(crate) struct Revoker {
    /// Raised while threads are turned away for want of a slot.
    contended: CachePadded<AtomicBool>,
    /// The word of slot `s`'s holder, from its publication to its
    /// withdrawal; null otherwise.
    owner: [AtomicPtr<AtomicUsize>; MAX_CPUS],
    /// Taken by a revoker while it follows `owner[s]`, and by the holder
    /// while it withdraws it.
    revoking: [AtomicBool; MAX_CPUS],
}

impl Revoker {
    loom_const_fn! {
        /// Nobody published, nothing contended.
        pub(crate) fn new() -> Self {
            Revoker {
                contended: CachePadded::new(atomic_bool(false)),
                owner: repeat!(atomic_null(); MAX_CPUS),
                revoking: repeat!(atomic_bool(false); MAX_CPUS),
            }
        }
    }

    /// Whether slots are short now (`Relaxed`: a hint for the holder's
    /// slow path).
    #[inline]
    pub(crate) fn contended(&self) -> bool {
        self.contended.load(Ordering::Relaxed)
    }

    /// A thread was turned away: raises the flag and, if it was low,
    /// revokes every armed holder (reading first keeps the line shared).
    #[inline]
    pub(crate) fn contend(&self) {
        if !self.contended.load(Ordering::Relaxed) && !self.contended.swap(true, Ordering::SeqCst) {
            self.revoke_all();
        }
    }

    /// Lowers the flag: a holder found nobody waiting (`Relaxed`: a late
    /// raise by a thread turned away is seen at its next operation).
    pub(crate) fn calm(&self) {
        self.contended.store(false, Ordering::Relaxed);
    }

    /// Publishes `word`, the holder of `slot`'s, for revokers.
    ///
    /// # Safety
    ///
    /// The caller holds `slot`, and `word` stays valid until the caller's
    /// [`Revoker::withdraw`] of `slot` returns.
    pub(crate) unsafe fn publish(&self, slot: usize, word: &AtomicUsize) {
        // Relaxed: ordered before the flag's second look by `arm`'s fence,
        // so a revoker whose raise that look missed finds the word (loom
        // found the holder left armed when only the word's store was so
        // ordered). A revoker follows the pointer only under
        // `revoking[slot]`, which `withdraw` takes before the word can go
        // away.
        self.owner[slot].store(core::ptr::from_ref(word).cast_mut(), Ordering::Relaxed);
    }

    /// Withdraws `owner[slot]`: once this returns, no revoker touches the
    /// word published for `slot`. Only the slot's holder calls it.
    pub(crate) fn withdraw(&self, slot: usize) {
        // Relaxed: only the holder writes it, so a null here is its own.
        if self.owner[slot].load(Ordering::Relaxed).is_null() {
            return;
        }
        // A revoker holds the flag for a few instructions: wait them out.
        while self.revoking[slot].compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spin_hint();
        }
        self.owner[slot].store(core::ptr::null_mut(), Ordering::Relaxed);
        // Release: a revoker that takes the flag next sees the null.
        self.revoking[slot].store(false, Ordering::Release);
    }

    /// In the child of a `fork`, whose only thread is the one that called
    /// it, with `own` its word: withdraws every other published word (their
    /// threads do not exist here) and frees every `revoking` flag (their
    /// holders do not either; the forking thread is inside `fork`, not in
    /// this module).
    pub(crate) fn after_fork(&self, own: &AtomicUsize) {
        for slot in 0..MAX_CPUS {
            if !core::ptr::eq(self.owner[slot].load(Ordering::Relaxed), own) {
                self.owner[slot].store(core::ptr::null_mut(), Ordering::Relaxed);
            }
            self.revoking[slot].store(false, Ordering::Release);
        }
    }

    /// The word published for `slot` (null: none).
    #[cfg(all(test, feature = "std", not(loom), not(miri)))]
    pub(crate) fn published(&self, slot: usize) -> *const AtomicUsize {
        self.owner[slot].load(Ordering::Relaxed)
    }

    /// Switches every published armed word to counting. A slot whose flag
    /// another revoker or its withdrawing holder has is skipped: the
    /// revoker finishes it, or the holder leaves.
    #[cold]
    fn revoke_all(&self) {
        // Dekker with `arm`: the raise before the loads of the owners and
        // words below, against the holder's stores of them before its
        // second look at the flag.
        fence(Ordering::SeqCst);
        for slot in 0..MAX_CPUS {
            // Relaxed: the fence above orders it (see `publish`).
            if self.owner[slot].load(Ordering::Relaxed).is_null()
                || self.revoking[slot].compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err()
            {
                continue;
            }
            let word = self.owner[slot].load(Ordering::Relaxed);
            // SAFETY: `owner[slot]` names a word that stays valid until
            // its holder's `withdraw`, which takes `revoking[slot]` (held
            // here) first (the contract of `publish`).
            if let Some(word) = unsafe { word.as_ref() } {
                // Relaxed: the fence above orders it. Only an armed word
                // changes: the holder alone writes the others.
                let armed = armed(slot);
                if word.load(Ordering::Relaxed) == armed {
                    let _ =
                        word.compare_exchange(armed, counting(slot, FAST_TICKS), Ordering::Relaxed, Ordering::Relaxed);
                }
            }
            self.revoking[slot].store(false, Ordering::Release);
        }
    }

    /// Arms the holder of `slot`'s `word`, or sets it counting if slots
    /// are short. Only the slot's holder calls it.
    #[inline]
    pub(crate) fn arm(&self, slot: usize, word: &AtomicUsize) {
        // `fast_hold` tells the compiler that an armed word is below
        // `ARMED_END`: it is, as long as slots are.
        debug_assert!(slot < MAX_CPUS);
        if self.contended.load(Ordering::Relaxed) {
            word.store(counting(slot, FAST_TICKS), Ordering::Relaxed);
            return;
        }
        // Store, fence, load (Dekker with `revoke_all`): a revoker raising
        // the flag now either sees this store and the publication before
        // it (and switches the word) or is seen here.
        word.store(armed(slot), Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.contended.load(Ordering::Relaxed) {
            word.store(counting(slot, FAST_TICKS), Ordering::Relaxed);
        }
    }
}
