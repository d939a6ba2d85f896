//! Typed caches: `kmem_cache_create` for Rust types.

use core::fmt;
use core::marker::PhantomData;
use core::mem::{align_of, size_of};
use core::ops::{BitOr, Deref, DerefMut};
use core::ptr::NonNull;

use lock_api::RawMutex;

use super::Cgroup;
use crate::cgroup::{CacheDesc, Group, mode};
use crate::error::{Error, Name};
use crate::heap::{Heap, Kmem, KmemOf, hardened_on_alloc, special_in};
use crate::magazine::MagCache;
use crate::platform::{PageSource, Platform};
use crate::slab::CacheStats;

/// Options of a typed cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheFlags(u32);

impl CacheFlags {
    /// No options.
    pub const NONE: CacheFlags = CacheFlags(0);
    /// Align objects to a cache line (64 bytes), so that no two objects share
    /// one (Linux `SLAB_HWCACHE_ALIGN`).
    pub const HWCACHE_ALIGN: CacheFlags = CacheFlags(1);
    /// Charge each object to the allocating group (Linux `SLAB_ACCOUNT`):
    /// groups' objects come from the cache's charged cache, whose slabs
    /// all groups share, and are charged in bytes (see the crate docs,
    /// *Charging*); the root's come from the cache itself.
    pub const ACCOUNT: CacheFlags = CacheFlags(2);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: CacheFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for CacheFlags {
    type Output = CacheFlags;
    fn bitor(self, rhs: CacheFlags) -> CacheFlags {
        CacheFlags(self.0 | rhs.0)
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Creates a named cache of `T` objects (Linux `kmem_cache_create`).
    ///
    /// Names are unique among live caches and appear in [`Kmem::slabinfo`].
    /// Dropping the handle gives the cache's slabs back and frees its
    /// descriptor (and, for an accounted cache, its charged cache), so
    /// create/destroy cycles do not grow memory.
    ///
    /// With [`CacheFlags::ACCOUNT`], allocations charge the calling
    /// context's current group.
    ///
    /// Errors: [`Error::NameEmpty`], [`Error::NameTooLong`],
    /// [`Error::NameInvalid`], [`Error::NameTaken`], [`Error::BadLayout`]
    /// (aligned above a page, or larger than a slab of the allocator's
    /// largest order holds: 1 MiB less its 64-byte header, less with
    /// detection's padding, and with [`CacheFlags::ACCOUNT`] less an
    /// 8-byte owner word per object),
    /// [`Error::OutOfMemory`] for the descriptor. There is no cap on the
    /// accounted caches live at once.
    pub fn create_cache<T>(&self, name: &str, flags: CacheFlags) -> Result<KmemCache<'_, T, Self>, Error> {
        let name = Name::new(name)?;
        let mut align = align_of::<T>();
        if flags.contains(CacheFlags::HWCACHE_ALIGN) {
            align = align.max(64);
        }
        // With detection on, objects carry its header and red zones.
        // (Saturating: a padding that cannot fit is `usize::MAX`, which the
        // geometry refuses.)
        let size =
            size_of::<T>().saturating_add(if self.detecting() { self.typed_padding(size_of::<T>(), align) } else { 0 });
        let account = flags.contains(CacheFlags::ACCOUNT);
        let geo = if account { self.accounted_cache_geometry(size, align) } else { self.cache_geometry(size, align) };
        let desc = self.tree().register_cache(self, name, geo.ok_or(Error::BadLayout)?, account)?;
        Ok(KmemCache { kmem: self, desc: NonNull::from(desc), _type: PhantomData })
    }
}

/// A named cache of `T` objects; created by [`Kmem::create_cache`].
/// Dropping it destroys the cache (its boxes borrow it, so none is left).
pub struct KmemCache<'k, T, K: Heap = Kmem> {
    kmem: &'k KmemOf<K>,
    /// The cache's descriptor, live until this handle's drop frees it: a
    /// pointer, not a reference, since a reference in a handle passed by
    /// value (`drop(cache)`) is a protected argument of that call, which
    /// the drop's freeing of the descriptor would then invalidate (Miri
    /// reports it under both borrow models).
    desc: NonNull<CacheDesc<K::Lock>>,
    _type: PhantomData<fn() -> T>,
}

impl<'k, T, K: Heap> KmemCache<'k, T, K> {
    /// The cache's descriptor.
    #[inline(always)]
    pub(crate) fn desc(&self) -> &CacheDesc<K::Lock> {
        // SAFETY: registered by `create_cache` for this handle and freed
        // only by its drop, so live while `self` is borrowed.
        unsafe { self.desc.as_ref() }
    }

    /// Moves `value` into a new object of this cache, charged (for an
    /// `ACCOUNT` cache) to the current group. Errors:
    /// [`Error::LimitExceeded`] naming the group whose limit held,
    /// [`Error::OutOfMemory`].
    #[inline(always)]
    pub fn alloc(&self, value: T) -> Result<CacheBox<'_, T, K>, Error> {
        let p = self.alloc_object()?.cast::<T>();
        // SAFETY: a fresh object of this cache, laid out for `T`.
        unsafe { p.as_ptr().write(value) };
        Ok(CacheBox { ptr: p, kmem: self.kmem, desc: self.desc(), _owns: PhantomData })
    }

    /// Moves `value` into a new object of this cache charged to `group`
    /// (for an `ACCOUNT` cache; otherwise as [`KmemCache::alloc`]), from
    /// any thread, without entering it: how a cache kept for one tenant
    /// (a dentry LRU, a connection pool) charges it while its owner's own
    /// allocations stay where they are. A removed group charges its
    /// nearest live ancestor. Errors: as for `alloc`, and
    /// [`Error::ForeignGroup`] for a group of another allocator.
    pub fn alloc_in(&self, group: &Cgroup<'k, K>, value: T) -> Result<CacheBox<'_, T, K>, Error> {
        if !core::ptr::eq(group.kmem(), self.kmem) {
            return Err(Error::ForeignGroup);
        }
        let g = self.kmem.tree().effective(group.g());
        let p = self.alloc_object_for(g)?.cast::<T>();
        // SAFETY: a fresh object of this cache, laid out for `T`.
        unsafe { p.as_ptr().write(value) };
        Ok(CacheBox { ptr: p, kmem: self.kmem, desc: self.desc(), _owns: PhantomData })
    }

    /// An object for the current group: a pointer (so the hit path returns
    /// in a register), with the error path out of line.
    #[inline(always)]
    fn alloc_object(&self) -> Result<NonNull<u8>, Error> {
        let k = self.kmem;
        if !k.holds_read_mode() {
            return self.alloc_object_moded();
        }
        // The hold first and one load of the mode word after it.
        k.alloc_cache_current(&self.desc().cache, self.desc().accounted, || self.alloc_object_moded_out())
    }

    /// [`KmemCache::alloc_object_moded`] out of line.
    #[inline(never)]
    fn alloc_object_moded_out(&self) -> Result<NonNull<u8>, Error> {
        self.alloc_object_moded()
    }

    /// [`KmemCache::alloc_object`] reading the mode word first.
    #[inline(always)]
    fn alloc_object_moded(&self) -> Result<NonNull<u8>, Error> {
        // `alloc_object_for(current())`, with one load of the mode word
        // for its tests.
        let m = self.kmem.alloc_mode();
        if special_in(m) {
            return self.alloc_object_special(self.kmem.current_in(m));
        }
        if m & mode::GROUPS == 0 {
            // The root's plain path, as `alloc_object_plain(null)`.
            let base = &self.desc().cache;
            let p = self.kmem.alloc_from(base)?;
            hardened_on_alloc(base, p);
            return Ok(p);
        }
        self.alloc_object_plain(self.kmem.current_in(m))
    }

    /// An object charged to `g` (null: root).
    #[inline(always)]
    fn alloc_object_for(&self, g: *const Group<K::Lock>) -> Result<NonNull<u8>, Error> {
        if self.kmem.special() {
            return self.alloc_object_special(g);
        }
        self.alloc_object_plain(g)
    }

    /// [`KmemCache::alloc_object_for`] with fault injection or detection
    /// on.
    #[cold]
    #[inline(never)]
    fn alloc_object_special(&self, g: *const Group<K::Lock>) -> Result<NonNull<u8>, Error> {
        let k = self.kmem;
        // SAFETY: callers pass null or a live group of this allocator.
        if let Some(gr) = unsafe { g.as_ref() }
            && k.tree().inject_fails(gr, true)
        {
            return Err(Error::Injected);
        }
        let p = self.alloc_object_plain(g)?;
        if k.detecting() {
            // SAFETY: a fresh slot of this cache (or a child of it), made
            // with detection on (`detecting` never changes once an
            // allocation was made).
            return Ok(unsafe {
                k.hand_out_typed(
                    KmemOf::<K>::owner(&self.desc().cache, p),
                    p,
                    size_of::<T>(),
                    self.desc().cache.cache.geometry().align,
                )
            });
        }
        Ok(p)
    }

    /// An object charged to `g`, with no injection or detection.
    #[inline(always)]
    fn alloc_object_plain(&self, g: *const Group<K::Lock>) -> Result<NonNull<u8>, Error> {
        let k = self.kmem;
        let base = &self.desc().cache;
        // SAFETY: callers pass null or a live group of this allocator.
        let g = if self.desc().accounted { unsafe { g.as_ref() } } else { None };
        let Some(g) = g else {
            let p = k.alloc_from(base)?;
            hardened_on_alloc(base, p);
            return Ok(p);
        };
        // The handle borrows the `Kmem` since `create_cache` checked it.
        let t = k.tree_borrowed();
        let charged = t.charged_in(k, &self.desc().cache.charged, base).ok_or(Error::OutOfMemory)?;
        let n = charged.cache.geometry().size;
        // SAFETY: the closure runs under the hold of `slot`.
        let r = charged.alloc_fast_charged(k, |slot| unsafe { t.stock_take_at(slot, g, n) });
        k.charged_popped_typed(r, g, charged)
    }

    /// The cache's name.
    pub fn name(&self) -> &str {
        self.desc().name.as_str()
    }

    /// The cache's counters: its own slabs plus, for an accounted cache,
    /// the slabs of the charged cache groups' objects of it come from.
    pub fn stats(&self) -> CacheStats {
        let mut sum = CacheStats::default();
        self.for_each_part(|c| {
            let s = c.cache.stats();
            sum.active_objects += s.active_objects;
            sum.total_objects += s.total_objects;
            sum.slabs += s.slabs;
            sum.empty_slabs += s.empty_slabs;
            sum.pages += s.pages;
        });
        sum
    }

    /// Empties the cache's magazines and gives its empty slabs back;
    /// returns the pages freed.
    pub fn shrink(&self) -> usize {
        let t = self.kmem.tree();
        crate::cgroup::Tree::drain_and_shrink(self.kmem, |f| t.for_each_cache_part(self.desc(), |c| f(c)))
    }

    /// Calls `f` on the cache itself and on its charged cache, if it has
    /// one.
    fn for_each_part(&self, f: impl FnMut(&MagCache<K::Lock>)) {
        self.kmem.tree().for_each_cache_part(self.desc(), f);
    }
}

impl<T, K: Heap> Drop for KmemCache<'_, T, K> {
    fn drop(&mut self) {
        // SAFETY: the descriptor `create_cache` registered for this
        // handle, which is being dropped.
        unsafe { self.kmem.tree().destroy_cache(self.kmem, self.desc) };
    }
}

impl<T, K: Heap> fmt::Debug for KmemCache<'_, T, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KmemCache").field("name", &self.name()).field("stats", &self.stats()).finish()
    }
}

// SAFETY: the handle holds shared references to a `Kmem` and a descriptor
// whose mutable state sits behind locks and atomics; it holds no `T`.
unsafe impl<T, K: Heap<Lock: Sync>> Send for KmemCache<'_, T, K> {}
// SAFETY: as for Send: every method takes `&self` and synchronises inside.
unsafe impl<T, K: Heap<Lock: Sync>> Sync for KmemCache<'_, T, K> {}

/// An owned `T` in a typed cache; frees its object on drop.
pub struct CacheBox<'c, T, K: Heap = Kmem> {
    ptr: NonNull<T>,
    kmem: &'c KmemOf<K>,
    desc: &'c CacheDesc<K::Lock>,
    _owns: PhantomData<T>,
}

impl<T, K: Heap> Deref for CacheBox<'_, T, K> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the box owns a live, initialised `T`.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T, K: Heap> DerefMut for CacheBox<'_, T, K> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the box owns a live `T` exclusively.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T, K: Heap> Drop for CacheBox<'_, T, K> {
    /// Drops the `T` and frees its object. If `T::drop` panics, the object
    /// is freed all the same while the panic unwinds (as `Box` does): its
    /// group is uncharged and the cache can go.
    #[inline]
    fn drop(&mut self) {
        let ptr = self.ptr;
        // Frees the object after the `T` is dropped, also when that unwinds.
        let _free = FreeOnDrop(self);
        // SAFETY: the box owns a live `T`; nothing uses it after (the
        // guard only frees its memory).
        unsafe { ptr.as_ptr().drop_in_place() };
    }
}

/// Frees a [`CacheBox`]'s object when dropped; its `T` is dropped (or its
/// drop unwound) by then.
struct FreeOnDrop<'a, 'c, T, K: Heap>(&'a CacheBox<'c, T, K>);

impl<T, K: Heap> Drop for FreeOnDrop<'_, '_, T, K> {
    #[inline]
    fn drop(&mut self) {
        let b = self.0;
        // SAFETY: the box's object of `desc.cache` or of a group's child
        // cache of it, whose `T` was dropped (or its drop unwound, which
        // leaves nothing to drop again); nothing uses it after.
        unsafe {
            let ptr = b.kmem.source().rebase(b.ptr.cast());
            let owner = KmemOf::<K>::owner(&b.desc.cache, ptr);
            b.kmem.free_typed(owner, ptr, || {
                if b.kmem.detecting() {
                    b.kmem.free_typed_checked(owner, ptr, size_of::<T>(), b.desc.cache.cache.geometry().align);
                } else {
                    b.kmem.free_into(owner, ptr);
                }
            });
        }
    }
}

impl<T: fmt::Debug, K: Heap> fmt::Debug for CacheBox<'_, T, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

// SAFETY: a box is an owned `T` plus shared references to synchronised
// allocator state; sending it sends the `T`.
unsafe impl<T: Send, K: Heap<Lock: Sync>> Send for CacheBox<'_, T, K> {}
// SAFETY: `&CacheBox` only gives `&T`.
unsafe impl<T: Sync, K: Heap<Lock: Sync>> Sync for CacheBox<'_, T, K> {}
