//! Heap layer: [`Kmem`], the allocator itself.
//!
//! `Kmem` owns a page source and one slab cache per size class, routes each
//! request to a class or to an exact page run, and keeps the registry of
//! named typed caches. It never allocates from anywhere but its own page
//! source, and no allocation path panics or logs.

mod classes;
mod report;
mod typed;

pub use classes::MAX_CLASS_SIZE;
pub use report::{KmemStats, SlabInfo};
pub use typed::{CacheBox, CacheFlags, KmemCache};

use core::ptr::NonNull;

use lock_api::{Mutex, RawMutex};

use crate::magazine::{Env, MAGAZINE_GEOMETRY, MagCache, Slots};
use crate::page::{alloc_exact, free_exact, pages_for};
use crate::platform::{DefaultPlatform, DefaultRawMutex, Ownership, PAGE_SIZE, PageSource, Platform};
use crate::slab::Cache;
use crate::sync::{AtomicPtr, Stat, atomic_null};
use classes::{GEOMETRIES, NCLASSES, class_of};
use typed::CacheDesc;

/// The allocator: size-class caches, a page path for large objects and named
/// typed caches over one page source.
///
/// `Kmem::new` is `const`, so a `Kmem` can be a `static` and serve as the
/// `#[global_allocator]`. Once it has handed out memory it must stay at one
/// address (a `static`, or a leaked box): slab headers record their cache.
///
/// ```
/// use kmemcg::{Kmem, Region};
/// use core::alloc::{GlobalAlloc, Layout};
///
/// static KMEM: Kmem<Region> = Kmem::new(Region::new());
/// static mut ARENA: [core::mem::MaybeUninit<u8>; 1 << 20] = [core::mem::MaybeUninit::uninit(); 1 << 20];
///
/// // SAFETY: the only reference ever taken to ARENA.
/// KMEM.source().add(unsafe { &mut *core::ptr::addr_of_mut!(ARENA) }, 0).unwrap();
/// let layout = Layout::new::<[u64; 4]>();
/// let p = unsafe { KMEM.alloc(layout) };
/// assert!(!p.is_null());
/// unsafe { KMEM.dealloc(p, layout) };
/// ```
pub struct Kmem<S: PageSource, R: RawMutex = DefaultRawMutex, P: Platform = DefaultPlatform> {
    source: S,
    platform: P,
    /// Handshake state of the per-CPU slots, shared by all caches.
    slots: Slots,
    /// Self-hosted metadata: magazines of every cache.
    magazines: Cache<R>,
    classes: [MagCache<R>; NCLASSES],
    /// Self-hosted metadata: descriptors of typed caches.
    descriptors: Cache<R>,
    /// Typed caches, newest first; descriptors are never unlinked (a
    /// destroyed cache is marked dead and reused by a later cache of the
    /// same name, type layout and flags). Pushed with `Release` under
    /// `registry_lock`, read with `Acquire` without it.
    registry: AtomicPtr<CacheDesc<R>>,
    /// Serialises cache creation and destruction (never taken on an
    /// allocation path).
    registry_lock: Mutex<R, ()>,
    large_allocs: Stat,
    large_pages: Stat,
    bad_frees: Stat,
}

impl<S: PageSource, R: RawMutex> Kmem<S, R, DefaultPlatform> {
    /// An allocator over `source` with the default platform (per-thread
    /// slots with `std`, none without); nothing is allocated until first use.
    #[cfg(not(loom))]
    pub const fn new(source: S) -> Self {
        Self::with_platform(source, DefaultPlatform::new())
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// An allocator over `source` whose per-CPU slots `platform` assigns.
    #[cfg(not(loom))]
    pub const fn with_platform(source: S, platform: P) -> Self {
        Kmem {
            source,
            platform,
            slots: Slots::new(),
            magazines: Cache::new(MAGAZINE_GEOMETRY),
            classes: class_caches(),
            descriptors: Cache::new(CacheDesc::<R>::GEOMETRY),
            registry: atomic_null(),
            registry_lock: Mutex::const_new(R::INIT, ()),
            large_allocs: Stat::new(),
            large_pages: Stat::new(),
            bad_frees: Stat::new(),
        }
    }

    /// The page source, e.g. to add regions to it.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The platform.
    pub fn platform(&self) -> &P {
        &self.platform
    }

    /// The node new slabs and runs should come from when no slot is held.
    #[inline]
    fn node(&self) -> usize {
        0
    }

    /// `size` bytes aligned to `align`, or `None`. `size == 0`, an alignment
    /// that is not a power of two, and sizes whose rounding overflows all
    /// give `None`.
    #[inline]
    pub(crate) fn alloc_raw(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        if size == 0 || !align.is_power_of_two() {
            return None;
        }
        match class_of(size, align) {
            Some(c) => self.classes[c].alloc(self),
            None => self.alloc_large(size, align),
        }
    }

    #[cold]
    #[inline(never)]
    fn alloc_large(&self, size: usize, align: usize) -> Option<NonNull<u8>> {
        if size > isize::MAX as usize - (align - 1) {
            return None;
        }
        let pages = pages_for(size)?;
        let p = alloc_exact(&self.source, pages, align.max(PAGE_SIZE), self.node())?;
        self.large_allocs.add(1);
        self.large_pages.add(pages);
        Some(p)
    }

    /// Frees what `alloc_raw(size, align)` returned.
    ///
    /// # Safety
    ///
    /// `ptr` must have come from `alloc_raw` (or `realloc_raw`) of this
    /// `Kmem` with this `size` and `align`, and not been freed since.
    #[inline]
    pub(crate) unsafe fn free_raw(&self, ptr: NonNull<u8>, size: usize, align: usize) {
        if size == 0 {
            return;
        }
        match class_of(size, align) {
            Some(c) => {
                let cache = &self.classes[c];
                if cfg!(debug_assertions) && !self.is_object_of(&cache.cache, ptr) {
                    self.bad_frees.add(1);
                    return;
                }
                // SAFETY: per the contract `ptr` is a live object of class c.
                unsafe { cache.free(self, ptr) }
            }
            None => {
                let pages = pages_for(size).unwrap_or(0);
                if cfg!(debug_assertions)
                    && (!(ptr.as_ptr() as usize).is_multiple_of(PAGE_SIZE)
                        || self.source.ownership(ptr.as_ptr() as usize) == Ownership::Foreign)
                {
                    self.bad_frees.add(1);
                    return;
                }
                self.large_allocs.sub(1);
                self.large_pages.sub(pages);
                // SAFETY: per the contract `ptr` heads an exact run of `pages`.
                unsafe { free_exact(&self.source, ptr, pages) }
            }
        }
    }

    /// Whether `ptr` is a live-looking object of `cache` (slab header check
    /// after the page source vouches for the address).
    fn is_object_of(&self, cache: &Cache<R>, ptr: NonNull<u8>) -> bool {
        self.source.ownership(ptr.as_ptr() as usize) == Ownership::Owned
            // SAFETY: the source owns the address, so its slab's header page
            // is mapped and readable.
            && unsafe { cache.is_object(ptr) }
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
        let old_class = class_of(old_size, align);
        let new_class = class_of(new_size, align);
        match (old_class, new_class) {
            (Some(a), Some(b)) if a == b => return Some(ptr),
            (None, None) if new_size <= isize::MAX as usize - (align - 1) => {
                let old_pages = pages_for(old_size)?;
                let new_pages = pages_for(new_size)?;
                if new_pages == old_pages {
                    return Some(ptr);
                }
                if new_pages < old_pages {
                    let tail = ptr.as_ptr() as usize + new_pages * PAGE_SIZE;
                    // SAFETY: the tail pages belong to this live run and are
                    // past the bytes the caller keeps; the tail starts on a
                    // page boundary.
                    unsafe { free_exact(&self.source, NonNull::new_unchecked(tail as *mut u8), old_pages - new_pages) };
                    self.large_pages.sub(old_pages - new_pages);
                    return Some(ptr);
                }
            }
            _ => {}
        }
        let new = self.alloc_raw(new_size, align)?;
        // SAFETY: both blocks are live, distinct, and at least this long.
        unsafe {
            core::ptr::copy_nonoverlapping(ptr.as_ptr(), new.as_ptr(), old_size.min(new_size));
            self.free_raw(ptr, old_size, align);
        }
        Some(new)
    }

    /// The bytes actually usable in a block of `size` and `align`: its class
    /// size, or its whole pages.
    pub(crate) fn usable_size(size: usize, align: usize) -> usize {
        match class_of(size, align) {
            Some(c) => GEOMETRIES[c].size,
            None => pages_for(size).map_or(size, |p| p * PAGE_SIZE),
        }
    }

    /// Calls `f` on every magazine cache: the size classes, then the live
    /// typed caches.
    fn for_each_cache(&self, mut f: impl FnMut(&MagCache<R>)) {
        self.classes.iter().for_each(&mut f);
        let mut d = self.registry.load(crate::sync::Ordering::Acquire);
        while let Some(desc) = NonNull::new(d) {
            // SAFETY: descriptors are never freed once published.
            let desc = unsafe { desc.as_ref() };
            f(&desc.cache);
            d = desc.next;
        }
    }

    /// Empties every magazine on every CPU and in every depot, gives every
    /// empty slab back to the page source, and trims the source. Returns
    /// the pages given back. (Linux `kmem_cache_shrink` on all caches.)
    pub fn shrink(&self) -> usize {
        let mut pages = 0;
        self.for_each_cache(|c| {
            c.drain(self);
            pages += c.cache.shrink(&self.source);
        });
        self.magazines.shrink(&self.source);
        pages + self.source.trim()
    }

    /// Bonwick's working-set reap, for a periodic timer (he used 15 s):
    /// depot magazines unused since the last reap, the magazines of slots no
    /// thread holds, and those of slots unused since the last reap go back
    /// to the slabs; then empty slabs go back to the page source and the
    /// source is trimmed. Returns the pages given back. What a burst freed
    /// just before a reap is the working set of that interval: the next
    /// reap returns it if it stays unused.
    pub fn reap(&self) -> usize {
        let idle = self.slots.reap_idle_mask();
        let mut pages = 0;
        self.for_each_cache(|c| {
            c.reap(self, &idle);
            pages += c.cache.shrink(&self.source);
        });
        pages + self.source.trim()
    }

    /// The cache serving `size`/`align` requests, for tests and reports.
    #[cfg(test)]
    pub(crate) fn class_cache(&self, size: usize, align: usize) -> Option<&Cache<R>> {
        class_of(size, align).map(|c| &self.classes[c].cache)
    }

    /// Checks every cache's lists and accounting (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        for c in &self.classes {
            c.cache.check();
        }
        self.descriptors.check();
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Env<R> for Kmem<S, R, P> {
    type Src = S;
    type Plat = P;
    #[inline(always)]
    fn src(&self) -> &S {
        &self.source
    }
    #[inline(always)]
    fn plat(&self) -> &P {
        &self.platform
    }
    #[inline(always)]
    fn slots(&self) -> &Slots {
        &self.slots
    }
    #[inline(always)]
    fn mags(&self) -> &Cache<R> {
        &self.magazines
    }
}

/// One cache per size class, built in a `const` context.
#[cfg(not(loom))]
const fn class_caches<R: RawMutex>() -> [MagCache<R>; NCLASSES] {
    let mut out = core::mem::MaybeUninit::<[MagCache<R>; NCLASSES]>::uninit();
    let first = out.as_mut_ptr() as *mut MagCache<R>;
    let mut i = 0;
    while i < NCLASSES {
        // SAFETY: `i < NCLASSES`, so the slot is inside the array; each slot
        // is written once and none is read before all are written.
        unsafe { first.add(i).write(MagCache::new(GEOMETRIES[i])) };
        i += 1;
    }
    // SAFETY: the loop initialised every element.
    unsafe { out.assume_init() }
}

#[cfg(all(test, not(loom)))]
mod tests;
