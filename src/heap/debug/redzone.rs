//! Red zones and tags: the checked allocation and free paths, and the
//! trailer every object carries (see the layout in the parent module).

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::report::{expect_bytes, slot_name};
use super::{ALIVE, FREED, POISON, RED, TRAILER, W};
use crate::cgroup::{Group, class_name};
use crate::error::Name;
use crate::heap::Kmem;
use crate::magazine::MagCache;
use crate::page::pages_for;
use crate::platform::{PAGE_SIZE, PageSource, Platform, report_abort};
use crate::slab::classes::{GEOMETRIES, class_of};
use crate::sync::Ordering;

/// Where a slot's trailer words are.
#[inline]
pub(super) fn trailer(p: *mut u8, slot: usize) -> (*mut *mut u8, *mut *const (), *mut usize) {
    let t = p.wrapping_add(slot - TRAILER);
    (t.cast(), t.wrapping_add(W).cast(), t.wrapping_add(2 * W).cast())
}

/// The tag of the slot at `p` of `slot` bytes in state `kind`, in the
/// slab born `birth` (0: a page run).
#[inline]
pub(super) fn tag(kind: usize, p: *mut u8, slot: usize, birth: u32) -> usize {
    kind ^ p.addr() ^ slot.rotate_left(usize::BITS / 2) ^ (birth as usize).rotate_left(usize::BITS / 4)
}

/// The birth number of the slab of `p`, an object of `cache`, or 0 for
/// a page run (`None`).
///
/// # Safety
///
/// `p` is a live object of `cache`.
pub(super) unsafe fn birth_in<R: RawMutex>(cache: Option<&MagCache<R>>, p: *mut u8) -> u32 {
    // SAFETY: forwarded.
    cache.map_or(0, |c| unsafe { c.cache.birth_of(p) })
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
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
    pub(super) unsafe fn check_live(
        &self,
        p: *mut u8,
        size: usize,
        slot: usize,
        birth: u32,
        cache: impl Fn() -> Name + Copy,
    ) {
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

    /// A large object's free with detection.
    ///
    /// # Safety
    ///
    /// As for `free_raw`.
    pub(super) unsafe fn free_large_checked(&self, ptr: NonNull<u8>, size: usize, padded: usize) {
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
