//! `Threads`: per-thread slots for programs on an OS (feature `std`).
//!
//! A thread claims a free slot on its first allocation and keeps it in a
//! `const`-initialised thread-local with no destructor, so the allocator
//! never re-enters itself through TLS teardown. A `pthread` key destructor
//! (which, unlike Rust TLS destructors, allocates nothing) hands the slot
//! back when the thread exits. Whatever magazines the slot still holds stay
//! with it: the next thread to claim the slot adopts them, and `reap`
//! drains slots nobody holds, so an exiting thread strands nothing.
//!
//! Where the kernel offers `membarrier(PRIVATE_EXPEDITED)`, slot holders
//! use compiler fences only and remote drains pay for a heavy barrier.

use core::cell::Cell;

use super::cpu::{MAX_CPUS, Platform};
use crate::sync::{AtomicBool, AtomicU8, AtomicUsize, Ordering, atomic_bool, atomic_u8, atomic_usize};

const NONE: usize = usize::MAX;

std::thread_local! {
    /// This thread's slot, or `NONE`. `Cell<usize>` has no destructor.
    static SLOT: Cell<usize> = const { Cell::new(NONE) };
    /// The slot again, for `try_enter`: set only where membarrier is
    /// available (`ASYM == 1`), so the fast paths need not ask.
    static FAST: Cell<usize> = const { Cell::new(NONE) };
    /// This thread's current group token (0: the root).
    static GROUP: Cell<*const ()> = const { Cell::new(core::ptr::null()) };
}

/// Slots held by a thread (or stolen by a drainer).
static CLAIMED: [AtomicBool; MAX_CPUS] = [const { atomic_bool(false) }; MAX_CPUS];
/// `pthread` key whose destructor gives a slot back: 0 not yet made,
/// 1 being made, `key + 2` once made.
static KEY: AtomicUsize = atomic_usize(0);
/// 0 unknown, 1 membarrier available, 2 not available.
static ASYM: AtomicU8 = atomic_u8(0);

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// The per-thread slot platform; the default with `std`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Threads;

impl Threads {
    /// The platform (all state is process-wide).
    pub const fn new() -> Self {
        Threads
    }
}

/// Runs at thread exit for threads that claimed a slot.
extern "C" fn release_slot(value: *mut libc::c_void) {
    let slot = value as usize - 1;
    // The thread-local has no destructor, so it is still accessible here.
    let _ = SLOT.try_with(|s| s.set(NONE));
    let _ = FAST.try_with(|s| s.set(NONE));
    // Publishes this thread's last writes to the slot's magazines to the
    // next claimer (pairs with the Acquire of the claiming CAS).
    CLAIMED[slot].store(false, Ordering::Release);
}

/// One-time set-up: the exit key and the barrier mode. Both finish before
/// any slot is handed out (contract point 3).
#[cold]
fn init() -> Option<libc::pthread_key_t> {
    loop {
        match KEY.load(Ordering::Acquire) {
            0 => {
                if KEY.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
                    continue;
                }
                // Miri has no membarrier: there, slot holders use fences.
                let register = || {
                    // SAFETY: registering for private expedited membarrier
                    // has no effect on memory; failure means "not available".
                    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
                };
                let asym = !cfg!(miri) && register();
                ASYM.store(if asym { 1 } else { 2 }, Ordering::Release);
                let mut key: libc::pthread_key_t = 0;
                // SAFETY: `key` is a valid out-pointer; the destructor is an
                // `extern "C"` fn that never unwinds.
                let ok = unsafe { libc::pthread_key_create(&mut key, Some(release_slot)) } == 0;
                KEY.store(if ok { key as usize + 2 } else { 0 }, Ordering::Release);
                if !ok {
                    return None;
                }
            }
            1 => crate::sync::spin_hint(),
            k => return Some((k - 2) as libc::pthread_key_t),
        }
    }
}

impl Threads {
    #[cold]
    #[inline(never)]
    fn claim(&self) -> Option<usize> {
        let key = init()?;
        for (slot, claimed) in CLAIMED.iter().enumerate() {
            // Acquire: adopt the magazines the previous holder left behind.
            if claimed.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                // SAFETY: `key` is a live key; the value is a plain integer.
                if unsafe { libc::pthread_setspecific(key, core::ptr::without_provenance::<libc::c_void>(slot + 1)) }
                    != 0
                {
                    // Without an exit hook the slot would leak on exit.
                    claimed.store(false, Ordering::Release);
                    return None;
                }
                let _ = SLOT.try_with(|s| s.set(slot));
                if ASYM.load(Ordering::Relaxed) == 1 {
                    let _ = FAST.try_with(|s| s.set(slot));
                }
                return Some(slot);
            }
        }
        None
    }
}

// SAFETY: (1) a slot is claimed by CAS, recorded in one thread's local, and
// released only by that thread's exit destructor (or by `unsteal` of a
// drainer that stole an unclaimed one), so two threads never hold one slot;
// Rust code does not re-enter a thread between enter and exit. (2) one node.
// (3) ASYM is settled in `init`, before the first claim, and `FAST` (what
// `try_enter` reads) is set only when it is 1. (4) `steal` claims
// by the same CAS. (5) TLS access, atomics, and two libc calls that do not
// allocate (pthread_setspecific for keys below PTHREAD_KEYS_2NDLEVEL_SIZE).
// (6) the group token lives in a per-thread cell.
unsafe impl Platform for Threads {
    #[inline(always)]
    fn current_group(&self) -> *const () {
        GROUP.try_with(Cell::get).unwrap_or(core::ptr::null())
    }

    fn set_current_group(&self, token: *const ()) -> *const () {
        GROUP.try_with(|g| g.replace(token)).unwrap_or(core::ptr::null())
    }

    #[inline(always)]
    fn enter(&self) -> Option<usize> {
        // A const-initialised cell without a destructor never becomes
        // inaccessible, so `with` has no failure path here.
        let slot = SLOT.with(Cell::get);
        if slot != NONE { Some(slot) } else { self.claim() }
    }

    /// The thread's slot once it has one and membarrier is available
    /// (`FAST` is set only then); the claim is left to `enter` on the slow
    /// path, so the fast paths make no call and read no global.
    #[inline(always)]
    fn try_enter(&self) -> Option<usize> {
        let slot = FAST.with(Cell::get);
        if slot != NONE { Some(slot) } else { None }
    }

    #[inline(always)]
    fn exit(&self, _slot: usize) {}

    #[inline(always)]
    fn asymmetric(&self) -> bool {
        ASYM.load(Ordering::Relaxed) == 1
    }

    fn heavy_barrier(&self) {
        // SAFETY: registered in `init` (asymmetric() is true only then).
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
    }

    fn steal(&self, slot: usize) -> bool {
        CLAIMED[slot].compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    fn unsteal(&self, slot: usize) {
        CLAIMED[slot].store(false, Ordering::Release);
    }
}
