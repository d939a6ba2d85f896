//! Slab layer: caches of equal-sized objects carved from page runs.
//!
//! A [`Cache`] holds objects of one size and alignment in *slabs*: runs of
//! `2^order` pages whose first [`HEADER`] bytes hold a [`Slab`] header and
//! whose remainder is cut into objects. Each node has its own lists of
//! partial, full and empty slabs behind its own lock, so no operation takes
//! a lock wider than one node of one cache, and each critical section is a
//! single slab-list update.
//!
//! A slab tracks its free objects in a bitmap right after its header (one
//! bit per object, set while the object is in the slab), not in a list
//! threaded through the objects: taking and returning objects reads and
//! writes the slab's first lines only, never the objects themselves. So a
//! batch of frees long after the objects were used does not miss the
//! cache once per object, growing a slab touches only its header page, a
//! write after free cannot forge what the slab hands out next (there is no
//! link in a free object to corrupt), and a double free that reaches the
//! slab finds its bit already set and is refused. Objects go out lowest
//! address first, from the first word with a free bit (`hint`).
//!
//! Accounting equation, per node, under its lock:
//! `active == Σ inuse over all listed slabs`, and for every slab
//! `inuse + free bits == capacity`.

use core::ptr::{self, NonNull};

use crossbeam_utils::CachePadded;
use lock_api::{Mutex, RawMutex};

use crate::platform::{MAX_NODES, PAGE_SIZE, PageRun, PageSource};
use crate::sync::{AtomicUsize, CellArray, Ordering, atomic_usize, loom_const_fn, repeat};

#[cfg(any(test, feature = "paranoid"))]
mod check;
pub(crate) mod classes;
mod geometry;
mod node;
mod pages;
mod walk;

pub(crate) use geometry::{Geometry, order_cap};
use node::{ListKind, NodeSlabs, Slab, free_map};
pub(crate) use pages::{GrowError, Pages};

/// Bytes reserved for the header at the start of every slab: at least
/// one cache line, which the free bitmap shares (from [`MAP_OFFSET`]) as
/// far as it fits, so returning objects to a slab of up to 192 of them
/// touches one line.
pub(crate) const HEADER: usize = 64;
/// Where the free bitmap starts: right after the `Slab` struct.
const MAP_OFFSET: usize = core::mem::size_of::<Slab>().next_multiple_of(8);
/// The largest slab: 2^8 pages (1 MiB).
pub(crate) const MAX_SLAB_ORDER: u32 = 8;
/// Marks a live slab header ("kmsb").
const SLAB_MAGIC: u32 = 0x6b6d_7362;
/// Empty slabs each node keeps before giving slabs back to the page source.
pub(crate) const EMPTY_RESERVE: usize = 1;

/// How many objects ahead of the one being freed `free_bulk` (through
/// `NodeSlabs::put_run`) prefetches the slab header of.
const PREFETCH_AHEAD: usize = 8;

/// Hints that the line holding `p` is about to be written. Only a hint:
/// it never faults, so any address will do.
#[inline(always)]
fn prefetch_write(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch is a hint that reads no memory and never faults.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}

/// Counters of one cache, summed over nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Objects handed out and not returned.
    pub active_objects: usize,
    /// Object slots in all slabs.
    pub total_objects: usize,
    /// Slabs held (partial, full and empty).
    pub slabs: usize,
    /// Of those, slabs with no object in use.
    pub empty_slabs: usize,
    /// Pages held by those slabs.
    pub pages: usize,
}

/// A cache of objects of one geometry.
///
/// The cache must stay at one address while it has slabs: each slab header
/// records it, which is how frees are checked and, for accounted caches, how
/// a slab's owner is found.
pub(crate) struct Cache<R: RawMutex> {
    /// Written at construction and at most once more by [`Cache::refit`],
    /// before the cache has a slab and before any other thread reads it
    /// (a `Kmem`'s first use: see `Kmem::settle`); read-only after. Not
    /// the loom-checked cell of `sync`: read on every slab operation, and
    /// no loom model refits a cache.
    geo: core::cell::UnsafeCell<Geometry>,
    /// Slabs held; changed on grow and release (slow paths only).
    nslabs: AtomicUsize,
    nodes: CellArray<CachePadded<Mutex<R, NodeSlabs>>, MAX_NODES>,
}

// SAFETY: the node lists are behind their locks (what `Mutex` needs: a
// `Sync` lock and `Send` contents), the counters are atomics, and the
// geometry cell is only written under `refit`'s contract, which keeps the
// write from racing any access.
unsafe impl<R: RawMutex + Sync> Sync for Cache<R> {}

impl<R: RawMutex> Cache<R> {
    loom_const_fn! {
        /// A cache with no slabs yet.
        pub(crate) fn new(geo: Geometry) -> Self {
            Cache {
                geo: core::cell::UnsafeCell::new(geo),
                nslabs: atomic_usize(0),
                nodes: CellArray::new(repeat!(CachePadded::new(Mutex::const_new(R::INIT, NodeSlabs::new())); MAX_NODES)),
            }
        }
    }

    /// The layout of this cache's objects.
    #[inline]
    pub(crate) fn geometry(&self) -> &Geometry {
        self.geo()
    }

    #[inline(always)]
    fn geo(&self) -> &Geometry {
        // SAFETY: the geometry is only written by `refit`, whose contract
        // orders the write before every read and keeps it from overlapping
        // any (see the field).
        unsafe { &*self.geo.get() }
    }

    /// Replaces the layout of this cache's objects (same size and
    /// alignment, another slab order: see `geometry`).
    ///
    /// # Safety
    ///
    /// The cache has never had a slab, no reference from
    /// [`Cache::geometry`] is live, and no other thread reads the geometry
    /// until a synchronisation orders this write before its reads (a
    /// `Kmem`'s first use publishes it with a `Release` store that its
    /// readers load with `Acquire` before they use a cache).
    pub(crate) unsafe fn refit(&self, geo: Geometry) {
        debug_assert!(self.nslabs() == 0 && geo.size == self.geo().size && geo.align == self.geo().align);
        // SAFETY: per the contract, nothing reads or writes the cell now.
        unsafe { *self.geo.get() = geo };
    }

    #[inline]
    fn id(&self) -> *const () {
        self as *const Self as *const ()
    }

    /// One object, from a slab of `node` if it has one, else from a new slab.
    #[inline]
    pub(crate) fn alloc<S: PageSource>(&self, pg: &Pages<'_, S>, node: usize) -> Result<NonNull<u8>, GrowError> {
        let node = node.min(MAX_NODES - 1);
        // SAFETY: every slab on this cache's lists has this cache's geometry.
        if let Some(p) = unsafe { self.nodes[node].lock().take(self.geo()) } {
            return Ok(p);
        }
        self.alloc_slow(pg, node)
    }

    /// Grows the cache by one slab and takes an object from it.
    #[cold]
    #[inline(never)]
    fn alloc_slow<S: PageSource>(&self, pg: &Pages<'_, S>, node: usize) -> Result<NonNull<u8>, GrowError> {
        // The page source is called without any cache lock held.
        let run = pg.grow(self.geo(), node)?;
        let s = self.init_slab(run, pg.owner);
        let mut lists = self.nodes[run.node].lock();
        // SAFETY: `s` is a live header on no list; we hold its node's lock,
        // and it has this cache's geometry; a fresh slab has a free object.
        unsafe {
            lists.partial.push(s, ListKind::Partial);
            Ok(lists.take(self.geo()).unwrap_unchecked())
        }
    }

    /// Fills `out` with up to `out.len()` objects from `node`'s slabs,
    /// growing the cache as needed; returns how many it took (an error only
    /// when it took none). One lock hold serves the whole batch from
    /// existing slabs.
    pub(crate) fn alloc_bulk<S: PageSource>(
        &self,
        pg: &Pages<'_, S>,
        node: usize,
        out: &mut [*mut u8],
    ) -> Result<usize, GrowError> {
        let node = node.min(MAX_NODES - 1);
        let mut n = 0;
        {
            let mut lists = self.nodes[node].lock();
            // SAFETY: every listed slab has this cache's geometry.
            n += unsafe { lists.take_bulk(self.geo(), out) };
        }
        while n < out.len() {
            let run = match pg.grow(self.geo(), node) {
                Ok(run) => run,
                Err(e) if n == 0 => return Err(e),
                Err(_) => break,
            };
            let s = self.init_slab(run, pg.owner);
            let mut lists = self.nodes[run.node].lock();
            // SAFETY: `s` is a fresh header on no list, of this geometry.
            unsafe { lists.partial.push(s, ListKind::Partial) };
            // SAFETY: as above.
            n += unsafe { lists.take_bulk(self.geo(), &mut out[n..]) };
        }
        Ok(n)
    }

    /// Returns a batch of objects to their slabs, one lock hold per run of
    /// objects on the same node; slabs that empty beyond the reserve go back
    /// to `src` after the lock is dropped.
    ///
    /// # Safety
    ///
    /// Every pointer must be a distinct live object of this cache from `src`.
    pub(crate) unsafe fn free_bulk<S: PageSource>(&self, pg: &Pages<'_, S>, objs: &[*mut u8]) {
        let slab_of = |p: *mut u8| self.slab_of(p) as *mut Slab;
        // The first headers' misses start now, the rest in `put_run`.
        for &p in objs.iter().take(PREFETCH_AHEAD) {
            prefetch_write(slab_of(p).cast());
        }
        let mut i = 0;
        while i < objs.len() {
            let mut release = [ptr::null_mut::<Slab>(); 8];
            let mut nrel = 0;
            // SAFETY: live objects of this cache lie in live slabs.
            let node = unsafe { self.node_of(objs[i]) };
            {
                let mut lists = self.nodes[node].lock();
                // SAFETY: as above, and the slab's node matches the lock held.
                while i < objs.len() && nrel < release.len() && unsafe { self.node_of(objs[i]) } == node {
                    // The run of objects in the same slab as `objs[i]` (a
                    // magazine of objects freed in order is a few runs).
                    // SAFETY: distinct live objects of this cache, the
                    // first in that slab, on this node.
                    let (n, r) = unsafe { lists.put_run(slab_of(objs[i]), &objs[i..], self.geo(), self.reserve()) };
                    if let Some(r) = r {
                        release[nrel] = r;
                        nrel += 1;
                    }
                    i += n;
                }
            }
            if nrel > 0 {
                // SAFETY: unlisted empty slabs of this cache.
                unsafe { self.release_slabs(pg, &release[..nrel]) };
            }
        }
    }

    /// The cache the header of the slab that would hold `ptr` (in a cache
    /// of this slab order) names, if that header is a live slab's: the
    /// debug and hardened checks of frees read the header once, here.
    ///
    /// # Safety
    ///
    /// The page at `slab_base(ptr)` must be readable.
    pub(crate) unsafe fn live_owner(&self, ptr: *mut u8) -> Option<*const ()> {
        let s = self.slab_of(ptr) as *const Slab;
        // SAFETY: per the contract the page is readable, and any bits are
        // a valid `u32` and pointer (the page may hold anything if `ptr`
        // is not ours). A live slab's `magic` and `cache` are fixed while
        // it lives, and a stale slab has magic 0. (Plain reads: in a
        // user's debug build `read_volatile` adds a precondition check
        // to every free.)
        let (magic, cache) = unsafe { ((*s).magic, (*s).cache) };
        (magic == SLAB_MAGIC).then_some(cache)
    }

    /// Whether `ptr`, in a live slab whose header names `cache` (as
    /// [`Cache::live_owner`] read it), is the start of an object slot of
    /// this cache.
    #[inline]
    pub(crate) fn is_slot(&self, ptr: NonNull<u8>, cache: *const ()) -> bool {
        let off = ptr.as_ptr().addr() & ((PAGE_SIZE << self.geo().order) - 1);
        cache == self.id()
            && off >= self.geo().first
            && (off - self.geo().first).is_multiple_of(self.geo().size)
            && (off - self.geo().first) / self.geo().size < self.geo().capacity
    }

    /// The cache that owns the slab holding `ptr`, judged by the slab
    /// header alone (so for any cache whose slabs have this cache's order).
    ///
    /// # Safety
    ///
    /// `ptr` must be a live object of a cache with this cache's slab order.
    #[inline]
    pub(crate) unsafe fn owner_of(&self, ptr: *mut u8) -> *const () {
        let s = self.slab_of(ptr) as *const Slab;
        // SAFETY: the header of a live slab; `cache` is fixed at creation.
        unsafe { (*s).cache }
    }

    /// The start of the slab `ptr` would be in: its address masked with
    /// the slab size (as `page::slab_base`, with the mask read from the
    /// geometry rather than made from the order).
    #[inline(always)]
    fn slab_of(&self, ptr: *mut u8) -> *mut u8 {
        let geo = self.geo();
        let mask = geo.slab_mask;
        debug_assert_eq!(mask, !((PAGE_SIZE << geo.order) - 1));
        if cfg!(debug_assertions) { ptr.wrapping_sub(ptr.addr() & !mask) } else { ptr.map_addr(|a| a & mask) }
    }

    /// The owner word of the object at `ptr`, in a cache whose slabs carry
    /// them ([`Geometry::with_owners`]): what the layers above keep there
    /// (whom the object is charged to) is theirs; this layer neither
    /// reads nor writes it. Written by whoever holds the object (its
    /// allocation, then its free), so plain accesses suffice: handing the
    /// object from thread to thread orders them.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live object of this cache, whose geometry has
    /// owner words.
    #[inline(always)]
    pub(crate) unsafe fn owner_word(&self, ptr: *mut u8) -> *mut *mut () {
        // SAFETY: forwarded; a cache has its own slabs' order.
        unsafe { self.owner_word_found_by(self, ptr) }
    }

    /// [`Cache::owner_word`] with the slab found through `like`'s
    /// geometry: a free that found the object's header through the
    /// cache of its class (`like`) masks the pointer once for both.
    ///
    /// # Safety
    ///
    /// As for [`Cache::owner_word`], and `like`'s slabs have this
    /// cache's order.
    #[inline(always)]
    pub(crate) unsafe fn owner_word_found_by(&self, like: &Self, ptr: *mut u8) -> *mut *mut () {
        let geo = self.geo();
        debug_assert!(geo.has_owners());
        debug_assert_eq!(geo.slab_mask, like.geo().slab_mask);
        let base = like.slab_of(ptr);
        let off = geo.owner_offset(ptr.addr() - base.addr());
        debug_assert_eq!(
            Some(off),
            geo.index_of(ptr.addr() - base.addr() - geo.first).map(|i| geo.owners + i * size_of::<usize>())
        );
        // The owner words are inside the slab, one per object, and `off` is
        // the live object's (see `Geometry::owner_offset`); `base` carries
        // the slab's provenance (derived from a live object's pointer).
        // SAFETY: so the word is in bounds of the slab's run.
        unsafe { base.add(off).cast::<*mut ()>() }
    }

    /// The birth number of the slab holding `ptr` (see `Slab::birth`).
    ///
    /// # Safety
    ///
    /// `ptr` must be a live object of this cache.
    pub(crate) unsafe fn birth_of(&self, ptr: *mut u8) -> u32 {
        let s = self.slab_of(ptr) as *const Slab;
        // SAFETY: the header of a live slab; `birth` is fixed at creation.
        unsafe { (*s).birth }
    }

    /// The node of the slab holding `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live object of this cache.
    #[inline]
    pub(crate) unsafe fn node_of(&self, ptr: *mut u8) -> usize {
        let s = self.slab_of(ptr) as *const Slab;
        // SAFETY: the header of a live slab; `node` is fixed at creation.
        unsafe { (*s).node as usize }
    }

    /// Writes a fresh header into `run`, naming `owner` (null: this cache;
    /// see `Pages::owner`) as its cache.
    fn init_slab(&self, run: PageRun, owner: *const ()) -> *mut Slab {
        self.nslabs.fetch_add(1, Ordering::Relaxed);
        let s = run.addr.as_ptr() as *mut Slab;
        // SAFETY: the run is fresh, at least HEADER bytes long and aligned
        // for `Slab`; nothing else refers to it yet.
        unsafe {
            s.write(Slab {
                magic: SLAB_MAGIC,
                node: run.node as u8,
                list: ListKind::Partial,
                inuse: 0,
                hint: 0,
                birth: crate::sync::next_sequence(),
                cache: if owner.is_null() { self.id() } else { owner },
                next: ptr::null_mut(),
                prev: ptr::null_mut(),
            });
        }
        let words = self.geo().words();
        // SAFETY: the bitmaps lie between the header and the first object
        // (`Geometry::new` reserved `bitmap_bytes` for them), inside the
        // fresh run: every object free, and (hardened) none handed out.
        unsafe {
            let map = free_map(s);
            for w in 0..words {
                let left = self.geo().capacity - w * 64;
                map.add(w).write(if left >= 64 { u64::MAX } else { (1u64 << left) - 1 });
            }
            if cfg!(feature = "hardened") {
                map.add(words).write_bytes(0, words);
            }
        }
        let geo = self.geo();
        if geo.has_owners() {
            // SAFETY: the owner words lie after the bitmaps and before the
            // first object (`Geometry::with_owners`), inside the fresh run:
            // no object has an owner yet.
            unsafe { s.cast::<u8>().add(geo.owners).cast::<*mut ()>().write_bytes(0, geo.capacity) };
        }
        s
    }

    /// The allocation-bitmap word and bit of object `ptr` (feature
    /// `hardened`): the bitmap after the free bitmap, one bit per object,
    /// set while a user holds it.
    ///
    /// # Safety
    ///
    /// `ptr` is an object slot of a live slab of this cache.
    unsafe fn bit(&self, ptr: *mut u8) -> (&AtomicUsize, usize) {
        const BITS: usize = usize::BITS as usize;
        let base = self.slab_of(ptr);
        let idx = (ptr.addr() - base.addr() - self.geo().first) / self.geo().size;
        let at = MAP_OFFSET + self.geo().words() * 8 + idx / BITS * (BITS / 8);
        // The word lies in the allocation bitmap after the free bitmap (as
        // many bytes, reserved by `Geometry::new`, zeroed with the slab),
        // aligned to 8, and is only ever accessed through these
        // `usize`-wide atomics (so 32-bit targets need no 64-bit atomics).
        // SAFETY: an in-bounds, aligned word only accessed atomically (above).
        let word = unsafe { &*base.wrapping_add(at).cast::<AtomicUsize>() };
        (word, 1 << (idx % BITS))
    }

    /// Hardened mode: records that `ptr` was handed out; `false` if it
    /// already was (the allocator handed one object out twice).
    ///
    /// # Safety
    ///
    /// As for [`Cache::bit`].
    pub(crate) unsafe fn mark_allocated(&self, ptr: *mut u8) -> bool {
        // SAFETY: forwarded.
        let (w, b) = unsafe { self.bit(ptr) };
        w.fetch_or(b, Ordering::Relaxed) & b == 0
    }

    /// Hardened mode: records that `ptr` was freed; `false` if it was not
    /// allocated (a double free).
    ///
    /// # Safety
    ///
    /// As for [`Cache::bit`].
    pub(crate) unsafe fn mark_freed(&self, ptr: *mut u8) -> bool {
        // SAFETY: forwarded.
        let (w, b) = unsafe { self.bit(ptr) };
        w.fetch_and(!b, Ordering::Relaxed) & b != 0
    }

    /// Returns an object to its slab, and the slab to `src` if it empties
    /// beyond the reserve.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live object allocated from this cache with `src`.
    #[inline]
    pub(crate) unsafe fn free<S: PageSource>(&self, pg: &Pages<'_, S>, ptr: NonNull<u8>) {
        let s = self.slab_of(ptr.as_ptr()) as *mut Slab;
        // SAFETY: `ptr` is a live object of this cache.
        let node = unsafe { self.node_of(ptr.as_ptr()) };
        // SAFETY: `ptr` is a live object of slab `s`, on node `node`.
        let release = unsafe { self.nodes[node].lock().put(s, ptr.as_ptr(), self.geo(), self.reserve()) };
        if let Some(s) = release {
            // SAFETY: the slab is off every list and holds no live object.
            unsafe { self.release_slab(pg, s) };
        }
    }

    /// Hands an unlisted empty slab back to the page source.
    ///
    /// # Safety
    ///
    /// `s` is an empty slab of this cache on no list.
    unsafe fn release_slab<S: PageSource>(&self, pg: &Pages<'_, S>, s: *mut Slab) {
        // SAFETY: forwarded.
        unsafe { self.release_slabs(pg, &[s]) }
    }

    /// Hands up to 8 unlisted empty slabs back to the page source in one
    /// call.
    ///
    /// # Safety
    ///
    /// Each of `slabs` is an empty slab of this cache on no list, all
    /// distinct.
    unsafe fn release_slabs<S: PageSource>(&self, pg: &Pages<'_, S>, slabs: &[*mut Slab]) {
        let mut runs = [NonNull::dangling(); 8];
        let mut on_node = [0usize; MAX_NODES];
        for (run, &s) in runs.iter_mut().zip(slabs) {
            // SAFETY: per the contract the header is ours; clearing the
            // magic makes a stale free of one of its objects detectable.
            unsafe {
                (*s).magic = 0;
                on_node[usize::from((*s).node).min(MAX_NODES - 1)] += 1;
                *run = NonNull::new_unchecked(s as *mut u8);
            }
        }
        if let Some(c) = pg.counter {
            for (node, &k) in on_node.iter().enumerate().filter(|(_, k)| **k > 0) {
                c.sub_node_pages(node, k * self.geo().slab_pages());
            }
        }
        let n = slabs.len().min(runs.len());
        self.nslabs.fetch_sub(n, Ordering::Relaxed);
        // SAFETY: empty slabs of ours, charged by `grow` when they grew.
        unsafe { pg.release_bulk(&runs[..n], self.geo()) };
    }

    /// Empty slabs kept per node.
    #[inline]
    fn reserve(&self) -> usize {
        EMPTY_RESERVE
    }

    /// Slabs held.
    pub(crate) fn nslabs(&self) -> usize {
        self.nslabs.load(Ordering::Relaxed)
    }

    /// Whether `ptr` is the start of an object this cache handed out, judged
    /// from the slab header. Does not detect a double free.
    ///
    /// # Safety
    ///
    /// The page holding `slab_base(ptr)` must be readable (e.g. the page
    /// source said it owns `ptr`).
    #[cfg(test)]
    pub(crate) unsafe fn is_object(&self, ptr: NonNull<u8>) -> bool {
        // SAFETY: forwarded.
        unsafe { self.live_owner(ptr.as_ptr()) }.is_some_and(|cache| self.is_slot(ptr, cache))
    }

    /// Gives every empty slab back to `src`; returns the pages freed.
    pub(crate) fn shrink<S: PageSource>(&self, pg: &Pages<'_, S>) -> usize {
        let mut pages = 0;
        for node in self.nodes.iter() {
            loop {
                let s = {
                    let mut lists = node.lock();
                    let s = lists.empty.head;
                    if s.is_null() {
                        break;
                    }
                    // SAFETY: `s` heads the empty list we hold the lock of.
                    unsafe { lists.empty.remove(s) };
                    s
                };
                // SAFETY: `s` is empty and unlisted.
                unsafe { self.release_slab(pg, s) };
                pages += self.geo().slab_pages();
            }
        }
        pages
    }

    /// Current counters.
    pub(crate) fn stats(&self) -> CacheStats {
        let mut st = CacheStats::default();
        for node in self.nodes.iter() {
            let lists = node.lock();
            let slabs = lists.partial.len + lists.full.len + lists.empty.len;
            st.active_objects += lists.active;
            st.slabs += slabs;
            st.empty_slabs += lists.empty.len;
        }
        st.total_objects = st.slabs * self.geo().capacity;
        st.pages = st.slabs * self.geo().slab_pages();
        st
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
