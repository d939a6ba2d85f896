//! Sampled guard-page objects (KFENCE's idea): one size-class
//! allocation in N ends at a page boundary before an inaccessible page.

use core::ptr::NonNull;

use lock_api::RawMutex;

use crate::cgroup::Group;
use crate::heap::Kmem;
use crate::page::pages_for;
use crate::platform::{PAGE_SIZE, PageSource, Platform, report_abort};
use crate::slab::classes::class_of;
use crate::sync::Ordering;

/// How many sampled guard-page objects can live at once.
pub const GUARDED_MAX: usize = 64;

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Whether this allocation of `size` bytes aligned to `align` is to be
    /// sampled: a size-class one, when the countdown from `guard_every`
    /// reaches it.
    #[inline]
    pub(super) fn sample_due(&self, size: usize, align: usize) -> bool {
        let n = self.detect.guard_every.load(Ordering::Relaxed);
        if n == 0 || class_of(size, align).is_none() {
            return false;
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

    /// Whether any sampled object is live (`Acquire`: pairs with the
    /// `Release` increment made once one is in the table).
    #[inline]
    pub(super) fn guarded_live(&self) -> bool {
        self.detect.guarded_live.load(Ordering::Acquire) != 0
    }

    /// A sampled object: `size` bytes ending at a page boundary (rounded to
    /// `align`) before a page made inaccessible, in a large run charged to
    /// `g`. `None` if the table is full or the source cannot protect
    /// pages: the caller allocates normally.
    #[cold]
    pub(super) fn alloc_guarded(&self, g: *const Group<R>, size: usize, align: usize) -> Option<NonNull<u8>> {
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
    pub(super) fn free_guarded(&self, p: *mut u8, size: usize, align: usize) -> bool {
        // Only a block that ends at a page boundary can be one: most frees
        // stop here, without the lock.
        if !p.addr().wrapping_add(size.next_multiple_of(align)).is_multiple_of(PAGE_SIZE) {
            return false;
        }
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
}
