//! Allocation and free sites of checked objects ([`Detection::sites`]):
//! return addresses taken with glibc's `backtrace(3)` (which unwinds from
//! the binary's unwind tables, so it needs no frame pointers, and, after
//! its first call has loaded the unwinder, allocates nothing) into a
//! fixed table keyed by slot address, and printed by a report as
//! function and offset with their module ([`symbols`](super::symbols):
//! from the module's symbol table, read without allocating).
//!
//! The table is best effort: a slot hashing to the entry of a newer one
//! loses its sites, and racing writers of one entry may mix frames; a
//! report prints sites only for an entry naming its slot.
//!
//! [`Detection::sites`]: super::Detection::sites

use crate::sync::{AtomicUsize, Ordering};

/// Return addresses kept per site.
const DEPTH: usize = 10;
/// Frames skipped: `backtrace` itself is not counted; these are the
/// recording function and the detection path above it.
const SKIP: usize = 2;
/// Entries in the table (a power of two).
const ENTRIES: usize = 1 << 13;

/// One slot's sites. Relaxed throughout: the entry is a best-effort
/// record whose words nothing else depends on.
struct Entry {
    slot: AtomicUsize,
    alloc: [AtomicUsize; DEPTH],
    free: [AtomicUsize; DEPTH],
}

static TABLE: [Entry; ENTRIES] = [const {
    Entry {
        slot: AtomicUsize::new(0),
        alloc: [const { AtomicUsize::new(0) }; DEPTH],
        free: [const { AtomicUsize::new(0) }; DEPTH],
    }
}; ENTRIES];

/// The entry of slot `s`.
fn entry(s: *mut u8) -> &'static Entry {
    let h = (s.addr() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - ENTRIES.trailing_zeros());
    &TABLE[h as usize]
}

/// The caller's stack into `out` (zeros after its end).
#[inline(never)]
fn capture(out: &[AtomicUsize; DEPTH]) {
    let mut buf = [core::ptr::null_mut::<libc::c_void>(); DEPTH + SKIP];
    // SAFETY: `buf` holds `DEPTH + SKIP` pointers; `backtrace` writes at
    // most that many.
    let n = unsafe { libc::backtrace(buf.as_mut_ptr(), (DEPTH + SKIP) as libc::c_int) }.max(0) as usize;
    for (i, o) in out.iter().enumerate() {
        let f = if SKIP + i < n { buf[SKIP + i].addr() } else { 0 };
        o.store(f, Ordering::Relaxed);
    }
}

/// Records the allocation site of slot `s` (and forgets a free site).
#[inline(never)]
pub(super) fn allocated(s: *mut u8) {
    let e = entry(s);
    e.slot.store(s.addr(), Ordering::Relaxed);
    capture(&e.alloc);
    e.free.iter().for_each(|f| f.store(0, Ordering::Relaxed));
}

/// Records the free site of slot `s`, if its entry is still its own.
#[inline(never)]
pub(super) fn freed(s: *mut u8) {
    let e = entry(s);
    if e.slot.load(Ordering::Relaxed) == s.addr() {
        capture(&e.free);
    }
}

/// Writes the allocation site recorded for slot `s` (a leak report's
/// row), if its entry is still its own, to `w`.
pub(super) fn write_alloc(w: &mut impl core::fmt::Write, s: usize) -> core::fmt::Result {
    let e = entry(core::ptr::without_provenance_mut(s));
    if s == 0 || e.slot.load(Ordering::Relaxed) != s {
        return Ok(());
    }
    let mut frames = e.alloc.iter().map(|f| f.load(Ordering::Relaxed)).take_while(|&a| a != 0).peekable();
    if frames.peek().is_some() {
        w.write_str("  allocated at:\n")?;
    }
    for (i, a) in frames.enumerate() {
        super::symbols::print_frame(w, i, a);
    }
    Ok(())
}

/// Prints the sites recorded for slot `s` on standard error, each frame
/// named by `symbols` (function and offset, module).
pub(super) fn print(s: *mut u8) {
    let e = entry(s);
    if e.slot.load(Ordering::Relaxed) != s.addr() {
        return;
    }
    let mut out = super::symbols::Out::new();
    for (what, frames) in [("  allocated at:\n", &e.alloc), ("  freed at:\n", &e.free)] {
        let mut frames = frames.iter().map(|f| f.load(Ordering::Relaxed)).take_while(|&a| a != 0).peekable();
        if frames.peek().is_none() {
            continue;
        }
        let _ = core::fmt::Write::write_str(&mut out, what);
        for (i, a) in frames.enumerate() {
            super::symbols::print_frame(&mut out, i, a);
        }
    }
}
