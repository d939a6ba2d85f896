//! Sampled guard-page objects (KFENCE's idea): one size-class
//! allocation in N ends at a page boundary before an inaccessible page.

use core::ptr::NonNull;

use lock_api::RawMutex;

use crate::cgroup::{Group, mode};
use crate::heap::{Kmem, hardened_on_free};
use crate::page::pages_for;
use crate::platform::{PAGE_SHIFT, PAGE_SIZE, PageSource, Platform, report_abort};
use crate::slab::classes::{SizeClass, class_of};
use crate::sync::Ordering;

/// Sampling alone at one allocation in this many or fewer counts slow
/// paths, not allocations (see `Kmem::sample_due`).
pub(super) const EXACT_BELOW: usize = 256;

/// About how many allocations a slow path stands for (magazines hold up
/// to 64 objects; refills and spills alternate).
const ALLOCS_PER_SLOW_PATH: usize = 32;

/// How many freed sampled runs are kept, inaccessible, for later samples.
pub(super) const RETIRED_MAX: usize = 16;

/// How many sampled guard-page objects can live at once.
pub const GUARDED_MAX: usize = 64;

/// Bits of the summary of live samples' guard pages (`Detector`'s
/// `guard_bits`): with `GUARDED_MAX` samples live, a quarter of them set
/// at most. (One word in unit tests, so that live samples share bits.)
const GUARD_BITS: usize = if cfg!(test) { usize::BITS as usize } else { 256 };
/// Words of that summary.
pub(super) const GUARD_WORDS: usize = GUARD_BITS / usize::BITS as usize;

/// The word and the bit of the summary that stand for the guard page at
/// `guard` (a hash of its page number).
#[inline(always)]
fn guard_bit(guard: usize) -> (usize, usize) {
    let h = (guard >> PAGE_SHIFT) % GUARD_BITS;
    (h / usize::BITS as usize, 1 << (h % usize::BITS as usize))
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Whether this allocation of `size` bytes aligned to `align` is to be
    /// sampled: a size-class one, when the countdown from `guard_every`
    /// reaches it. Sampling alone at a rate of one in [`EXACT_BELOW`] or
    /// less often counts on the slow paths instead ([`Kmem::sample_tick`])
    /// and arms the allocation paths for one sample, taken here.
    #[inline]
    pub(super) fn sample_due(&self, size: usize, align: usize) -> bool {
        let n = self.detect.guard_every.load(Ordering::Relaxed);
        // Only layouts whose size is a multiple of their alignment (every
        // Rust type's): a sample ends at its guard page, so `ptr + size`
        // is a page boundary, the one test `free_unsampled` makes.
        if n == 0 || size & (align - 1) != 0 || class_of(size, align).is_none() {
            return false;
        }
        if self.counts_on_slow_paths(n) {
            let armed = self.slots.mode() & mode::ARMED != 0;
            if armed {
                self.slots.set_mode(mode::ARMED, false);
            }
            return armed;
        }
        // A load and a store, not a read-modify-write: racing threads may
        // both take the same count, so a sample comes a little early or
        // late now and then; no lock-prefixed instruction on every
        // allocation (GWP-ASan keeps its countdown per thread for the
        // same reason).
        let left = self.detect.sampled.load(Ordering::Relaxed);
        if left > 1 {
            self.detect.sampled.store(left - 1, Ordering::Relaxed);
            return false;
        }
        self.detect.sampled.store(n, Ordering::Relaxed);
        true
    }

    /// Whether sampling one allocation in `n` counts slow paths (sampling
    /// alone, a rate of one in [`EXACT_BELOW`] or less often): then the
    /// allocation fast paths stay as without detection.
    #[inline]
    fn counts_on_slow_paths(&self, n: usize) -> bool {
        n >= EXACT_BELOW && !self.checks_objects()
    }

    /// Counts one slow path (a magazine refill or spill, from
    /// `decay_tick`): with sampling alone at a low rate, arms the
    /// allocation paths for one sample once about `guard_every`
    /// allocations went by (a slow path comes about every
    /// [`ALLOCS_PER_SLOW_PATH`] of them).
    #[inline]
    pub(crate) fn sample_tick(&self) {
        if !self.sampling() || self.slots.mode() & mode::ARMED != 0 {
            return;
        }
        // The countdown inline (a load and a store, as in `sample_due`):
        // `ARMED` clear with a rate set means sampling alone at a low
        // rate, which counts here (at a higher rate, or with red zones or
        // poison, `ARMED` stays set), so only arming is out of line.
        let left = self.detect.sampled.load(Ordering::Relaxed);
        if left > 1 {
            self.detect.sampled.store(left - 1, Ordering::Relaxed);
            return;
        }
        self.sample_tick_slow();
    }

    /// Whether sampling is on (a rate is set), sampled objects live or
    /// not. `Relaxed`: the settings are fixed before the first object and
    /// ordered by the mode word's `Release`/`Acquire` pair.
    #[inline]
    pub(crate) fn sampling(&self) -> bool {
        self.detect.guard_every.load(Ordering::Relaxed) != 0
    }

    /// [`Kmem::sample_tick`] once its countdown ran out: restarts the
    /// count and arms the allocation paths for one sample (not while the
    /// table of samples is full, nor twice in one millisecond, nor while
    /// the settings are still being read and `ARMED` is not yet set).
    #[cold]
    fn sample_tick_slow(&self) {
        let n = self.detect.guard_every.load(Ordering::Relaxed);
        if n == 0 || !self.counts_on_slow_paths(n) {
            return;
        }
        // The count restarts whether or not this period arms a sample, so
        // a full table or the clock below costs one call a period.
        self.detect.sampled.store(n / ALLOCS_PER_SLOW_PATH, Ordering::Relaxed);
        if self.detect.guarded_live.load(Ordering::Relaxed) >= GUARDED_MAX {
            return;
        }
        // At most one sample armed per millisecond of the platform's clock
        // (where it has one): a sample costs two `mprotect` calls, a few
        // microseconds, which at one allocation in 5,000 of a program
        // allocating every few nanoseconds would be several percent of its
        // time. KFENCE arms one per 100 ms.
        if let Some(now) = self.platform.now_ms() {
            let now = now as usize;
            if self.detect.armed_ms.load(Ordering::Relaxed) == now {
                return;
            }
            self.detect.armed_ms.store(now, Ordering::Relaxed);
        }
        self.slots.set_mode(mode::ARMED, true);
    }

    /// With sampling alone, while sampled objects live, and no sample due
    /// (the mode word `m` is `DEBUG`, maybe with `GROUPS`; while none
    /// lives, `DEBUG` is clear and frees take the plain path), frees `ptr`
    /// as the path without detection would, unless the block ends at a
    /// page boundary whose bit in the guard-page summary is set
    /// ([`Kmem::may_be_sampled`]), as a sampled one's does; returns whether
    /// it did. Inlined into the free path past its test of a non-zero mode
    /// word, so it costs nothing with detection off.
    ///
    /// # Safety
    ///
    /// As for `Kmem::free_raw` (a rebased, non-null pointer, `size > 0`),
    /// `class` being `class_of(size, align)` of the block's layout.
    #[inline(always)]
    pub(crate) unsafe fn free_unsampled(&self, m: usize, class: Option<usize>, ptr: NonNull<u8>, size: usize) -> bool {
        // Samples are only of sizes that are multiples of their alignment
        // (`sample_due`), so a sample's `ptr + size` is its guard page.
        let end = ptr.as_ptr().addr().wrapping_add(size);
        if end.is_multiple_of(PAGE_SIZE) && self.may_be_sampled(end) {
            return false;
        }
        // No groups (the mode word is `DEBUG` alone, tested first: one
        // compare on the common path): every object of the class is in
        // its base cache, as on the plain path.
        if let Some(c) = class
            && m == mode::DEBUG
        {
            if let Some(base) = self.base_for_free(c, ptr) {
                hardened_on_free(base, ptr);
                // SAFETY: forwarded.
                unsafe { base.free(self, ptr) };
            }
            return true;
        }
        if m & !mode::GROUPS != mode::DEBUG {
            return false;
        }
        // SAFETY: forwarded.
        unsafe { self.free_unsampled_grouped(class, ptr) };
        true
    }

    /// [`Kmem::free_unsampled`] once groups exist, or of a large object:
    /// out of line, so the path without groups stays short.
    ///
    /// # Safety
    ///
    /// As for `Kmem::free_raw`.
    #[inline(never)]
    unsafe fn free_unsampled_grouped(&self, class: Option<usize>, ptr: NonNull<u8>) {
        // SAFETY: forwarded; `class` is `class_of`'s, below NCLASSES.
        unsafe { self.free_grouped(class.map(|c| SizeClass::from_index(c)), ptr) }
    }

    /// Whether allocation and free sites are recorded (for sampled
    /// objects: with sampling alone too).
    #[cfg(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu"))]
    fn records_sites(&self) -> bool {
        self.detect.flags.load(Ordering::Relaxed) & super::SITES != 0
    }

    /// Whether a block of `size` and `align` at `ptr` may be a live sampled
    /// object: its end, rounded to `align`, a page boundary whose bit in
    /// the summary is set ([`Kmem::may_be_sampled`]). `false` is exact.
    /// `align` is a power of two (from a `Layout`): rounded with a mask,
    /// not a division; were it not, `end` would be an address no sample
    /// ends at, and the block no sample.
    #[inline(always)]
    pub(crate) fn may_be_sample(&self, ptr: NonNull<u8>, size: usize, align: usize) -> bool {
        let mask = align.wrapping_sub(1);
        let end = ptr.as_ptr().addr().wrapping_add(size.wrapping_add(mask) & !mask);
        end.is_multiple_of(PAGE_SIZE) && self.may_be_sampled(end)
    }

    /// Whether a block ending at `end`, a page boundary, may be a live
    /// sampled object: its guard page's bit in the summary is set (a live
    /// sample's always is: set before the sample is handed out, cleared
    /// only when no live sample has it, both under the table's lock, so a
    /// free of a sample, which comes after its allocation, sees it).
    /// `false` is exact; `true` sends the free to the table.
    #[inline(always)]
    pub(super) fn may_be_sampled(&self, end: usize) -> bool {
        let (w, b) = guard_bit(end);
        // SAFETY: `guard_bit` gives words below GUARD_WORDS.
        unsafe { self.detect.guard_bits.get_unchecked(w) }.load(Ordering::Relaxed) & b != 0
    }

    /// Whether any sampled object is live (`Acquire`: pairs with the
    /// `Release` increment made once one is in the table).
    #[inline]
    pub(super) fn guarded_live(&self) -> bool {
        self.detect.guarded_live.load(Ordering::Acquire) != 0
    }

    /// A sampled object: `size` bytes ending at a page boundary (rounded to
    /// `align`) before a page made inaccessible, in a large run charged to
    /// `g`: a retired one of the same pages and group if there is one
    /// (two `mprotect` calls per sample, no mapping made), else a new one.
    /// `None` if the table is full or the source cannot protect pages: the
    /// caller allocates normally.
    #[cold]
    pub(super) fn alloc_guarded(&self, g: *const Group<R>, size: usize, align: usize) -> Option<NonNull<u8>> {
        if self.detect.guarded_live.load(Ordering::Relaxed) >= GUARDED_MAX {
            return None;
        }
        let pages = pages_for(size)?;
        let reused = {
            let mut q = self.detect.quarantine.lock();
            let fits = |&(_, run): &(*mut u8, *mut u8)| {
                // SAFETY: a retired run: a live large object of ours.
                let run = unsafe { NonNull::new_unchecked(run) };
                self.large_pages_of(run) == Some(pages + 1)
                    // SAFETY: as above.
                    && unsafe { self.large_group(run) }.map(|o| o.map_or(core::ptr::null(), |g| g as *const Group<R>))
                        == Some(g)
            };
            let n = q.retired_n;
            q.retired[..n].iter().position(fits).map(|i| {
                let run = q.retired[i].1;
                q.retired.copy_within(i + 1..n, i);
                q.retired_n -= 1;
                run
            })
        };
        let (run, protected) = match reused {
            // SAFETY: a retired run, now ours again: its object pages made
            // accessible (its guard page stays off).
            Some(run) => (run, unsafe { self.source.protect(NonNull::new_unchecked(run), pages, false) }),
            None => {
                // Only a try: refused, the caller allocates from a slab, so
                // a refusal here is no limit event (issue 26, item 10).
                let run = self.try_alloc_large_sample(g, (pages + 1) * PAGE_SIZE)?.as_ptr();
                // SAFETY: the last page of the run we just made, which
                // nothing else touches; it is turned back on before the run
                // goes.
                (run, unsafe { self.source.protect(NonNull::new_unchecked(run.add(pages * PAGE_SIZE)), 1, true) })
            }
        };
        let guard = run.wrapping_add(pages * PAGE_SIZE);
        let p = guard.wrapping_sub(size.next_multiple_of(align));
        let kept = protected && {
            let mut q = self.detect.quarantine.lock();
            match q.guarded.iter_mut().find(|e| e.0.is_null()) {
                Some(e) => {
                    *e = (p, run);
                    let (w, b) = guard_bit(guard.addr());
                    self.detect.guard_bits[w].fetch_or(b, Ordering::Relaxed);
                    // The first live sample sets `DEBUG` (a no-op with red
                    // zones or poison, where it stays set), so frees test
                    // for sampled objects from now on: under the table's
                    // lock, so it cannot be ordered before the clear made
                    // when the last one was freed; before `p` is handed
                    // out, so a free of `p` sees it.
                    if self.detect.guarded_live.fetch_add(1, Ordering::Release) == 0 {
                        self.slots.set_mode(mode::DEBUG, true);
                    }
                    true
                }
                None => false,
            }
        };
        if !kept {
            // SAFETY: the run is ours and unused: every page accessible
            // again, then freed.
            unsafe { self.free_run(run) };
            return None;
        }
        #[cfg(all(feature = "std", not(loom)))]
        self.hook_process();
        #[cfg(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu"))]
        if self.records_sites() {
            super::sites::allocated(p);
        }
        NonNull::new(p)
    }

    /// Makes every page of the sampled run `run` accessible and frees it.
    ///
    /// # Safety
    ///
    /// `run` is a sampled run (live large object) no one uses.
    unsafe fn free_run(&self, run: *mut u8) {
        // SAFETY: per the contract (a run is not null).
        unsafe {
            let run = NonNull::new_unchecked(run);
            let pages = self.large_pages_of(run).unwrap_or(0);
            self.source.protect(run, pages, false);
            self.free_large(run);
        }
    }

    /// Frees `p` if it is a live sampled object; returns whether it was.
    /// Aborts if it is one but `size` and `align` are not its layout's.
    #[inline]
    pub(super) fn free_guarded(&self, p: *mut u8, size: usize, align: usize) -> bool {
        // Only a block that ends at a page boundary can be one: most frees
        // stop here, without the lock.
        let end = p.addr().wrapping_add(size.next_multiple_of(align));
        end.is_multiple_of(PAGE_SIZE) && self.may_be_sampled(end) && self.free_guarded_slow(p, size, align)
    }

    /// [`Kmem::free_guarded`] past its test of the block's end: the
    /// object's pages made inaccessible too (a use after free faults), and
    /// the run retired for a later sample; the oldest retired one goes.
    #[cold]
    #[inline(never)]
    fn free_guarded_slow(&self, p: *mut u8, size: usize, align: usize) -> bool {
        let mut q = self.detect.quarantine.lock();
        let Some(e) = q.guarded.iter_mut().find(|e| e.0 == p) else { return false };
        let run = e.1;
        let guard = self.guard_of(run);
        if size.checked_next_multiple_of(align) != Some(guard.addr() - p.addr()) {
            drop(q);
            report_abort(format_args!(
                "kmemcg: free of {p:p} ({size} bytes, align {align}), a sampled object of another size"
            ));
        }
        *e = (core::ptr::null_mut(), core::ptr::null_mut());
        // Its bit in the summary goes unless another live sample's guard
        // page has it too.
        let bit = guard_bit(guard.addr());
        if !q.guarded.iter().any(|e| !e.0.is_null() && guard_bit(self.guard_of(e.1).addr()) == bit) {
            self.detect.guard_bits[bit.0].fetch_and(!bit.1, Ordering::Relaxed);
        }
        #[cfg(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu"))]
        if self.records_sites() {
            super::sites::freed(p);
        }
        // With sampling alone, the last live sample clears `DEBUG`: frees
        // take the plain path again (see `alloc_guarded`).
        if self.detect.guarded_live.fetch_sub(1, Ordering::Relaxed) == 1 && !self.checks_objects() {
            self.slots.set_mode(mode::DEBUG, false);
        }
        let pages = (guard.addr() - run.addr()) / PAGE_SIZE;
        // SAFETY: the run of a sampled object just freed, ours.
        if !unsafe { self.source.protect(NonNull::new_unchecked(run), pages, true) } {
            drop(q);
            // SAFETY: as above.
            unsafe { self.free_run(run) };
            return true;
        }
        let evicted = if q.retired_n == RETIRED_MAX {
            let old = q.retired[0].1;
            q.retired.copy_within(1.., 0);
            q.retired_n -= 1;
            self.detect.in_transit.fetch_add(1, Ordering::Relaxed);
            old
        } else {
            core::ptr::null_mut()
        };
        let n = q.retired_n;
        q.retired[n] = (p, run);
        q.retired_n += 1;
        drop(q);
        if !evicted.is_null() {
            // SAFETY: a retired run, out of the list: no one uses it.
            unsafe { self.free_run(evicted) };
            self.detect.in_transit.fetch_sub(1, Ordering::Release);
        }
        true
    }

    /// Frees every retired sampled run (`flush_quarantine` calls it, so
    /// `check_empty`, reclaim and `shrink` see them gone).
    pub(super) fn free_retired(&self) {
        loop {
            let run = {
                let mut q = self.detect.quarantine.lock();
                if q.retired_n == 0 {
                    return;
                }
                q.retired_n -= 1;
                let n = q.retired_n;
                self.detect.in_transit.fetch_add(1, Ordering::Relaxed);
                q.retired[n].1
            };
            // SAFETY: a retired run, out of the list.
            unsafe { self.free_run(run) };
            // Release: the run is freed (uncharged) before a waiter sees
            // it counted out (see `Kmem::settle_quarantine`).
            self.detect.in_transit.fetch_sub(1, Ordering::Release);
        }
    }

    /// The guard page of the sampled object in `run` (its last page).
    pub(super) fn guard_of(&self, run: *mut u8) -> *mut u8 {
        // SAFETY: `run` is a sampled object's run, from the table: a live
        // large object of ours, so not null.
        let pages = self.large_pages_of(unsafe { NonNull::new_unchecked(run) }).unwrap_or(1);
        run.wrapping_add((pages - 1) * PAGE_SIZE)
    }

    /// If `p` is a live sampled object, the bytes from it to its guard
    /// page (its size rounded up to its alignment).
    #[cold]
    pub(super) fn guarded_room(&self, p: *mut u8) -> Option<usize> {
        let q = self.detect.quarantine.lock();
        let e = q.guarded.iter().find(|e| e.0 == p)?;
        Some(self.guard_of(e.1).addr() - p.addr())
    }

    /// Registers this allocator for the process hooks, once (`std`): the
    /// quarantine checked at exit, guard-page faults reported.
    #[cfg(all(feature = "std", not(loom)))]
    #[inline]
    pub(super) fn hook_process(&self) {
        // Relaxed: the flag guards only the registration, whose table
        // entries are atomics of their own.
        if self.detect.hooked.load(Ordering::Relaxed) == 0 {
            self.hook_process_slow();
        }
    }

    #[cfg(all(feature = "std", not(loom)))]
    #[cold]
    fn hook_process_slow(&self) {
        if self.detect.hooked.swap(1, Ordering::Relaxed) == 0 {
            super::hooks::register(self);
        }
    }

    /// From the `SIGSEGV` handler: if `addr` lies on the guard page of a
    /// live sampled object, or in the run of a freed one, reports it and
    /// aborts; else returns. The table's lock is only tried (the faulting
    /// code is not ours and holds none of our locks; another thread may
    /// hold it for a moment).
    #[cfg(all(feature = "std", not(loom)))]
    pub(super) fn report_guard_fault(&self, addr: usize) {
        let mut q = None;
        for _ in 0..1 << 16 {
            q = self.detect.quarantine.try_lock();
            if q.is_some() {
                break;
            }
            core::hint::spin_loop();
        }
        let Some(q) = q else { return };
        for &(p, run) in &q.guarded {
            if p.is_null() {
                continue;
            }
            let guard = self.guard_of(run);
            if (guard.addr()..guard.addr() + PAGE_SIZE).contains(&addr) {
                super::report::abort_at(
                    p,
                    format_args!(
                        "kmemcg: overflow onto a guard page: address {addr:#x} is byte {} of sampled object {p:p} ({} \
                     bytes, its size rounded to its alignment)",
                        addr - p.addr(),
                        guard.addr() - p.addr()
                    ),
                );
            }
        }
        for &(p, run) in &q.retired[..q.retired_n] {
            let end = self.guard_of(run).addr() + PAGE_SIZE;
            if (run.addr()..end).contains(&addr) {
                super::report::abort_at(
                    p,
                    format_args!(
                        "kmemcg: use after free of a sampled object: address {addr:#x} is byte {} of object {p:p}, \
                     freed (its pages are kept inaccessible)",
                        addr.wrapping_sub(p.addr()) as isize
                    ),
                );
            }
        }
    }
}
