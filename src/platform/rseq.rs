//! `Rseq`: per-CPU slots on Linux through restartable sequences (feature
//! `std`, x86_64 with glibc 2.35 or later); [`Threads`]' per-thread slots
//! wherever rseq is missing.
//!
//! # Why
//!
//! `Threads` gives each *thread* a slot: magazine memory grows with the
//! threads that ever allocated (up to [`MAX_CPUS`] slots' worth), and
//! once threads outnumber slots they take turns (rotation, revocation,
//! sleeping waiters). A CPU runs one thread at a time, so a slot per CPU
//! is enough, and is what the magazine design (Bonwick & Adams) assumes;
//! what a host program lacks is a way to know it still runs on the CPU it
//! read, which restartable sequences (Linux 4.18) give: a *critical
//! section* registered with the kernel is aborted (the thread resumes at
//! its abort handler) if the thread is preempted, migrated or signalled
//! before the section's last instruction, its *commit*.
//!
//! # The design: a fence-free per-CPU lock
//!
//! Each CPU `c` below [`MAX_CPUS`] has a slot, `slot_for_cpu(c)` (which
//! keeps neighbouring CPUs' magazines on separate cache lines), and the
//! slot a lock word; below, `locks[c]` is the lock of CPU `c`'s slot. The
//! slot a holder gets is its CPU's, and the magazine layer's slot protocol
//! is unchanged: the slots are *locks* (`Platform::slots_are_locks`,
//! contract point 7), as `PerCpu`'s are in a kernel, so the holder
//! neither marks nor checks anything of the handshake, and a drainer
//! takes the lock itself (`steal`).
//!
//! | transition | by | how |
//! | --- | --- | --- |
//! | `FREE` → `HELD` | a thread running on CPU `c`, in `enter`/`try_enter` | an rseq critical section: read `cpu_id` from the thread's rseq area, load `locks[c]`, and if it is `FREE` store `HELD`: the store is the commit |
//! | `FREE` → `HELD` | threads mode only: the thread `Threads` gave the slot (there `locks[s]` is slot `s`'s lock, `s` a `Threads` slot) | a compare-and-swap (`Acquire`) |
//! | `HELD` → `FREE` | the holder, in `exit` (on whatever CPU it runs on by then) | a `Release` store |
//! | `FREE` → `DRAIN` | a drainer's `steal` | a compare-and-swap (`Acquire`), then (rseq mode) `membarrier(PRIVATE_EXPEDITED_RSEQ)` on CPU `c` and a load: the slot is the drainer's iff it still reads `DRAIN` |
//! | `DRAIN` → `FREE` | the drainer, in `unsteal` | a `Release` store |
//!
//! Why a plain load and store give mutual exclusion among threads: a
//! section commits only if its thread ran on CPU `c` without preemption
//! from its read of `cpu_id` to the commit. Two such sections of two
//! threads cannot overlap (one CPU runs one thread at a time, and being
//! switched out aborts the other), and the second reads the first's
//! store, made on the same CPU, so at most one thread moves a lock from
//! `FREE` to `HELD`; a thread that holds a lock and is then migrated
//! keeps it (the lock, not the CPU, is what it holds) and gives it back
//! from wherever it runs, while threads that now run on `c` find it
//! `HELD` and take the shared path for that one operation. The holder's
//! load of the lock is an acquire on x86 (loads are not reordered with
//! later loads and stores), so a holder sees what the last holder or
//! drainer wrote before its `Release` store of `FREE`; and the compiler
//! sees the section as an opaque block that may read and write any
//! memory, so it moves no magazine access across it.
//!
//! Why a drainer can take the lock with a compare-and-swap racing the
//! plain stores of sections: a section on CPU `c` may have read `FREE`
//! before the drainer's compare-and-swap and commit its `HELD` after it.
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)`, aimed at CPU `c`
//! (`MEMBARRIER_CMD_FLAG_CPU`), returns only once CPU `c` has run a full
//! barrier and any critical section it was running has been restarted:
//! a section that had not committed by then is aborted, and when it runs
//! again it reads `DRAIN`; a section that had committed has its `HELD`
//! visible to the drainer's load after the barrier. So if that load
//! still reads `DRAIN`, no section committed over it and none will: the
//! drainer owns the slot. If it reads anything else, a holder overwrote
//! `DRAIN` and owns the slot; the drainer owns nothing, writes nothing,
//! and tries again (the holder's `exit` frees it). Stealers of one lock
//! take turns (its `stealing` flag, held for the whole of `steal`: the
//! magazine layer serialises the drainers of one slot of one `Kmem`, but
//! not those of two `Kmem`s on `Rseq`, nor a caller of `heavy_barrier`),
//! and the owner of a `DRAIN` writes only `FREE`, so a `DRAIN` read after
//! the barrier is the reader's own.
//!
//! A drainer waits for the slot inside `steal` (the magazine layer calls
//! it until it succeeds anyway), and while it waits it counts itself in
//! the lock's `want` byte, which the section also reads: no new hold
//! starts, so the drainer waits for the hold in progress only, instead
//! of racing every thread of a busy CPU for the instant the lock is free.
//! It yields the CPU between tries: the holder may have been preempted
//! and be waiting for this very CPU. `want` is a hint for progress; no
//! exclusion rests on it. (A drain therefore waits for a preempted holder
//! to run again; the fast path never waits: a busy lock sends the
//! operation to the shared path.)
//!
//! The same load-then-store section serves `enter` and `try_enter`:
//! there is nothing to claim, nothing to count and no per-thread state.
//! The magazine layer's hits do not even hold the lock: through
//! `Platform::rseq_fast` they run a pop or a push that is a section of
//! its own (`magazine/cpu_mags.rs`, `rseq_ops`): read `cpu_id`, check
//! that CPU's `state` and `want` bytes are 0, and commit with the store
//! of the magazine's count. Every other writer of that CPU's magazines
//! holds its lock, and could only have taken it on that CPU (aborting
//! the section) or as a drainer (whose barrier aborts it, or finds it
//! committed). So a hit costs the section alone (about 78 instructions
//! a 64-byte pair through `GlobalAlloc`, counted from the disassembly,
//! against `Threads`' 85 under callgrind): no atomic read-modify-write,
//! no hardware fence, two stores. Rotation and
//! revocation are gone: with a hundred threads on eight CPUs, every
//! thread that runs uses its CPU's slot for each operation. Only slow
//! paths hold the lock, and a thread that finds its CPU's lock taken (a
//! slow path preempted or migrated while it holds it, or a drain) takes
//! the shared path for that operation.
//!
//! # Registration, and the fallback
//!
//! glibc (2.35+) registers every thread's rseq area itself and exposes
//! its place as `__rseq_offset` (from the thread pointer) and
//! `__rseq_size` (0 when it did not register, e.g. with the tunable
//! `glibc.pthread.rseq=0`). Only the documented fields of the original
//! ABI are used: `cpu_id` (offset 4) and `rseq_cs` (offset 8); the
//! abort handler is preceded by glibc's signature, `RSEQ_SIG`
//! (`0x53053053` on x86). `mm_cid` (a dense per-process id, Linux 6.3) is
//! not used: glibc 2.36 registers 20 bytes (`__rseq_size == 20`), without
//! it.
//!
//! The mode is settled once, on the first call that needs it, before any
//! slot is handed out: *rseq* if glibc registered (`__rseq_size >= 20`
//! and this thread's `cpu_id` is a CPU) and
//! `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ` succeeds; else
//! *threads* for good (also under Miri, on other architectures and C
//! libraries; under loom `Rseq` is the model `Threads`): a thread's slot
//! is then the one [`Threads`] gives it (per thread, with its rotation),
//! and each hold also takes that slot's lock word by compare-and-swap,
//! so that slots are locks in both modes and the magazine layer's fast
//! path never asks which mode it is in. That makes the fallback slow:
//! the fast path's own sections refuse (`limit` is 0), so every operation
//! takes the slow path (a call, `Threads`' slot, a compare-and-swap); it
//! is there to be correct where rseq is missing, not fast. A thread whose
//! own registration failed
//! (glibc leaves `cpu_id` at `RSEQ_CPU_ID_REGISTRATION_FAILED`) and a CPU
//! whose index is [`MAX_CPUS`] or more read a `cpu_id` the section
//! refuses, and take the shared path.
//!
//! # After `fork`
//!
//! The child's only thread is the one that forked, outside the allocator.
//! A lock that another thread of the parent held at the fork stays held
//! in the child (nobody there will free it): that CPU's slot is lost to
//! the child, whose threads take the shared path on it, and its magazines
//! stay stranded. That is safe; clearing the lock would not be (the
//! holder may have been part way through a magazine update). Likewise a
//! `want` count of a drainer that was inside `steal` at the fork stays
//! raised, and that CPU's slot is lost to the child the same way. A drain
//! in the child of a slot lost so waits forever, as it would for a lock
//! of the allocator that another thread held at the fork: a child of a
//! multithreaded program should only `exec`, or allocate little. The
//! child registers for membarrier again (a `pthread_atfork` handler).
//!
//! # Atomics
//!
//! | atomic | written by | ordering | paired with |
//! | --- | --- | --- | --- |
//! | `locks[c].stealing` | stealers of `c` (compare-and-swap false → true, store false) | `Acquire` CAS, `Release` store | each other: one stealer at a time, each seeing where the last left the lock |
//! | `locks[c].want` | drainers in `steal` (increment, decrement) | `Relaxed` read-modify-writes; the section's plain load | nothing: a hint that keeps new holds from starting while a drainer waits |
//! | `locks[c]` (its `state`) | see the table above | the section's plain load and store (x86: acquire and release), `Release` stores, `Acquire` compare-and-swap | each other: every holder and drainer sees what the previous one wrote to the slot's magazines |
//! | `limit` | `init`, once, after `MODE` | `Release`; read by the section's plain load (x86: acquire) | a thread that reads `MAX_CPUS` there sees `MODE` settled to rseq |
//! | `MODE` | `init`, once | `Release`; `Relaxed` loads once settled | `Acquire` in `mode` before anything relies on it |

use core::mem::{offset_of, size_of};

use crossbeam_utils::CachePadded;

use super::cpu::{MAX_CPUS, Platform, RseqFast, cpu_for_slot};
use super::threads::Threads;
use crate::sync::{AtomicBool, AtomicU8, AtomicU32, Ordering, atomic_bool, atomic_u8, wait_step};

/// `locks[c]`: nobody holds CPU `c`'s slot.
const FREE: u8 = 0;
/// `locks[c]`: a thread holds it (taken on CPU `c` by an rseq section).
const HELD: u8 = 1;
/// `locks[c]`: a drainer holds it, or is finding out whether it does.
const DRAIN: u8 = 2;

/// `MODE`: not settled yet.
const UNKNOWN: u8 = 0;
/// `MODE`: slots are CPUs, held through rseq sections.
const RSEQ: u8 = 1;
/// `MODE`: slots are `Threads`', each also a lock taken by
/// compare-and-swap.
const THREADS: u8 = 2;
/// `MODE`: being settled by a thread in `init`.
const SETTLING: u8 = 3;

/// One CPU's lock: its state, and the drainers waiting for it.
///
/// The section takes the lock only if both bytes are 0; `exit` stores
/// the `state` byte alone, so a drainer's `want` survives the holder's
/// release.
#[repr(C, align(2))]
struct Lock {
    /// `FREE`, `HELD` or `DRAIN` (see the module docs).
    state: AtomicU8,
    /// Drainers inside `steal` for this lock (a count, wrapping at 256
    /// of them at once, which only weakens the hint): while it is not 0
    /// no new hold starts, so a drainer waits only for the hold in
    /// progress instead of racing every holder of a busy CPU for the
    /// moment the lock is free (seen: a reap waited 1.5 s behind six
    /// threads that took two CPUs' locks in a tight loop). A hint for
    /// progress only: no one relies on it for exclusion.
    want: AtomicU8,
    /// Set while a thread is inside `steal` for this lock: stealers take
    /// turns, so that a `DRAIN` a stealer reads after its barrier is its
    /// own. Without it, two stealers (two `Kmem`s on `Rseq` draining the
    /// same CPU, or a caller of the safe `heavy_barrier` beside a drain)
    /// could interleave: A's `DRAIN` overwritten by a section's `HELD`,
    /// that holder's `exit`, B's `DRAIN`, and A's check after its barrier
    /// reads B's `DRAIN`: A and B would both own the slot. The section
    /// does not read this byte.
    stealing: AtomicBool,
}

/// What the rseq section reads, in one static so that it takes one base
/// register: the limit on its own line (read-mostly), then the locks.
#[repr(C)]
struct State {
    /// The lowest `cpu_id` the section refuses: 0 until the rseq mode is
    /// settled (so no slot is handed out before), [`MAX_CPUS`] after. A
    /// `u32`, compared with the 32-bit `cpu_id`.
    limit: CachePadded<AtomicU32>,
    /// The lock word of each CPU's slot, a cache line each (a holder
    /// writes it twice per operation, on its own CPU).
    locks: [CachePadded<Lock>; MAX_CPUS],
}

static STATE: State = State {
    limit: CachePadded::new(AtomicU32::new(0)),
    locks: [const { CachePadded::new(Lock { state: atomic_u8(FREE), want: atomic_u8(0), stealing: atomic_bool(false) }) };
        MAX_CPUS],
};

/// The mode: [`UNKNOWN`], [`SETTLING`], [`RSEQ`] or [`THREADS`].
static MODE: AtomicU8 = atomic_u8(UNKNOWN);

/// log2 of a lock's stride in `State::locks`.
#[cfg_attr(miri, allow(dead_code))] // read by the rseq sections, not built under Miri
pub(crate) const LOCK_SHIFT: u32 = size_of::<CachePadded<Lock>>().trailing_zeros();
/// Where the locks start in `State`.
pub(crate) const LOCKS_OFF: usize = offset_of!(State, locks);
static_assertions::const_assert!(size_of::<CachePadded<Lock>>().is_power_of_two());
static_assertions::const_assert!(offset_of!(Lock, state) == 0 && offset_of!(Lock, want) == 1);
static_assertions::const_assert!(offset_of!(State, limit) == 0 && LOCKS_OFF < 1 << 20);
static_assertions::const_assert!(MAX_CPUS <= u32::MAX as usize);

/// Whether this build can use rseq at all.
const SUPPORTED: bool = cfg!(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri)));

const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 7;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 8;
const MEMBARRIER_CMD_FLAG_CPU: libc::c_long = 1 << 0;

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri)))]
unsafe extern "C" {
    /// glibc: the offset of this thread's `struct rseq` from the thread
    /// pointer (`fs` base on x86_64); fixed for the process.
    static __rseq_offset: isize;
    /// glibc: the size of the area it registered, 0 if it did not.
    static __rseq_size: u32;
}

/// Per-CPU slots through restartable sequences where the kernel and
/// glibc offer them, per-thread slots ([`Threads`]) elsewhere. See the
/// module docs.
///
/// Opt-in: `Kmem::with_platform(OsPages::new(), Rseq::new())`. Its state
/// is process-wide (one lock per CPU), so several allocators may use it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rseq;

impl Rseq {
    /// The platform (all state is process-wide).
    pub const fn new() -> Self {
        Rseq
    }

    /// Whether slots are CPUs held through rseq in this process (settles
    /// the mode if nobody asked yet): `false` means they are the
    /// per-thread slots of [`Threads`].
    pub fn per_cpu(&self) -> bool {
        mode() == RSEQ
    }
}

/// The settled mode ([`RSEQ`] or [`THREADS`]), settling it first if
/// needed.
#[inline]
fn mode() -> u8 {
    // Acquire: pairs with `init`'s Release, so what `init` did (the
    // membarrier registration, `limit`) happened before.
    match MODE.load(Ordering::Acquire) {
        m @ (RSEQ | THREADS) => m,
        _ => init(),
    }
}

/// Settles the mode, once; others wait for the thread doing it.
#[cold]
#[inline(never)]
fn init() -> u8 {
    // Others wait yielding: registering for membarrier may take the
    // kernel milliseconds (an RCU grace period).
    let mut i = 0;
    loop {
        match MODE.compare_exchange(UNKNOWN, SETTLING, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => {
                let m = if SUPPORTED && registered() && register() { RSEQ } else { THREADS };
                if m == RSEQ {
                    // Failure (out of memory) only leaves a child of a
                    // fork unregistered: its drains then stop the program
                    // (see `restart`).
                    // SAFETY: registers a handler for a fork's child: an
                    // `extern "C"` fn that never unwinds and makes one
                    // syscall (async-signal-safe).
                    unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
                }
                MODE.store(m, Ordering::Release);
                if m == RSEQ {
                    // Release: a section that reads it also sees `MODE`.
                    STATE.limit.store(MAX_CPUS as u32, Ordering::Release);
                }
                return m;
            }
            Err(m @ (RSEQ | THREADS)) => return m,
            Err(_) => {
                wait_step(i);
                i += 1;
            }
        }
    }
}

/// Whether glibc registered this thread's rseq area with the fields we
/// use.
fn registered() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri)))]
    {
        // SAFETY: plain reads of glibc's constants.
        let size = unsafe { __rseq_size };
        // `cpu_id` ends at 8, `rseq_cs` at 16; the original ABI is 20.
        size >= 20 && cpu_id() < u32::MAX - 16
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri))))]
    false
}

/// This thread's `cpu_id` field (a single-copy atomic read of a field
/// only the kernel writes).
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri)))]
fn cpu_id() -> u32 {
    let id: u32;
    // SAFETY: glibc keeps every thread's rseq area at `__rseq_offset` from
    // the thread pointer (the TCB), registered or not; a 4-byte read of
    // its `cpu_id` touches nothing else.
    // SAFETY: by the argument just above.
    unsafe {
        core::arch::asm!(
            "mov {id:e}, dword ptr fs:[{off} + 4]",
            off = in(reg) __rseq_offset,
            id = out(reg) id,
            options(nostack, readonly, preserves_flags),
        );
    }
    id
}

/// Registers the process for `membarrier(PRIVATE_EXPEDITED_RSEQ)`.
fn register() -> bool {
    // SAFETY: the registration touches no memory of ours; failure means
    // "not available".
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, 0, 0) == 0 }
}

/// In the child of a `fork`: registers the child's process again.
extern "C" fn after_fork_child() {
    register();
}

/// Restarts any rseq critical section running on CPU `cpu` and makes it
/// run a full barrier; returns once it has. Falls back to every CPU if the
/// kernel refuses the one (a CPU index it does not know), and stops the
/// program if it refuses both: the process registered in `init`, so only
/// a kernel bug, or a child of a fork whose registration failed, gets
/// there, and a drain cannot go on without the barrier.
fn restart(cpu: usize) {
    // SAFETY: membarrier touches no memory of ours.
    let r = unsafe {
        libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU, cpu)
    };
    if r == 0 {
        return;
    }
    // SAFETY: as above.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, 0, 0) };
    if r != 0 {
        super::fatal("kmemcg: membarrier(PRIVATE_EXPEDITED_RSEQ) failed; per-CPU slots cannot be drained");
    }
}

/// The rseq hold: CPU `c`'s slot `s` (`slot_for_cpu(c)`) if this
/// thread runs on CPU `c`, `c` is below `limit` and `locks[s]` is free;
/// else a value of at least [`MAX_CPUS`].
///
/// # Safety
///
/// The caller holds no slot of this platform (the lock would be its own,
/// held: it would only be refused, but `exit` must pair with a hold).
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri)))]
#[inline(always)]
unsafe fn hold() -> usize {
    let slot: usize;
    // SAFETY: (1) the section writes only this thread's own `rseq_cs`
    // field (the descriptor's address, as the ABI asks) and the `state`
    // byte of the lock of the slot of the CPU it runs on, an `AtomicU8` (a byte `mov`,
    // single-copy atomic, as an atomic store is); (2) the
    // descriptor lies in `__rseq_cs`, a writable data section (its
    // addresses take relocations), 32-byte aligned as the ABI requires,
    // version 0, no flags, the abort handler outside the section and
    // preceded by glibc's signature; (3) the lock's address is
    // `locks + s * stride` for `s = slot_for_cpu(c) < MAX_CPUS`, `c`
    // below `limit <= MAX_CPUS`; (4) the
    // block may read and write memory, so the compiler keeps the
    // magazine accesses of the hold after it.
    // SAFETY: by the argument just above.
    unsafe {
        core::arch::asm!(
            // The descriptor (`struct rseq_cs`): version 0, flags 0, the
            // section's start, its length up to the commit included, and
            // the abort handler.
            ".pushsection __rseq_cs, \"aw\"",
            ".balign 32",
            "9:",
            ".long 0, 0",
            ".quad 3f, 5f - 3f, 6f",
            ".popsection",
            "2:",
            "lea {tmp}, [rip + 9b]",
            "mov qword ptr fs:[{off} + 8], {tmp}",
            "3:",
            "mov {cpu:e}, dword ptr fs:[{off} + 4]",
            "cmp {cpu:e}, dword ptr [{state}]",
            "jae 8f",
            // The CPU's slot's lock, at `slot << LOCK_SHIFT`.
            "lea {tmp}, [rip + {table}]",
            "mov {slot:e}, dword ptr [{tmp} + {cpu} * 4]",
            // Free, and no drainer waiting. Two byte loads, not one of
            // both bytes: `exit`'s byte store, likely still in the store
            // buffer, cannot forward to a wider load (a stall that cost
            // 10 ns a pair).
            "cmp byte ptr [{state} + {slot} + {locks}], 0",
            "jne 8f",
            "cmp byte ptr [{state} + {slot} + {locks} + 1], 0",
            "jne 8f",
            "mov byte ptr [{state} + {slot} + {locks}], {held}",
            "5:",
            // Off the hit path: the abort handler, after glibc's
            // signature, starts again (the kernel cleared `rseq_cs`);
            // a refusal returns `u32::MAX`.
            ".pushsection .text.unlikely.kmemcg_rseq, \"ax\"",
            ".long 0x53053053",
            "6:",
            "jmp 2b",
            "8:",
            "mov {slot:e}, -1",
            "jmp 5b",
            ".popsection",
            off = in(reg) __rseq_offset,
            state = in(reg) &raw const STATE,
            table = sym LOCK_OFFSETS,
            locks = const LOCKS_OFF,
            held = const HELD,
            slot = out(reg) slot,
            cpu = out(reg) _,
            tmp = out(reg) _,
            options(nostack),
        );
    }
    // A refusal's `u32::MAX` stays at least MAX_CPUS.
    slot >> LOCK_SHIFT
}

/// `slot_for_cpu(c) << LOCK_SHIFT` for each CPU `c`: where the lock of
/// CPU `c`'s slot lies in `State::locks`, one load away.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri)))]
static LOCK_OFFSETS: [u32; MAX_CPUS] = {
    let mut t = [0u32; MAX_CPUS];
    let mut c = 0;
    while c < MAX_CPUS {
        t[c] = (super::cpu::slot_for_cpu(c) << LOCK_SHIFT) as u32;
        c += 1;
    }
    t
};

/// Without rseq: never a slot.
///
/// # Safety
///
/// None needed; `unsafe` to match the rseq build.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri))))]
#[inline(always)]
unsafe fn hold() -> usize {
    MAX_CPUS
}

impl Rseq {
    /// `try_enter`'s and `enter`'s way without an rseq slot. In the
    /// threads mode: the slot `Threads` gives this thread, whose lock it
    /// then takes by compare-and-swap (failing only while a drainer has
    /// it). In the rseq mode: the shared path (a busy lock, a CPU out of
    /// range, a thread glibc could not register), after one more try if
    /// the mode was settled just now.
    #[cold]
    #[inline(never)]
    fn enter_other(&self, fast: bool) -> Option<usize> {
        if mode() == THREADS {
            // SAFETY: the caller holds no slot (`enter`'s contract).
            let s = unsafe { if fast { Threads.try_enter() } else { Threads.enter() } }?;
            // Acquire: the last holder's (or drainer's) magazine writes.
            let lock = &STATE.locks[s];
            // Relaxed: `want` only steers (see `Lock`).
            if lock.want.load(Ordering::Relaxed) == 0
                && lock.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return Some(s);
            }
            // SAFETY: `Threads` handed `s` out just above.
            unsafe { Threads.exit(s) };
            return None;
        }
        // SAFETY: the caller holds no slot.
        let s = unsafe { hold() };
        (s < MAX_CPUS).then_some(s)
    }
}

// SAFETY: slots are always locks (`locks[s]`), taken by rseq sections
// in the rseq mode and by compare-and-swap over `Threads`' slots in the
// threads mode; the mode is settled before the first slot is handed out
// (`limit` is 0 until then, so `hold` refuses every CPU) and never
// changes. (1) Rseq mode: a slot is CPU `c`'s, below `MAX_CPUS`, held
// from the commit of the section that moved `locks[c]` from `FREE` to
// `HELD` to the holder's `exit`, and nobody else can take it meanwhile
// (the module docs: only sections on CPU `c` write `HELD`, one at a
// time; a drainer's `DRAIN` is its own only if no section overwrote it
// before its barrier); a signal handler that interrupts a hold finds the
// lock held and takes the shared path. Threads mode: `Threads` gives
// slot `s` to one thread at a time (its point 1), which takes
// `locks[s]` by compare-and-swap (a drainer may have it) until `exit`.
// (2) node 0. (3) always asymmetric; `heavy_barrier` takes and gives
// back every lock through `steal`, which waits out each hold. (4)
// `steal` returns `true` only when it moved the lock to `DRAIN` and, in
// the rseq mode, that `DRAIN` survived the barrier, which no section can
// then overwrite (stealers take turns under `stealing`, so the `DRAIN`
// it reads is its own); no `enter` takes the lock until `unsteal` stores
// `FREE`. (5) atomics, thread-locals (through `Threads`), the rseq
// section, and membarrier, which does not allocate; `fatal` only if the
// kernel refuses a barrier it accepted the registration for. (6) the
// group token is `Threads`' per-thread cell. (7) always locks; holders
// are ordered by the lock's acquire (the section's load, on x86, or the
// compare-and-swap) and `exit`'s `Release` store, drainers by their
// `Acquire` compare-and-swap and `Release` store; `steal` takes a lock
// nobody holds, unless a section racing it commits (then a context holds
// it).
unsafe impl Platform for Rseq {
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
        // SAFETY: the caller holds no slot.
        let s = unsafe { hold() };
        if s < MAX_CPUS { Some(s) } else { self.enter_other(false) }
    }

    #[inline(always)]
    unsafe fn try_enter(&self) -> Option<usize> {
        // SAFETY: the caller holds no slot.
        let s = unsafe { hold() };
        if s < MAX_CPUS { Some(s) } else { self.enter_other(true) }
    }

    #[inline(always)]
    unsafe fn exit(&self, slot: usize) {
        // Release: the next holder or drainer sees our magazine writes.
        // (`Threads::exit`, in the threads mode, does nothing.)
        // SAFETY: slots are below MAX_CPUS (contract point 1).
        unsafe { crate::sync::at(&STATE.locks, slot) }.state.store(FREE, Ordering::Release);
    }

    #[inline(always)]
    fn asymmetric(&self) -> bool {
        true
    }

    #[inline(always)]
    fn slots_are_locks(&self) -> bool {
        true
    }

    fn heavy_barrier(&self) {
        for slot in 0..MAX_CPUS {
            // SAFETY: taken (waiting for it) and given back at once,
            // touching nothing.
            if unsafe { self.steal(slot) } {
                // SAFETY: stolen just above.
                unsafe { self.unsteal(slot) };
            }
        }
    }

    fn now_ms(&self) -> Option<u64> {
        Threads.now_ms()
    }

    /// Waits until it has the slot (a drain's `steal` is retried until
    /// it succeeds anyway, where slots are locks): raises `want` so that
    /// no new hold starts, and waits out the hold in progress, yielding
    /// the CPU (its holder may be preempted, and wait for this very CPU).
    unsafe fn steal(&self, slot: usize) -> bool {
        let Some(lock) = STATE.locks.get(slot) else { return false };
        // Settled first, so that a section cannot start committing after
        // the check below found the threads mode.
        let rseq = mode() == RSEQ;
        // Relaxed: a hint (see `Lock`); holders see it soon enough.
        lock.want.fetch_add(1, Ordering::Relaxed);
        // One stealer at a time (see `Lock::stealing`). Acquire/Release:
        // the next stealer sees where this one left the lock.
        while lock.stealing.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        loop {
            // Acquire: the last holder's magazine writes.
            if lock.state.compare_exchange(FREE, DRAIN, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                if !rseq {
                    break;
                }
                restart(cpu_for_slot(slot));
                // Acquire: after the barrier, a section that committed
                // `HELD` over our `DRAIN` shows here (and the slot is its
                // holder's until its `exit`).
                if lock.state.load(Ordering::Acquire) == DRAIN {
                    break;
                }
            }
            std::thread::yield_now();
        }
        lock.stealing.store(false, Ordering::Release);
        lock.want.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// One try of [`Rseq::steal`]'s: `false` where another stealer is at
    /// it or a context holds the slot (a reap waits for nobody: a review
    /// found a decay reap, and a child of `fork`, waiting here for a lock
    /// whose holder was preempted or gone). Raises no `want`.
    unsafe fn try_steal(&self, slot: usize) -> bool {
        let Some(lock) = STATE.locks.get(slot) else { return false };
        let rseq = mode() == RSEQ;
        // As in `steal`, one stealer at a time.
        if lock.stealing.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        // Acquire: the last holder's magazine writes. In the rseq mode,
        // a section that committed `HELD` over our `DRAIN` shows after the
        // barrier, and then the slot is its holder's (who frees it), not
        // ours: we wrote nothing more.
        let got = lock.state.compare_exchange(FREE, DRAIN, Ordering::Acquire, Ordering::Relaxed).is_ok()
            && (!rseq || {
                restart(cpu_for_slot(slot));
                lock.state.load(Ordering::Acquire) == DRAIN
            });
        lock.stealing.store(false, Ordering::Release);
        got
    }

    unsafe fn unsteal(&self, slot: usize) {
        // Release: the next holder sees the drained magazines.
        STATE.locks[slot].state.store(FREE, Ordering::Release);
    }

    fn throttle(&self, ns: u64) {
        Threads.throttle(ns)
    }

    /// glibc's offset and `STATE`, wherever the section is built (in the
    /// threads mode too: `limit` is 0 there, and every section refuses).
    #[inline(always)]
    fn rseq_fast(&self) -> Option<RseqFast> {
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri)))]
        {
            // SAFETY: a plain read of glibc's constant.
            let off = unsafe { __rseq_offset };
            Some(RseqFast { off, state: (&raw const STATE).cast() })
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri))))]
        None
    }
}

/// The drainers waiting for slot `slot`, for tests.
#[cfg(all(test, not(miri)))]
pub(crate) fn lock_want(slot: usize) -> usize {
    STATE.locks[slot].want.load(Ordering::Relaxed) as usize
}

/// The lock words, for tests: `FREE`, `HELD` or `DRAIN` of each slot.
#[cfg(all(test, not(miri)))]
pub(crate) fn lock_state(slot: usize) -> usize {
    STATE.locks[slot].state.load(Ordering::Relaxed) as usize
}
