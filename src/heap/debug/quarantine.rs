//! Poison and the quarantine: freed objects filled with `POISON` wait in
//! a FIFO of bounded bytes (per CPU slot, then global) before they go back
//! to their caches; their poison is checked on the way out (and when the
//! program exits, with `std`), once: an object let out checked is marked
//! `CLEAN`, and its hand-out does not check it again.

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::guard::{GUARDED_MAX, RETIRED_MAX};
use super::header::{birth_in, freed_front, tag, words};
use super::report::expect_bytes;
use super::{CLEAN, Detection, FREED, HEAD, POISON, POISON_FROM};
use crate::heap::Kmem;
use crate::magazine::MagCache;
use crate::platform::{PageSource, Platform};
use crate::sync::{Ordering, ptr_store_shared, word_store_shared};

/// Freed objects waiting to go back to their caches, oldest first, linked
/// through their header's third word (`head` and `tail` point at slots).
pub(super) struct Fifo {
    pub(super) head: *mut u8,
    pub(super) tail: *mut u8,
    pub(super) bytes: usize,
    pub(super) objects: usize,
}

impl Fifo {
    pub(super) const EMPTY: Fifo =
        Fifo { head: core::ptr::null_mut(), tail: core::ptr::null_mut(), bytes: 0, objects: 0 };

    /// Appends `other` (a chain of whole objects) at the tail.
    ///
    /// # Safety
    ///
    /// Both hold slots written by [`Kmem::quarantine`].
    pub(super) unsafe fn append(&mut self, other: Fifo) {
        if other.head.is_null() {
            return;
        }
        if self.tail.is_null() {
            self.head = other.head;
        } else {
            // SAFETY: the tail is a quarantined slot, ours.
            unsafe { words(self.tail).2.write_unaligned(other.head) };
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
pub(super) struct Quarantine {
    pub(super) fifo: Fifo,
    /// Live sampled objects and the large runs holding them.
    pub(super) guarded: [(*mut u8, *mut u8); GUARDED_MAX],
    /// Freed sampled objects and their runs, every page inaccessible (a
    /// use after free faults), oldest first: the first `retired_n` are
    /// set.
    pub(super) retired: [(*mut u8, *mut u8); RETIRED_MAX],
    pub(super) retired_n: usize,
}

// SAFETY: as for `Fifo`; the table's pointers are sampled objects' runs,
// reached only under the lock.
unsafe impl Send for Quarantine {}

/// The owner word of a quarantined page run: its bytes with the low bit
/// set (a `MagCache` address has it clear).
const RUN: usize = 1;

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Poisons a freed slot and queues it (`owner`: its cache, `None`: a
    /// page run); gives the oldest back when the quarantine is over its
    /// bound. `front`: where the object starts in the slot.
    ///
    /// # Safety
    ///
    /// `s` is the slot of a live object of `owner` (or a live page run),
    /// of `slot` bytes, checked, freed once.
    pub(super) unsafe fn quarantine(&self, owner: Option<&MagCache<R>>, s: *mut u8, slot: usize, front: usize) {
        let d = self.detect.get();
        let (t, own, link) = words(s);
        // SAFETY: the slot is ours now.
        unsafe {
            if d.poison {
                core::ptr::write_bytes(s.add(POISON_FROM), POISON, slot - POISON_FROM);
            }
            link.write_unaligned(core::ptr::null_mut());
            let word = owner.map_or(core::ptr::without_provenance(slot | RUN), |o| (o as *const MagCache<R>).cast());
            // Shared, as the tag: `Cgroup::stat` reads them. The tag
            // first: a scan that reads the owner where the size was
            // rereads the tag after (its `Acquire` fence; `leaks`) and
            // finds it no longer live.
            word_store_shared(t, tag(FREED, s, slot, birth_in(owner, s)));
            crate::sync::shared_release_fence();
            ptr_store_shared(own.cast::<*const ()>(), word);
            s.add(HEAD).cast::<usize>().write_unaligned(front);
        }
        #[cfg(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu"))]
        if d.sites {
            super::sites::freed(s);
        }
        if d.poison {
            self.check_at_exit();
        }
        if d.quarantine == 0 {
            if owner.is_none() {
                // A page run goes back to the page source, which may trim
                // or hand out its pages in other runs: nothing can check
                // its poison at a later hand-out (which read a run half
                // of fresh zero pages as a write after free). Marked
                // checked, so a run made here again is not read.
                // SAFETY: the run's first word, ours until given back.
                unsafe { word_store_shared(t, tag(CLEAN, s, slot, birth_in(owner, s))) };
            }
            // Straight back to its cache: a slot's hand-out checks the
            // poison.
            // SAFETY: a freed slot of `owner` (or a run), written above.
            return unsafe { self.give_back(owner, s) };
        }
        let one = Fifo { head: s, tail: s, bytes: slot, objects: 1 };
        // This CPU's quarantine first; a full one goes to the global one
        // whole, under both locks (this CPU's first), so a flush that
        // visits this CPU's and then the global one cannot miss it between
        // the two (`Cgroup::check_empty` relies on that).
        let per_cpu = d.quarantine / 8;
        // SAFETY: no slot is held here (frees hold none while they
        // quarantine), and each arm below exits the one it gets.
        let evicted = match unsafe { self.platform.enter() } {
            // An object larger than a CPU's share goes to the global one.
            Some(cpu) if per_cpu >= slot => {
                // SAFETY: the platform keeps slots below MAX_CPUS.
                let mut l = unsafe { self.detect.locals.get_unchecked(cpu) }.lock();
                // SAFETY: slots written here.
                unsafe { l.append(one) };
                let evicted =
                    if l.bytes > per_cpu { self.to_global(core::mem::replace(&mut *l, Fifo::EMPTY), d) } else { None };
                drop(l);
                // SAFETY: entered above.
                unsafe { self.platform.exit(cpu) };
                evicted
            }
            cpu => {
                if let Some(cpu) = cpu {
                    // SAFETY: entered above.
                    unsafe { self.platform.exit(cpu) };
                }
                self.to_global(one, d)
            }
        };
        if let Some(chain) = evicted {
            // SAFETY: the chain taken out of the quarantine.
            unsafe { self.release(chain, d) };
        }
    }

    /// Appends `batch` to the global quarantine and takes the oldest
    /// objects out until it is within its bound: them (counted in
    /// transit), if any.
    fn to_global(&self, batch: Fifo, d: Detection) -> Option<*mut u8> {
        let mut q = self.detect.quarantine.lock();
        // SAFETY: slots written by `quarantine`; the quarantine's too.
        unsafe { q.fifo.append(batch) };
        let chain = self.take_over(&mut q.fifo, d.quarantine);
        (!chain.is_null()).then_some(chain)
    }

    /// Frees a freed slot into its cache, or a page run.
    ///
    /// # Safety
    ///
    /// `s` is a slot freed by [`Kmem::quarantine`] with `owner`, out of
    /// the quarantine.
    unsafe fn give_back(&self, owner: Option<&MagCache<R>>, s: *mut u8) {
        // SAFETY: per the contract (a slot is never null).
        unsafe {
            let s = NonNull::new_unchecked(s);
            match owner {
                Some(o) => self.free_into(o, s),
                None => self.free_large(s),
            }
        }
    }

    /// Gives every quarantined object back to its cache (reclaim, reports,
    /// `check_empty` and group removal call it), checking its poison.
    pub(crate) fn flush_quarantine(&self) {
        let d = self.detect.get();
        for l in &self.detect.locals {
            let batch = self.take_out(&mut l.lock());
            // SAFETY: the chain taken out of a per-CPU quarantine.
            unsafe { self.release(batch.head, d) };
        }
        let chain = self.take_over(&mut self.detect.quarantine.lock().fifo, 0);
        // SAFETY: the chain taken out of the quarantine.
        unsafe { self.release(chain, d) };
        self.free_retired();
    }

    /// Waits (a bounded while) until no object another thread took out of
    /// the quarantine is still on its way back to its cache, so that what
    /// a flush found missing is back; `false` if one still is then.
    pub(crate) fn settle_quarantine(&self) -> bool {
        crate::sync::wait_until(|| self.quarantine_settled())
    }

    /// Whether no object taken out of the quarantine is on its way back
    /// now. Acquire: pairs with the Release of [`Kmem::release`]'s count,
    /// made once it is done with the object's cache.
    pub(crate) fn quarantine_settled(&self) -> bool {
        self.detect.in_transit.load(Ordering::Acquire) == 0
    }

    /// Empties a per-CPU quarantine (under its lock) for a flush, its
    /// objects counted in transit until [`Kmem::release`] has them back.
    fn take_out(&self, l: &mut Fifo) -> Fifo {
        self.detect.in_transit.fetch_add(l.objects, Ordering::Relaxed);
        core::mem::replace(l, Fifo::EMPTY)
    }

    /// [`take_over`] with the objects taken counted in transit until
    /// [`Kmem::release`] has them back (under the quarantine's lock, so a
    /// flush that finds them gone sees them counted).
    fn take_over(&self, q: &mut Fifo, max: usize) -> *mut u8 {
        let before = q.objects;
        // SAFETY: every slot in a quarantine FIFO was written by
        // `quarantine`.
        let chain = unsafe { take_over::<R>(q, max) };
        self.detect.in_transit.fetch_add(before - q.objects, Ordering::Relaxed);
        chain
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

    /// Checks the poison of the quarantined slot `s` of `slot` bytes:
    /// aborts with a report on a write after free.
    ///
    /// # Safety
    ///
    /// `s` is a quarantined slot, written by [`Kmem::quarantine`], whose
    /// owner (if any) is `owner`.
    unsafe fn check_poison(&self, s: *mut u8, slot: usize, owner: Option<&MagCache<R>>) {
        let name = || owner.map_or(crate::error::Name::LARGE, |o| self.cache_name(o));
        // SAFETY: per the contract.
        unsafe {
            let obj = s.add(freed_front(s, slot));
            expect_bytes(s, POISON_FROM, slot, POISON, "write after free", name, obj, None);
        }
    }

    /// Checks the poison of each object of `chain` and frees it into its
    /// cache, marked `CLEAN` (checked: its hand-out skips the check).
    ///
    /// # Safety
    ///
    /// `chain` came out of the quarantine: slots of objects freed by
    /// their users, checked and queued by [`Kmem::quarantine`].
    pub(super) unsafe fn release(&self, mut chain: *mut u8, d: Detection) {
        // A read guard for the give-backs: a typed cache destroyed
        // meanwhile is not freed while this thread may still be inside it
        // (after an object's slab went, its release reads the cache's
        // geometry and counter: a review found its descriptor freed
        // there). Retirement also waits for nothing to be in transit.
        let _read = (!chain.is_null()).then(|| self.tree().read_guard());
        while !chain.is_null() {
            // SAFETY: per the contract.
            let (s, slot, owner, next) = unsafe { queued::<R>(chain) };
            chain = next;
            // SAFETY: the slot is a quarantined one of `slot` bytes; its
            // owner cache outlives its objects.
            unsafe {
                let owner = owner.as_ref();
                if d.poison {
                    self.check_poison(s, slot, owner);
                }
                word_store_shared(words(s).0, tag(CLEAN, s, slot, birth_in(owner, s)));
                self.give_back(owner, s);
            }
            // Release: the object is back (its bytes uncharged) before a
            // waiter sees it counted out.
            self.detect.in_transit.fetch_sub(1, Ordering::Release);
        }
    }

    /// Checks the poison of every quarantined object, leaving them there
    /// (at exit). A quarantine whose lock another thread holds is skipped.
    #[cfg(all(feature = "std", not(loom)))]
    pub(super) fn check_quarantine(&self) {
        if !self.detect.get().poison {
            return;
        }
        let walk = |mut chain: *mut u8| {
            while !chain.is_null() {
                // SAFETY: a chain of quarantined slots, under its lock.
                unsafe {
                    let (s, slot, owner, next) = queued::<R>(chain);
                    self.check_poison(s, slot, owner.as_ref());
                    chain = next;
                }
            }
        };
        for l in &self.detect.locals {
            if let Some(l) = l.try_lock() {
                walk(l.head);
            }
        }
        if let Some(q) = self.detect.quarantine.try_lock() {
            walk(q.fifo.head);
        }
    }

    /// With `std`, once: has the quarantine checked when the program
    /// exits (a write after free whose object is still quarantined then).
    #[inline]
    fn check_at_exit(&self) {
        #[cfg(all(feature = "std", not(loom)))]
        self.hook_process();
    }
}

/// A quarantined slot: its start, its bytes, its owner cache (null: a page
/// run) and the next slot in the chain.
///
/// # Safety
///
/// `s` is a quarantined slot, written by [`Kmem::quarantine`].
unsafe fn queued<R: RawMutex>(s: *mut u8) -> (*mut u8, usize, *const MagCache<R>, *mut u8) {
    let (_, own, link) = words(s);
    // SAFETY: per the contract: the link and owner words; a quarantined
    // object keeps its cache alive.
    unsafe {
        let next = link.read_unaligned();
        let owner = own.cast::<*const ()>().read_unaligned();
        if owner.addr() & RUN != 0 {
            return (s, owner.addr() & !RUN, core::ptr::null(), next);
        }
        let owner = owner.cast::<MagCache<R>>();
        (s, (*owner).cache.geometry().size, owner, next)
    }
}

/// Takes objects off the quarantine's head until it holds at most `max`
/// bytes; returns them as a chain.
///
/// # Safety
///
/// Every slot in `q` was written by [`Kmem::quarantine`].
unsafe fn take_over<R: RawMutex>(q: &mut Fifo, max: usize) -> *mut u8 {
    let first = q.head;
    let mut last: *mut u8 = core::ptr::null_mut();
    while q.bytes > max && !q.head.is_null() {
        // SAFETY: per the contract: the owner word says the slot's bytes.
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
    // SAFETY: `last` is the chain's last slot: end the chain there.
    unsafe { words(last).2.write_unaligned(core::ptr::null_mut()) };
    first
}
