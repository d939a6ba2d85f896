//! [`NumaThreads`]: [`Threads`]' slots, each on the node its claimer ran
//! on.

use super::*;

/// [`Threads`] with NUMA nodes: a slot's node is the node its claimer ran
/// on (see the module's *Nodes*), and [`Platform::nodes`] the count of
/// nodes the process may allocate on (1 on a host without NUMA). The same
/// slots as `Threads` (the two share all state), so a program may use
/// both.
///
/// Not the default: every free asks for the node count, which costs 6
/// instructions per 64-byte alloc+free pair even on one node
/// (`scripts/icount.sh`, case `numa`: 52 against `generic`'s 46; a load
/// of a library static, which a position-independent binary reaches
/// through the GOT, and the branch; a thread-local copy cost 3 to 4). A
/// host with one node pays nothing only if it does not ask, so `Threads`
/// stays on node 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct NumaThreads;

impl NumaThreads {
    /// The platform (all state is process-wide).
    pub const fn new() -> Self {
        NumaThreads
    }
}

// SAFETY: every method but `node_of` and `nodes` is `Threads`'s, so its
// points (1) and (3)-(7) hold as there. (2) `SLOT_NODE[s]` is below
// `NODES` (`numa::current_node` folds it below `numa::nodes`, which
// `init` stored into `NODES` before the first claim), both at most
// MAX_NODES; it is written only by a claim of `s`, after the claiming
// CAS and before the claimer's first hold, so it stays fixed while the
// slot is held.
unsafe impl Platform for NumaThreads {
    #[inline(always)]
    fn current_group(&self) -> *const () {
        Threads.current_group()
    }

    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        // SAFETY: forwarded.
        unsafe { Threads.set_current_group(token) }
    }

    #[inline(always)]
    unsafe fn enter(&self) -> Option<usize> {
        // SAFETY: forwarded.
        unsafe { Threads.enter() }
    }

    #[inline(always)]
    unsafe fn try_enter(&self) -> Option<usize> {
        // SAFETY: forwarded.
        unsafe { Threads.try_enter() }
    }

    #[inline(always)]
    unsafe fn exit(&self, slot: usize) {
        // SAFETY: forwarded.
        unsafe { Threads.exit(slot) }
    }

    /// The node the slot's holder ran on when it claimed it (see *Nodes*).
    #[inline(always)]
    fn node_of(&self, slot: usize) -> usize {
        // Relaxed: see `SLOT_NODE`. `get`: a slot is below MAX_CPUS by
        // contract, and node 0 is valid for any other value.
        SLOT_NODE.get(slot).map_or(0, |n| n.load(Ordering::Relaxed) as usize)
    }

    /// The nodes the process may allocate on (1 without NUMA, and before
    /// the first slot is claimed).
    #[inline(always)]
    fn nodes(&self) -> usize {
        // Relaxed: set once in `init`, before any claim; every holder
        // passed through `init`'s Acquire of `KEY`.
        NODES.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn asymmetric(&self) -> bool {
        Threads.asymmetric()
    }

    fn heavy_barrier(&self) {
        Threads.heavy_barrier()
    }

    fn try_heavy_barrier(&self) -> bool {
        Threads.try_heavy_barrier()
    }

    fn now_ms(&self) -> Option<u64> {
        Threads.now_ms()
    }

    unsafe fn steal(&self, slot: usize) -> bool {
        // SAFETY: forwarded.
        unsafe { Threads.steal(slot) }
    }

    unsafe fn unsteal(&self, slot: usize) {
        // SAFETY: forwarded.
        unsafe { Threads.unsteal(slot) }
    }

    fn throttle(&self, ns: u64) {
        Threads.throttle(ns)
    }
}
