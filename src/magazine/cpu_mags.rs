//! One slot's magazines of one cache, the struct the fast paths touch.

use core::mem::size_of;
use core::ptr::{self, NonNull};

use super::Magazine;

/// One slot's magazines of one cache: the loaded magazine as a stack of
/// round pointers, and the previous one.
///
/// The fast paths touch this struct and one round of the loaded
/// magazine, nothing else. The loaded magazine is kept as three pointers
/// into its rounds, not as a magazine pointer and a count: a pop compares
/// `top` with `floor` and reads the round below `top`, a push compares
/// `top` with `ceil` and writes at `top`, with no load of the magazine
/// pointer and no index arithmetic (5 instructions fewer per pair than
/// `count`, `cap` and `loaded`). With nothing loaded all three are null,
/// so a pop finds `top == floor` and a push `top >= ceil` without a null
/// check.
///
/// 32 bytes, two to a cache line, at index `s` of a cache's array for
/// slot `s`, so a fast path finds it with a shift. The fast paths write
/// `top`: two busy slots on one line would bounce it between their CPUs
/// on every operation (seen as a 2x slower `xfree`), so platforms number
/// their CPUs through [`slot_for_cpu`](crate::platform::slot_for_cpu), which puts the first half of them
/// on lines of their own. (One line per slot would double every cache's
/// size; a permutation here cost 4 instructions per operation.)
///
/// Invariant: either `floor`, `top` and `ceil` are null (nothing
/// loaded), or `floor` is the start of the rounds of a live magazine of
/// the slot (`loaded`), `ceil` is `floor` plus the cache's rounds per
/// magazine, `floor <= top <= ceil`, the rounds in `[floor, top)` are
/// free objects of the cache and `loaded.count` is stale. The slow paths
/// take the magazines out with [`CpuMags::spill`], which writes the count
/// back and leaves the slot empty, work on the magazines' own counts, and
/// put them back with [`CpuMags::load`].
#[repr(C, align(32))]
pub(super) struct CpuMags {
    top: *mut *mut u8,
    floor: *mut *mut u8,
    ceil: *mut *mut u8,
    previous: *mut Magazine,
}

static_assertions::const_assert_eq!(size_of::<CpuMags>(), 32);

/// A slot's two magazines while a slow path or a drainer works on them,
/// with their own counts current. Either may be null.
#[derive(Clone, Copy)]
pub(super) struct Spilled {
    pub(super) loaded: *mut Magazine,
    pub(super) previous: *mut Magazine,
}

impl CpuMags {
    pub(super) const EMPTY: CpuMags =
        CpuMags { top: ptr::null_mut(), floor: ptr::null_mut(), ceil: ptr::null_mut(), previous: ptr::null_mut() };

    /// A round off the loaded magazine, if it has one.
    ///
    /// # Safety
    ///
    /// The invariant of the type holds; the caller owns the slot.
    #[inline(always)]
    pub(super) unsafe fn pop(&mut self) -> Option<NonNull<u8>> {
        if self.top == self.floor {
            return None;
        }
        // SAFETY: `floor < top <= ceil` (the invariant, `top != floor`):
        // `top - 1` is a round of the loaded magazine, a free object.
        unsafe {
            self.top = self.top.sub(1);
            Some(NonNull::new_unchecked(*self.top))
        }
    }

    /// Pushes `p` onto the loaded magazine if it has room.
    ///
    /// # Safety
    ///
    /// As for [`CpuMags::pop`].
    #[inline(always)]
    pub(super) unsafe fn push(&mut self, p: NonNull<u8>) -> bool {
        if self.top >= self.ceil {
            return false;
        }
        // SAFETY: `floor <= top < ceil` (the invariant; all null fails the
        // test above): `top` is a round of the loaded magazine, with room.
        unsafe {
            *self.top = p.as_ptr();
            self.top = self.top.add(1);
        }
        true
    }

    /// Takes the magazines out for a slow path or a drainer: writes the
    /// fill level back into the loaded magazine and leaves the slot with
    /// none (so a slow path that unwinds leaves no pointer to a magazine
    /// it moved).
    ///
    /// # Safety
    ///
    /// The invariant of the type holds; the caller owns the slot.
    #[inline]
    pub(super) unsafe fn spill(&mut self) -> Spilled {
        let loaded = if self.floor.is_null() {
            ptr::null_mut()
        } else {
            // SAFETY: `floor` points to the rounds of the live magazine
            // `loaded` (the invariant), `top` into the same array.
            unsafe {
                let l = self.floor.byte_sub(ROUNDS).cast::<Magazine>();
                (*l).count = self.top.offset_from(self.floor) as usize;
                l
            }
        };
        let s = Spilled { loaded, previous: self.previous };
        *self = CpuMags::EMPTY;
        s
    }

    /// Puts magazines back after a slow path, with `loaded`'s own count.
    ///
    /// # Safety
    ///
    /// `s.loaded` is null or a live magazine of the slot holding `count <=
    /// rounds` free objects of the cache, `rounds` the cache's rounds per
    /// magazine; `s.previous` is null or another live magazine of the slot.
    #[inline]
    pub(super) unsafe fn load(&mut self, s: Spilled, rounds: usize) {
        self.previous = s.previous;
        if s.loaded.is_null() {
            (self.top, self.floor, self.ceil) = (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
        } else {
            // SAFETY: per the contract `rounds` and `count` are within the
            // magazine's array.
            unsafe {
                let floor = ptr::addr_of_mut!((*s.loaded).rounds).cast::<*mut u8>();
                self.floor = floor;
                self.top = floor.add((*s.loaded).count);
                self.ceil = floor.add(rounds);
            }
        }
    }
}

/// Where a magazine's rounds begin.
const ROUNDS: usize = core::mem::offset_of!(Magazine, rounds);

/// The fast paths of the `Rseq` platform: a pop and a push that are
/// rseq critical sections of their own (x86_64, glibc), so a hit takes no
/// lock at all: the section reads `cpu_id`, checks that CPU's lock is
/// free with no drainer waiting (as the platform's own hold does), and
/// commits with the store of the CPU's `top`.
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
/// that store lands at `top`, above the free rounds, where no one reads.
///
/// These holds leave no `USED` mark for reap (`Slots::unhold`): a CPU
/// that only ever hits looks idle to a reap, which then empties its
/// magazines once per reap interval.
#[cfg(all(feature = "std", target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(miri), not(loom)))]
pub(super) mod rseq_ops {
    use core::mem::offset_of;

    use super::CpuMags;
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
    const TOP: usize = offset_of!(CpuMags, top);
    const FLOOR: usize = offset_of!(CpuMags, floor);
    const CEIL: usize = offset_of!(CpuMags, ceil);

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
        // (as the ABI asks) and, at its commit, the `top` of the CPU
        // it ran on throughout, whose lock it found free (see above);
        // (2) the descriptor as in `platform::rseq::hold`; (3) `top` is
        // not `floor`, so the round below `top` is a free object of the
        // loaded magazine (the invariant of `CpuMags`); (4) `OFFSETS[c]`,
        // the lock and the `CpuMags` it locates are in bounds for `c <
        // limit <= MAX_CPUS` (`slot_for_cpu(c) < MAX_CPUS`).
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
                "mov {c}, qword ptr [{t} + {top}]",
                "cmp {c}, qword ptr [{t} + {floor}]",
                "je 8f",
                "mov {p}, qword ptr [{c} - 8]",
                "sub {c}, 8",
                "mov qword ptr [{t} + {top}], {c}",
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
                top = const TOP,
                floor = const FLOOR,
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
        // SAFETY: as in `pop`; `top < ceil` means a live magazine is
        // loaded with room at `top` (`ceil` ends its rounds).
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
                "mov {c}, qword ptr [{t} + {top}]",
                "cmp {c}, qword ptr [{t} + {ceil}]",
                "jae 8f",
                "mov qword ptr [{c}], {p}",
                "add {c}, 8",
                "mov qword ptr [{t} + {top}], {c}",
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
                top = const TOP,
                ceil = const CEIL,
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
    use crate::magazine::MAG_MAX;

    /// The pointer form of the loaded magazine: nothing loaded refuses
    /// both operations; a loaded one takes `rounds` pushes, pops them
    /// last in first out, and survives a spill and a load with its fill
    /// level (written back into the magazine's own count).
    #[test]
    fn a_loaded_magazine_is_a_bounded_stack() {
        let mut objs = [0u8; MAG_MAX + 1];
        let base = objs.as_mut_ptr();
        let obj = |i: usize| NonNull::new(base.wrapping_add(i)).unwrap();
        let mut m = CpuMags::EMPTY;
        // SAFETY: `m` is ours alone, with nothing loaded.
        unsafe {
            assert!(m.pop().is_none());
            assert!(!m.push(obj(0)));
            let s = m.spill();
            assert!(s.loaded.is_null() && s.previous.is_null());
        }
        let mut mag = Magazine { next: ptr::null_mut(), count: 0, rounds: [ptr::null_mut(); MAG_MAX] };
        let mag: *mut Magazine = &mut mag;
        let rounds = MAG_MAX - 1;
        // SAFETY: `m` is ours alone, and what it loads is `mag`, live to
        // the end of the test and reached through `mag` only.
        unsafe {
            m.load(Spilled { loaded: mag, previous: ptr::null_mut() }, rounds);
            assert!(m.pop().is_none());
            for i in 0..rounds {
                assert!(m.push(obj(i)), "push {i}");
            }
            assert!(!m.push(obj(rounds)), "full at `rounds`, not at MAG_MAX");
            assert_eq!(m.pop(), Some(obj(rounds - 1)));
            let s = m.spill();
            assert_eq!(s.loaded, mag);
            assert_eq!((*mag).count, rounds - 1);
            assert!(m.pop().is_none(), "a spilled slot is empty");
            m.load(s, rounds);
            for i in (0..rounds - 1).rev() {
                assert_eq!(m.pop(), Some(obj(i)), "pop {i}");
            }
            assert!(m.pop().is_none());
            m.spill();
            assert_eq!((*mag).count, 0);
        }
    }

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
