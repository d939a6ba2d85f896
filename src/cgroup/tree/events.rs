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
use crate::cgroup::{Event, Group, GroupId, IN_HOOK, MEMALLOC, Marks, RECLAIMING};
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
        let _marks = if platform.in_interrupt() {
            None
        } else {
            let m = Marks::add(platform, IN_HOOK | RECLAIMING | MEMALLOC);
            if m.saved() & IN_HOOK != 0 {
                // Raised by the hook's own allocation: counted, not reported.
                return;
            }
            Some(m)
        };
        // SAFETY: `event_hook` holds null or a function pointer of type
        // `EventHook` (only `set_event_hook` stores to it), and pointers to
        // data and to functions have one size here.
        let f = unsafe { core::mem::transmute::<*mut (), EventHook>(hook) };
        // The marks guard restores the context's marks when the hook
        // returns or unwinds.
        f(self.group_id(g), e);
    }
}
