//! The calling context's current-group token and its marks: which group
//! its allocations charge, and whether it runs reclaim, the event hook or
//! another callback of the allocator.

use core::ptr::NonNull;

use super::{Group, HEAD_OFFSET, TokenHead};
use crate::platform::Platform;

/// The low bit of a current-group token: set while its context runs
/// shrinkers (or an event hook, or an atomic scope), so an allocation it
/// makes skips reclaim instead of re-entering it. A tagged token names the
/// same group, with the same reference, as the untagged one (groups are
/// aligned to at least 8).
pub(crate) const RECLAIMING: usize = 1;

/// The next bit: set while its context runs the event hook, so events the
/// hook's own allocations raise are counted but not reported to it again.
pub(crate) const IN_HOOK: usize = 2;

/// The next bit: set while its context runs a callback of the allocator
/// (a shrinker, the event hook, the out-of-memory handler), Linux's
/// `PF_MEMALLOC`: a charge it makes that a `max` refuses is made anyway,
/// up to [`RECLAIM_OVERDRAFT`] pages past the `max` of each level, and
/// counted there (`GroupStat::overdrafts`), rather than failing. (Interrupt
/// context, where the platform keeps no marks, never has it.)
pub(crate) const MEMALLOC: usize = 4;

/// The next bit: set while an atomic scope ([`crate::Kmem::atomic_scope`])
/// is alive in the context. Its allocations never reclaim, as with
/// [`RECLAIMING`], but the bit is the scopes' alone: a callback's marks
/// ([`Marks`]) save and restore the others only, so an outermost scope
/// dropped inside a callback ends the atomic state for good, and one made
/// inside a callback outlives it if kept.
pub(crate) const ATOMIC: usize = 8;

/// The marks a callback adds and puts back ([`Marks`]).
const CALLBACK_TAGS: usize = RECLAIMING | IN_HOOK | MEMALLOC;

/// The tags of a token.
const TAGS: usize = CALLBACK_TAGS | ATOMIC;

// The tags live in the low bits of a group's head address.
static_assertions::const_assert!(core::mem::align_of::<Group<crate::platform::DefaultRawMutex>>() > TAGS);
static_assertions::const_assert!(HEAD_OFFSET.is_multiple_of(TAGS + 1));

/// Pages a charge made inside a callback of the allocator (a shrinker,
/// the event hook, the out-of-memory handler) may take each level of the
/// group tree past its `max`, all such charges of a group together, when
/// the `max` refuses it (Linux forces the charges of a task in reclaim,
/// `PF_MEMALLOC`, past `memory.max`): 256 KiB, room for a shrinker's list
/// of victims. A charge that would go further fails as before; the page
/// source is never overdrawn. The pages are counted in the group's
/// [`GroupStat::overdrafts`](crate::GroupStat::overdrafts), and the limit
/// holds again on the way back: the allocation that started the reclaim
/// charges within `max` or fails, and the next reclaim of the group
/// aims to take it back under its `max`.
pub const RECLAIM_OVERDRAFT: usize = 64;

/// The calling context's marks ([`RECLAIMING`], [`IN_HOOK`],
/// [`MEMALLOC`]) with some added, for the length of a callback: dropping
/// the guard restores the marks the context had when it was made, on
/// whatever token is current then (the callback may have entered and left
/// groups; each swap keeps the marks). A drop guard, so a callback that
/// panics and unwinds leaves its context as it found it.
pub(crate) struct Marks<'p, P: Platform> {
    platform: &'p P,
    /// The context's marks before.
    saved: usize,
}

impl<'p, P: Platform> Marks<'p, P> {
    /// Adds `tags` (of [`RECLAIMING`], [`IN_HOOK`], [`MEMALLOC`]) to the
    /// calling context's marks until the guard drops.
    pub(crate) fn add(platform: &'p P, tags: usize) -> Self {
        debug_assert_eq!(tags & !CALLBACK_TAGS, 0);
        let token = retag(platform, |a| a | tags);
        Marks { platform, saved: token.addr() & TAGS }
    }

    /// The context's marks from before the guard ([`ATOMIC`] included).
    pub(crate) fn saved(&self) -> usize {
        self.saved
    }
}

impl<P: Platform> Drop for Marks<'_, P> {
    fn drop(&mut self) {
        // The callback marks as they were; [`ATOMIC`] as the scopes left it.
        let saved = self.saved & CALLBACK_TAGS;
        retag(self.platform, |a| (a & !CALLBACK_TAGS) | saved);
    }
}

/// Whether the calling context runs a callback of the allocator, whose
/// refused charges may overdraw (see [`MEMALLOC`]).
#[inline]
pub(crate) fn in_callback<P: Platform>(platform: &P) -> bool {
    !platform.in_interrupt() && platform.current_group().addr() & MEMALLOC != 0
}

/// `token` without its tags.
#[inline(always)]
pub(super) fn untag(token: *const ()) -> *const () {
    token.map_addr(|a| a & !TAGS)
}

/// Makes `token` (untagged) the calling context's current group and
/// returns the token it replaces, with its reference. The context's
/// marks ([`RECLAIMING`], [`IN_HOOK`]) stay as they are: they belong to
/// the running context (a shrinker that enters or leaves a group stays
/// marked), not to the token. The caller hands over the reference `token`
/// carries.
pub(crate) fn swap_token<P: Platform>(platform: &P, token: *const ()) -> *const () {
    let marks = platform.current_group().addr() & TAGS;
    // SAFETY: `token` is null or a group token whose reference the caller
    // hands over (tagged with the context's own marks), and the caller
    // takes the one returned.
    unsafe { platform.set_current_group(untag(token).map_addr(|a| a | marks)) }
}

/// Sets (`on`) or clears the calling context's no-reclaim mark (the
/// [`RECLAIMING`] bit of its token, which every swap keeps); returns
/// whether it was set. While set, allocations are atomic: no reclaim, no
/// shrinkers, no tree lock.
pub(crate) fn set_no_reclaim<P: Platform>(platform: &P, on: bool) -> bool {
    let token = retag(platform, |a| if on { a | RECLAIMING } else { a & !RECLAIMING });
    token.addr() & RECLAIMING != 0
}

/// Sets (`on`) or clears the calling context's [`ATOMIC`] mark; returns
/// whether it was set.
pub(crate) fn set_atomic<P: Platform>(platform: &P, on: bool) -> bool {
    let token = retag(platform, |a| if on { a | ATOMIC } else { a & !ATOMIC });
    token.addr() & ATOMIC != 0
}

/// Changes the calling context's marks to `f` of them (its token's
/// address, marks included; the group bits stay) and returns the token
/// from before. Through [`Platform::retag_current_group`], retried until
/// no other context swapped the token in between: on `NoCpus` every
/// thread shares the token, and a plain read and write would undo another
/// thread's `enter` (losing the reference it swapped in, and leaving its
/// guard to release ours a second time).
fn retag<P: Platform>(platform: &P, f: impl Fn(usize) -> usize) -> *const () {
    loop {
        let token = platform.current_group();
        let new = token.map_addr(&f);
        debug_assert_eq!(untag(new), untag(token), "a retag changes marks only");
        // SAFETY: the context's own token, retagged: the same group and
        // reference.
        if new == token || unsafe { platform.retag_current_group(token, new) } {
            return token;
        }
    }
}

/// Releases the reference a current-group token holds; null (the root)
/// holds none.
///
/// # Safety
///
/// `token` is null or points to the [`TokenHead`] of a live group, and the
/// caller owns one of its references, which this gives up.
pub(crate) unsafe fn release_token(token: *const ()) {
    if let Some(t) = NonNull::new(untag(token).cast_mut().cast::<TokenHead>()) {
        // SAFETY: a live group's head (caller contract); `release` is its
        // tree's, for the reference the caller hands over.
        unsafe { (t.as_ref().release)(t) }
    }
}

/// Takes a reference on the group a current-group token names, whichever
/// allocator made it; null (the root) needs none.
///
/// # Safety
///
/// `token` is null or points to the [`TokenHead`] of a live group.
pub(crate) unsafe fn acquire_token(token: *const ()) {
    if let Some(t) = NonNull::new(untag(token).cast_mut().cast::<TokenHead>()) {
        // SAFETY: a live group's head (caller contract); `acquire` is its
        // tree's.
        unsafe { (t.as_ref().acquire)(t) }
    }
}
