//! `Threads`: per-thread slots for programs on an OS (feature `std`).
//!
//! A thread claims a free slot on its first allocation and keeps it in
//! `const`-initialised thread-locals with no destructor, so the allocator
//! never re-enters itself through TLS teardown. A `pthread` key destructor
//! (which, unlike Rust TLS destructors, allocates nothing) hands the slot
//! back when the thread exits. Whatever magazines the slot still holds stay
//! with it: the next thread to claim the slot adopts them, and `reap`
//! drains slots nobody holds, so an exiting thread strands nothing.
//!
//! Where the kernel offers `membarrier(PRIVATE_EXPEDITED)`, slot holders
//! use compiler fences only and remote drains pay for a heavy barrier.
//!
//! # Thread exit
//!
//! The exit hook is kmemcg's `pthread` key destructor, and a thread gets
//! one from its first `enter`, with a slot or without ([`HOOK_ONLY`]): it
//! releases the slot and marks the thread [`EXITED`], after which the
//! thread takes the shared path (another key's destructor may still
//! allocate). One case is left: a thread whose very first allocation
//! through this platform comes from a key destructor in glibc's last
//! round (`PTHREAD_DESTRUCTOR_ITERATIONS`, 4) sets the key too late for
//! glibc to run the hook, and keeps its slot for good (its magazines
//! stranded, its `OWNER` entry naming its freed `FAST` word). No glibc
//! interface tells a destructor round from ordinary running.
//!
//! # Signal handlers
//!
//! A slot is the thread's, not the operation's: a signal handler that
//! allocates through the same `Kmem` while its thread is inside an
//! operation gets the slot that operation holds, part way through a pop
//! or a push (a review's test saw one object handed to the handler and to
//! the interrupted code). As with `malloc`, allocating in a signal
//! handler is not supported (the README says so); marking holds per
//! thread to refuse it would be a store on every operation. Installing a
//! handler takes `unsafe` code, so no safe program gets there.
//!
//! # More threads than slots
//!
//! With more live threads than [`MAX_CPUS`], the threads without a slot
//! would take the shared path on every operation; its locks spin, and a
//! lock holder preempted among dozens of runnable threads stalls every
//! other thread on that path for whole scheduler rounds (seen: 256
//! alloc/free pairs in 3 s against 12 million for a slot holder). So slot
//! time is shared out instead:
//!
//! * **Releases and the epoch.** A slot is only ever freed by a
//!   *release* (thread exit, a give-up, `unsteal`), which bumps the
//!   `RELEASES` epoch after freeing it and wakes one sleeping waiter. A
//!   thread whose scan found nothing remembers the epoch it read first
//!   (`SEEN`) and scans again only once it has moved, so a slotless
//!   operation costs a load, not a scan. A scan starts at the slot
//!   released last (`HINT`) and reads each flag before trying its CAS: one
//!   CAS per slot that looked free, not one per slot.
//! * **Waiting.** A thread turned away sleeps on the epoch (a futex on
//!   its low 32 bits, counted in `WAITERS`) until a release wakes it or
//!   [`WAIT_NS`] passes. A release it loses to another thread sends it
//!   back to sleep; a whole [`WAIT_NS`] without any release means the
//!   holders are not rotating (they are idle, or allocate too rarely to
//!   end a quantum): it records the epoch in `VAIN` and takes the shared
//!   path, as do all threads until the next release, raising `WANTED`.
//!   (Under Miri nobody sleeps: a thread turned away takes the shared
//!   path and scans again on its next operation.)
//! * **Rotation.** A holder counts its operations and, after
//!   [`QUANTUM`] of them, gives its slot up if more threads sleep for one
//!   than slots are free (and no wait at this epoch was in vain), or if it
//!   can clear `WANTED`: exactly as thread exit does (cells cleared,
//!   `OWNER[s]` withdrawn, the exit hook disarmed, the flag stored with
//!   `Release`, the epoch bumped), in `enter`, which the allocator calls
//!   outside any hold. It then waits like any other thread, behind those
//!   already asleep (futex queues are FIFO), so slots go round. If no
//!   release comes for [`WAIT_NS`] it scans once more and mostly gets its
//!   own slot back.
//! * **Counting only under contention.** Counting is a store on every
//!   operation, and a store-then-reload dependency on the next one (about
//!   1.4 ns a pair), so holders count only while slots are short. A
//!   holder's fast path is *armed* while its `FAST` word is its slot
//!   times 32 (`armed(s)`, the byte offset of the slot's entries in the
//!   magazine layer's arrays, so the fast path has no shift to make):
//!   `try_enter` then only loads it. The first thread turned away raises
//!   `CONTENDED` and *revokes* every armed holder: it switches each one's
//!   `FAST` (whose address the holder publishes in `OWNER[s]`) to
//!   *counting*, `counting(slot, FAST_TICKS)`, by compare-and-swap from
//!   the armed value. A counting holder's `try_enter` (out of line)
//!   counts a tick down per hold and, out of ticks, sends the operation
//!   to `enter`, which counts the ticks against the quantum and starts
//!   another [`FAST_TICKS`]. At the end of a quantum with nobody waiting
//!   and `WANTED` clear the holder lowers `CONTENDED` and re-arms. A
//!   holder arms only while `CONTENDED` is low, and reads it again after
//!   arming (`SeqCst` on both sides, Dekker with the revoker), so no
//!   holder stays armed through contention. Without membarrier `FAST` is
//!   always `NONE` and `enter` counts every operation.
//! * **Revocation is guarded.** A thread's `FAST` dies with the thread,
//!   so a revoker writes it only while it holds the slot's `REVOKING`
//!   flag and `OWNER[s]` names it, and a holder withdraws `OWNER[s]`
//!   under the same flag before it frees the slot or exits (it waits out
//!   a revoker's few instructions).
//!
//! With no more active threads than slots nobody sleeps, revokes or
//! raises `WANTED`, and a holder pays one load per fast-path operation
//! and nothing per [`QUANTUM`].
//! A thread that keeps a slot but stops allocating is never asked for it
//! (only `enter` can give a slot up); threads waiting behind such holders
//! find out after [`WAIT_NS`], once per release.
//!
//! # Nodes
//!
//! `Threads` puts every slot on node 0. [`NumaThreads`] (the same slots)
//! tells nodes apart: a slot's node is the node its claimer ran on at the claim (`getcpu(2)`,
//! node 0 if the kernel cannot tell; see the `numa` module), stored per
//! slot, so `node_of` is one load; `nodes()` is the count of nodes the
//! process may allocate on, asked once in `init`. On a host with one node
//! neither costs a syscall. A thread that the scheduler moves to another
//! node keeps its slot's node until it claims a slot again (after a
//! give-up, or in a new thread): its refills then come from the old
//! node's slabs, still correct, only remote. Linux 6.3's rseq `node_id`
//! would let a holder refresh it with a thread-local load; that is not
//! done: glibc registers the rseq area itself and exposes only its
//! offset, and the node would then change while the slot is held, which
//! `Platform::node_of` forbids.
//!
//! # Per-thread state
//!
//! | state | `SLOT` | `FAST` | `OWNER[s]` | key value | `CLAIMED[s]` |
//! | --- | --- | --- | --- | --- | --- |
//! | holds `s`, fast path armed (asymmetric only) | `s` | `armed(s)` | `&FAST` | `s + 1` | `true` |
//! | holds `s`, counting (asymmetric only) | `s` | `counting(s, ticks)` | `&FAST` | `s + 1` | `true` |
//! | holds `s`, no membarrier | `s` | `NONE` | null | `s + 1` | `true` |
//! | no slot | `NONE` | `NONE` | — | null | — |
//!
//! Cells change only on their own thread, except that a revoker may
//! switch an armed `FAST` to counting; a slot's cells are set after its claiming
//! CAS and cleared (and `OWNER[s]` withdrawn) before the store that
//! frees it.
//!
//! # Atomics
//!
//! | atomic | written by | ordering | paired with |
//! | --- | --- | --- | --- |
//! | `CLAIMED[s]` | a claim or `steal` (CAS false → true), a release (store false) | `Acquire` CAS, `Release` store | each other: the claimer adopts the magazines the releaser left |
//! | `RELEASES` | every release, after freeing its slot | `SeqCst` `fetch_add` | a scanner's `Acquire` load (a scan after reading an epoch sees the slots freed before it); with `WAITERS`, Dekker: a releaser sees the waiter or the waiter sees the epoch move |
//! | `WAITERS` | threads starting and ending a sleep | `SeqCst` inc, `Relaxed` dec | the releaser's `SeqCst` load before it wakes anyone; holders read it `Relaxed` |
//! | `HINT`, `VAIN`, `WANTED` | releases; a wait in vain; slotless threads (set) and holders (clear) | `Relaxed` | nothing: hints that steer scans and give-ups, never a publication |
//! | `FAST`, and `REVOKER`'s `CONTENDED`, `OWNER[s]`, `REVOKING[s]` | see the `revoke` module | | |
//! | `KEY`, `ASYM` | `init`, once | `Release` | `Acquire` in `init` before any claim |
//! | `NODES` | `init`, once, before `KEY` | `Relaxed` | `KEY`'s `Release`/`Acquire`: every claimer and holder passed `init` |
//! | `SLOT_NODE[s]` | a claim of `s`, after its CAS | `Relaxed` | nothing: read by `NumaThreads::node_of` in the holder that wrote it (a later holder reads it after its own claim rewrote it) |

use core::cell::Cell;
use core::mem::size_of;

use crossbeam_utils::CachePadded;

use super::cpu::{MAX_CPUS, Platform, cpu_for_slot, slot_for_cpu};
use super::revoke::{self, FAST_TICKS, Revoker, armed_slot, counting, ticks_used};
use crate::sync::{AtomicBool, AtomicU8, AtomicUsize, Ordering, atomic_bool, atomic_u8, atomic_usize};

/// `SLOT` of a thread without a slot; also "never" for epochs; and the
/// `FAST` word of a thread without a fast path.
const NONE: usize = revoke::NONE;

/// Counted operations a holder performs before it looks for threads
/// waiting for a slot (tens to hundreds of microseconds of allocation).
const QUANTUM: usize = 16 * 1024;
/// How long a waiting thread sleeps for a release before it concludes
/// that the holders are not rotating.
const WAIT_NS: libc::c_long = 1_000_000;

std::thread_local! {
    /// This thread's slot, or `NONE`. `Cell<usize>` has no destructor.
    static SLOT: Cell<usize> = const { Cell::new(NONE) };
    /// For `try_enter`: the slot while the fast path is armed,
    /// `counting(slot, ticks)` while the holder counts, else `NONE`:
    /// always `NONE` without a slot and where membarrier is unavailable
    /// (`ASYM != 1`), so the fast paths need not ask. An atomic only so
    /// that a revoker may switch it to counting (see *Counting only under
    /// contention*).
    static FAST: AtomicUsize = const { atomic_usize(NONE) };
    /// Operations left in this holder's quantum.
    static LEFT: Cell<usize> = const { Cell::new(0) };
    /// Without a slot: the `RELEASES` epoch at which this thread last saw
    /// every slot taken (`NONE`: never looked); it scans again once the
    /// epoch differs.
    static SEEN: Cell<usize> = const { Cell::new(NONE) };
    /// This thread's current group token (0: the root).
    static GROUP: Cell<*const ()> = const { Cell::new(core::ptr::null()) };
    /// Set by the exit hook ([`release_slot`]): the thread claims no slot
    /// again. A key destructor that runs after ours and allocates would
    /// otherwise claim one and set our key again, which glibc no longer
    /// looks at in its last round: the slot would stay claimed for good,
    /// its `OWNER` naming the dead thread's `FAST` (a review found the next
    /// revocation reading it after the thread's memory was gone).
    static EXITED: Cell<bool> = const { Cell::new(false) };
    /// Whether kmemcg's key holds a value for this thread (a slot, or
    /// [`HOOK_ONLY`]): from its first `enter`, every thread's exit hook
    /// runs, with or without a slot.
    static HOOKED: Cell<bool> = const { Cell::new(false) };
}

/// kmemcg's key value for a thread that entered the allocator and holds
/// no slot (it found none, or gave its own up): not null, so the exit hook
/// runs for it too and marks it [`EXITED`], but it names no slot (`slot + 1`
/// of a real one is at most [`MAX_CPUS`]). Without it, such a thread's
/// exit ran no hook, and a later key destructor that allocated could
/// claim a slot that no hook would ever release (a review found it after
/// the first fix).
const HOOK_ONLY: usize = MAX_CPUS + 1;

/// The node of each slot: the node its holder ran on when it claimed it
/// (see *Nodes*). Written by the claimer after its claiming CAS, read by
/// the holder (and by later holders only after their own claim rewrote
/// it), so `Relaxed` suffices: the `CLAIMED` pair orders it anyway.
static SLOT_NODE: [AtomicU8; MAX_CPUS] = [const { atomic_u8(0) }; MAX_CPUS];
/// The nodes the process may use (`numa::nodes`), stored in `init`
/// before the first claim; 1 until then, and on a host with one node.
static NODES: AtomicUsize = atomic_usize(1);
/// Slots held by a thread (or stolen by a drainer).
static CLAIMED: [AtomicBool; MAX_CPUS] = [const { atomic_bool(false) }; MAX_CPUS];
/// Releases so far, bumped after every store of `false` to `CLAIMED`; its
/// low 32 bits are the futex word waiting threads sleep on.
static RELEASES: CachePadded<AtomicUsize> = CachePadded::new(atomic_usize(0));
/// Threads asleep (or about to sleep) on `RELEASES`.
static WAITERS: CachePadded<AtomicUsize> = CachePadded::new(atomic_usize(0));
/// Set by a thread that takes the shared path for want of a slot; a
/// holder at the end of its quantum that clears it gives its slot up.
static WANTED: CachePadded<AtomicBool> = CachePadded::new(atomic_bool(false));
/// Where scans start: the claim order (`cpu_for_slot`) of the slot
/// released last.
static HINT: AtomicUsize = atomic_usize(0);
/// `CONTENDED`, `OWNER[s]` and `REVOKING[s]`: which holders' `FAST`
/// words a thread turned away switches to counting (see *Counting only
/// under contention*).
static REVOKER: Revoker = Revoker::new();
/// The epoch at which a thread last waited [`WAIT_NS`] without a release
/// (`NONE`: never): until the next release, slotless threads do not wait.
static VAIN: AtomicUsize = atomic_usize(NONE);
/// `pthread` key whose destructor gives a slot back: 0 not yet made,
/// 1 being made, `key + 2` once made.
static KEY: AtomicUsize = atomic_usize(0);
/// 0 unknown, 1 membarrier available, 2 not available.
static ASYM: AtomicU8 = atomic_u8(0);

mod numa_threads;
pub use numa_threads::NumaThreads;

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
/// Tries of a refused `membarrier` before [`membarrier`] gives up.
const BARRIER_TRIES: usize = 8;

/// `membarrier(PRIVATE_EXPEDITED)`: whether it ran. The process
/// registered in `init`, but the kernel may still refuse the call
/// (`ENOMEM` on kernels that allocate the CPU mask, or a seccomp filter
/// installed since, on the calling thread only); a refusal is retried a
/// few times, yielding between tries.
fn membarrier() -> bool {
    for _ in 0..BARRIER_TRIES {
        // SAFETY: membarrier touches no memory of ours.
        if unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) } == 0 {
            return true;
        }
        // SAFETY: no memory touched.
        unsafe { libc::sched_yield() };
    }
    false
}

/// The per-thread slot platform; the default with `std`. Every slot is
/// node 0: see [`NumaThreads`] for hosts with several nodes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Threads;

impl Threads {
    /// The platform (all state is process-wide).
    pub const fn new() -> Self {
        Threads
    }
}

/// The futex word: the low 32 bits of `RELEASES`. Only the kernel reads
/// it as a `u32` (in `FUTEX_WAIT`, comparing it with the epoch a waiter
/// read); our code always accesses `RELEASES` whole.
fn futex_word() -> *mut u32 {
    let p = RELEASES.as_ptr().cast::<u32>();
    if cfg!(target_endian = "big") && size_of::<usize>() == 8 { p.wrapping_add(1) } else { p }
}

/// Sleeps while the low 32 bits of `RELEASES` equal those of `epoch`, at
/// most [`WAIT_NS`]; `false` if the time ran out.
fn sleep_on(epoch: usize) -> bool {
    let timeout = libc::timespec { tv_sec: 0, tv_nsec: WAIT_NS };
    // SAFETY: the word is a live, aligned static the kernel only reads
    // here; `timeout` outlives the call. FUTEX_WAIT touches no memory of
    // ours and returns on a wake, a signal, a changed word or the timeout.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_word(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            epoch as u32,
            &timeout as *const libc::timespec,
        )
    };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ETIMEDOUT)
}

/// Frees `slot`, which the caller owns and no longer uses (its cells are
/// cleared), and wakes one waiting thread; returns the epoch after this
/// release.
fn release(slot: usize) -> usize {
    // Relaxed: the hint only steers where scans start; any value is a
    // valid slot.
    HINT.store(cpu_for_slot(slot), Ordering::Relaxed);
    // Publishes the owner's last writes to the slot's magazines to the
    // next claimer (pairs with the Acquire of the claiming CAS).
    CLAIMED[slot].store(false, Ordering::Release);
    // SeqCst: Release for scanners (one that reads this epoch sees the
    // store above), and ordered before the load of WAITERS below against
    // a waiter's increment and load of the epoch (Dekker), so a thread
    // going to sleep on the old epoch is seen and woken.
    let epoch = RELEASES.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
    if WAITERS.load(Ordering::SeqCst) > 0 {
        // SAFETY: as in `sleep_on`; FUTEX_WAKE only reads the address.
        unsafe { libc::syscall(libc::SYS_futex, futex_word(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1) };
    }
    epoch
}

/// Runs at thread exit for threads that entered the allocator: releases
/// the slot the value names, if any ([`HOOK_ONLY`] names none).
extern "C" fn release_slot(value: *mut libc::c_void) {
    // The thread-locals have no destructor, so they are still accessible.
    let _ = EXITED.try_with(|e| e.set(true));
    let slot = value as usize - 1;
    if slot >= MAX_CPUS {
        return;
    }
    let _ = SLOT.try_with(|s| s.set(NONE));
    let _ = FAST.try_with(|f| f.store(NONE, Ordering::Relaxed));
    // Before this thread's `FAST` goes away with it.
    withdraw(slot);
    release(slot);
}

/// One-time set-up: the exit key and the barrier mode. Both finish before
/// any slot is handed out (contract point 3).
#[cold]
fn init() -> Option<libc::pthread_key_t> {
    // Others wait for the one thread setting up, yielding: registering for
    // membarrier may take the kernel milliseconds (an RCU grace period).
    let mut i = 0;
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
                // Before any claim: a claim reads it to fold its node.
                NODES.store(super::numa::nodes(), Ordering::Relaxed);
                let asym = !cfg!(miri) && register();
                ASYM.store(if asym { 1 } else { 2 }, Ordering::Release);
                if asym {
                    // Failure (out of memory) leaves the gap `after_fork`
                    // closes.
                    // SAFETY: registers a handler for a fork's child: an
                    // `extern "C"` fn that never unwinds and only stores to
                    // atomics (async-signal-safe).
                    unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
                }
                let mut key: libc::pthread_key_t = 0;
                // SAFETY: `key` is a valid out-pointer; the destructor is an
                // `extern "C"` fn that never unwinds.
                let ok = unsafe { libc::pthread_key_create(&mut key, Some(release_slot)) } == 0;
                KEY.store(if ok { key as usize + 2 } else { 0 }, Ordering::Release);
                if !ok {
                    return None;
                }
            }
            1 => {
                crate::sync::wait_step(i);
                i += 1;
            }
            k => return Some((k - 2) as libc::pthread_key_t),
        }
    }
}

/// In the child of a `fork`: only the forking thread exists, so no other
/// thread's `FAST` word may be written to (see `revoke`'s *After fork*).
extern "C" fn after_fork_child() {
    FAST.with(|f| REVOKER.after_fork(f));
}

/// The word published for `slot`, for the fork test.
#[cfg(all(test, feature = "std", not(loom), not(miri)))]
pub(crate) fn published(slot: usize) -> *const AtomicUsize {
    REVOKER.published(slot)
}

/// Whether `try_enter` hands out slots. Relaxed: `ASYM` is settled in
/// `init`, which every holder passed through (with an Acquire load of
/// `KEY`) before its claim (drainers: see `Threads::asymmetric`).
#[inline(always)]
fn fast_ok() -> bool {
    ASYM.load(Ordering::Relaxed) == 1
}

/// Whether holders arm `FAST`: with membarrier, and always under Miri,
/// which has no membarrier but would otherwise send every operation down
/// the slow path (about twice the interpreted work of a user's test run):
/// there `Slots::try_hold` fences itself, as the slow path's handshake
/// does without an asymmetric barrier.
#[inline(always)]
fn armed_ok() -> bool {
    cfg!(miri) || fast_ok()
}

/// Asks holders for a slot. Relaxed: the flag carries no data; reading
/// first keeps threads on the shared path from writing a line holders
/// read.
#[inline]
fn want() {
    if !WANTED.load(Ordering::Relaxed) {
        WANTED.store(true, Ordering::Relaxed);
    }
    contend();
}

/// A thread was turned away: makes every holder count (once per spell of
/// contention).
#[inline]
fn contend() {
    REVOKER.contend();
}

/// Publishes the calling holder's `FAST` word for revokers of `slot`.
fn publish(slot: usize) {
    FAST.with(|f| {
        // SAFETY: the caller holds `slot`; a `const` thread-local without
        // a destructor lives as long as its thread, and the holder
        // withdraws the word before it frees the slot or its thread ends.
        unsafe { REVOKER.publish(slot, f) }
    });
}

/// Withdraws the caller's `FAST` word from revokers of `slot`, which it
/// holds: before it frees the slot or its thread ends.
fn withdraw(slot: usize) {
    REVOKER.withdraw(slot);
}

/// Arms the calling holder's fast path on `slot` (or sets it counting
/// while slots are short); membarrier is available (the caller checked).
#[inline]
fn arm(slot: usize) {
    FAST.with(|f| REVOKER.arm(slot, f));
}

/// Slots nobody holds now (Relaxed: a snapshot for a heuristic).
fn free_slots() -> usize {
    CLAIMED.iter().filter(|c| !c.load(Ordering::Relaxed)).count()
}

impl Threads {
    /// `enter` for a holder: nothing to do while its fast path is armed
    /// (this is one of its slow paths); else counts the operation against
    /// the quantum, and at the quantum's end may give the slot up.
    #[inline(always)]
    fn turn(&self, slot: usize) -> Option<usize> {
        let fast = armed_ok();
        let mut used = 1;
        if fast {
            let v = FAST.with(|f| f.load(Ordering::Relaxed));
            if armed_slot(v).is_some() {
                return Some(slot);
            }
            // Counting: the holds `try_enter` granted, and this one.
            if v != NONE {
                used = ticks_used(v) + 1;
            }
        }
        let left = LEFT.with(Cell::get);
        if left > used {
            LEFT.with(|l| l.set(left - used));
            if fast {
                FAST.with(|f| f.store(counting(slot, FAST_TICKS), Ordering::Relaxed));
            }
            return Some(slot);
        }
        self.quantum_end(slot, fast)
    }

    /// A holder's quantum is over: give the slot up if more threads sleep
    /// for one than slots are free, or if a thread on the shared path
    /// asked (clearing its request, so one request frees one slot), and
    /// wait like the others; else start another quantum.
    #[cold]
    #[inline(never)]
    fn quantum_end(&self, slot: usize, fast: bool) -> Option<usize> {
        // Relaxed loads: whom to give a slot to is a heuristic; the swap
        // makes exactly one holder answer a request. Sleepers count only
        // while waiting pays: after a wait in vain at this epoch they may
        // be gone (a `fork` leaves its child the parent's count).
        let waiters = WAITERS.load(Ordering::Relaxed);
        let sleepers =
            waiters > 0 && VAIN.load(Ordering::Relaxed) != RELEASES.load(Ordering::Relaxed) && waiters > free_slots();
        if sleepers || (WANTED.load(Ordering::Relaxed) && WANTED.swap(false, Ordering::Relaxed)) {
            // `init` ran before the claim, so the key is there.
            if let Some(key) = init()
                // SAFETY: `key` is a live key; `HOOK_ONLY` keeps the exit
                // hook for this thread but names no slot (and setting it
                // allocates nothing, as in `claim`).
                && unsafe { libc::pthread_setspecific(key, core::ptr::without_provenance(HOOK_ONLY)) } == 0
            {
                SLOT.with(|s| s.set(NONE));
                FAST.with(|f| f.store(NONE, Ordering::Relaxed));
                withdraw(slot);
                let epoch = release(slot);
                // Not a scan straight away: that would take the slot back.
                SEEN.with(|s| s.set(epoch));
                return self.wait(key);
            }
        }
        LEFT.with(|l| l.set(QUANTUM));
        if fast {
            // Nobody asked (the loads above): the spell of contention is
            // over, as far as this holder can tell.
            if REVOKER.contended() && waiters == 0 && !WANTED.load(Ordering::Relaxed) {
                REVOKER.calm();
            }
            arm(slot);
        }
        Some(slot)
    }

    /// `enter` without a slot: a scan if the epoch moved since this
    /// thread's last failed one, else a wait.
    #[cold]
    #[inline(never)]
    fn enter_slotless(&self) -> Option<usize> {
        // An exiting thread past its exit hook: the shared path.
        if EXITED.with(Cell::get) {
            return None;
        }
        let key = init()?;
        if !HOOKED.with(Cell::get) {
            // SAFETY: `key` is a live key; the value is a plain integer.
            if unsafe { libc::pthread_setspecific(key, core::ptr::without_provenance(HOOK_ONLY)) } == 0 {
                HOOKED.with(|h| h.set(true));
            }
        }
        // Acquire: pairs with the bump in `release`, so the scan after
        // reading an epoch sees every slot freed before it.
        let epoch = RELEASES.load(Ordering::Acquire);
        if epoch != SEEN.with(Cell::get) {
            if let Some(slot) = self.claim(key) {
                return Some(slot);
            }
            SEEN.with(|s| s.set(epoch));
            contend();
        }
        self.wait(key)
    }

    /// Waits for a slot, with `SEEN` the epoch of this thread's last
    /// failed scan (or of its give-up): sleeps until a release, scans,
    /// and sleeps again if another thread won; `None` (the shared path)
    /// once a whole [`WAIT_NS`] passes without a release, and at once
    /// while `VAIN` says the last such wait was at this epoch.
    fn wait(&self, key: libc::pthread_key_t) -> Option<usize> {
        // Miri: no futex on part of an atomic, so no sleep; a scan (two
        // slots there) instead, which also takes back a slot given up.
        if cfg!(miri) {
            return self.claim(key).or_else(|| {
                want();
                None
            });
        }
        // Relaxed: `VAIN` is a hint (a stale value costs one wait, or one
        // operation on the shared path).
        if VAIN.load(Ordering::Relaxed) == SEEN.with(Cell::get) {
            want();
            return None;
        }
        // SeqCst: before the epoch load below (Dekker with `release`).
        WAITERS.fetch_add(1, Ordering::SeqCst);
        let slot = loop {
            let seen = SEEN.with(Cell::get);
            // SeqCst: see above; also Acquire for the scan.
            let epoch = RELEASES.load(Ordering::SeqCst);
            if epoch != seen {
                if let Some(slot) = self.claim(key) {
                    break Some(slot);
                }
                SEEN.with(|s| s.set(epoch));
                continue;
            }
            if !sleep_on(epoch) && RELEASES.load(Ordering::Acquire) == epoch {
                // No release for a whole wait: the holders are not
                // rotating. One more scan: a slot may be free that nobody
                // was woken for (this thread's own, after a give-up nobody
                // took).
                VAIN.store(epoch, Ordering::Relaxed);
                break self.claim(key);
            }
        };
        // Relaxed: the count only decides whether releases wake anyone
        // and holders give up; a late decrement costs a spare wake.
        WAITERS.fetch_sub(1, Ordering::Relaxed);
        if slot.is_none() {
            want();
        }
        slot
    }

    /// One pass over the slots in [`slot_for_cpu`] order (so that the
    /// first half of the threads to claim one have magazines on cache
    /// lines of their own) from `HINT`: the first free one that a CAS
    /// takes becomes this thread's.
    fn claim(&self, key: libc::pthread_key_t) -> Option<usize> {
        // Relaxed: any value is a valid place to start.
        let start = HINT.load(Ordering::Relaxed) % MAX_CPUS;
        for i in 0..MAX_CPUS {
            let slot = slot_for_cpu(if start + i < MAX_CPUS { start + i } else { start + i - MAX_CPUS });
            let claimed = &CLAIMED[slot];
            // Relaxed load: only decides whether to try the CAS, which
            // (Acquire) adopts the magazines the previous holder left; a
            // failed CAS reads nothing we use (Relaxed).
            if claimed.load(Ordering::Relaxed)
                || claimed.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err()
            {
                continue;
            }
            // SAFETY: `key` is a live key; the value is a plain integer.
            if unsafe { libc::pthread_setspecific(key, core::ptr::without_provenance::<libc::c_void>(slot + 1)) } != 0 {
                // Without an exit hook the slot would leak on exit.
                release(slot);
                return None;
            }
            // Relaxed: see `SLOT_NODE`; below MAX_NODES (`numa`), so the
            // cast keeps it.
            SLOT_NODE[slot].store(super::numa::current_node() as u8, Ordering::Relaxed);
            HOOKED.with(|h| h.set(true));
            SLOT.with(|s| s.set(slot));
            LEFT.with(|l| l.set(QUANTUM));
            if armed_ok() {
                publish(slot);
                arm(slot);
            }
            return Some(slot);
        }
        None
    }
}

// SAFETY: (1) a slot is owned from a successful CAS of its `CLAIMED` flag
// (in `claim`, or `steal`) to the owner's own store of `false` (in
// `release`: thread exit, a give-up, a claim whose exit hook failed; or
// `unsteal`), and nobody else stores `false`, so two threads never own one
// slot. A thread writes its slot into `SLOT`/`FAST` after the CAS and
// clears them before the store; other threads only ever store `NONE`
// into `FAST` (revokers, while `OWNER[s]` names it, which the holder
// withdraws before its thread or its hold of the slot ends); and
// `enter`/`try_enter` return only what those cells hold, so only an owned
// slot. It stays owned until the
// caller's `exit`: ownership ends only at thread exit (after all of the
// thread's code) or in a give-up, which happens inside `enter`, and the
// allocator calls `enter` only outside a hold (it holds one slot at a
// time and pairs each `enter` with `exit` before the next); Rust code
// does not re-enter a thread between enter and exit, except a signal
// handler, which must not allocate through the allocator (the module's
// *Signal handlers*; installing one is `unsafe`). The Release store /
// Acquire CAS pair hands the slot's magazines to the next owner. (2) one
// node. (3) ASYM is settled in `init`, before the first claim, and `FAST`
// (what `try_enter` reads) holds a slot only when it is 1. (4) `steal`
// claims by the same CAS, and `claim` cannot take the slot until
// `unsteal` stores `false`. (5) TLS access, atomics, and libc calls that
// do not allocate: pthread_setspecific (for keys below
// PTHREAD_KEYS_2NDLEVEL_SIZE, and of null values), futex wait and wake
// (`enter` may sleep, as a lock would, but only outside a hold and at
// most [`WAIT_NS`] without a release); the arithmetic cannot overflow
// (a counting word's ticks never exceed `FAST_TICKS`, and `left > used`
// is checked before the subtraction).
// (6) the group token lives in a per-thread cell.
unsafe impl Platform for Threads {
    #[inline(always)]
    fn current_group(&self) -> *const () {
        GROUP.try_with(Cell::get).unwrap_or(core::ptr::null())
    }

    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        GROUP.try_with(|g| g.replace(token)).unwrap_or(core::ptr::null())
    }

    #[inline(always)]
    unsafe fn enter(&self) -> Option<usize> {
        // A const-initialised cell without a destructor never becomes
        // inaccessible, so `with` has no failure path here.
        let slot = SLOT.with(Cell::get);
        if slot != NONE { self.turn(slot) } else { self.enter_slotless() }
    }

    /// The thread's slot while it has one, membarrier is available (`FAST`
    /// holds a slot only then) and its fast path is armed, or counting
    /// with ticks left; a claim, and the quantum's accounting, are left to
    /// `enter` on the slow path, so an armed fast path makes one load, no
    /// call and no store.
    #[inline(always)]
    unsafe fn try_enter(&self) -> Option<usize> {
        // Relaxed: the word only ever names this thread's own slot, or
        // none (see the atomics table).
        FAST.with(revoke::fast_hold)
    }

    #[inline(always)]
    unsafe fn exit(&self, _slot: usize) {}

    /// A holder passed through `init` before its claim, so it reads
    /// `ASYM` settled. A drainer may not have (a thread that only reaps or
    /// shrinks): where it reads `ASYM` unsettled it settles it through
    /// `init`, whose Acquire load of `KEY` orders the value stored before
    /// any claim before its own read (contract point 3: a stale "unknown"
    /// would send it down the symmetric path while holders fence with the
    /// compiler alone).
    #[inline(always)]
    fn asymmetric(&self) -> bool {
        if ASYM.load(Ordering::Relaxed) == 0 {
            let _ = init();
        }
        fast_ok()
    }

    /// `membarrier(PRIVATE_EXPEDITED)`. Holders fence with the compiler
    /// alone while [`Platform::asymmetric`] holds, so the drain that asks
    /// for this barrier must not go on without it: a refusal (see
    /// `membarrier` in this module) stops the program. Reaps ask through
    /// [`Platform::try_heavy_barrier`] and give up instead.
    fn heavy_barrier(&self) {
        if !membarrier() {
            super::fatal("kmemcg: membarrier(PRIVATE_EXPEDITED) failed; slots cannot be drained safely");
        }
    }

    fn try_heavy_barrier(&self) -> bool {
        membarrier()
    }

    /// `CLOCK_MONOTONIC` (loom: none).
    fn now_ms(&self) -> Option<u64> {
        if cfg!(loom) {
            return None;
        }
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec to write; the call neither allocates nor
        // blocks.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
            return None;
        }
        Some(ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000)
    }

    unsafe fn steal(&self, slot: usize) -> bool {
        // Acquire: the drainer adopts the magazines, like a claimer.
        CLAIMED[slot].compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    unsafe fn unsteal(&self, slot: usize) {
        release(slot);
    }

    /// Sleeps the thread (`std::thread::sleep`, which allocates nothing).
    fn throttle(&self, ns: u64) {
        std::thread::sleep(core::time::Duration::from_nanos(ns));
    }
}
