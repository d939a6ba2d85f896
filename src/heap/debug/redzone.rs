//! Red zones, tags and sizes: the checked allocation and free paths, and
//! the header every checked object carries (see the layout in the parent
//! module).

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::header::{birth_in, freed_front, tag, words};
use super::report::{abort_at, expect_bytes, slot_name};
use super::{ALIVE, CHECKED_ALIGN_MAX, CLEAN, FREED, HEAD, POISON, POISONED, RED, REDZONE, W, front, padded};
use crate::cgroup::{Group, class_name, mode};
use crate::error::Name;
use crate::heap::{Kmem, hardened_on_free};
use crate::magazine::MagCache;
use crate::page::pages_for;
use crate::platform::{PAGE_SIZE, PageSource, Platform, report_abort};
use crate::slab::classes::{GEOMETRIES, SizeClass, class_of};
use crate::sync::{Ordering, word_store_shared};

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Whether objects carry the header and red zones (red zones or poison
    /// on); sampling alone leaves the others as they are.
    #[inline]
    pub(super) fn checks_objects(&self) -> bool {
        self.detect.flags.load(Ordering::Relaxed) & (REDZONE | POISONED) != 0
    }

    /// [`Kmem::alloc_pow2`] with detection: a sample onto a guard page
    /// when one is due, else (red zones or poison on) a slot of
    /// `padded(size, align)` bytes with its header and red zones armed and
    /// a reused object's poison checked.
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_checked(&self, g: *const Group<R>, size: usize, align: usize) -> Option<NonNull<u8>> {
        if self.sample_due(size, align)
            && let Some(p) = self.alloc_guarded(g, size, align)
        {
            return Some(p);
        }
        if !self.checks_objects() || align > CHECKED_ALIGN_MAX {
            return self.alloc_pow2::<false>(g, size, align);
        }
        let padded = padded(size, align)?;
        let s = self.alloc_pow2::<false>(g, padded, align)?;
        let (slot, birth) = match class_of(padded, align) {
            Some(c) => {
                // SAFETY: `s` is a fresh object of class `c`, in a slab of
                // its base cache or of a child of it.
                let birth = unsafe { birth_in(Some(Self::owner(&self.tree.classes()[c], s)), s.as_ptr()) };
                (GEOMETRIES[c].size, birth)
            }
            None => (pages_for(padded).unwrap_or(0) * PAGE_SIZE, 0),
        };
        // SAFETY: a fresh object of `slot >= padded` bytes.
        Some(unsafe { self.hand_out(s, size, align, slot, birth, || slot_name(padded, align)) })
    }

    /// Checks a reused slot's poison, arms its header and red zones for an
    /// object of `size` bytes aligned to `align`, and returns the object.
    ///
    /// # Safety
    ///
    /// `s` is a slot of `slot` bytes just handed out, `padded(size, align)
    /// <= slot`, aligned to `align`.
    pub(super) unsafe fn hand_out(
        &self,
        s: NonNull<u8>,
        size: usize,
        align: usize,
        slot: usize,
        birth: u32,
        cache: impl Fn() -> Name,
    ) -> NonNull<u8> {
        let s = s.as_ptr();
        let (t, n, _) = words(s);
        let f = front(align);
        let d = self.detect.get();
        // SAFETY: the slot is ours (per the contract), `f + size <= slot`.
        unsafe {
            // Poison is checked here only for an object that skipped the
            // quarantine (none, or full): one let out of it was checked
            // then (`CLEAN`).
            if d.poison && t.read_unaligned() == tag(FREED, s, slot, birth) {
                let f_was = freed_front(s, slot);
                expect_bytes(s, HEAD + W, slot, POISON, "write after free", cache, s.add(f_was), None);
            }
            // Shared: `Cgroup::stat` reads them from other threads. The
            // size first: a scan that reads the live tag reads it after
            // (its `Acquire` fence; `leaks`).
            word_store_shared(n, size);
            crate::sync::shared_release_fence();
            word_store_shared(t, tag(ALIVE, s, slot, birth));
            #[cfg(all(feature = "std", not(loom), target_os = "linux", target_env = "gnu"))]
            if d.sites {
                super::sites::allocated(s);
            }
            if d.redzone {
                core::ptr::write_bytes(s.add(2 * W), RED, f - 2 * W);
                core::ptr::write_bytes(s.add(f + size), RED, slot - f - size);
            }
            NonNull::new_unchecked(s.add(f))
        }
    }

    /// Checks the header and red zones of a live object being freed (or
    /// resized): aborts on a double free, an underflow, a free with
    /// another size than the allocation's, or an overflow.
    ///
    /// # Safety
    ///
    /// `s` is a slot of `slot` bytes (its cache said so) at least
    /// `padded(size, align)` bytes long.
    pub(super) unsafe fn check_live(
        &self,
        s: *mut u8,
        size: usize,
        align: usize,
        slot: usize,
        birth: u32,
        cache: impl Fn() -> Name + Copy,
    ) {
        let (t, n, _) = words(s);
        let f = front(align);
        let p = s.wrapping_add(f);
        // SAFETY: the slot is readable (per the contract).
        let found = unsafe { t.read_unaligned() };
        if found == tag(FREED, s, slot, birth) || found == tag(CLEAN, s, slot, birth) {
            abort_at(s, format_args!("kmemcg: double free: cache {}, object {p:p} ({size} bytes)", cache().as_str()));
        }
        let redzone = self.detect.get().redzone;
        let alive = found == tag(ALIVE, s, slot, birth);
        if redzone || !alive {
            // SAFETY: as above.
            unsafe { expect_bytes(s, 2 * W, f, RED, "underflow into the red zone", cache, p, Some(size)) };
        }
        if !alive {
            abort_at(
                s,
                format_args!(
                    "kmemcg: the header before object {p:p} ({size} bytes, cache {}) was overwritten (an underflow \
                 past its red zone), or it is no live object of that layout",
                    cache().as_str()
                ),
            );
        }
        // SAFETY: as above.
        let was = unsafe { n.read_unaligned() };
        if was != size {
            abort_at(
                s,
                format_args!(
                    "kmemcg: wrong-size free: object {p:p} (cache {}) allocated with {was} bytes, freed (or resized) \
                 as {size} bytes (align {align})",
                    cache().as_str()
                ),
            );
        }
        if redzone {
            // SAFETY: as above.
            unsafe { expect_bytes(s, f + size, slot, RED, "overflow into the red zone", cache, p, Some(size)) };
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
        // A sampled object first, whatever the size says: it has no slab
        // header nor red zones, and its run is no plain large object.
        if self.guarded_live() && self.free_guarded(p, size, align) {
            return;
        }
        if !self.checks_objects() || align > CHECKED_ALIGN_MAX {
            // A plain object (sampling alone, or aligned past what gets
            // red zones): freed as the plain path frees it.
            let class = class_of(size, align);
            if self.slots.mode() & mode::GROUPS == 0
                && let Some(c) = class
            {
                let Some(base) = self.base_for_free(c, ptr) else { return };
                hardened_on_free(base, ptr);
                // SAFETY: forwarded: with no groups, every object of class
                // `c` is in the base cache.
                return unsafe { base.free(self, ptr) };
            }
            // SAFETY: forwarded; `class` is `class_of`'s, below NCLASSES.
            return unsafe { self.free_grouped(class.map(|c| SizeClass::from_index(c)), ptr) };
        }
        // SAFETY: forwarded.
        unsafe { self.free_checked_full(ptr, size, align) }
    }

    /// [`Kmem::free_checked`] with red zones or poison on.
    ///
    /// # Safety
    ///
    /// As for `free_raw`; a bad pointer is reported, not freed.
    #[inline(never)]
    unsafe fn free_checked_full(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        let p = ptr.as_ptr();
        let Some(padded) = padded(size, align) else {
            report_abort(format_args!("kmemcg: free of {p:p} with an impossible size {size}"))
        };
        let s = p.wrapping_sub(front(align));
        let Some(c) = class_of(padded, align) else {
            // SAFETY: forwarded.
            return unsafe { self.free_large_checked(s, size, align, padded) };
        };
        // SAFETY: `class_of` returns indices below NCLASSES.
        let base = unsafe { self.tree.classes().get_unchecked(c) };
        let Some(slot_ptr) = NonNull::new(s).filter(|&s| p.addr() >= front(align) && self.is_object_of(base, s)) else {
            report_abort(format_args!(
                "kmemcg: free of {p:p} ({size} bytes, align {align}), which is not an object kmemcg handed out \
                 for that layout (a foreign pointer, an interior pointer or a wrong size)"
            ));
        };
        let slot = GEOMETRIES[c].size;
        // SAFETY: a live slot of `base`'s class (checked above).
        let owner = unsafe { Self::owner(base, slot_ptr) };
        // SAFETY: a slot of class `c` in `owner` (checked above).
        unsafe { self.check_live(s, size, align, slot, birth_in(Some(owner), s), || class_name(c)) };
        // SAFETY: a live object of `owner`, checked, freed once.
        unsafe { self.quarantine(Some(owner), s, slot, front(align)) };
    }

    /// A large object's free with detection: `s` is where its slot (page
    /// run) would start.
    ///
    /// # Safety
    ///
    /// As for `free_raw`.
    unsafe fn free_large_checked(&self, s: *mut u8, size: usize, align: usize, padded: usize) {
        let p = s.wrapping_add(front(align));
        let a = s.addr();
        let pages = pages_for(padded);
        let owned = a.is_multiple_of(PAGE_SIZE)
            && a >= PAGE_SIZE
            && self.source.ownership(a - PAGE_SIZE) == crate::platform::Ownership::Owned
            && self.source.ownership(a) == crate::platform::Ownership::Owned;
        let live = owned && NonNull::new(s).and_then(|s| self.large_pages_of(s)).is_some_and(|n| Some(n) == pages);
        if !live {
            report_abort(format_args!(
                "kmemcg: free of {p:p} ({size} bytes): not a live large object of that size (a double free, a \
                 foreign pointer or a wrong size)"
            ));
        }
        let slot = pages.unwrap_or(0) * PAGE_SIZE;
        // SAFETY: a live large object of `slot` bytes (checked above),
        // checked, freed once.
        unsafe {
            self.check_live(s, size, align, slot, 0, || Name::LARGE);
            self.quarantine(None, s, slot, front(align));
        }
    }

    /// What a typed cache of objects of `size` bytes aligned to `align`
    /// adds to each with detection on (see [`Kmem::create_cache`]): the
    /// header and red zones, or nothing with sampling alone.
    pub(crate) fn typed_padding(&self, size: usize, align: usize) -> usize {
        if self.checks_objects() && align <= CHECKED_ALIGN_MAX {
            padded(size, align).map_or(usize::MAX, |p| p - size)
        } else {
            0
        }
    }

    /// A typed cache's slot handed out from `cache` with detection on:
    /// header and red zones armed for an object of `size` bytes aligned
    /// to `align`; returns the object.
    ///
    /// # Safety
    ///
    /// `s` is a slot just handed out by `cache`, whose slots are at least
    /// `size + typed_padding(size, align)` bytes (the cache was made with
    /// detection on).
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn hand_out_typed(
        &self,
        cache: &MagCache<R>,
        s: NonNull<u8>,
        size: usize,
        align: usize,
    ) -> NonNull<u8> {
        if !self.checks_objects() || align > CHECKED_ALIGN_MAX {
            return s;
        }
        let slot = cache.cache.geometry().size;
        // SAFETY: forwarded.
        unsafe { self.hand_out(s, size, align, slot, birth_in(Some(cache), s.as_ptr()), || self.cache_name(cache)) }
    }

    /// A typed cache's object `p` freed with detection on: checked,
    /// poisoned, quarantined.
    ///
    /// # Safety
    ///
    /// `p` is a live object of `owner` returned by
    /// [`Kmem::hand_out_typed`] with `size` and `align`, freed once.
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn free_typed_checked(&self, owner: &MagCache<R>, p: NonNull<u8>, size: usize, align: usize) {
        if !self.checks_objects() || align > CHECKED_ALIGN_MAX {
            // SAFETY: forwarded (no header: the object is its slot).
            return unsafe { self.free_into(owner, p) };
        }
        let slot = owner.cache.geometry().size;
        let s = p.as_ptr().wrapping_sub(front(align));
        // SAFETY: forwarded: its slot starts `front(align)` before it.
        unsafe {
            self.check_live(s, size, align, slot, birth_in(Some(owner), s), || self.cache_name(owner));
            self.quarantine(Some(owner), s, slot, front(align));
        }
    }

    /// [`Kmem::resize_in_place`] with detection: within the slot only,
    /// header and red zone checked and moved.
    ///
    /// # Safety
    ///
    /// As for `resize_in_place`.
    pub(crate) unsafe fn resize_checked(&self, ptr: NonNull<u8>, old: usize, align: usize, new: usize) -> bool {
        if align > CHECKED_ALIGN_MAX {
            // Not checked (see `CHECKED_ALIGN_MAX`): moved by realloc, as
            // plain and as unchecked as it was made.
            return false;
        }
        // A sampled object has neither slab header nor red zones: it stays
        // only if it still ends at its guard page, else it moves (and its
        // free finds it in the table).
        if self.guarded_live()
            && self.may_be_sample(ptr, old, align)
            && let Some(room) = self.guarded_room(ptr.as_ptr())
        {
            if old.checked_next_multiple_of(align) != Some(room) {
                report_abort(format_args!(
                    "kmemcg: resize of {:p} ({old} bytes, align {align}), a sampled object of another size",
                    ptr.as_ptr()
                ));
            }
            // In place only at exactly its room: a sample's free tells it
            // by `ptr + size` alone (see `Kmem::free_unsampled`), so its
            // size stays the distance to its guard page; any other size
            // moves it.
            return new == room;
        }
        if !self.checks_objects() {
            return match (class_of(old, align), class_of(new, align)) {
                (Some(a), Some(b)) => a == b,
                // SAFETY: forwarded: a live large object.
                (None, None) => unsafe { self.resize_large_in_place(ptr, new) },
                _ => false,
            };
        }
        let (Some(po), Some(pn)) = (padded(old, align), padded(new, align)) else { return false };
        let (Some(a), Some(b)) = (class_of(po, align), class_of(pn, align)) else { return false };
        if a != b {
            return false;
        }
        let slot = GEOMETRIES[a].size;
        let f = front(align);
        let s = ptr.as_ptr().wrapping_sub(f);
        // SAFETY: a live object of class `a` (per the contract), whose slot
        // starts `f` before it, in a slab of its base cache or of a child
        // of it.
        unsafe {
            let birth = birth_in(Some(Self::owner(&self.tree.classes()[a], ptr)), s);
            self.check_live(s, old, align, slot, birth, || class_name(a));
            word_store_shared(words(s).1, new);
            if new < old && self.detect.get().redzone {
                core::ptr::write_bytes(s.add(f + new), RED, old - new);
            }
        }
        true
    }
}
