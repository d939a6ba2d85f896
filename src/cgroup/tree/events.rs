//! Memory events: counted up the tree, and reported to the allocator's
//! event hook.
//!
//! An event (`max`, `oom`, `high`, `low`, `min`; see [`Event`]) is counted
//! in its group's local counters and in the hierarchical counters of the
//! group and each ancestor, then passed to the hook, if one is set, as
//! `(group, event)`. The hook is called where the event happens: on the
//! allocation path (a refused charge, a failed one, `high`), or in
//! reclaim, always with no allocator lock held (a reclaim walk may hold a
//! read guard, which is no lock), possibly in interrupt context or an
//! atomic scope. While it runs, its context is marked as if it ran a
//! shrinker (an allocation it makes anyway is atomic: no reclaim; one a
//! `max` refuses overdraws it, see `RECLAIM_OVERDRAFT`) and as running
//! the hook (events that allocation raises are counted, not reported
//! again); in interrupt context, where the platform keeps no per-context
//! marks, neither holds. The marks are a drop guard's, so a hook that
//! panics and unwinds leaves its context's marks as they were.

use core::ptr;

use lock_api::RawMutex;

use super::Tree;
use crate::cgroup::{
    Event, Group, GroupId, IN_HOOK, MEMALLOC, Marks, RECLAIMING, acquire_token, release_token, swap_token,
};
use crate::magazine::Env;
use crate::platform::Platform;
use crate::sync::Ordering;

/// A function the allocator calls with each memory event of each group
/// ([`Kmem::set_event_hook`](crate::Kmem::set_event_hook)): the group it
/// happened in and what happened.
///
/// It is called outside every allocator lock, on the path of the
/// allocation or reclaim that raised the event, in whatever context that
/// runs: another thread's, an atomic scope, or (with a platform that says
/// so) interrupt context. So it must be quick, must not block, and must
/// not allocate from the allocator (nor panic): a kernel would set a flag
/// or wake a task, a program bump a counter or write to a pipe. An
/// allocation it makes anyway outside interrupt context is atomic (it
/// never reclaims; a `max` that refuses it is overdrawn instead, by at
/// most [`RECLAIM_OVERDRAFT`](crate::RECLAIM_OVERDRAFT) pages, as for a
/// shrinker) and the events it raises are counted but not reported to the
/// hook again; in interrupt context nothing guards against that.
///
/// The hook leaves its context's current group as it found it: if it
/// enters another group, or resets to the root, that is undone when it
/// returns, and the group current before stays alive while it runs (the
/// allocation that raised the event still charges it).
///
/// If the hook panics and the panic unwinds (with `panic = abort` nothing
/// does), it goes on up the allocation or reclaim that raised the event:
/// the event is counted, the context's marks are restored, no allocator
/// lock is held, and the allocation (or reclaim) stops there, having
/// taken back any charge it made; the hook is called again with the next
/// event. Through `GlobalAlloc`, which must not unwind, the panic aborts
/// the program instead.
/// The [`GroupId`] is the one [`Cgroup::id`](crate::Cgroup::id) returns
/// ([`GroupId::ROOT`] for the root); compare it, do not keep it past the
/// group's life.
pub type EventHook = fn(GroupId, Event);

impl<R: RawMutex> Tree<R> {
    /// Sets the event hook (`None`: no hook).
    pub(crate) fn set_event_hook(&self, hook: Option<EventHook>) {
        let p = hook.map_or(ptr::null_mut(), |f| f as *const () as *mut ());
        // Release: a hook that reads what its setter wrote before sees it.
        self.event_hook.store(p, Ordering::Release);
    }

    /// Counts `e` for `g` (locally, and hierarchically up to the root)
    /// and reports it to the hook. Called with no allocator lock held.
    pub(crate) fn event<E: Env<R>>(&self, env: &E, g: &Group<R>, e: Event) {
        g.count(e);
        // Acquire: pairs with the Release in `set_event_hook`.
        let hook = self.event_hook.load(Ordering::Acquire);
        if hook.is_null() {
            return;
        }
        let platform = env.plat();
        // In interrupt context the platform keeps no per-context marks.
        let _scope = if platform.in_interrupt() {
            None
        } else {
            let m = self.callback_scope(platform, IN_HOOK | RECLAIMING | MEMALLOC);
            if !m.may_run(IN_HOOK) {
                // Raised by the hook's own allocation (or in a context
                // that cannot be marked): counted, not reported.
                return;
            }
            Some(m)
        };
        // SAFETY: `event_hook` holds null or a function pointer of type
        // `EventHook` (only `set_event_hook` stores to it), and pointers to
        // data and to functions have one size here.
        let f = unsafe { core::mem::transmute::<*mut (), EventHook>(hook) };
        // The scope restores the context's marks and current group when
        // the hook returns or unwinds.
        f(self.group_id(g), e);
    }
}

impl<R: RawMutex> Tree<R> {
    /// Enters a callback of the allocator (the event hook, shrinkers, the
    /// out-of-memory handler) on the calling context: adds `tags` to its
    /// marks and takes a reference on its current group, both until the
    /// scope drops. See [`CallbackScope`].
    pub(crate) fn callback_scope<'a, P: Platform>(&'a self, platform: &'a P, tags: usize) -> CallbackScope<'a, P> {
        let token = crate::cgroup::marks::untag(platform.current_group());
        // SAFETY: the context's token names null or a live group (of this
        // tree or another), which its reference keeps.
        unsafe { acquire_token(token) };
        CallbackScope { platform, pinned: token, marks: Marks::add(platform, tags) }
    }
}

/// A callback's hold on the context that runs it. An allocation that
/// calls back (its event hook on a refused charge, shrinkers, the
/// out-of-memory handler) goes on charging the group its context's token
/// names, on the token's reference alone; the callback may drop that
/// reference (reset the current group, drop a guard it kept) and remove
/// the group. So the scope holds a reference of its own on the token's
/// group, whichever allocator made it (a callback of one allocator may
/// run while another's group is current), and when it drops (the
/// callback returned or unwound) the context's current group is the one
/// it had before: a group the callback left current is released, and the
/// scope's reference goes back into the context in its place. Dropping
/// also restores the callback marks, after the token.
pub(crate) struct CallbackScope<'a, P: Platform> {
    platform: &'a P,
    /// The context's token (untagged) from before, on whose group the
    /// scope holds a reference; null: the root.
    pinned: *const (),
    marks: Marks<'a, P>,
}

impl<P: Platform> CallbackScope<'_, P> {
    /// The context's marks from before the scope.
    pub(crate) fn saved(&self) -> usize {
        self.marks.saved()
    }

    /// Whether the callback may run: the context was not in a callback of
    /// the allocator already (`busy`, of the saved marks) and keeps the
    /// marks just added. A context where the platform keeps no token
    /// (`PerCpu` on a CPU without a slot) cannot be marked, so a callback
    /// there could not tell its own allocations from others and would
    /// be re-entered from them: none runs there.
    pub(crate) fn may_run(&self, busy: usize) -> bool {
        self.saved() & busy == 0 && self.platform.current_group().addr() & RECLAIMING != 0
    }
}

impl<P: Platform> Drop for CallbackScope<'_, P> {
    fn drop(&mut self) {
        let now = crate::cgroup::marks::untag(self.platform.current_group());
        if now == self.pinned {
            // SAFETY: the scope's own reference on the group (none for
            // the root).
            unsafe { release_token(self.pinned) };
        } else {
            // The callback left another group current (or the root): ours
            // goes back, with the scope's reference, and the one it left
            // (with the reference the context held on it) is released.
            let left = swap_token(self.platform, self.pinned);
            // SAFETY: the context's token, whose reference the swap
            // handed to us.
            unsafe { release_token(left) };
        }
    }
}
