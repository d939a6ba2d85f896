//! The free paths (plain, grouped, with detection on), finding an
//! object's cache, and resizing.

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::{Kmem, SPECIAL, hardened_abort, hardened_on_free};
use crate::cgroup::mode;
use crate::magazine::{ChargedPush, DRAINS, Hold, MagCache};
use crate::page::pages_for;
use crate::platform::{Ownership, PAGE_SIZE, PageSource, Platform};
use crate::slab::classes::{GEOMETRIES, SizeClass, class_of, class_of_large, lut_class};
use crate::sync::{word_load, word_store};

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Frees what `alloc_raw(size, align)` returned.
    ///
    /// # Safety
    ///
    /// `ptr` must have come from `alloc_raw`/`alloc_in` (or `realloc_raw`)
    /// of this `Kmem` with this `size` and `align`, and not been freed since.
    #[inline(always)]
    pub(crate) unsafe fn free_raw(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        // The allocator writes to the object's slab header or page-run
        // header: through its own provenance, not the caller's (a no-op
        // outside Miri).
        let ptr = self.source.rebase(ptr);
        // The class first, so the moded branch of a size-class free knows
        // it has one. The sizes and alignments one table lookup serves
        // inline; the rest (larger ones, and a zero size, for which
        // nothing was allocated) out of line whole, a tail call.
        match lut_class(size, align) {
            // SAFETY: forwarded.
            Some(c) => unsafe { self.free_class(c, ptr, size, align) },
            // SAFETY: forwarded.
            None => unsafe { Self::free_other(ptr, size, align, self) },
        }
    }

    /// [`Kmem::free_raw`] out of line: the old block's free when a resize
    /// moves it. Inlined into a resize, the whole free path (each mode's
    /// copy of it) would make that function too large for LLVM to inline
    /// what the free path itself inlines (the thread-local slot reads
    /// became calls); out of line it is one function as lean as
    /// `dealloc`, for a call beside the copy.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`].
    #[inline(never)]
    pub(crate) unsafe fn free_moved(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        // SAFETY: forwarded.
        unsafe { self.free_raw(ptr, size, align) }
    }

    /// [`Kmem::free_raw`] of an object of size class `c`.
    ///
    /// As for an allocation ([`Kmem::alloc_current`]): the class's cache,
    /// then the slot's handshake, whose one load of the word tells the
    /// mode and the drains: clear, the plain push; `GROUPS` alone, the
    /// grouped free under the same hold; anything else, the hold ends and
    /// [`Kmem::free_class_moded`] takes the free.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`] (a rebased pointer), `c` being
    /// `class_of(size, align)`.
    #[inline(always)]
    unsafe fn free_class(&self, c: SizeClass, ptr: NonNull<u8>, size: usize, align: usize) {
        // As in `alloc_current`: where slots are locks, the mode word first.
        if !self.holds_read_mode() {
            // SAFETY: forwarded.
            return unsafe { self.free_class_moded(c, ptr, size, align) };
        }
        let base = self.cache_of(c);
        let slot = match self.slots.try_hold_checked(&self.platform, usize::MAX) {
            Hold::Clear(slot) => slot,
            // SAFETY: forwarded.
            Hold::Flagged(slot, w) => return unsafe { self.free_flagged(slot, w, c, base, ptr, size, align) },
            // SAFETY: forwarded.
            Hold::None => return unsafe { Self::free_class_out(ptr, size, align, c, self) },
        };
        // SAFETY: with no groups, every object of class `c` is in the base
        // cache; we hold `slot`, with no drain in progress.
        unsafe { self.free_base_held(slot, base, ptr) }
    }

    /// Frees `ptr` into `base` under the hold of `slot`, which ends here:
    /// a push onto the loaded magazine, else the cache's slow path; a
    /// pointer `base` does not own (debug and `hardened` builds check)
    /// is counted, or aborts when hardened, and left alone.
    ///
    /// # Safety
    ///
    /// `ptr` is an object of `base`, a class's base cache (or, in checked
    /// builds, a pointer they reject); the caller holds `slot`, with no
    /// drain in progress.
    #[inline(always)]
    unsafe fn free_base_held(&self, slot: usize, base: &MagCache<R>, ptr: NonNull<u8>) {
        let Some(base) = self.checked_base(base, ptr) else {
            return self.slots.unhold(&self.platform, slot);
        };
        hardened_on_free(base, ptr);
        // SAFETY: forwarded.
        unsafe {
            if !base.push_held(self, slot, ptr) {
                base.free_slow(self, ptr)
            }
        }
    }

    /// [`Kmem::free_class`] once its handshake read word `w` with a bit
    /// set, holding `slot`: with `GROUPS` the only one, the free into
    /// whichever cache owns the object, under this hold (and with `DEBUG`
    /// alone, see below); else the hold ends and
    /// [`Kmem::free_class_moded`] takes the free.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_class`]; the caller holds `slot` and `base` is
    /// class `c`'s cache.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn free_flagged(
        &self,
        slot: usize,
        w: usize,
        c: SizeClass,
        base: &MagCache<R>,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) {
        // `GROUPS` alone first: the grouped free, one compare away.
        // Besides it, `DEBUG` alone (sampling, while a sampled object
        // lives) is served here too, for a block that does not end at a
        // page boundary, as a sample's does (`free_unsampled`; the summary
        // of the samples' guard pages is read off the hold, as it may
        // take a lock).
        if w != mode::GROUPS {
            let others = w & !mode::GROUPS;
            if others != mode::DEBUG || ptr.as_ptr().addr().wrapping_add(size).is_multiple_of(PAGE_SIZE) {
                self.slots.unhold(&self.platform, slot);
                // SAFETY: forwarded.
                return unsafe { Self::free_class_out(ptr, size, align, c, self) };
            }
            if w & mode::GROUPS == 0 {
                // `DEBUG` alone: no groups, so the object is the base
                // cache's.
                // SAFETY: as in `free_class`'s plain push.
                return unsafe { self.free_base_held(slot, base, ptr) };
            }
        }
        let Some(base) = self.checked_base(base, ptr) else {
            return self.slots.unhold(&self.platform, slot);
        };
        if !self.at_home() {
            self.slots.unhold(&self.platform, slot);
            return super::moved_here();
        }
        // SAFETY: a live object of class `c`, in a slab of `base` or of its
        // charged cache.
        let owner = unsafe { Self::owner(base, ptr) };
        hardened_on_free(owner, ptr);
        // SAFETY: forwarded; we hold `slot`, with no drain in progress
        // (`w`).
        unsafe {
            if owner.cache.geometry().has_owners() {
                self.free_charged_in(owner, base, ptr, slot)
            } else if !owner.push_held(self, slot, ptr) {
                self.free_into_slow(owner, ptr)
            }
        }
    }

    /// [`Kmem::free_class_moded`] out of line, with the block's pointer,
    /// size and alignment first, in the registers a `GlobalAlloc::dealloc`
    /// call brought them in (the class after them: first, it made
    /// `dealloc`'s fast path copy the size to a spare register, one
    /// instruction on every free).
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_class`].
    #[inline(never)]
    unsafe fn free_class_out(ptr: NonNull<u8>, size: usize, align: usize, c: SizeClass, this: &Self) {
        // SAFETY: forwarded.
        unsafe { this.free_class_moded(c, ptr, size, align) }
    }

    /// [`Kmem::free_class`] that reads the mode word first.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_class`].
    #[inline(always)]
    unsafe fn free_class_moded(&self, c: SizeClass, ptr: NonNull<u8>, size: usize, align: usize) {
        let m = self.slots.mode();
        if m != 0 {
            // SAFETY: forwarded.
            return unsafe { self.free_moded(m, Some(c), ptr, size, align) };
        }
        let Some(base) = self.checked_base(self.cache_of(c), ptr) else { return };
        hardened_on_free(base, ptr);
        // SAFETY: with no groups, every object of class `c` is in the base
        // cache.
        unsafe { base.free(self, ptr) }
    }

    /// [`Kmem::free_raw`] past its table: larger sizes, larger
    /// alignments, zero sizes. The block's pointer, size and alignment
    /// first, in the registers a `GlobalAlloc::dealloc` call brought them
    /// in, so the tail call to it moves nothing on the fast path.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`] (a rebased pointer).
    #[inline(never)]
    unsafe fn free_other(ptr: NonNull<u8>, size: usize, align: usize, this: &Self) {
        match class_of_large(size, align) {
            // SAFETY: forwarded; `class_of_large` returns indices below
            // NCLASSES.
            Some(c) => unsafe { this.free_class(SizeClass::from_index(c), ptr, size, align) },
            None if size == 0 => {}
            None => {
                let m = this.slots.mode();
                if m != 0 {
                    // SAFETY: forwarded.
                    return unsafe { this.free_moded(m, None, ptr, size, align) };
                }
                // SAFETY: forwarded: a live large object of this `Kmem`.
                unsafe { this.free_large(ptr) }
            }
        }
    }

    /// [`Kmem::free_raw`] once groups exist or detection is on (mode `m`):
    /// inlined into it, but only the owner lookup and free go out of line
    /// (`free_owned`, two arguments), so the plain path stays a leaf.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`] (a rebased, non-null pointer, `size > 0`).
    #[inline(always)]
    pub(super) unsafe fn free_moded(
        &self,
        m: usize,
        class: Option<SizeClass>,
        ptr: NonNull<u8>,
        size: usize,
        align: usize,
    ) {
        if m & (mode::DEBUG | mode::ENV | mode::BYTES) != 0 {
            let class = class.map(SizeClass::index);
            // SAFETY: forwarded.
            if unsafe { self.free_unsampled(m, class, ptr, size) } {
                return;
            }
            // SAFETY: forwarded.
            return unsafe { self.free_special(ptr, size, align, class) };
        }
        if self.platform.rseq_fast().is_some() {
            // As in `alloc_current`: `Rseq`'s sections take registers.
            // SAFETY: forwarded.
            return unsafe { self.free_grouped_out(class, ptr) };
        }
        // SAFETY: forwarded.
        unsafe { self.free_grouped(class, ptr) }
    }

    /// [`Kmem::free_grouped`] out of line (see [`Kmem::free_moded`]).
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`].
    #[inline(never)]
    unsafe fn free_grouped_out(&self, class: Option<SizeClass>, ptr: NonNull<u8>) {
        // SAFETY: forwarded.
        unsafe { self.free_grouped(class, ptr) }
    }

    /// A free once groups exist (no detection); `class` is `class_of` of
    /// its layout: into whichever cache (base or a group's child) owns the
    /// object's slab.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`].
    #[inline(always)]
    pub(super) unsafe fn free_grouped(&self, class: Option<SizeClass>, ptr: NonNull<u8>) {
        match class {
            Some(c) => {
                let Some(base) = self.checked_base(self.cache_of(c), ptr) else { return };
                // SAFETY: forwarded.
                unsafe { self.free_owned(base, ptr) }
            }
            // SAFETY: forwarded: a live large object of this `Kmem`.
            None => unsafe { self.free_large(ptr) },
        }
    }

    /// Frees an object of `base`'s class once groups exist: into whichever
    /// cache (base or its charged cache) owns its slab. Inline: every miss
    /// below it is a tail call with its arguments in registers, so the
    /// free path around it stays a leaf.
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of `base`'s class, in a slab of `base` or of
    /// its charged cache.
    #[inline(always)]
    pub(super) unsafe fn free_owned(&self, base: &MagCache<R>, ptr: NonNull<u8>) {
        if !self.at_home() {
            return super::moved_here();
        }
        // SAFETY: forwarded.
        unsafe { self.free_into_as::<true>(Self::owner(base, ptr), ptr) }
    }

    /// [`Kmem::free_plain`] out of line: a root object's free once groups
    /// exist, a tail call from [`Kmem::free_owned`] (inlined, its platform
    /// calls would make every free there save registers).
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_plain`].
    #[inline(never)]
    unsafe fn free_plain_out(&self, owner: &MagCache<R>, ptr: NonNull<u8>) {
        // SAFETY: forwarded.
        unsafe { self.free_plain(owner, ptr) }
    }

    /// A free with detection on, or the environment still to read (a free
    /// before any allocation: then as without detection).
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`].
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn free_special(&self, ptr: NonNull<u8>, size: usize, align: usize, class: Option<usize>) {
        self.settle();
        let m = self.resolve_mode();
        // SAFETY: forwarded.
        unsafe {
            if m & mode::DEBUG != 0 || self.sampling() {
                return self.free_checked(ptr, size, align);
            }
            if m & mode::BYTES != 0
                && let Some(c) = self.charged_counter(ptr, size, align)
            {
                c.sub_bytes(self.usable_size(size, align));
            }
            // `class` is `class_of`'s, below NCLASSES.
            self.free_grouped(class.map(|c| SizeClass::from_index(c)), ptr)
        }
    }

    /// The base cache of class `c` (from `class_of`) for a free of `ptr`;
    /// `None` (counted, and an abort when hardened) if debug builds or
    /// `hardened` find that no cache of the class owns `ptr`.
    #[inline(always)]
    pub(super) fn base_for_free(&self, c: usize, ptr: NonNull<u8>) -> Option<&MagCache<R>> {
        // SAFETY: `class_of` returns indices below NCLASSES.
        self.checked_base(unsafe { self.tree.classes().get_unchecked(c) }, ptr)
    }

    /// [`Kmem::base_for_free`] of a class whose base cache is `base`.
    #[inline(always)]
    fn checked_base<'a>(&self, base: &'a MagCache<R>, ptr: NonNull<u8>) -> Option<&'a MagCache<R>> {
        if (cfg!(debug_assertions) || cfg!(feature = "hardened")) && !self.is_object_of(base, ptr) {
            self.bad_free();
            return None;
        }
        Some(base)
    }

    /// Counts and (hardened) reports a free of a pointer no cache owns.
    #[cold]
    pub(crate) fn bad_free(&self) {
        self.bad_frees.add(1);
        hardened_abort("kmemcg: free of a pointer that no cache owns");
    }

    /// The cache that owns the slab of `ptr`: `base` or one of its child
    /// caches.
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of `base` or of its charged cache.
    #[inline(always)]
    pub(crate) unsafe fn owner(base: &MagCache<R>, ptr: NonNull<u8>) -> &MagCache<R> {
        // SAFETY: per the contract, a slab of `base`'s geometry whose
        // header names its `MagCache`, which outlives its live objects.
        unsafe { &*(base.cache.owner_of(ptr.as_ptr()) as *const MagCache<R>) }
    }

    /// Frees `ptr` into `owner`, the cache its slab names: a charged
    /// cache's object is first uncharged from the group its owner word
    /// names; then a magazine push inline, everything else out of line.
    /// (Charged caches go with the tree, with their typed cache, whose
    /// handle every free of it borrows, or at a shrink with no group left,
    /// which waits for a slot's holder and for the read guard the slow
    /// path takes for them, `Tree::free_uncharged`.)
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of `owner`, freed once.
    #[inline(always)]
    pub(crate) unsafe fn free_into(&self, owner: &MagCache<R>, ptr: NonNull<u8>) {
        // SAFETY: forwarded.
        unsafe { self.free_into_as::<false>(owner, ptr) }
    }

    /// A typed cache's free of `ptr`, an object of `owner` (its cache or a
    /// charged cache of it): as `free_into` after one load of the word in
    /// the slot's handshake (see [`Kmem::alloc_current`]), which also
    /// tells whether a special path is on (then the hold ends, and
    /// `typed_special` frees it: with detection on, `free_typed_checked`).
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_into`]; `typed_special` frees `ptr` by the
    /// typed cache's checked path (it is called with no hold).
    #[inline(always)]
    pub(crate) unsafe fn free_typed(&self, owner: &MagCache<R>, ptr: NonNull<u8>, typed_special: impl FnOnce()) {
        let held = if !self.holds_read_mode() {
            Hold::None
        } else {
            self.slots.try_hold_checked(&self.platform, DRAINS | SPECIAL)
        };
        match held {
            Hold::Clear(slot) => {
                hardened_on_free(owner, ptr);
                // SAFETY: forwarded; we hold `slot`, with no drain in
                // progress.
                unsafe {
                    if owner.cache.geometry().has_owners() {
                        self.free_charged_in(owner, owner, ptr, slot)
                    } else if !owner.push_held(self, slot, ptr) {
                        self.free_into_slow(owner, ptr)
                    }
                }
            }
            Hold::Flagged(slot, _) => {
                self.slots.unhold(&self.platform, slot);
                typed_special()
            }
            Hold::None => {
                if self.special() {
                    return typed_special();
                }
                // SAFETY: forwarded.
                unsafe { self.free_into(owner, ptr) }
            }
        }
    }

    /// [`Kmem::free_into`], with the plain free out of line if
    /// `PLAIN_OUT` (see [`Kmem::free_plain_out`]).
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_into`].
    #[inline(always)]
    unsafe fn free_into_as<const PLAIN_OUT: bool>(&self, owner: &MagCache<R>, ptr: NonNull<u8>) {
        hardened_on_free(owner, ptr);
        // SAFETY: forwarded.
        unsafe {
            if owner.cache.geometry().has_owners() {
                self.free_charged(owner, ptr)
            } else if PLAIN_OUT {
                self.free_plain_out(owner, ptr)
            } else {
                self.free_plain(owner, ptr)
            }
        }
    }

    /// [`Kmem::free_into`] of an object of a cache without owner words: a
    /// magazine push inline, everything else out of line.
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of `owner`, freed once.
    #[inline(always)]
    unsafe fn free_plain(&self, owner: &MagCache<R>, ptr: NonNull<u8>) {
        // SAFETY: forwarded.
        if !unsafe { owner.free_fast(self, ptr) } {
            // SAFETY: forwarded.
            unsafe { self.free_into_slow(owner, ptr) }
        }
    }

    /// [`Kmem::free_charged`] under the caller's hold of `slot`, which it
    /// ends.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_charged`]; the caller holds `slot`, with no
    /// drain in progress; `found_by` is a cache whose slabs have `owner`'s
    /// order, through which the caller found `ptr`'s header (see
    /// [`Cache::owner_word_found_by`](crate::slab::Cache::owner_word_found_by)).
    #[inline(always)]
    unsafe fn free_charged_in(&self, owner: &MagCache<R>, found_by: &MagCache<R>, ptr: NonNull<u8>, slot: usize) {
        let n = owner.cache.geometry().size;
        // SAFETY: forwarded.
        let key = unsafe { Self::take_owner(owner, found_by, ptr) };
        // A null `key` (an object not charged: a double free the slab will
        // refuse) is no stock's owner (`magazine::NO_OWNER`): the stock
        // refuses it, and `free_charged_held` takes it from there.
        // SAFETY: forwarded; the closure runs under the hold of `slot`.
        let r = unsafe { owner.free_charged_held(self, slot, ptr, |slot| self.tree.stock_add_at(slot, key, n)) };
        // SAFETY: forwarded.
        unsafe { self.charged_pushed(r, owner, ptr, key) }
    }

    /// Reads and clears the owner word of `ptr`, a live object of
    /// `owner` (a charged cache): the group it is charged to, or null.
    /// Its slab is found through `found_by`'s geometry.
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of `owner`, whose slabs have owner words;
    /// `found_by`'s slabs have their order.
    #[inline(always)]
    unsafe fn take_owner(owner: &MagCache<R>, found_by: &MagCache<R>, ptr: NonNull<u8>) -> *mut () {
        // SAFETY: a live object of `owner`, whose slabs have owner words,
        // written only through `word_store`, found through a cache of the
        // same slab order (caller).
        unsafe {
            let w = owner.cache.owner_word_found_by(&found_by.cache, ptr.as_ptr());
            let key = word_load(w);
            word_store(w, core::ptr::null_mut());
            key
        }
    }

    /// What [`Kmem::free_charged`] does with its push's outcome `r`, the
    /// object's owner word having named `key`: everything but a push goes
    /// out of line.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_charged`]; on [`ChargedPush::Refused`] the
    /// caller holds its slot.
    #[inline(always)]
    unsafe fn charged_pushed(&self, r: ChargedPush, owner: &MagCache<R>, ptr: NonNull<u8>, key: *mut ()) {
        match r {
            ChargedPush::Pushed => {}
            // SAFETY: forwarded (uncharged).
            ChargedPush::Uncharged => unsafe { self.free_into_slow(owner, ptr) },
            // SAFETY: forwarded; the caller holds `slot`.
            ChargedPush::Refused(slot) => unsafe { self.free_charged_held(owner, ptr, key, slot) },
            // SAFETY: forwarded.
            ChargedPush::NoSlot => unsafe { self.free_charged_slow(owner, ptr, key) },
        }
    }

    /// [`Kmem::free_into`] of a charged cache's object: uncharged from the
    /// group its owner word names before it goes back (from then on
    /// another thread may hand it out), under the same hold of the slot
    /// as the push when the slot's stock takes it.
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of `owner`, a charged cache, freed once.
    #[inline(always)]
    unsafe fn free_charged(&self, owner: &MagCache<R>, ptr: NonNull<u8>) {
        let n = owner.cache.geometry().size;
        // SAFETY: forwarded.
        let key = unsafe { Self::take_owner(owner, owner, ptr) };
        if key.is_null() {
            // Not charged (a double free the slab will refuse).
            // SAFETY: forwarded.
            return unsafe { self.free_into_slow(owner, ptr) };
        }
        // SAFETY: forwarded; the closure runs under the hold of `slot`.
        let r = unsafe { owner.free_fast_charged(self, ptr, |slot| self.tree.stock_add_at(slot, key, n)) };
        // SAFETY: forwarded.
        unsafe { self.charged_pushed(r, owner, ptr, key) }
    }

    /// [`Kmem::free_charged`] when the slot's stock did not take the
    /// object's bytes (it holds another group's, or would pass a page, or
    /// the group was removed): [`Tree::give_slow_at`] and the push, still
    /// under the hold of `slot`, so frees of a removed group's objects
    /// stay on the magazines. Out of line with its arguments in
    /// registers, so the hit path around it saves none. A null `key` (the
    /// object was not charged: a double free) ends the hold and goes to
    /// the slab, which refuses it.
    ///
    /// # Safety
    ///
    /// `ptr` is an object of `owner`, a charged cache, whose owner word
    /// held `key` (now cleared): if `key` is not null, a live one freed
    /// once. The caller holds `slot` and hands the hold over.
    ///
    /// [`Tree::give_slow_at`]: crate::cgroup::Tree
    #[cold]
    #[inline(never)]
    unsafe fn free_charged_held(&self, owner: &MagCache<R>, ptr: NonNull<u8>, key: *mut (), slot: usize) {
        if key.is_null() {
            self.slots.unhold(&self.platform, slot);
            // SAFETY: forwarded (not charged).
            return unsafe { self.free_into_slow(owner, ptr) };
        }
        // SAFETY: forwarded: we hold `slot`.
        let pushed = unsafe {
            self.tree.give_slow_at(slot, key, owner.cache.geometry().size);
            owner.push_held(self, slot, ptr)
        };
        if !pushed {
            // SAFETY: forwarded (uncharged).
            unsafe { self.free_into_slow(owner, ptr) }
        }
    }

    /// [`Kmem::free_charged`] with no slot held: uncharged through
    /// [`Tree::uncharge_object`](crate::cgroup::Tree), then freed.
    ///
    /// # Safety
    ///
    /// `ptr` is a live object of `owner`, a charged cache, freed once,
    /// whose owner word held `key` (now cleared).
    #[cold]
    #[inline(never)]
    unsafe fn free_charged_slow(&self, owner: &MagCache<R>, ptr: NonNull<u8>, key: *mut ()) {
        self.tree.uncharge_object(self, key, owner.cache.geometry().size);
        // SAFETY: forwarded (uncharged).
        unsafe { self.free_into_slow(owner, ptr) }
    }

    /// The slow path of [`Kmem::free_into`].
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_into`].
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn free_into_slow(&self, owner: &MagCache<R>, ptr: NonNull<u8>) {
        self.settle();
        // SAFETY: forwarded.
        unsafe {
            if owner.cache.geometry().has_owners() {
                // An object already uncharged keeps neither its group nor
                // the charged cache: freed under a read guard.
                self.tree.free_uncharged(self, owner, ptr);
            } else {
                owner.free_slow(self, ptr);
            }
        }
        self.decay_tick();
    }

    /// Whether `ptr` is a live-looking object of the class `base` serves,
    /// in a slab of `base` or of its charged cache. Reads the slab
    /// header only after the page source vouches for the address, and
    /// only once. (Debug builds run it on every free, in a user's crate at
    /// its opt-level: kept to two lookups and one header read.)
    pub(super) fn is_object_of(&self, base: &MagCache<R>, ptr: NonNull<u8>) -> bool {
        self.settle();
        // The header is read at the start of the run a slab of this class
        // would occupy: the source must own that page too (a stray pointer
        // into a one-page run of its own must not make us read below it),
        // unless it is the page of `ptr`.
        let p = ptr.as_ptr();
        let header = crate::page::slab_base(p, base.cache.geometry().order);
        if self.source.ownership(p.addr()) != Ownership::Owned
            || (p.addr() - header.addr() >= PAGE_SIZE && self.source.ownership(header.addr()) != Ownership::Owned)
        {
            return false;
        }
        // SAFETY: the source owns the page where the slab header would be,
        // so it is readable.
        let Some(cache) = (unsafe { base.cache.live_owner(p) }) else { return false };
        // SAFETY: a live slab's header names its `MagCache`, which outlives
        // its slabs (see `Kmem::owner`).
        let owner = unsafe { &*(cache as *const MagCache<R>) };
        (core::ptr::eq(owner, base) || owner.cache.geometry().same_slots(base.cache.geometry()))
            && owner.cache.is_slot(ptr, cache)
    }

    /// Resizes in place when the new size keeps the class (or the page
    /// count, or shrinks a page run), else moves. `None` leaves the old
    /// block intact.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`] with `old_size`.
    pub(crate) unsafe fn realloc_raw(
        &self,
        ptr: NonNull<u8>,
        old_size: usize,
        align: usize,
        new_size: usize,
    ) -> Option<NonNull<u8>> {
        if new_size == 0 || old_size == 0 {
            return None;
        }
        // SAFETY: forwarded.
        if unsafe { self.resize_in_place(ptr, old_size, align, new_size) } {
            return Some(ptr);
        }
        // The new block is charged to the current group, like any
        // allocation; the old one is uncharged from its owner.
        let new = if new_size > old_size && self.grows_onto_pages(new_size, align) {
            // The group `alloc_raw` would charge: `current` is null without
            // groups and in interrupt context.
            self.alloc_large(self.current(), new_size, align, true)
        } else {
            self.alloc_raw(new_size, align)
        }?;
        // SAFETY: both blocks are live, distinct, and at least this long.
        unsafe {
            core::ptr::copy_nonoverlapping(ptr.as_ptr(), new.as_ptr(), old_size.min(new_size));
            self.free_moved(ptr, old_size, align);
        }
        Some(new)
    }

    /// Whether a block that must move to grow to `size` goes to the page
    /// path, where the move places it with room to grow in place (see
    /// `large`): not with detection or fault injection on (or the
    /// environment still to read), which take their usual paths.
    #[inline]
    pub(crate) fn grows_onto_pages(&self, size: usize, align: usize) -> bool {
        self.slots.mode() & SPECIAL == 0 && align.is_power_of_two() && class_of(size, align).is_none()
    }

    /// Resizes a block of `old_size` to `new_size` (both non-zero) without
    /// moving it, if the class stays, or the page run can give back its
    /// tail or take the pages after it; returns whether it did.
    ///
    /// # Safety
    ///
    /// As for [`Kmem::free_raw`] with `old_size`.
    pub(crate) unsafe fn resize_in_place(
        &self,
        ptr: NonNull<u8>,
        old_size: usize,
        align: usize,
        new_size: usize,
    ) -> bool {
        let ptr = self.source.rebase(ptr);
        let m = self.slots.mode();
        // Sampling alone with a sample live (`DEBUG`, maybe with
        // `GROUPS`, nothing else): a block that cannot be a sample resizes
        // as plain, as its free frees it as plain.
        if m & mode::DEBUG != 0 && (m & !(mode::DEBUG | mode::GROUPS) != 0 || self.may_be_sample(ptr, old_size, align))
        {
            self.settle();
            // SAFETY: forwarded.
            return unsafe { self.resize_checked(ptr, old_size, align, new_size) };
        }
        match (class_of(old_size, align), class_of(new_size, align)) {
            (Some(a), Some(b)) => a == b,
            // Byte tracking counts a large object's pages at allocation
            // and free: it moves instead.
            (None, None) if self.slots.mode() & mode::BYTES != 0 => false,
            (None, None) => {
                self.settle();
                // SAFETY: forwarded: a live large object.
                unsafe { self.resize_large_in_place(ptr, new_size) }
            }
            _ => false,
        }
    }

    /// The bytes actually usable in a block of `size` and `align`: its class
    /// size, or its whole pages (`size` itself with detection on: the rest
    /// is red zone).
    pub(crate) fn usable_size(&self, size: usize, align: usize) -> usize {
        if self.slots.mode() & mode::DEBUG != 0 {
            return size;
        }
        match class_of(size, align) {
            Some(c) => GEOMETRIES[c].size,
            None => pages_for(size).map_or(size, |p| p * PAGE_SIZE),
        }
    }
}
