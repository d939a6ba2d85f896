//! The allocation paths: the plain fast path, the grouped one, the paths
//! with detection or injection on, and the out-of-line slow paths.

use core::ptr::NonNull;

use lock_api::RawMutex;

use super::{FreeOnUnwind, Kmem, NoUnwind, SPECIAL, hardened_on_alloc};
use crate::cgroup::{Group, mode};
use crate::counter::PageCounter;
use crate::error::Error;
use crate::magazine::{Acct, ChargedPop, DRAINS, Hold, MagCache};
use crate::platform::{PageSource, Platform};
use crate::slab::classes::{SizeClass, class_of, class_of_large, lut_class};
use crate::sync::{word_load, word_store};

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// `size` bytes aligned to `align` for the current group, or `None`.
    /// `size == 0`, an alignment that is not a power of two, sizes whose
    /// rounding overflows and a refused charge all give `None`.
    #[inline]
    pub(crate) fn alloc_raw(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        if !align.is_power_of_two() {
            return None;
        }
        self.alloc_current::<false>(size, align)
    }

    /// [`Kmem::alloc_raw`] for a `Layout`, whose alignment is a power of
    /// two: the `Allocator` entry, inlined into it (a callback that
    /// panics unwinds through it).
    #[inline(always)]
    pub(crate) fn alloc_layout(&self, layout: core::alloc::Layout) -> Option<NonNull<u8>> {
        self.alloc_current::<false>(layout.size(), layout.align())
    }

    /// [`Kmem::alloc_layout`] for `GlobalAlloc`, which must not unwind: a
    /// callback that panics on one of its slow paths aborts there
    /// ([`Kmem::no_unwind_special`]).
    #[inline(always)]
    pub(crate) fn alloc_layout_global(&self, layout: core::alloc::Layout) -> Option<NonNull<u8>> {
        self.alloc_current::<true>(layout.size(), layout.align())
    }

    /// The slow paths of an allocation that must not unwind
    /// (`GlobalAlloc`'s), each with a [`NoUnwind`] guard: a callback
    /// (shrinker, event hook, out-of-memory handler) that panics in one
    /// aborts the program there. Out of line and cold, with their
    /// arguments in registers, so the guard's landing pad is not on the
    /// fast path, which then needs no stack frame.
    ///
    /// The request's size and alignment come first, in the registers a
    /// `GlobalAlloc::alloc` call brought them in (as for
    /// [`Kmem::alloc_pow2_other`]): the entry point moves nothing on the
    /// way to the fast path.
    #[cold]
    #[inline(never)]
    pub(super) fn no_unwind_special(size: usize, align: usize, this: &Self) -> Option<NonNull<u8>> {
        let guard = NoUnwind;
        let r = Self::alloc_special_current(size, align, this);
        core::mem::forget(guard);
        r
    }

    /// See [`Kmem::no_unwind_special`].
    #[cold]
    #[inline(never)]
    pub(super) fn no_unwind_slow(&self, cache: &MagCache<R>) -> Option<NonNull<u8>> {
        let guard = NoUnwind;
        let r = self.alloc_slow_opt(cache);
        core::mem::forget(guard);
        r
    }

    /// See [`Kmem::no_unwind_special`].
    #[cold]
    #[inline(never)]
    pub(super) fn no_unwind_large(&self, g: *const Group<R>, size: usize, align: usize) -> Option<NonNull<u8>> {
        let guard = NoUnwind;
        let r = self.alloc_large(g, size, align, false);
        core::mem::forget(guard);
        r
    }

    /// An allocation for the current group. `NOUNWIND`: for `GlobalAlloc`
    /// (see [`Kmem::no_unwind_special`]).
    ///
    /// The class's cache first, then the slot's handshake, whose one load
    /// of the word (`Slots::try_hold_checked`) tells the mode and the
    /// drains together: clear, the plain pop; `GROUPS` alone (besides
    /// `DEBUG`, which an allocation ignores while no sample is due), the
    /// grouped path under the same hold. Everything else (detection,
    /// injection, a drain, no fast slot, sizes past the table, platforms
    /// whose slots are locks) takes [`Kmem::alloc_current_moded`], which
    /// reads the mode word first, as every allocation did before the word
    /// held the drains.
    #[inline(always)]
    pub(super) fn alloc_current<const NOUNWIND: bool>(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        // Where slots are locks (`PerCpu`, `NoCpus`, `Rseq`), the mode word
        // first: their holds make no handshake whose load could tell it
        // (after the lock, the same test cost 2 to 3 instructions more).
        if !self.holds_read_mode() {
            return self.alloc_current_moded::<NOUNWIND>(size, align);
        }
        let Some(c) = lut_class(size, align) else { return Self::alloc_current_out::<NOUNWIND>(size, align, self) };
        let slot = match self.slots.try_hold_checked(&self.platform, !mode::DEBUG) {
            Hold::Clear(slot) => slot,
            Hold::Flagged(slot, w) => return self.alloc_flagged::<NOUNWIND>(slot, w, self.cache_of(c), size, align),
            Hold::None => return Self::alloc_current_out::<NOUNWIND>(size, align, self),
        };
        let base = self.cache_of(c);
        // SAFETY: we hold `slot`, with no drain in progress.
        self.hit_or_slow::<NOUNWIND>(base, unsafe { base.pop_held(self, slot) })
    }

    /// [`Kmem::alloc_current`] once its handshake read word `w` with a
    /// bit besides `DEBUG` set, holding `slot`: with `GROUPS` the only
    /// one, the current group's object under this hold; else the hold
    /// ends and [`Kmem::alloc_current_moded`] takes the request.
    #[inline(always)]
    fn alloc_flagged<const NOUNWIND: bool>(
        &self,
        slot: usize,
        w: usize,
        base: &MagCache<R>,
        size: usize,
        align: usize,
    ) -> Option<NonNull<u8>> {
        if w & (DRAINS | SPECIAL) != 0 {
            self.slots.unhold(&self.platform, slot);
            return Self::alloc_current_out::<NOUNWIND>(size, align, self);
        }
        let g = if self.platform.in_interrupt() {
            // Interrupt context charges the root, not the interrupted task.
            core::ptr::null()
        } else {
            self.tree.charged_for(self.platform.current_group())
        };
        // SAFETY: `charged_for` gives null or a live group of this
        // allocator.
        let Some(g) = (unsafe { g.as_ref() }) else {
            // The root's object, as on the plain path, under this hold.
            // SAFETY: we hold `slot`, with no drain in progress (`w`).
            return self.hit_or_slow::<NOUNWIND>(base, unsafe { base.pop_held(self, slot) });
        };
        match self.tree.charged_of(base) {
            // SAFETY: as above.
            Some(charged) => unsafe { self.alloc_charged_in::<NOUNWIND>(g, charged, slot) },
            None => {
                self.slots.unhold(&self.platform, slot);
                if NOUNWIND { self.no_unwind_new_charged(g, base) } else { self.alloc_in_new_charged(g, base) }
            }
        }
    }

    /// Whether a slot's hold makes a handshake whose load of the mode word
    /// can tell the mode as well (`alloc_current`, `free_class`,
    /// `free_typed`, [`Kmem::alloc_cache_current`]): not
    /// where slots are locks (`PerCpu`, `NoCpus`) or `Rseq`'s.
    #[inline(always)]
    pub(crate) fn holds_read_mode(&self) -> bool {
        self.platform.rseq_fast().is_none() && !self.platform.slots_are_locks()
    }

    /// An object of `base`, a typed cache's (`accounted`: it charges
    /// groups), for the current group, as [`Kmem::alloc_current`] takes a
    /// size class's: the slot's hold first, whose one load of the mode word
    /// tells the mode and the drains together (the typed path had read
    /// the word before the hold as well: `typed` 58 -> 53 instructions a
    /// pair, `typed-group` 103 -> 99). Only where
    /// [`Kmem::holds_read_mode`]. Where the hold tells nothing more
    /// (no fast hold; detection, injection or a drain flagged; the first
    /// grouped object of the cache, its charged cache still to make),
    /// `moded`, the caller's path that reads the word first, with nothing
    /// done.
    #[inline(always)]
    pub(crate) fn alloc_cache_current(
        &self,
        base: &MagCache<R>,
        accounted: bool,
        moded: impl FnOnce() -> Result<NonNull<u8>, Error>,
    ) -> Result<NonNull<u8>, Error> {
        debug_assert!(self.holds_read_mode());
        let slot = match self.slots.try_hold_checked(&self.platform, !mode::DEBUG) {
            Hold::Clear(slot) => slot,
            Hold::Flagged(slot, w) => {
                if w & (DRAINS | SPECIAL) != 0 {
                    self.slots.unhold(&self.platform, slot);
                    return moded();
                }
                let g = if accounted { self.current_in(w) } else { core::ptr::null() };
                // SAFETY: `current_in` gives null or a live group of this
                // allocator.
                if let Some(g) = unsafe { g.as_ref() } {
                    let Some(charged) = self.tree.charged_of(base) else {
                        self.slots.unhold(&self.platform, slot);
                        return moded();
                    };
                    let n = charged.cache.geometry().size;
                    // SAFETY: we hold `slot`, with no drain in progress
                    // (`w`); the closure runs under that hold.
                    let r =
                        unsafe { charged.alloc_charged_held(self, slot, |slot| self.tree.stock_take_at(slot, g, n)) };
                    return self.charged_popped_typed(r, g, charged);
                }
                // The root's object, under this hold.
                slot
            }
            Hold::None => return moded(),
        };
        // SAFETY: we hold `slot`, with no drain in progress.
        let p = match unsafe { base.pop_held(self, slot) } {
            Some(p) => p,
            None => self.alloc_slow_from(base)?,
        };
        hardened_on_alloc(base, p);
        Ok(p)
    }

    /// [`Kmem::alloc_current_moded`] out of line, with the request's size
    /// and alignment first, in the registers a `GlobalAlloc::alloc` call
    /// brought them in.
    #[inline(never)]
    fn alloc_current_out<const NOUNWIND: bool>(size: usize, align: usize, this: &Self) -> Option<NonNull<u8>> {
        this.alloc_current_moded::<NOUNWIND>(size, align)
    }

    /// An allocation for the current group that reads the mode word before
    /// anything else: one test of it takes the plain path (no groups, no
    /// detection, no injection).
    #[inline(always)]
    fn alloc_current_moded<const NOUNWIND: bool>(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        let m = self.slots.mode();
        // `DEBUG` alone: sampling with no sample due, as plain.
        if m & !mode::DEBUG == 0 {
            // A path of its own: merged with the grouped one, the null
            // group would be tested again after the class lookup.
            return self.alloc_pow2::<NOUNWIND>(core::ptr::null(), size, align);
        }
        let g = if m & SPECIAL != 0 {
            if NOUNWIND {
                return Self::no_unwind_special(size, align, self);
            }
            return Self::alloc_special_current(size, align, self);
        } else if self.platform.in_interrupt() {
            // Interrupt context charges the root, not the interrupted task.
            core::ptr::null()
        } else {
            self.tree.charged_for(self.platform.current_group())
        };
        if self.platform.rseq_fast().is_some() {
            // `Rseq`'s sections take registers: inlined, its grouped path
            // would make every allocation save five.
            return self.alloc_pow2_out::<NOUNWIND>(g, size, align);
        }
        self.alloc_pow2::<NOUNWIND>(g, size, align)
    }

    /// [`Kmem::alloc_pow2`] out of line (see [`Kmem::alloc_current`]).
    #[inline(never)]
    fn alloc_pow2_out<const NOUNWIND: bool>(
        &self,
        g: *const Group<R>,
        size: usize,
        align: usize,
    ) -> Option<NonNull<u8>> {
        self.alloc_pow2::<NOUNWIND>(g, size, align)
    }

    /// [`Kmem::alloc_layout`] charging group `g` (null: root).
    #[inline(always)]
    pub(crate) fn alloc_layout_in(&self, g: *const Group<R>, layout: core::alloc::Layout) -> Option<NonNull<u8>> {
        self.alloc_for(g, layout.size(), layout.align())
    }

    /// An allocation charging `g` (a group handle's), detection and fault
    /// injection included.
    #[inline(always)]
    pub(super) fn alloc_for(&self, g: *const Group<R>, size: usize, align: usize) -> Option<NonNull<u8>> {
        if self.slots.mode() & SPECIAL != 0 {
            return self.alloc_special(g, size, align, true);
        }
        self.alloc_pow2::<false>(g, size, align)
    }

    /// [`Kmem::alloc_special`] for the current group, which it looks up
    /// itself: a call made inline would keep the size and alignment in
    /// callee-saved registers, and the plain path would save and restore
    /// them on every allocation.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_special_current(size: usize, align: usize, this: &Self) -> Option<NonNull<u8>> {
        this.alloc_special(this.current(), size, align, false)
    }

    /// The allocation path with detection or fault injection on (or the
    /// environment still to read). `handle`: a group handle's allocation,
    /// which can report failure (injection applies to the others only
    /// when the group asked for it).
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_special(
        &self,
        g: *const Group<R>,
        size: usize,
        align: usize,
        handle: bool,
    ) -> Option<NonNull<u8>> {
        if !self.settle_alloc() {
            return None;
        }
        let m = self.resolve_mode();
        // SAFETY: callers pass null or a live group of this allocator.
        if m & mode::INJECT != 0 && unsafe { g.as_ref() }.is_some_and(|g| self.tree.inject_fails(g, handle)) {
            return None;
        }
        if (m & mode::DEBUG != 0 || self.sampling()) && size != 0 {
            return self.alloc_checked(g, size, align);
        }
        let p = self.alloc_pow2::<false>(g, size, align)?;
        if m & mode::BYTES != 0 {
            // SAFETY: `p` is a live object of `size` and `align` from
            // `alloc_pow2` (no detection).
            if let Some(c) = unsafe { self.charged_counter(p, size, align) } {
                c.add_bytes(self.usable_size(size, align));
            }
        }
        Some(p)
    }

    /// The counter an object is charged to, for byte tracking (detection
    /// off): its cache's group for a size-class object, its header's for a
    /// large one (the root's for both when charged to the root); `None`
    /// for an unaccounted cache's. Read from the object itself at both
    /// allocation and free, so the two always name the same counter.
    ///
    /// # Safety
    ///
    /// `p` is a live object of this `Kmem` allocated with `size` (non-zero)
    /// and `align`, with detection off.
    pub(super) unsafe fn charged_counter(&self, p: NonNull<u8>, size: usize, align: usize) -> Option<&PageCounter> {
        let root = self.tree.root().counter();
        match class_of(size, align) {
            Some(c) => {
                // SAFETY: `class_of` returns indices below NCLASSES.
                let base = unsafe { self.tree.classes().get_unchecked(c) };
                // SAFETY: a live object of `base`'s class (caller).
                let owner = unsafe { Self::owner(base, p) };
                if owner.cache.geometry().has_owners() {
                    // SAFETY: a live object of a charged cache, whose owner
                    // word names its group, which its charge keeps alive.
                    let key = unsafe { word_load(owner.cache.owner_word(p.as_ptr())) };
                    // SAFETY: as above.
                    return Some(if key.is_null() { root } else { unsafe { &*key.cast::<Group<R>>() }.counter() });
                }
                match owner.acct {
                    Acct::Root => Some(root),
                    Acct::None => None,
                }
            }
            // SAFETY: a live large object (caller); its reference keeps its
            // group alive.
            None => Some(unsafe { self.large_group(p) }?.map_or(root, |g| g.counter())),
        }
    }

    /// [`Kmem::alloc_in`] for an `align` known to be a power of two, with
    /// no detection or injection.
    ///
    /// The requests one table lookup serves (sizes up to a page, aligned
    /// to at most 8) inline; the rest out of line whole, a tail call, so
    /// the fast path has no merge point.
    #[inline(always)]
    pub(crate) fn alloc_pow2<const NOUNWIND: bool>(
        &self,
        g: *const Group<R>,
        size: usize,
        align: usize,
    ) -> Option<NonNull<u8>> {
        match lut_class(size, align) {
            Some(c) => self.alloc_class::<NOUNWIND>(g, c),
            None => Self::alloc_pow2_other::<NOUNWIND>(size, align, g, self),
        }
    }

    /// [`Kmem::alloc_pow2`] past its table: larger sizes, larger
    /// alignments, zero sizes. The request's size and alignment first,
    /// in the registers a `GlobalAlloc::alloc` call brought them in, so
    /// the tail call to it moves nothing on the fast path.
    #[inline(never)]
    fn alloc_pow2_other<const NOUNWIND: bool>(
        size: usize,
        align: usize,
        g: *const Group<R>,
        this: &Self,
    ) -> Option<NonNull<u8>> {
        match class_of_large(size, align) {
            // SAFETY: `class_of_large` returns indices below NCLASSES.
            Some(c) => this.alloc_class::<NOUNWIND>(g, unsafe { SizeClass::from_index(c) }),
            None if size == 0 => None,
            None if NOUNWIND => this.no_unwind_large(g, size, align),
            None => this.alloc_large(g, size, align, false),
        }
    }

    /// An object of size class `c` charged to `g` (null: root). Callers
    /// pass null or a live group of this allocator.
    #[inline(always)]
    fn alloc_class<const NOUNWIND: bool>(&self, g: *const Group<R>, c: SizeClass) -> Option<NonNull<u8>> {
        // SAFETY: callers pass null or a live group of this allocator.
        if let Some(g) = unsafe { g.as_ref() } {
            let base = self.cache_of(c);
            return match self.tree.charged_of(base) {
                Some(charged) => self.alloc_charged::<NOUNWIND>(g, charged),
                None if NOUNWIND => self.no_unwind_new_charged(g, base),
                None => self.alloc_in_new_charged(g, base),
            };
        }
        let base = self.cache_of(c);
        self.hit_or_slow::<NOUNWIND>(base, base.alloc_fast(self))
    }

    /// The object a magazine `hit` of the base cache `base` gave, or on a
    /// miss one from its slow path (out of line, without unwinding under
    /// `NOUNWIND`); checked when hardened.
    #[inline(always)]
    fn hit_or_slow<const NOUNWIND: bool>(&self, base: &MagCache<R>, hit: Option<NonNull<u8>>) -> Option<NonNull<u8>> {
        let p = match hit {
            Some(p) => p,
            None if NOUNWIND => self.no_unwind_slow(base)?,
            None => self.alloc_slow_opt(base)?,
        };
        hardened_on_alloc(base, p);
        Some(p)
    }

    /// One object of `charged`, a charged cache, charged to `g`: a stock
    /// hit and a magazine hit inline, everything else out of line.
    #[inline(always)]
    pub(crate) fn alloc_charged<const NOUNWIND: bool>(
        &self,
        g: &Group<R>,
        charged: &MagCache<R>,
    ) -> Option<NonNull<u8>> {
        let n = charged.cache.geometry().size;
        // SAFETY: the closure runs under the hold of `slot`.
        let r = charged.alloc_fast_charged(self, |slot| unsafe { self.tree.stock_take_at(slot, g, n) });
        self.charged_popped::<NOUNWIND>(r, g, charged)
    }

    /// What [`Kmem::alloc_charged`] does with its pop's outcome `r`: a hit
    /// gets its owner word, everything else goes out of line.
    #[inline(always)]
    fn charged_popped<const NOUNWIND: bool>(
        &self,
        r: ChargedPop,
        g: &Group<R>,
        charged: &MagCache<R>,
    ) -> Option<NonNull<u8>> {
        let p = match r {
            ChargedPop::Hit(p) => p,
            ChargedPop::Charged if NOUNWIND => return self.no_unwind_charged(g, charged, true),
            ChargedPop::Charged => return self.charged_refill(g, charged).ok(),
            ChargedPop::Uncharged if NOUNWIND => return self.no_unwind_charged(g, charged, false),
            ChargedPop::Uncharged => return self.alloc_charged_slow(g, charged).ok(),
        };
        // SAFETY: a fresh object of a charged cache.
        unsafe { Self::set_owner(charged, p, g) };
        hardened_on_alloc(charged, p);
        Some(p)
    }

    /// [`Kmem::charged_popped`] for a typed cache, whose allocation
    /// reports why it failed.
    #[inline(always)]
    pub(crate) fn charged_popped_typed(
        &self,
        r: ChargedPop,
        g: &Group<R>,
        charged: &MagCache<R>,
    ) -> Result<NonNull<u8>, Error> {
        match r {
            ChargedPop::Hit(p) => {
                // SAFETY: a fresh object of a charged cache.
                unsafe { Self::set_owner(charged, p, g) };
                hardened_on_alloc(charged, p);
                Ok(p)
            }
            ChargedPop::Charged => self.charged_refill(g, charged),
            ChargedPop::Uncharged => self.alloc_charged_slow(g, charged),
        }
    }

    /// [`Kmem::alloc_charged`] under the caller's hold of `slot`, which it
    /// ends.
    ///
    /// # Safety
    ///
    /// The caller holds `slot`, with no drain in progress.
    #[inline(always)]
    unsafe fn alloc_charged_in<const NOUNWIND: bool>(
        &self,
        g: &Group<R>,
        charged: &MagCache<R>,
        slot: usize,
    ) -> Option<NonNull<u8>> {
        let n = charged.cache.geometry().size;
        // SAFETY: forwarded; the closure runs under the hold of `slot`.
        let r = unsafe { charged.alloc_charged_held(self, slot, |slot| self.tree.stock_take_at(slot, g, n)) };
        self.charged_popped::<NOUNWIND>(r, g, charged)
    }

    /// Records `g` as the owner of `p`.
    ///
    /// # Safety
    ///
    /// `p` is an object of `charged`, a charged cache, just handed out.
    #[inline(always)]
    pub(crate) unsafe fn set_owner(charged: &MagCache<R>, p: NonNull<u8>, g: &Group<R>) {
        // SAFETY: per the contract, an object of a cache with owner words.
        unsafe { word_store(charged.cache.owner_word(p.as_ptr()), g.key()) };
    }

    /// [`Kmem::alloc_charged`] past the stock: charges (reclaiming if a
    /// limit refuses), then allocates.
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_charged_slow(&self, g: &Group<R>, charged: &MagCache<R>) -> Result<NonNull<u8>, Error> {
        if !self.settle_alloc() {
            return Err(Error::OutOfMemory);
        }
        self.tree.charge_object_slow(self, g, charged.cache.geometry().size)?;
        self.charged_refill(g, charged)
    }

    /// An object of `charged` for `g`, whose charge is taken: from the
    /// magazines or a refill; the charge goes back if it fails (or
    /// unwinds).
    #[cold]
    #[inline(never)]
    pub(crate) fn charged_refill(&self, g: &Group<R>, charged: &MagCache<R>) -> Result<NonNull<u8>, Error> {
        let n = charged.cache.geometry().size;
        let undo = Uncharge { kmem: self, key: g.key(), n };
        let r = self.alloc_from(charged);
        core::mem::forget(undo);
        match r {
            Ok(p) => {
                // SAFETY: a fresh object of a charged cache.
                unsafe { Self::set_owner(charged, p, g) };
                hardened_on_alloc(charged, p);
                Ok(p)
            }
            Err(e) => {
                self.tree.uncharge_object(self, g.key(), n);
                Err(e)
            }
        }
    }

    /// See [`Kmem::no_unwind_special`]: [`Kmem::charged_refill`] if the
    /// charge is `taken`, else [`Kmem::alloc_charged_slow`].
    #[cold]
    #[inline(never)]
    fn no_unwind_charged(&self, g: &Group<R>, charged: &MagCache<R>, taken: bool) -> Option<NonNull<u8>> {
        let guard = NoUnwind;
        let r = if taken { self.charged_refill(g, charged) } else { self.alloc_charged_slow(g, charged) };
        core::mem::forget(guard);
        r.ok()
    }

    /// See [`Kmem::no_unwind_special`].
    #[cold]
    #[inline(never)]
    fn no_unwind_new_charged(&self, g: &Group<R>, base: &MagCache<R>) -> Option<NonNull<u8>> {
        let guard = NoUnwind;
        let r = self.alloc_in_new_charged(g, base);
        core::mem::forget(guard);
        r
    }

    /// [`Kmem::alloc_in`] for the first group object of a size class
    /// (`base`, its cache): makes the class's charged cache, then
    /// allocates.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_in_new_charged(&self, g: &Group<R>, base: &MagCache<R>) -> Option<NonNull<u8>> {
        self.settle();
        let charged = self.tree.charged_in(self, &base.charged, base)?;
        self.alloc_charged_slow(g, charged).ok()
    }

    /// One object from `cache`: a magazine hit inline, everything else
    /// (refills, limits, throttling) out of line.
    #[inline(always)]
    pub(crate) fn alloc_from(&self, cache: &MagCache<R>) -> Result<NonNull<u8>, Error> {
        match cache.alloc_fast(self) {
            Some(p) => Ok(p),
            None => self.alloc_slow_from(cache),
        }
    }

    /// The slow path of [`Kmem::alloc_from`]: after a refill, the `high`
    /// and contention checks run here, once per magazine.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_slow_from(&self, cache: &MagCache<R>) -> Result<NonNull<u8>, Error> {
        if !self.settle_alloc() {
            return Err(Error::OutOfMemory);
        }
        let grow = || match cache.alloc_slow(self) {
            Ok(p) => Ok(p),
            Err(e) => self.tree.grow_failed(self, cache, e),
        };
        let r = match grow() {
            // The source is dry even after reclaim: recorded for
            // `last_oom`, then the handler may add memory; one retry.
            Err(Error::OutOfMemory) => {
                let geo = cache.cache.geometry();
                self.record_oom_slab(geo);
                if self.out_of_memory(1 << geo.order) {
                    grow().inspect_err(|e| {
                        if *e == Error::OutOfMemory {
                            self.record_oom_slab(geo)
                        }
                    })
                } else {
                    Err(Error::OutOfMemory)
                }
            }
            r => r,
        };
        if let Ok(p) = r {
            // `high` reclaim and contention may call shrinkers and the
            // event hook: if one unwinds, the object goes back.
            let undo = FreeOnUnwind { kmem: self, cache, p };
            self.tree.after_refill(self, cache);
            core::mem::forget(undo);
        }
        self.decay_tick();
        r
    }

    /// [`Kmem::alloc_slow_from`] for the paths that want no error: an
    /// `Option` comes back in a register, so the fast path around it needs
    /// no stack frame.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_slow_opt(&self, cache: &MagCache<R>) -> Option<NonNull<u8>> {
        self.alloc_slow_from(cache).ok()
    }
}

/// Gives an object charge back if what follows it unwinds.
struct Uncharge<'a, S: PageSource, R: RawMutex, P: Platform> {
    kmem: &'a Kmem<S, R, P>,
    key: *mut (),
    n: usize,
}

impl<S: PageSource, R: RawMutex, P: Platform> Drop for Uncharge<'_, S, R, P> {
    fn drop(&mut self) {
        self.kmem.tree.uncharge_object(self.kmem, self.key, self.n);
    }
}
