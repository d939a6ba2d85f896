//! One slot's magazines of one cache, the struct the fast paths touch.

use core::mem::size_of;
use core::ptr::{self, NonNull};

use super::Magazine;
use crate::sync::{at, at_mut};

/// One slot's magazines of one cache. Either pointer may be null.
///
/// The fast paths touch this struct and one round of `loaded`, nothing
/// else: `loaded`'s fill level lives here, not in the magazine, while it
/// is loaded, and `cap` is 0 when nothing is loaded, so a pop checks
/// `count != 0` and a push `count < cap` without a null check.
///
/// 32 bytes, two to a cache line, at index `s` of a cache's array for
/// slot `s`, so a fast path finds it with a shift. The fast paths write
/// `count`: two busy slots on one line would bounce it between their CPUs
/// on every operation (seen as a 2x slower `xfree`), so platforms number
/// their CPUs through [`slot_for_cpu`](crate::platform::slot_for_cpu), which puts the first half of them
/// on lines of their own. (One line per slot would double every cache's
/// size; a permutation here cost 4 instructions per operation.)
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

/// The fast paths of the `Rseq` platform: a pop and a push that are
/// rseq critical sections of their own (x86_64, glibc), so a hit takes no
/// lock at all: the section reads `cpu_id`, checks that CPU's lock is
/// free with no drainer waiting (as the platform's own hold does), and
/// commits with the store of the CPU's `count`.
///
/// Why it is enough (the lock protocol is in `platform::rseq`): every
/// other writer of CPU `c`'s magazines holds `c`'s lock — a slow path
/// (its section took the lock on CPU `c`) or a drainer (whose
/// compare-and-swap is followed by a barrier that restarts any section
/// running on `c`). A section that found the lock free runs to its
/// commit only if its thread ran on `c` throughout: a slow path cannot
/// take the lock meanwhile (it would have to run on `c`, which aborts
/// this section), and a drainer touches nothing before its barrier,
/// which aborts this section or finds it committed. A section that
/// started later reads the lock taken and refuses. So the section's
/// loads see a consistent `CpuMags` and its stores race nothing. The
/// push stores its round before the commit; if the section is aborted,
/// that store lands past `count`, where no one reads.
///
/// These holds leave no `USED` mark for reap (`Slots::unhold`): a CPU
/// that only ever hits looks idle to a reap, which then empties its
/// magazines once per reap interval.
#[cfg(all(feature = "std", target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri), not(loom)))]
pub(super) mod rseq_ops {
    use core::mem::offset_of;

    use super::{CpuMags, Magazine};
    use crate::platform::rseq::{LOCK_SHIFT, LOCKS_OFF};
    use crate::platform::{MAX_CPUS, RseqFast, slot_for_cpu};

    /// `slot_for_cpu(c) * size_of::<CpuMags>()` for each CPU `c`: where
    /// the `CpuMags` of CPU `c`'s slot lie in a cache's array, one load
    /// away.
    static OFFSETS: [u32; MAX_CPUS] = {
        let mut t = [0u32; MAX_CPUS];
        let mut c = 0;
        while c < MAX_CPUS {
            t[c] = (slot_for_cpu(c) * core::mem::size_of::<CpuMags>()) as u32;
            c += 1;
        }
        t
    };
    /// `OFFSETS[c] * LOCK_SCALE` is the offset of the slot's lock in the
    /// platform's lock array (`slot << LOCK_SHIFT`): an index scale.
    const LOCK_SCALE: usize = 1 << (LOCK_SHIFT - core::mem::size_of::<CpuMags>().trailing_zeros());
    static_assertions::const_assert!(matches!(LOCK_SCALE, 1 | 2 | 4 | 8));
    static_assertions::const_assert_eq!(core::mem::size_of::<CpuMags>(), 32);
    static_assertions::const_assert_eq!(
        core::mem::size_of::<crate::sync::UnsafeCell<CpuMags>>(),
        core::mem::size_of::<CpuMags>()
    );
    const COUNT: usize = offset_of!(CpuMags, count);
    const CAP: usize = offset_of!(CpuMags, cap);
    const LOADED: usize = offset_of!(CpuMags, loaded);
    const ROUNDS: usize = offset_of!(Magazine, rounds);

    /// A round off the loaded magazine of the CPU the thread runs on;
    /// null if there is none, the CPU's lock is taken or wanted, or the
    /// platform is not in its rseq mode.
    ///
    /// # Safety
    ///
    /// `f` comes from `Rseq::rseq_fast`, and `mags` points to a cache's
    /// `[UnsafeCell<CpuMags>; MAX_CPUS]`, indexed by slot, whose
    /// slots are `Rseq`'s (every other access to them holds the slot).
    #[inline(always)]
    pub(in crate::magazine) unsafe fn pop(f: RseqFast, mags: *const CpuMags) -> *mut u8 {
        let p: *mut u8;
        // SAFETY: (1) the section writes only this thread's `rseq_cs`
        // (as the ABI asks) and, at its commit, the `count` of the CPU
        // it ran on throughout, whose lock it found free (see above);
        // (2) the descriptor as in `platform::rseq::hold`; (3) `count`
        // is non-zero, so `loaded` is a live magazine with `count`
        // rounds (the invariant of `CpuMags`); (4) `OFFSETS[c]`, the lock and
        // the `CpuMags` it locates are in bounds for `c < limit <=
        // MAX_CPUS` (`slot_for_cpu(c) < MAX_CPUS`).
        // SAFETY: by the argument just above.
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "9:",
                ".long 0, 0",
                ".quad 3f, 5f - 3f, 6f",
                ".popsection",
                "2:",
                "lea {t}, [rip + 9b]",
                "mov qword ptr fs:[{off} + 8], {t}",
                "3:",
                "mov {c:e}, dword ptr fs:[{off} + 4]",
                "cmp {c:e}, dword ptr [{state}]",
                "jae 8f",
                // `slot_for_cpu(c) * size_of::<CpuMags>()`.
                "lea {t}, [rip + {table}]",
                "mov {t:e}, dword ptr [{t} + {c} * 4]",
                // The slot's lock: `state` and `want` both 0, in one
                // load: no byte store to them is likely in flight (only
                // slow paths and drains write them), so the load is not
                // held up.
                "cmp word ptr [{state} + {t} * {scale} + {locks}], 0",
                "jne 8f",
                "add {t}, {mags}",
                "mov {c}, qword ptr [{t} + {count}]",
                "test {c}, {c}",
                "jz 8f",
                "mov {p}, qword ptr [{t} + {loaded}]",
                "mov {p}, qword ptr [{p} + {c} * 8 + {rounds} - 8]",
                "dec {c}",
                "mov qword ptr [{t} + {count}], {c}",
                "5:",
                ".pushsection .text.unlikely.kmemcg_rseq, \"ax\"",
                ".long 0x53053053",
                "6:",
                "jmp 2b",
                "8:",
                "xor {p:e}, {p:e}",
                "jmp 5b",
                ".popsection",
                off = in(reg) f.off,
                state = in(reg) f.state,
                mags = in(reg) mags,
                scale = const LOCK_SCALE,
                locks = const LOCKS_OFF,
                table = sym OFFSETS,
                count = const COUNT,
                loaded = const LOADED,
                rounds = const ROUNDS,
                p = out(reg) p,
                c = out(reg) _,
                t = out(reg) _,
                options(nostack),
            );
        }
        p
    }

    /// Pushes `p` onto the loaded magazine of the CPU the thread runs on;
    /// `false` if it is full or missing, the CPU's lock is taken or
    /// wanted, or the platform is not in its rseq mode.
    ///
    /// # Safety
    ///
    /// As for [`pop`]; `p` is a free object of the cache.
    #[inline(always)]
    pub(in crate::magazine) unsafe fn push(f: RseqFast, mags: *const CpuMags, p: *mut u8) -> bool {
        let ok: usize;
        // SAFETY: as in `pop`; `count < cap` means `loaded` is live with
        // room at `count` (`cap` is its rounds).
        // SAFETY: by the argument just above.
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "9:",
                ".long 0, 0",
                ".quad 3f, 5f - 3f, 6f",
                ".popsection",
                "2:",
                "lea {t}, [rip + 9b]",
                "mov qword ptr fs:[{off} + 8], {t}",
                "3:",
                "mov {c:e}, dword ptr fs:[{off} + 4]",
                "cmp {c:e}, dword ptr [{state}]",
                "jae 8f",
                // `slot_for_cpu(c) * size_of::<CpuMags>()`.
                "lea {t}, [rip + {table}]",
                "mov {t:e}, dword ptr [{t} + {c} * 4]",
                // The slot's lock: `state` and `want` both 0, in one
                // load: no byte store to them is likely in flight (only
                // slow paths and drains write them), so the load is not
                // held up.
                "cmp word ptr [{state} + {t} * {scale} + {locks}], 0",
                "jne 8f",
                "add {t}, {mags}",
                "mov {c}, qword ptr [{t} + {count}]",
                "cmp {c}, qword ptr [{t} + {cap}]",
                "jae 8f",
                // `ok` is free until the commit: the magazine.
                "mov {ok}, qword ptr [{t} + {loaded}]",
                "mov qword ptr [{ok} + {c} * 8 + {rounds}], {p}",
                "inc {c}",
                "mov qword ptr [{t} + {count}], {c}",
                "5:",
                "mov {ok:e}, 1",
                "7:",
                ".pushsection .text.unlikely.kmemcg_rseq, \"ax\"",
                ".long 0x53053053",
                "6:",
                "jmp 2b",
                "8:",
                "xor {ok:e}, {ok:e}",
                "jmp 7b",
                ".popsection",
                off = in(reg) f.off,
                state = in(reg) f.state,
                mags = in(reg) mags,
                p = in(reg) p,
                scale = const LOCK_SCALE,
                locks = const LOCKS_OFF,
                table = sym OFFSETS,
                count = const COUNT,
                cap = const CAP,
                loaded = const LOADED,
                rounds = const ROUNDS,
                ok = out(reg) ok,
                c = out(reg) _,
                t = out(reg) _,
                options(nostack),
            );
        }
        ok != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// `slot_for_cpu` is a permutation of the slots, undone by
    /// `cpu_for_slot`, that keeps each of the first half of the CPUs'
    /// `CpuMags` on a cache line of its own (slot `s` at index `s`).
    #[test]
    fn slot_for_cpu_spreads_neighbouring_cpus() {
        use crate::platform::{MAX_CPUS, cpu_for_slot, slot_for_cpu};
        let mut seen = [false; MAX_CPUS];
        for cpu in 0..MAX_CPUS {
            let s = slot_for_cpu(cpu);
            assert!(s < MAX_CPUS && !seen[s], "cpu {cpu} -> {s}");
            assert_eq!(cpu_for_slot(s), cpu);
            seen[s] = true;
        }
        // Out of range (a platform checks first): no overflow, no panic.
        for x in [MAX_CPUS, usize::MAX / 2, usize::MAX] {
            let _ = (slot_for_cpu(x), cpu_for_slot(x));
        }
        let line = |cpu: usize| slot_for_cpu(cpu) * size_of::<CpuMags>() / 64;
        for a in 0..MAX_CPUS / 2 {
            for b in 0..a {
                assert_ne!(line(a), line(b), "cpus {a} and {b} share a line");
            }
        }
    }
}
