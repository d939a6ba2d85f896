//! Memory-error detection, for test suites and debugging: red zones,
//! poison with a quarantine, double and foreign frees.
//!
//! Chosen per `Kmem` when it is built ([`Kmem::with_detection`]) or, with
//! `std`, from the `KMEMCG_DEBUG` environment variable, read once at the
//! first allocation ([`Detection::from_env_value`] gives its syntax). Off,
//! it costs nothing on the fast paths: they test the tree's mode word,
//! which they test anyway, and the detection paths hang off its non-zero
//! branch (`Tree::mode`).
//!
//! # Object layout
//!
//! A request of `size` bytes is served from the class (or page run) of
//! `size + TRAILER` bytes, so every object has a *slot* of at least that
//! many bytes; the trailer sits at the end of the slot:
//!
//! ```text
//! live:  | object (size) | red zone 0xbb ... (link, owner words too)  | tag ALIVE |
//! freed: | poison 0x6b ...                      | link | owner       | tag FREED |
//! ```
//!
//! * a free checks the tag (`FREED`: a double free; anything but `ALIVE`:
//!   the trailer was overwritten) and every red-zone byte from `size` on
//!   (an overflow, even by one byte, even inside the class's slack);
//! * a freed object is poisoned and waits in a FIFO quarantine of bounded
//!   bytes (per CPU slot, then globally, as Linux's KASAN keeps it),
//!   linked through its trailer, before it goes back to its cache;
//!   its poison is checked when it leaves the quarantine and again when
//!   the object is handed out (a write after free);
//! * tags mix in the object's address and slot size, so a tag left in
//!   memory by an earlier use of the same pages in another layout does not
//!   pass for one of this slot.
//!
//! An underflow (a write before the object) lands in the red zone or the
//! poison of the slot before it and is found when that one is checked.
//! Detection keeps the size-class and page paths as they are underneath:
//! objects still come from magazines and slabs, charges and limits work
//! as without it (objects are `TRAILER` bytes larger).

use core::fmt;
use core::ptr::NonNull;

use crossbeam_utils::CachePadded;
use lock_api::{Mutex, RawMutex};

use super::Kmem;
use crate::cgroup::{Group, class_name, mode};
use crate::error::Name;
use crate::magazine::MagCache;
use crate::page::pages_for;
use crate::platform::{MAX_CPUS, PAGE_SIZE, PageSource, Platform, report_abort};
use crate::slab::classes::{GEOMETRIES, class_of};
use crate::sync::{AtomicUsize, Ordering, Stat, atomic_usize, loom_const_fn, repeat};

const W: usize = size_of::<usize>();
/// Bytes added to every request: the quarantine link, the owner cache and
/// the tag.
pub(crate) const TRAILER: usize = 3 * W;
/// The red zone's byte (SLUB's `SLUB_RED_ACTIVE`).
const RED: u8 = 0xbb;
/// A freed object's byte (SLUB's `POISON_FREE`).
const POISON: u8 = 0x6b;
/// Tag of a live object ("kmalive!" on 64-bit).
const ALIVE: usize = 0x6b6d_616c_6976_6521_u64 as usize;
/// Tag of a freed object ("kmfreed!").
const FREED: usize = 0x6b6d_6672_6565_6421_u64 as usize;

/// What memory-error detection a [`Kmem`] does; see
/// [`Kmem::with_detection`].
///
/// ```
/// use kmemcg::Detection;
/// let d = Detection::ALL.quarantine(256 << 10);
/// assert!(d.redzones_on() && d.poison_on());
/// assert_eq!(Detection::from_env_value(b"redzone,quarantine=64k"), Detection::OFF.redzones(true).quarantine(64 << 10));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Detection {
    redzone: bool,
    poison: bool,
    quarantine: usize,
    guard_every: usize,
}

impl Detection {
    /// No detection: the plain allocator.
    pub const OFF: Detection = Detection { redzone: false, poison: false, quarantine: 0, guard_every: 0 };
    /// Red zones, poison, a 1 MiB quarantine, and one size-class
    /// allocation in 256 on a guard page.
    pub const ALL: Detection = Detection { redzone: true, poison: true, quarantine: 1 << 20, guard_every: 256 };

    /// With red zones checked (`on`) or not.
    pub const fn redzones(mut self, on: bool) -> Self {
        self.redzone = on;
        self
    }

    /// With freed objects poisoned and checked (`on`) or not.
    pub const fn poison(mut self, on: bool) -> Self {
        self.poison = on;
        self
    }

    /// With a quarantine of at most `bytes` globally, and an eighth of it
    /// per CPU slot, which hands its objects to the global one in a batch
    /// when full (0: freed objects are checked and reused at once).
    pub const fn quarantine(mut self, bytes: usize) -> Self {
        self.quarantine = bytes;
        self
    }

    /// With one size-class allocation in `n` placed to end at a page
    /// boundary before an inaccessible page (0: none), so an overflow
    /// faults at the instruction that makes it (KFENCE's idea). Only page
    /// sources that can protect pages (`OsPages`) sample; at most
    /// [`GUARDED_MAX`] sampled objects live at once.
    pub const fn guard_pages(mut self, n: usize) -> Self {
        self.guard_every = n;
        self
    }

    /// One allocation in how many is sampled onto a guard page (0: none).
    pub const fn guard_every(&self) -> usize {
        self.guard_every
    }

    /// Whether red zones are checked.
    pub const fn redzones_on(&self) -> bool {
        self.redzone
    }

    /// Whether freed objects are poisoned.
    pub const fn poison_on(&self) -> bool {
        self.poison
    }

    /// The quarantine's bound in bytes.
    pub const fn quarantine_bytes(&self) -> usize {
        self.quarantine
    }

    /// Whether any check is on.
    pub const fn is_on(&self) -> bool {
        self.redzone || self.poison
    }

    /// Detection from a `KMEMCG_DEBUG` value: empty, `0` or `off`: none;
    /// `1`, `on` or `all`: [`Detection::ALL`]; otherwise a comma-separated
    /// list of `redzone`, `poison`, `quarantine=N` (bytes, with an
    /// optional `k` or `m`) and `guard=N` (one allocation in N). Unknown words are ignored (the allocator
    /// cannot report them); [`Kmem::detection`] tells what was taken.
    pub const fn from_env_value(v: &[u8]) -> Detection {
        match v {
            b"" | b"0" | b"off" => return Detection::OFF,
            b"1" | b"on" | b"all" => return Detection::ALL,
            _ => {}
        }
        let mut d = Detection::OFF;
        let mut i = 0;
        while i < v.len() {
            let mut j = i;
            while j < v.len() && v[j] != b',' {
                j += 1;
            }
            let (word, _) = v.split_at(j);
            let (_, word) = word.split_at(i);
            match word {
                b"redzone" => d.redzone = true,
                b"poison" => d.poison = true,
                _ => {
                    if let Some(n) = parse_number(word, b"quarantine=") {
                        d.quarantine = n;
                    } else if let Some(n) = parse_number(word, b"guard=") {
                        d.guard_every = n;
                    }
                }
            }
            i = j + 1;
        }
        d
    }
}

/// `key` followed by `N[k|m]`, as a number.
const fn parse_number(word: &[u8], key: &[u8]) -> Option<usize> {
    if word.len() <= key.len() {
        return None;
    }
    let mut i = 0;
    while i < key.len() {
        if word[i] != key[i] {
            return None;
        }
        i += 1;
    }
    let mut n: usize = 0;
    while i < word.len() {
        let shift = match word[i] {
            b'0'..=b'9' => {
                n = match n.checked_mul(10) {
                    Some(m) => m.saturating_add((word[i] - b'0') as usize),
                    None => usize::MAX,
                };
                i += 1;
                continue;
            }
            b'k' | b'K' => 10,
            b'm' | b'M' => 20,
            _ => return None,
        };
        return if i + 1 == word.len() { Some(n.saturating_mul(1 << shift)) } else { None };
    }
    Some(n)
}

/// The detection state of a `Kmem`: its settings (fixed before the first
/// object; atomics because the environment is read at run time) and the
/// quarantine.
pub(crate) struct Detector<R: RawMutex> {
    /// `REDZONE | POISON` while on.
    flags: AtomicUsize,
    quarantine_max: AtomicUsize,
    guard_every: AtomicUsize,
    /// Allocations seen by the sampler.
    sampled: AtomicUsize,
    /// Sampled objects live (so frees look the table up only when some
    /// are).
    guarded_live: AtomicUsize,
    quarantine: Mutex<R, Quarantine>,
    /// Per-CPU quarantines (by platform slot), each bounded by a share of
    /// the global bound; a full one moves whole into the global one, so
    /// the global lock is taken once per batch.
    locals: [CachePadded<Mutex<R, Fifo>>; MAX_CPUS],
    /// Frees checked (a statistic).
    frees_checked: Stat,
}

const REDZONE: usize = 1;
const POISONED: usize = 2;

/// Freed objects waiting to go back to their caches, oldest first, linked
/// through their trailers (`head` and `tail` point at trailers).
struct Fifo {
    head: *mut u8,
    tail: *mut u8,
    bytes: usize,
    objects: usize,
}

impl Fifo {
    const EMPTY: Fifo = Fifo { head: core::ptr::null_mut(), tail: core::ptr::null_mut(), bytes: 0, objects: 0 };

    /// Appends `other` (a chain of whole objects) at the tail.
    ///
    /// # Safety
    ///
    /// Both hold trailers written by [`Kmem::quarantine`].
    unsafe fn append(&mut self, other: Fifo) {
        if other.head.is_null() {
            return;
        }
        if self.tail.is_null() {
            self.head = other.head;
        } else {
            // SAFETY: the tail is a quarantined object's trailer, ours.
            unsafe { self.tail.cast::<*mut u8>().write_unaligned(other.head) };
        }
        self.tail = other.tail;
        self.bytes += other.bytes;
        self.objects += other.objects;
    }
}

// SAFETY: the objects linked are owned by the quarantine (freed by their
// users, not yet given back), reached only under its lock.
unsafe impl Send for Fifo {}

/// The global quarantine and the table of sampled objects.
struct Quarantine {
    fifo: Fifo,
    /// Live sampled objects and the large runs holding them.
    guarded: [(*mut u8, *mut u8); GUARDED_MAX],
}

/// How many sampled guard-page objects can live at once.
pub const GUARDED_MAX: usize = 64;

// SAFETY: as for `Fifo`; the table's pointers are sampled objects' runs,
// reached only under the lock.
unsafe impl Send for Quarantine {}

impl<R: RawMutex> Detector<R> {
    loom_const_fn! {
        /// A detector doing `d`.
        pub(crate) fn new(d: Detection) -> Self {
            Detector {
                flags: atomic_usize(if d.redzone { REDZONE } else { 0 } | if d.poison { POISONED } else { 0 }),
                quarantine_max: atomic_usize(d.quarantine),
                guard_every: atomic_usize(d.guard_every),
                sampled: atomic_usize(0),
                guarded_live: atomic_usize(0),
                quarantine: Mutex::const_new(R::INIT, Quarantine {
                    fifo: Fifo::EMPTY,
                    guarded: [(core::ptr::null_mut(), core::ptr::null_mut()); GUARDED_MAX],
                }),
                locals: repeat!(CachePadded::new(Mutex::const_new(R::INIT, Fifo::EMPTY)); MAX_CPUS),
                frees_checked: Stat::new(),
            }
        }
    }

    fn set(&self, d: Detection) {
        self.flags.store(if d.redzone { REDZONE } else { 0 } | if d.poison { POISONED } else { 0 }, Ordering::Relaxed);
        self.quarantine_max.store(d.quarantine, Ordering::Relaxed);
        self.guard_every.store(d.guard_every, Ordering::Relaxed);
    }

    fn get(&self) -> Detection {
        let f = self.flags.load(Ordering::Relaxed);
        Detection {
            redzone: f & REDZONE != 0,
            poison: f & POISONED != 0,
            quarantine: self.quarantine_max.load(Ordering::Relaxed),
            guard_every: self.guard_every.load(Ordering::Relaxed),
        }
    }
}

/// Where a slot's trailer words are.
#[inline]
fn trailer(p: *mut u8, slot: usize) -> (*mut *mut u8, *mut *const (), *mut usize) {
    let t = p.wrapping_add(slot - TRAILER);
    (t.cast(), t.wrapping_add(W).cast(), t.wrapping_add(2 * W).cast())
}

/// The tag of the slot at `p` of `slot` bytes in state `kind`, in the
/// slab born `birth` (0: a page run).
#[inline]
fn tag(kind: usize, p: *mut u8, slot: usize, birth: u32) -> usize {
    kind ^ p.addr() ^ slot.rotate_left(usize::BITS / 2) ^ (birth as usize).rotate_left(usize::BITS / 4)
}

/// The birth number of the slab of `p`, an object of `cache`, or 0 for
/// a page run (`None`).
///
/// # Safety
///
/// `p` is a live object of `cache`.
unsafe fn birth_in<R: RawMutex>(cache: Option<&MagCache<R>>, p: *mut u8) -> u32 {
    // SAFETY: forwarded.
    cache.map_or(0, |c| unsafe { c.cache.birth_of(p) })
}

/// The first and last offsets in `p[from..to]` that differ from `byte`.
///
/// # Safety
///
/// `p[from..to]` is readable.
unsafe fn changed(p: *const u8, from: usize, to: usize, byte: u8) -> Option<(usize, usize)> {
    // Word by word first (the common case: nothing changed), then the
    // bytes of a word that differs, from each end.
    let word = usize::from_ne_bytes([byte; W]);
    let mut i = from;
    let mut first = None;
    while i < to {
        if to - i >= W {
            // SAFETY: in range, per the contract.
            if unsafe { p.add(i).cast::<usize>().read_unaligned() } == word {
                i += W;
                continue;
            }
        }
        // SAFETY: as above.
        if unsafe { p.add(i).read() } != byte {
            first = Some(i);
            break;
        }
        i += 1;
    }
    let first = first?;
    let mut last = to - 1;
    // SAFETY: `first..to` is in range; `first` itself differs, so the loop
    // stops there at the latest.
    while unsafe { p.add(last).read() } == byte {
        last -= 1;
    }
    Some((first, last))
}

/// Up to 8 bytes of `p` from `at`, for a report.
struct Bytes<'a>(&'a [u8]);

impl fmt::Display for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().take(8).enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Aborts with a report of the bytes of `p[from..to]` that should all be
/// `byte`, if any is not; `cache` names the cache (called only then).
///
/// # Safety
///
/// `p[from..to]` is readable.
unsafe fn expect_bytes(
    p: *mut u8,
    from: usize,
    to: usize,
    byte: u8,
    what: &str,
    cache: impl Fn() -> Name,
    size: usize,
) {
    // SAFETY: forwarded.
    if let Some((a, b)) = unsafe { changed(p, from, to, byte) } {
        // SAFETY: `a..=b` lies in the checked range.
        let shown = unsafe { core::slice::from_raw_parts(p.add(a), (b - a + 1).min(8)) };
        report_abort(format_args!(
            "kmemcg: {what}: cache {}, object {p:p} ({size} bytes), bytes {a}..={b} changed \
             (expected {byte:02x}, found {})",
            cache().as_str(),
            Bytes(shown)
        ));
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    crate::sync::loom_const_fn! {
        /// This allocator with memory-error detection `d`, for a `static`:
        /// `Kmem::new(OsPages::new()).with_detection(Detection::ALL)`
        /// (which replaces the `KMEMCG_DEBUG` environment variable for this
        /// allocator). See [`Detection`] and the README's "Catching memory
        /// bugs in tests".
        pub fn with_detection(mut self, d: Detection) -> Self {
            // The old detector holds no resources (atomics and an unlocked,
            // empty quarantine): forgotten, as a `const fn` cannot drop.
            core::mem::forget(core::mem::replace(self.detect.get_mut(), Detector::new(d)));
            self.tree_mut().mode = atomic_usize(if d.is_on() { mode::DEBUG } else { 0 });
            self
        }
    }

    /// The detection this allocator does (after reading `KMEMCG_DEBUG`,
    /// if it was to).
    pub fn detection(&self) -> Detection {
        self.resolve_mode();
        self.detect.get()
    }

    /// The mode word with `Acquire`, once the environment is read.
    #[inline]
    pub(crate) fn resolve_mode(&self) -> usize {
        let m = self.tree.mode_acquire();
        if m & mode::ENV == 0 {
            return m;
        }
        self.read_env();
        self.tree.mode_acquire()
    }

    /// Reads `KMEMCG_DEBUG` (with `std`) and clears the `ENV` bit. Runs
    /// before the first object is handed out; racing first allocations
    /// read the same variable and store the same settings.
    #[cold]
    fn read_env(&self) {
        let d = env_detection();
        self.detect.set(d);
        self.tree.set_mode(mode::DEBUG, d.is_on());
        self.tree.set_mode(mode::ENV, false);
    }

    /// [`Kmem::alloc_pow2`] with detection: `size + TRAILER` bytes, the
    /// trailer written and a reused object's poison checked.
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_checked(&self, g: *const Group<R>, size: usize, align: usize) -> Option<NonNull<u8>> {
        let padded = size.checked_add(TRAILER)?;
        let n = self.detect.guard_every.load(Ordering::Relaxed);
        if n != 0
            && class_of(padded, align).is_some()
            && self.detect.sampled.fetch_add(1, Ordering::Relaxed).is_multiple_of(n)
            && let Some(p) = self.alloc_guarded(g, size, align)
        {
            return Some(p);
        }
        let p = self.alloc_pow2::<false>(g, padded, align)?;
        let (slot, birth) = match class_of(padded, align) {
            Some(c) => {
                // SAFETY: `p` is a fresh object of class `c`, in a slab of
                // its base cache or of a child of it.
                let birth = unsafe { birth_in(Some(Self::owner(&self.tree.classes()[c], p)), p.as_ptr()) };
                (GEOMETRIES[c].size, birth)
            }
            None => (pages_for(padded).unwrap_or(0) * PAGE_SIZE, 0),
        };
        // SAFETY: a fresh object of `slot` bytes.
        unsafe { self.hand_out(p.as_ptr(), size, slot, birth, || slot_name(padded, align)) };
        Some(p)
    }

    /// Checks a reused object's poison and arms its red zone and tag.
    ///
    /// # Safety
    ///
    /// `p` is an object of `slot` bytes just handed out, `size + TRAILER
    /// <= slot`.
    pub(crate) unsafe fn hand_out(&self, p: *mut u8, size: usize, slot: usize, birth: u32, cache: impl Fn() -> Name) {
        let (_, _, t) = trailer(p, slot);
        let d = self.detect.get();
        // SAFETY: the slot is ours (per the contract).
        unsafe {
            if d.poison && t.read_unaligned() == tag(FREED, p, slot, birth) {
                expect_bytes(p, 0, slot - TRAILER, POISON, "write after free", cache, slot - TRAILER);
            }
            core::ptr::write_bytes(p.add(size), RED, slot - W - size);
            t.write_unaligned(tag(ALIVE, p, slot, birth));
        }
    }

    /// Checks the tag and red zone of a live object being freed (or
    /// resized): aborts on a double free or an overflow.
    ///
    /// # Safety
    ///
    /// `p` is an object of `slot` bytes (its cache said so), `size +
    /// TRAILER <= slot`.
    unsafe fn check_live(&self, p: *mut u8, size: usize, slot: usize, birth: u32, cache: impl Fn() -> Name + Copy) {
        let (_, _, t) = trailer(p, slot);
        // SAFETY: the slot is readable (per the contract).
        let found = unsafe { t.read_unaligned() };
        if found == tag(FREED, p, slot, birth) {
            report_abort(format_args!("kmemcg: double free: cache {}, object {p:p} ({size} bytes)", cache().as_str()));
        }
        if self.detect.get().redzone || found != tag(ALIVE, p, slot, birth) {
            // SAFETY: as above.
            unsafe { expect_bytes(p, size, slot - W, RED, "overflow into the red zone", cache, size) };
        }
        if found != tag(ALIVE, p, slot, birth) {
            report_abort(format_args!(
                "kmemcg: the trailer of object {p:p} ({size} bytes, cache {}) was overwritten, or the free's \
                 size is not the allocation's",
                cache().as_str()
            ));
        }
        self.detect.frees_checked.add(1);
    }

    /// [`Kmem::free_raw`] with detection.
    ///
    /// # Safety
    ///
    /// As for `free_raw`; a bad pointer is reported, not freed.
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn free_checked(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        let p = ptr.as_ptr();
        let Some(padded) = size.checked_add(TRAILER) else {
            report_abort(format_args!("kmemcg: free of {p:p} with an impossible size {size}"))
        };
        // A sampled object first, whatever the size says: it has no slab
        // header nor trailer, and its run is no plain large object.
        if self.detect.guarded_live.load(Ordering::Acquire) != 0 && self.free_guarded(p, size, align) {
            return;
        }
        let Some(c) = class_of(padded, align) else {
            // SAFETY: forwarded.
            return unsafe { self.free_large_checked(ptr, size, padded) };
        };
        // SAFETY: `class_of` returns indices below NCLASSES.
        let base = unsafe { self.tree.classes().get_unchecked(c) };
        if !self.is_object_of(base, ptr) {
            report_abort(format_args!(
                "kmemcg: free of {p:p} ({size} bytes, align {align}), which is not an object kmemcg handed out \
                 for that layout (a foreign pointer, an interior pointer or a wrong size)"
            ));
        }
        let slot = GEOMETRIES[c].size;
        // SAFETY: a live object of `base`'s class (checked above).
        let owner = unsafe { Self::owner(base, ptr) };
        // SAFETY: an object of class `c` in `owner` (checked above).
        unsafe { self.check_live(p, size, slot, birth_in(Some(owner), p), || class_name(c)) };
        // SAFETY: a live object of `owner`, checked, freed once.
        unsafe { self.quarantine(owner, p, slot) };
    }

    /// A sampled object: `size` bytes ending at a page boundary (rounded to
    /// `align`) before a page made inaccessible, in a large run charged to
    /// `g`. `None` if the table is full or the source cannot protect
    /// pages: the caller allocates normally.
    #[cold]
    fn alloc_guarded(&self, g: *const Group<R>, size: usize, align: usize) -> Option<NonNull<u8>> {
        if self.detect.guarded_live.load(Ordering::Relaxed) >= GUARDED_MAX {
            return None;
        }
        let pages = pages_for(size)?;
        // Only a try: refused, the caller allocates from a slab, so a
        // refusal here is no limit event (issue 26, item 10).
        let run = self.try_alloc_large_sample(g, (pages + 1) * PAGE_SIZE)?;
        let guard = run.as_ptr().wrapping_add(pages * PAGE_SIZE);
        // SAFETY: `guard` is the last page of the run we just made, which
        // nothing else touches; it is turned back on before the run goes.
        let protected = unsafe { self.source.protect(NonNull::new_unchecked(guard), 1, true) };
        let p = guard.wrapping_sub(size.next_multiple_of(align));
        let kept = protected && {
            let mut q = self.detect.quarantine.lock();
            match q.guarded.iter_mut().find(|e| e.0.is_null()) {
                Some(e) => {
                    *e = (p, run.as_ptr());
                    self.detect.guarded_live.fetch_add(1, Ordering::Release);
                    true
                }
                None => false,
            }
        };
        if !kept {
            if protected {
                // SAFETY: as above; accessible again before it is freed.
                unsafe { self.source.protect(NonNull::new_unchecked(guard), 1, false) };
            }
            // SAFETY: the run we just made, unused.
            unsafe { self.free_large(run) };
            return None;
        }
        NonNull::new(p)
    }

    /// Frees `p` if it is a live sampled object; returns whether it was.
    /// Aborts if it is one but `size` and `align` are not its layout's.
    #[cold]
    fn free_guarded(&self, p: *mut u8, size: usize, align: usize) -> bool {
        let run = {
            let mut q = self.detect.quarantine.lock();
            let Some(e) = q.guarded.iter_mut().find(|e| e.0 == p) else { return false };
            let run = e.1;
            if size.checked_next_multiple_of(align) != Some(self.guard_of(run).addr() - p.addr()) {
                drop(q);
                report_abort(format_args!(
                    "kmemcg: free of {p:p} ({size} bytes, align {align}), a sampled object of another size"
                ));
            }
            *e = (core::ptr::null_mut(), core::ptr::null_mut());
            self.detect.guarded_live.fetch_sub(1, Ordering::Relaxed);
            run
        };
        // SAFETY: the run of a live sampled object (the table said so),
        // now ours: its guard page made accessible, then freed.
        unsafe {
            self.source.protect(NonNull::new_unchecked(self.guard_of(run)), 1, false);
            self.free_large(NonNull::new_unchecked(run));
        }
        true
    }

    /// The guard page of the sampled object in `run` (its last page).
    fn guard_of(&self, run: *mut u8) -> *mut u8 {
        // SAFETY: `run` is a sampled object's run, from the table: a live
        // large object of ours, so not null.
        let pages = self.large_pages_of(unsafe { NonNull::new_unchecked(run) }).unwrap_or(1);
        run.wrapping_add((pages - 1) * PAGE_SIZE)
    }

    /// If `p` is a live sampled object, the bytes from it to its guard
    /// page (its size rounded up to its alignment).
    #[cold]
    fn guarded_room(&self, p: *mut u8) -> Option<usize> {
        let q = self.detect.quarantine.lock();
        let e = q.guarded.iter().find(|e| e.0 == p)?;
        Some(self.guard_of(e.1).addr() - p.addr())
    }

    /// A large object's free with detection.
    ///
    /// # Safety
    ///
    /// As for `free_raw`.
    unsafe fn free_large_checked(&self, ptr: NonNull<u8>, size: usize, padded: usize) {
        let p = ptr.as_ptr();
        let a = p.addr();
        let pages = pages_for(padded);
        let owned = a.is_multiple_of(PAGE_SIZE)
            && a >= PAGE_SIZE
            && self.source.ownership(a - PAGE_SIZE) == crate::platform::Ownership::Owned
            && self.source.ownership(a) == crate::platform::Ownership::Owned;
        let live = owned && self.large_pages_of(ptr).is_some_and(|n| Some(n) == pages);
        if !live {
            report_abort(format_args!(
                "kmemcg: free of {p:p} ({size} bytes): not a live large object of that size (a double free, a \
                 foreign pointer or a wrong size)"
            ));
        }
        let slot = pages.unwrap_or(0) * PAGE_SIZE;
        // SAFETY: a live large object of `slot` bytes (checked above).
        unsafe {
            self.check_live(p, size, slot, 0, || Name::LARGE);
            self.free_large(ptr);
        }
    }

    /// Poisons a freed object and queues it; gives the oldest back when
    /// the quarantine is over its bound.
    ///
    /// # Safety
    ///
    /// `p` is a live object of `owner` of `slot` bytes, checked, freed once.
    unsafe fn quarantine(&self, owner: &MagCache<R>, p: *mut u8, slot: usize) {
        let d = self.detect.get();
        let (link, own, t) = trailer(p, slot);
        // SAFETY: the object is ours now.
        unsafe {
            if d.poison {
                core::ptr::write_bytes(p, POISON, slot - TRAILER);
            }
            link.write_unaligned(core::ptr::null_mut());
            own.write_unaligned((owner as *const MagCache<R>).cast());
            t.write_unaligned(tag(FREED, p, slot, birth_in(Some(owner), p)));
        }
        let one = Fifo { head: link.cast(), tail: link.cast(), bytes: slot, objects: 1 };
        // This CPU's quarantine first; a full one goes to the global one
        // whole.
        let per_cpu = d.quarantine / 8;
        // SAFETY: no slot is held here (frees hold none while they
        // quarantine), and each arm below exits the one it gets.
        let batch = match unsafe { self.platform.enter() } {
            Some(cpu) if per_cpu != 0 => {
                // SAFETY: the platform keeps slots below MAX_CPUS.
                let mut l = unsafe { self.detect.locals.get_unchecked(cpu) }.lock();
                // SAFETY: trailers written here.
                unsafe { l.append(one) };
                let full = l.bytes > per_cpu;
                let batch = if full { core::mem::replace(&mut *l, Fifo::EMPTY) } else { Fifo::EMPTY };
                drop(l);
                // SAFETY: entered above.
                unsafe { self.platform.exit(cpu) };
                batch
            }
            cpu => {
                if let Some(cpu) = cpu {
                    // SAFETY: entered above.
                    unsafe { self.platform.exit(cpu) };
                }
                one
            }
        };
        if batch.head.is_null() {
            return;
        }
        let evicted = {
            let mut q = self.detect.quarantine.lock();
            // SAFETY: trailers written here; the quarantine's too.
            unsafe {
                q.fifo.append(batch);
                take_over::<R>(&mut q.fifo, d.quarantine)
            }
        };
        // SAFETY: the chain taken out of the quarantine.
        unsafe { self.release(evicted, d) };
    }

    /// Gives every quarantined object back to its cache (reclaim, reports
    /// and group removal call it).
    pub(crate) fn flush_quarantine(&self) {
        let d = self.detect.get();
        for l in &self.detect.locals {
            let batch = core::mem::replace(&mut *l.lock(), Fifo::EMPTY);
            // SAFETY: the chain taken out of a per-CPU quarantine.
            unsafe { self.release(batch.head, d) };
        }
        // SAFETY: the quarantine's trailers were written by `quarantine`.
        let chain = unsafe { take_over::<R>(&mut self.detect.quarantine.lock().fifo, 0) };
        // SAFETY: the chain taken out of the quarantine.
        unsafe { self.release(chain, d) };
    }

    /// Quarantined objects and their bytes.
    pub(crate) fn quarantined(&self) -> (usize, usize) {
        let mut n = {
            let q = self.detect.quarantine.lock();
            (q.fifo.objects, q.fifo.bytes)
        };
        for l in &self.detect.locals {
            let l = l.lock();
            n = (n.0 + l.objects, n.1 + l.bytes);
        }
        n
    }

    /// Checks the poison of each object of `chain` and frees it into its
    /// cache.
    ///
    /// # Safety
    ///
    /// `chain` came out of the quarantine: trailers of objects freed by
    /// their users, checked and queued by [`Kmem::quarantine`].
    unsafe fn release(&self, mut chain: *mut u8, d: Detection) {
        while !chain.is_null() {
            // SAFETY: per the contract.
            let (p, slot, owner, next) = unsafe { queued::<R>(chain) };
            chain = next;
            // SAFETY: the object is a quarantined one of `slot` bytes; its
            // owner cache outlives its objects.
            unsafe {
                if d.poison {
                    let name = || self.cache_name(&*owner);
                    expect_bytes(p, 0, slot - TRAILER, POISON, "write after free", name, slot - TRAILER);
                }
                self.free_into(&*owner, NonNull::new_unchecked(p));
            }
        }
    }

    /// A typed cache's object handed out from `cache` with detection on:
    /// red zone and tag armed for an object of `size` bytes.
    ///
    /// # Safety
    ///
    /// `p` is an object just handed out by `cache`, whose objects are at
    /// least `size + TRAILER` bytes (the cache was made with detection on).
    pub(crate) unsafe fn hand_out_typed(&self, cache: &MagCache<R>, p: NonNull<u8>, size: usize) {
        let slot = cache.cache.geometry().size;
        // SAFETY: forwarded.
        unsafe { self.hand_out(p.as_ptr(), size, slot, birth_in(Some(cache), p.as_ptr()), || self.cache_name(cache)) };
    }

    /// A typed cache's object freed with detection on: checked, poisoned,
    /// quarantined.
    ///
    /// # Safety
    ///
    /// `p` is a live object of `owner` handed out by
    /// [`Kmem::hand_out_typed`] with `size`, freed once.
    pub(crate) unsafe fn free_typed_checked(&self, owner: &MagCache<R>, p: NonNull<u8>, size: usize) {
        let slot = owner.cache.geometry().size;
        // SAFETY: forwarded.
        unsafe {
            self.check_live(p.as_ptr(), size, slot, birth_in(Some(owner), p.as_ptr()), || self.cache_name(owner));
            self.quarantine(owner, p.as_ptr(), slot);
        }
    }

    /// [`Kmem::resize_in_place`] with detection: within the slot only,
    /// red zone checked and moved.
    ///
    /// # Safety
    ///
    /// As for `resize_in_place`.
    pub(crate) unsafe fn resize_checked(&self, ptr: NonNull<u8>, old: usize, align: usize, new: usize) -> bool {
        // A sampled object has neither slab header nor trailer: it stays
        // only if it still ends at its guard page, else it moves (and its
        // free finds it in the table).
        if self.detect.guarded_live.load(Ordering::Acquire) != 0
            && let Some(room) = self.guarded_room(ptr.as_ptr())
        {
            if old.checked_next_multiple_of(align) != Some(room) {
                report_abort(format_args!(
                    "kmemcg: resize of {:p} ({old} bytes, align {align}), a sampled object of another size",
                    ptr.as_ptr()
                ));
            }
            return new.checked_next_multiple_of(align) == Some(room);
        }
        let (Some(po), Some(pn)) = (old.checked_add(TRAILER), new.checked_add(TRAILER)) else { return false };
        let (Some(a), Some(b)) = (class_of(po, align), class_of(pn, align)) else { return false };
        if a != b {
            return false;
        }
        let slot = GEOMETRIES[a].size;
        let p = ptr.as_ptr();
        // SAFETY: a live object of class `a` (per the contract), in a slab
        // of its base cache or of a child of it.
        unsafe {
            let birth = birth_in(Some(Self::owner(&self.tree.classes()[a], ptr)), p);
            self.check_live(p, old, slot, birth, || class_name(a));
            if new < old {
                core::ptr::write_bytes(p.add(new), RED, old - new);
            }
        }
        true
    }
}

/// A quarantined object from its trailer `t`: the object, its slot size,
/// its owner cache and the next trailer in the chain.
///
/// # Safety
///
/// `t` is the trailer of a quarantined object, written by
/// [`Kmem::quarantine`].
unsafe fn queued<R: RawMutex>(t: *mut u8) -> (*mut u8, usize, *const MagCache<R>, *mut u8) {
    // SAFETY: per the contract: the link and owner words; a quarantined
    // object keeps its cache alive.
    unsafe {
        let next = t.cast::<*mut u8>().read_unaligned();
        let owner = t.add(W).cast::<*const MagCache<R>>().read_unaligned();
        let slot = (*owner).cache.geometry().size;
        (t.sub(slot - TRAILER), slot, owner, next)
    }
}

/// Takes objects off the quarantine's head until it holds at most `max`
/// bytes; returns their trailers as a chain.
///
/// # Safety
///
/// Every trailer in `q` was written by [`Kmem::quarantine`].
unsafe fn take_over<R: RawMutex>(q: &mut Fifo, max: usize) -> *mut u8 {
    let first = q.head;
    let mut last: *mut u8 = core::ptr::null_mut();
    while q.bytes > max && !q.head.is_null() {
        // SAFETY: per the contract.
        let (_, slot, _, next) = unsafe { queued::<R>(q.head) };
        last = q.head;
        q.head = next;
        q.bytes -= slot;
        q.objects -= 1;
    }
    if last.is_null() {
        return core::ptr::null_mut();
    }
    if q.head.is_null() {
        q.tail = core::ptr::null_mut();
    }
    // SAFETY: `last` is the chain's last trailer: end the chain there.
    unsafe { last.cast::<*mut u8>().write_unaligned(core::ptr::null_mut()) };
    first
}

/// The name of the cache a `padded`-byte request is served from.
fn slot_name(padded: usize, align: usize) -> Name {
    class_of(padded, align).map_or(Name::LARGE, class_name)
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// The name of `cache`, found by identity (a typed cache may have a
    /// size class's geometry): its size class's, its typed cache's, or
    /// for a group's child cache, that of the cache it was made from.
    fn cache_name(&self, cache: &MagCache<R>) -> Name {
        let is = |c: &MagCache<R>| core::ptr::eq(c, cache);
        if let Some(c) = self.tree.classes().iter().position(is) {
            return class_name(c);
        }
        let mut found = None;
        self.tree.for_each_desc(|d| {
            if is(&d.cache) {
                found = Some(d.name);
            }
        });
        if let Some(name) = found {
            return name;
        }
        let mut idx = None;
        self.tree.for_each_group(|g| {
            g.for_each_cache(|i, c| {
                if is(c) {
                    idx = Some(i);
                }
            })
        });
        idx.map_or(Name::UNKNOWN, |i| self.tree.acct_name(i))
    }
}

/// The detection `KMEMCG_DEBUG` asks for (none without `std`).
fn env_detection() -> Detection {
    #[cfg(all(feature = "std", not(loom)))]
    {
        // SAFETY: a NUL-terminated name; `getenv` neither allocates nor
        // locks, and what it returns is read before anything can change
        // the environment of a program that is only starting to allocate.
        unsafe {
            let v = libc::getenv(c"KMEMCG_DEBUG".as_ptr());
            if !v.is_null() {
                return Detection::from_env_value(core::ffi::CStr::from_ptr(v).to_bytes());
            }
        }
    }
    Detection::OFF
}
