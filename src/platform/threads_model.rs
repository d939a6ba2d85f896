//! `Threads` under `--cfg loom` (feature `std`): the per-thread slot
//! platform with the OS build's API, over loom's model thread-locals and
//! per-execution statics, so that a user's loom test whose `Kmem` takes
//! the default platform runs the magazine layer's slot handshake under
//! the model checker.
//!
//! The OS build rests on what loom cannot run (`const` thread-locals read
//! without a destructor, a `pthread` key destructor at thread exit,
//! futexes, `membarrier`), so this one is simpler, with the same slot
//! contract:
//!
//! * a thread claims a free slot on its first `enter` (a CAS of its
//!   `CLAIMED` flag) and holds it until it ends, when the drop of its
//!   thread-local slot cell frees it, as the OS build's key destructor
//!   does; while every slot is taken it takes the shared path, and scans
//!   again on its next operation (no waiting, no rotation: loom models a
//!   handful of threads, and [`MAX_CPUS`] is 2 under loom);
//! * no asymmetric barrier (`asymmetric()` is false), so the fast paths
//!   take the symmetric handshake, whose fences loom models;
//! * loom drops a model thread's thread-locals after a `join` of that
//!   thread may already have returned (std's `join` waits for them), so a
//!   slot can still be held after its thread was joined: loom then checks
//!   that drains empty it through the handshake, as for any held slot.
//!   The model's statics may be gone by then too (loom drops them when the
//!   model's main thread ends), so a thread's slot cell keeps its own
//!   reference to the flags.
//!
//! # Atomics
//!
//! | atomic | written by | ordering | paired with |
//! | --- | --- | --- | --- |
//! | `CLAIMED[s]` | a claim or `steal` (CAS false → true), a release at thread end or `unsteal` (store false) | `Acquire` CAS, `Release` store | each other: the claimer adopts the magazines the releaser left |

use core::cell::Cell;

use std::sync::Arc;

use super::cpu::{MAX_CPUS, Platform};
use crate::sync::{AtomicBool, Ordering, atomic_bool, model_static, model_thread_local};

/// The slot cell of a thread without a slot.
const NONE: usize = usize::MAX;

/// The slots' flags: `true` while a model thread holds the slot (or a
/// drainer stole it).
type Flags = Arc<[AtomicBool; MAX_CPUS]>;

model_static! {
    /// The flags, made afresh for every execution of the model.
    static ref CLAIMED: Flags = Arc::new(core::array::from_fn(|_| atomic_bool(false)));
}

/// A thread's slot (`NONE`: none) and the flags it was claimed in; its
/// drop, when the thread ends, frees the slot.
struct Held {
    slot: Cell<usize>,
    /// Set with `slot`: the flags outlive `CLAIMED`, which loom may drop
    /// before this thread's locals.
    flags: core::cell::OnceCell<Flags>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(flags) = self.flags.get() {
            release(flags, self.slot.get());
        }
    }
}

model_thread_local! {
    /// This thread's slot.
    static SLOT: Held = Held { slot: Cell::new(NONE), flags: core::cell::OnceCell::new() };
    /// This thread's current group token (null: the root).
    static GROUP: Cell<*const ()> = Cell::new(core::ptr::null());
}

/// Frees `slot`, which the caller owns and no longer uses.
fn release(flags: &Flags, slot: usize) {
    // Release: publishes the owner's last writes to the slot's magazines
    // to the next claimer (pairs with the Acquire of the claiming CAS).
    flags[slot].store(false, Ordering::Release);
}

/// Takes a free slot: the first one whose flag a CAS sets.
fn claim() -> Option<usize> {
    // Acquire: adopts the magazines the previous holder left; a failed
    // CAS reads nothing we use (Relaxed).
    (0..MAX_CPUS).find(|&s| CLAIMED[s].compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok())
}

/// The per-thread slot platform; the default with `std` (under loom: the
/// model build described in this module).
#[derive(Clone, Copy, Debug, Default)]
pub struct Threads;

impl Threads {
    /// The platform (all state is per model execution).
    pub const fn new() -> Self {
        Threads
    }
}

// SAFETY: (1) a slot is owned from a successful CAS of its `CLAIMED` flag
// (in `claim`, or `steal`) to the owner's own store of `false` (the drop
// of its thread-local cell when the thread ends, or `unsteal`), and nobody
// else stores `false`, so two contexts never own one slot; `enter`
// returns only the slot its thread's cell holds, which is set after the
// CAS, and a thread's code has ended when its cell drops, so the slot is
// held until the caller's `exit`. (2) one node. (3) never asymmetric, so
// `try_enter` (the default) returns `None`. (4) `steal` claims by the same
// CAS, and no `enter` can take the slot until `unsteal` stores `false`.
// (5) model thread-locals and atomics only. (6) the group token lives in
// a per-thread cell.
unsafe impl Platform for Threads {
    fn current_group(&self) -> *const () {
        GROUP.try_with(Cell::get).unwrap_or(core::ptr::null())
    }

    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        GROUP.try_with(|g| g.replace(token)).unwrap_or(core::ptr::null())
    }

    unsafe fn enter(&self) -> Option<usize> {
        // A thread whose cell is already gone (in its other thread-locals'
        // destructors) takes the shared path.
        SLOT.try_with(|s| {
            if s.slot.get() == NONE {
                s.slot.set(claim()?);
                s.flags.get_or_init(|| CLAIMED.clone());
            }
            Some(s.slot.get())
        })
        .ok()
        .flatten()
    }

    unsafe fn exit(&self, _slot: usize) {}

    unsafe fn steal(&self, slot: usize) -> bool {
        // Acquire: the drainer adopts the magazines, like a claimer.
        CLAIMED[slot].compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    unsafe fn unsteal(&self, slot: usize) {
        release(&CLAIMED, slot);
    }
}
