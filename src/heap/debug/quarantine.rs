//! Poison and the quarantine: freed objects filled with `POISON` wait in
//! a FIFO of bounded bytes (per CPU slot, then global) before they go back
//! to their caches; their poison is checked on the way out.

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::guard::GUARDED_MAX;
use super::redzone::{birth_in, tag, trailer};
use super::report::expect_bytes;
use super::{Detection, FREED, POISON, TRAILER, W};
use crate::heap::Kmem;
use crate::magazine::MagCache;
use crate::platform::{PageSource, Platform};

/// Freed objects waiting to go back to their caches, oldest first, linked
/// through their trailers (`head` and `tail` point at trailers).
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
    /// Both hold trailers written by [`Kmem::quarantine`].
    pub(super) unsafe fn append(&mut self, other: Fifo) {
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
pub(super) struct Quarantine {
    pub(super) fifo: Fifo,
    /// Live sampled objects and the large runs holding them.
    pub(super) guarded: [(*mut u8, *mut u8); GUARDED_MAX],
}

// SAFETY: as for `Fifo`; the table's pointers are sampled objects' runs,
// reached only under the lock.
unsafe impl Send for Quarantine {}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Poisons a freed object and queues it; gives the oldest back when
    /// the quarantine is over its bound.
    ///
    /// # Safety
    ///
    /// `p` is a live object of `owner` of `slot` bytes, checked, freed once.
    pub(super) unsafe fn quarantine(&self, owner: &MagCache<R>, p: *mut u8, slot: usize) {
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
    pub(super) unsafe fn release(&self, mut chain: *mut u8, d: Detection) {
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
