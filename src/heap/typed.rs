//! Typed caches: `kmem_cache_create` for Rust types.

use core::fmt;
use core::marker::PhantomData;
use core::mem::{align_of, size_of};
use core::ops::{BitOr, Deref, DerefMut};
use core::ptr::NonNull;

use lock_api::RawMutex;

use super::Kmem;
use super::classes::NCLASSES;
use crate::cgroup::MAX_ACCOUNTED;
use crate::error::{Error, Name};
use crate::magazine::{Acct, MagCache};
use crate::platform::{PageSource, Platform};
use crate::slab::{CacheStats, Geometry, Pages};
use crate::sync::{AtomicBool, AtomicPtr, Ordering, atomic_bool, atomic_null};

/// Options of a typed cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheFlags(u32);

impl CacheFlags {
    /// No options.
    pub const NONE: CacheFlags = CacheFlags(0);
    /// Align objects to a cache line (64 bytes), so that no two objects share
    /// one (Linux `SLAB_HWCACHE_ALIGN`).
    pub const HWCACHE_ALIGN: CacheFlags = CacheFlags(1);
    /// Charge the cache's slabs to the allocating group (Linux
    /// `SLAB_ACCOUNT`): each group that allocates from the cache gets a
    /// child cache of its own, charged to it.
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

/// A typed cache's descriptor, kept in the allocator's own `descriptors`
/// cache (self-hosting) and linked into its registry.
///
/// Everything but the atomics is fixed once the descriptor is published,
/// so lock-free readers of the registry (under a read guard) may read it.
/// When its `KmemCache` is dropped, the descriptor is unlinked and freed
/// once no iteration is in progress, and its accounting index is given
/// back, unless objects of it were leaked (`mem::forget` of a box): then
/// it stays, dead, with its index, since slabs still name it.
pub(crate) struct CacheDesc<R: RawMutex> {
    pub(crate) cache: MagCache<R>,
    pub(crate) name: Name,
    /// Set while a `KmemCache` handle owns the descriptor.
    pub(crate) live: AtomicBool,
    /// Accounting index (groups' `caches` slot), or `NOT_ACCOUNTED`.
    pub(crate) acct_idx: usize,
    /// The next older descriptor; changed under the registry lock
    /// (`Release`), read by iterations (`Acquire`).
    pub(crate) next: AtomicPtr<CacheDesc<R>>,
    /// Link in the tree lock's list of descriptors waiting to be freed.
    pub(crate) retired_next: AtomicPtr<CacheDesc<R>>,
}

/// The accounting indices of typed caches (`NCLASSES..MAX_ACCOUNTED`)
/// that no live cache holds: bit `i` stands for index `NCLASSES + i`.
/// A destroyed accounted cache gives its index back.
pub(crate) struct AcctIndices(u64);

impl AcctIndices {
    pub(super) const ALL: AcctIndices = AcctIndices((1u64 << (MAX_ACCOUNTED - NCLASSES)) - 1);

    /// Takes the lowest free index.
    pub(crate) fn take(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let i = self.0.trailing_zeros() as usize;
        self.0 &= !(1 << i);
        Some(NCLASSES + i)
    }

    /// Gives index `idx` back.
    pub(crate) fn give(&mut self, idx: usize) {
        self.0 |= 1 << (idx - NCLASSES);
    }
}

static_assertions::const_assert!(MAX_ACCOUNTED - NCLASSES <= 64);
static_assertions::const_assert_eq!(MAX_ACCOUNTED - NCLASSES, crate::cgroup::MAX_ACCOUNTED_CACHES);

/// Drain-and-look rounds before a destroyed cache that still holds slabs
/// is taken to have leaked objects.
const DESTROY_TRIES: usize = 64;

/// `CacheDesc::acct_idx` of a cache created without `ACCOUNT`.
pub(crate) const NOT_ACCOUNTED: usize = usize::MAX;

impl<R: RawMutex> CacheDesc<R> {
    /// Slab geometry of the descriptor cache.
    pub(crate) const GEOMETRY: Geometry = match Geometry::new(size_of::<Self>(), align_of::<Self>()) {
        Some(g) => g,
        None => panic!("cache descriptor does not fit a slab"),
    };
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// Creates a named cache of `T` objects (Linux `kmem_cache_create`).
    ///
    /// Names are unique among live caches and appear in [`Kmem::slabinfo`].
    /// Dropping the handle gives the cache's slabs back and frees its
    /// descriptor (and, for an accounted cache, its child cache in every
    /// group, and its accounting index), so create/destroy cycles neither
    /// grow memory nor run out of indices.
    ///
    /// With [`CacheFlags::ACCOUNT`], allocations charge the calling
    /// context's current group.
    ///
    /// Errors: [`Error::NameEmpty`], [`Error::NameTooLong`],
    /// [`Error::NameInvalid`], [`Error::NameTaken`], [`Error::BadLayout`]
    /// (aligned above a page or larger than 1 MiB),
    /// [`Error::TooManyAccountedCaches`] (at most 21 accounted typed caches
    /// live at once; a dropped one gives its index back),
    /// [`Error::OutOfMemory`] for the descriptor.
    pub fn create_cache<T>(&self, name: &str, flags: CacheFlags) -> Result<KmemCache<'_, T, S, R, P>, Error> {
        let name = Name::new(name)?;
        let mut align = align_of::<T>();
        if flags.contains(CacheFlags::HWCACHE_ALIGN) {
            align = align.max(64);
        }
        let geo = Geometry::new(size_of::<T>(), align).ok_or(Error::BadLayout)?;
        let mut indices = self.registry_lock.lock();
        let mut taken = false;
        self.for_each_desc(|d| taken |= d.name == name && d.live.load(Ordering::Relaxed));
        if taken {
            return Err(Error::NameTaken);
        }
        let accounted = flags.contains(CacheFlags::ACCOUNT);
        let acct_idx = if accounted { indices.take().ok_or(Error::TooManyAccountedCaches)? } else { NOT_ACCOUNTED };
        let Ok(mem) = self.descriptors.alloc(&Pages::plain(&self.source), self.node()) else {
            if accounted {
                indices.give(acct_idx);
            }
            return Err(Error::OutOfMemory);
        };
        let p = mem.cast::<CacheDesc<R>>();
        // SAFETY: `mem` is a fresh object of the descriptor cache, sized and
        // aligned for `CacheDesc<R>`.
        unsafe {
            p.as_ptr().write(CacheDesc {
                cache: MagCache::new(geo, if accounted { Acct::Root } else { Acct::None }),
                name,
                live: atomic_bool(true),
                acct_idx,
                next: AtomicPtr::new(self.registry.load(Ordering::Relaxed)),
                retired_next: atomic_null(),
            });
        }
        // Publishes the initialised descriptor to lock-free readers (pairs
        // with their Acquire loads of `registry`).
        self.registry.store(p.as_ptr(), Ordering::Release);
        // SAFETY: just initialised; freed only after the handle is dropped.
        let desc = unsafe { &*p.as_ptr() };
        Ok(KmemCache { kmem: self, desc, _type: PhantomData })
    }

    /// Destroys the cache of `desc`, whose handle is being dropped and
    /// whose objects are all freed (or leaked): see [`CacheDesc`].
    fn destroy_cache(&self, desc: &CacheDesc<R>) {
        let mut indices = self.registry_lock.lock();
        desc.live.store(false, Ordering::Relaxed);
        let idx = desc.acct_idx;
        let mut tree = self.tree_lock.lock();
        // Empty the cache (and its child caches) of cached objects and
        // slabs; a slab left means a leaked object still names the cache.
        // A concurrent drain (`reap`, `shrink`) may hold some of the
        // cache's magazines for a moment: look again a few times before
        // concluding that objects were leaked.
        let mut leaked = true;
        for _ in 0..DESTROY_TRIES {
            leaked = false;
            self.for_each_cache_part(desc, |c| {
                c.drain(self);
                c.cache.shrink(&c.pages(self, None));
                leaked |= c.cache.nslabs() != 0;
            });
            if !leaked {
                break;
            }
            crate::sync::spin_hint();
        }
        if leaked {
            return;
        }
        if idx != NOT_ACCOUNTED {
            self.for_each_group(|g| {
                let c = g.caches[idx].swap(core::ptr::null_mut(), Ordering::AcqRel);
                if let Some(cp) = NonNull::new(c) {
                    // SAFETY: a published child cache; taken out of its
                    // group here, it is freed only once no iteration runs.
                    let c = unsafe { cp.as_ref() };
                    c.cache.mark_dead();
                    if c.take_empty_dead() {
                        // The reference it held on its group.
                        self.put_group(g);
                    }
                    tree.retire_cache(cp);
                }
            });
            indices.give(idx);
        }
        let desc = self.unlink_desc(desc);
        tree.retire_desc(desc);
        self.reclaim_groups(&mut tree);
    }

    /// Unlinks `desc` from the registry (registry lock held) and returns
    /// the pointer the registry held, which it is freed through.
    fn unlink_desc(&self, desc: &CacheDesc<R>) -> NonNull<CacheDesc<R>> {
        // SAFETY: linked descriptors are live, and links change only under
        // the registry lock, which the caller holds.
        unsafe { super::lifecycle::unlink(&self.registry, desc, |d| &d.next) }
    }

    /// Calls `f` on the cache of `desc` and, if it is accounted, on its
    /// child cache in every group that has one.
    fn for_each_cache_part(&self, desc: &CacheDesc<R>, mut f: impl FnMut(&MagCache<R>)) {
        f(&desc.cache);
        if desc.acct_idx != NOT_ACCOUNTED {
            self.for_each_group(|g| {
                if let Some(c) = Self::published_child(g, desc.acct_idx) {
                    f(c)
                }
            });
        }
    }
}

/// A named cache of `T` objects; created by [`Kmem::create_cache`].
/// Dropping it destroys the cache (its boxes borrow it, so none is left).
pub struct KmemCache<
    'k,
    T,
    S: PageSource = crate::platform::DefaultSource,
    R: RawMutex = crate::platform::DefaultRawMutex,
    P: Platform = crate::platform::DefaultPlatform,
> {
    kmem: &'k Kmem<S, R, P>,
    pub(crate) desc: &'k CacheDesc<R>,
    _type: PhantomData<fn() -> T>,
}

impl<'k, T, S: PageSource, R: RawMutex, P: Platform> KmemCache<'k, T, S, R, P> {
    /// Moves `value` into a new object of this cache, charged (for an
    /// `ACCOUNT` cache) to the current group. Errors:
    /// [`Error::LimitExceeded`] naming the group whose limit held,
    /// [`Error::OutOfMemory`].
    #[inline(always)]
    pub fn alloc(&self, value: T) -> Result<CacheBox<'_, T, S, R, P>, Error> {
        let p = self.alloc_object()?.cast::<T>();
        // SAFETY: a fresh object of this cache, laid out for `T`.
        unsafe { p.as_ptr().write(value) };
        Ok(CacheBox { ptr: p, kmem: self.kmem, desc: self.desc, _owns: PhantomData })
    }

    /// Moves `value` into a new object of this cache charged to `group`
    /// (for an `ACCOUNT` cache; otherwise as [`KmemCache::alloc`]), from
    /// any thread, without entering it: how a cache kept for one tenant
    /// (a dentry LRU, a connection pool) charges it while its owner's own
    /// allocations stay where they are. A removed group charges its
    /// nearest live ancestor. Errors: as for `alloc`, and
    /// [`Error::ForeignGroup`] for a group of another allocator.
    pub fn alloc_in(&self, group: &super::Cgroup<'k, S, R, P>, value: T) -> Result<CacheBox<'_, T, S, R, P>, Error> {
        if !core::ptr::eq(group.kmem(), self.kmem) {
            return Err(Error::ForeignGroup);
        }
        let g = self.kmem.effective(group.g());
        let p = self.alloc_object_for(g)?.cast::<T>();
        // SAFETY: a fresh object of this cache, laid out for `T`.
        unsafe { p.as_ptr().write(value) };
        Ok(CacheBox { ptr: p, kmem: self.kmem, desc: self.desc, _owns: PhantomData })
    }

    /// An object for the current group: a pointer (so the hit path returns
    /// in a register), with the error path out of line.
    #[inline(always)]
    fn alloc_object(&self) -> Result<NonNull<u8>, Error> {
        self.alloc_object_for(self.kmem.current())
    }

    /// An object charged to `g` (null: root).
    #[inline(always)]
    fn alloc_object_for(&self, g: *const crate::cgroup::Group<R>) -> Result<NonNull<u8>, Error> {
        let k = self.kmem;
        let base = &self.desc.cache;
        let cache = if self.desc.acct_idx == NOT_ACCOUNTED {
            base
        } else {
            match k.cache_for(g, self.desc.acct_idx, base) {
                Some(c) => c,
                None => return Err(Error::OutOfMemory),
            }
        };
        let p = k.alloc_from(cache)?;
        super::hardened_on_alloc(cache, p);
        Ok(p)
    }

    /// The cache's name.
    pub fn name(&self) -> &str {
        self.desc.name.as_str()
    }

    /// The cache's counters: its own slabs plus, for an accounted cache,
    /// the slabs of its child caches in every group.
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
        let k = self.kmem;
        let mut pages = 0;
        self.for_each_part(|c| {
            c.drain(k);
            pages += c.cache.shrink(&c.pages(k, None));
        });
        pages
    }

    /// Calls `f` on the cache itself and, if it is accounted, on its child
    /// cache in every group that has one.
    fn for_each_part(&self, f: impl FnMut(&MagCache<R>)) {
        self.kmem.for_each_cache_part(self.desc, f);
    }
}

impl<T, S: PageSource, R: RawMutex, P: Platform> Drop for KmemCache<'_, T, S, R, P> {
    fn drop(&mut self) {
        self.kmem.destroy_cache(self.desc);
    }
}

impl<T, S: PageSource, R: RawMutex, P: Platform> fmt::Debug for KmemCache<'_, T, S, R, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KmemCache").field("name", &self.name()).field("stats", &self.stats()).finish()
    }
}

// SAFETY: the handle holds shared references to a `Kmem` and a descriptor
// whose mutable state sits behind locks and atomics; it holds no `T`.
unsafe impl<T, S: PageSource, R: RawMutex + Sync, P: Platform> Send for KmemCache<'_, T, S, R, P> {}
// SAFETY: as for Send: every method takes `&self` and synchronises inside.
unsafe impl<T, S: PageSource, R: RawMutex + Sync, P: Platform> Sync for KmemCache<'_, T, S, R, P> {}

/// An owned `T` in a typed cache; frees its object on drop.
pub struct CacheBox<
    'c,
    T,
    S: PageSource = crate::platform::DefaultSource,
    R: RawMutex = crate::platform::DefaultRawMutex,
    P: Platform = crate::platform::DefaultPlatform,
> {
    ptr: NonNull<T>,
    kmem: &'c Kmem<S, R, P>,
    desc: &'c CacheDesc<R>,
    _owns: PhantomData<T>,
}

impl<T, S: PageSource, R: RawMutex, P: Platform> Deref for CacheBox<'_, T, S, R, P> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the box owns a live, initialised `T`.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T, S: PageSource, R: RawMutex, P: Platform> DerefMut for CacheBox<'_, T, S, R, P> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the box owns a live `T` exclusively.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T, S: PageSource, R: RawMutex, P: Platform> Drop for CacheBox<'_, T, S, R, P> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the box owns a live `T` in an object of `desc.cache` or of
        // a group's child cache of it (same slab order), whose slab header
        // names its `MagCache`; nothing uses it after.
        unsafe {
            self.ptr.as_ptr().drop_in_place();
            let owner = &*(self.desc.cache.cache.owner_of(self.ptr.as_ptr().cast()) as *const MagCache<R>);
            self.kmem.free_into(owner, self.ptr.cast());
        }
    }
}

impl<T: fmt::Debug, S: PageSource, R: RawMutex, P: Platform> fmt::Debug for CacheBox<'_, T, S, R, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

// SAFETY: a box is an owned `T` plus shared references to synchronised
// allocator state; sending it sends the `T`.
unsafe impl<T: Send, S: PageSource, R: RawMutex + Sync, P: Platform> Send for CacheBox<'_, T, S, R, P> {}
// SAFETY: `&CacheBox` only gives `&T`.
unsafe impl<T: Sync, S: PageSource, R: RawMutex + Sync, P: Platform> Sync for CacheBox<'_, T, S, R, P> {}
