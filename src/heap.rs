//! Heap layer: [`Kmem`], the allocator itself.
//!
//! `Kmem` owns a page source and one slab cache per size class, routes each
//! request to a class or to an exact page run, and keeps the registry of
//! named typed caches. It never allocates from anywhere but its own page
//! source, and no allocation path panics or logs.
//!
//! | file | holds |
//! | --- | --- |
//! | `heap.rs` | [`Kmem`]: its fields, construction, first use, the calls that reach the tree |
//! | `alloc` | the allocation paths, fast and slow |
//! | `free` | the free paths, finding an object's cache, resizing |
//! | `large` | objects of whole page runs |
//! | `debug` | memory-error detection, one file per detector |
//! | `fit`, `decay`, `oom`, `report`, `check` | slab orders fitted to the source, idle memory given back, out-of-memory records, reports, invariant checks |

mod alloc;
mod check;
mod debug;
mod decay;
mod fit;
mod free;
mod large;
mod oom;
mod report;
#[cfg(all(miri, feature = "std", not(loom)))]
mod tree_miri;

pub use debug::{Detection, GUARDED_MAX};
pub(crate) use debug::{LeakSizes, write_leak_site};
pub use decay::Decay;
pub use oom::{OomReport, OomSite};
pub use report::{KmemStats, SlabInfo};

use core::ptr::NonNull;

use lock_api::RawMutex;

use crate::cgroup::{EventHook, Group, GroupId, Shrinker, Tree, mode};
use crate::counter::PageCounter;
use crate::error::Error;
use crate::magazine::{Env, MAGAZINE_GEOMETRY, MagCache, Slots};
pub(crate) use crate::platform::hardened_abort;
use crate::platform::{DefaultPlatform, DefaultRawMutex, DefaultSource, PAGE_SIZE, PageSource, Platform};
use crate::slab::Cache;
use crate::slab::classes::SizeClass;
use crate::sync::{AtomicPtr, AtomicUsize, OneCell, Ordering, Stat};

/// The allocator: size-class caches, a page path for large objects and named
/// typed caches over one page source.
///
/// `Kmem::new` is `const`, so a `Kmem` can be a `static` and serve as the
/// `#[global_allocator]`. Once it has handed out memory it must stay at one
/// address (a `static`, or a leaked box): slab headers record their cache.
/// Its first use (an allocation, a cache or group made, a report) also
/// sizes its slabs to the page source's memory then: add a `Region`'s
/// memory before it (see [`Kmem::with_max_slab_order`]).
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
pub struct Kmem<S: PageSource = DefaultSource, R: RawMutex = DefaultRawMutex, P: Platform = DefaultPlatform> {
    source: S,
    platform: P,
    /// Handshake state of the per-CPU slots, shared by all caches.
    slots: Slots,
    /// Self-hosted metadata: magazines of every cache.
    magazines: OneCell<Cache<R>>,
    /// The groups, the size classes (the root's caches), the typed caches,
    /// and reclaim.
    tree: OneCell<TreeBox<R>>,
    large_allocs: Stat,
    large_pages: Stat,
    bad_frees: Stat,
    /// Memory-error detection (off unless asked for).
    detect: OneCell<debug::Detector<R>>,
    /// Giving idle memory back by itself.
    decay: decay::Decayer,
    /// The out-of-memory handler: null, or an [`OomHandler`] of this
    /// `Kmem`'s type (only `set_oom_handler` stores to it).
    oom: AtomicPtr<()>,
    /// The address this `Kmem` was first used at (0 before): slab headers,
    /// groups, tokens and large objects point back into it from then on,
    /// so [`Kmem::settle`] refuses to run anywhere else. Set once, by CAS,
    /// to that address `| SETTLING` while the first use fits the caches to
    /// the page source, then (`Release`) to the address.
    home: AtomicUsize,
    /// The largest slab order of this allocator's caches: `fit::AUTO` until
    /// the first use fits it to the page source (or `with_max_slab_order`
    /// fixed it); written before `home` is published.
    slab_cap: AtomicUsize,
    /// Why the page source last came up short (see `oom`).
    last_oom: oom::OomRecord,
}

// A `Kmem` is unwind safe: no operation leaves a broken invariant behind
// when a panic unwinds through it (only callbacks can panic: shrinkers,
// the event hook and the out-of-memory handler, and the drop guards
// around them restore the context's marks, release every lock and read
// guard, and take back the charge of the allocation they interrupted),
// so code that catches the panic may go on using the allocator, its
// groups and caches. Its cells are behind atomics and locks; its page
// source and platform must be unwind safe themselves.
impl<S: PageSource + core::panic::RefUnwindSafe, R: RawMutex, P: Platform + core::panic::RefUnwindSafe>
    core::panic::RefUnwindSafe for Kmem<S, R, P>
{
}
impl<S: PageSource + core::panic::UnwindSafe, R: RawMutex, P: Platform + core::panic::UnwindSafe>
    core::panic::UnwindSafe for Kmem<S, R, P>
{
}

/// How a `Kmem` holds its tree: inline, so that it can be a `static`;
/// under loom, on the heap, so that a `Kmem` (then not `const`) can be
/// built inside a loom model on a model thread's default 32 KiB stack,
/// as loom's docs write models.
#[cfg(not(any(loom, all(miri, feature = "std"))))]
type TreeBox<R> = InlineTree<R>;
/// Under Miri (with `std`): out of line from its first use (see
/// `tree_miri`).
#[cfg(all(miri, feature = "std", not(loom)))]
type TreeBox<R> = tree_miri::OutOfLineTree<R>;
#[cfg(loom)]
type TreeBox<R> = std::boxed::Box<Tree<R>>;

/// A tree held inline (see [`TreeBox`]): `TreeBox::new` is `const`.
#[cfg(not(any(loom, all(miri, feature = "std"))))]
#[repr(transparent)]
struct InlineTree<R: RawMutex>(Tree<R>);

#[cfg(not(any(loom, all(miri, feature = "std"))))]
impl<R: RawMutex> InlineTree<R> {
    const fn new(t: Tree<R>) -> Self {
        InlineTree(t)
    }
}

#[cfg(not(any(loom, all(miri, feature = "std"))))]
impl<R: RawMutex> core::ops::Deref for InlineTree<R> {
    type Target = Tree<R>;
    #[inline(always)]
    fn deref(&self) -> &Tree<R> {
        &self.0
    }
}

#[cfg(not(any(loom, all(miri, feature = "std"))))]
impl<R: RawMutex> core::ops::DerefMut for InlineTree<R> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Tree<R> {
        &mut self.0
    }
}

/// The low bit of `Kmem::home` while the first use fits the caches.
const SETTLING: usize = 1;

/// Called when the page source cannot supply `pages` pages even after
/// reclaim ([`Kmem::set_oom_handler`]); returns whether it added memory
/// (a kernel adds a region), and then the allocation retries once. It runs
/// with no allocator lock held, in the allocating context; allocations it
/// makes are atomic (no reclaim, and no nested handler call) and may
/// overdraw a group's `max` as a shrinker's do
/// ([`RECLAIM_OVERDRAFT`](crate::RECLAIM_OVERDRAFT)).
///
/// Like every callback of the allocator, it leaves its context's current
/// group as it found it (a group it enters, or a reset to the root, is
/// undone when it returns).
///
/// If it panics and the panic unwinds (with `panic = abort` nothing
/// does), the panic goes on up the allocation that called it: the
/// context's marks are restored, no allocator lock is held, and the
/// allocation takes back its charge and makes nothing; the handler is
/// called again at the next out-of-memory. Through `GlobalAlloc`, which
/// must not unwind, the panic aborts the program instead.
pub type OomHandler<K> = fn(&K, usize) -> bool;

/// A [`Kmem`] type, named by one parameter: the handles ([`crate::Cgroup`],
/// [`crate::KmemCache`], ...) are generic over it, so code that names
/// them writes `Cgroup<'_, K>` (or `Cgroup<'_, Kmem<Region>>`) instead of
/// repeating the source, lock and platform types. Implemented by every
/// `Kmem` and nothing else.
pub trait Heap: sealed::Sealed {
    /// The page source.
    type Source: PageSource;
    /// The lock type of the allocator's caches and tree.
    type Lock: RawMutex;
    /// The platform.
    type Platform: Platform;
}

impl<S: PageSource, R: RawMutex, P: Platform> Heap for Kmem<S, R, P> {
    type Source = S;
    type Lock = R;
    type Platform = P;
}

mod sealed {
    /// Keeps [`super::Heap`] to `Kmem`s.
    pub trait Sealed {}
    impl<S: super::PageSource, R: super::RawMutex, P: super::Platform> Sealed for super::Kmem<S, R, P> {}
}

/// The `Kmem` a [`Heap`] names.
pub(crate) type KmemOf<K> = Kmem<<K as Heap>::Source, <K as Heap>::Lock, <K as Heap>::Platform>;

/// Hardened mode: marks `p` handed out by `cache`; an object handed out
/// twice means the heap is corrupt.
#[inline(always)]
pub(crate) fn hardened_on_alloc<R: RawMutex>(cache: &MagCache<R>, p: NonNull<u8>) {
    // SAFETY: `p` is an object the cache just handed out.
    if cfg!(feature = "hardened") && !unsafe { cache.cache.mark_allocated(p.as_ptr()) } {
        hardened_abort("kmemcg: an object was handed out twice (heap corruption)");
    }
}

/// Hardened mode: marks `p` freed in `cache`; freeing an object that is
/// not allocated is a double free.
#[inline(always)]
pub(crate) fn hardened_on_free<R: RawMutex>(cache: &MagCache<R>, p: NonNull<u8>) {
    // SAFETY: `p` is an object slot of `cache` (checked before in hardened
    // mode).
    if cfg!(feature = "hardened") && !unsafe { cache.cache.mark_freed(p.as_ptr()) } {
        hardened_abort("kmemcg: double free");
    }
}

/// An object just taken from `cache` and not yet handed out: freed back
/// when dropped, which happens only if a callback (a shrinker, the event
/// hook) reached before it is handed out unwinds; forgotten otherwise.
struct FreeOnUnwind<'a, S: PageSource, R: RawMutex, P: Platform> {
    kmem: &'a Kmem<S, R, P>,
    cache: &'a MagCache<R>,
    p: NonNull<u8>,
}

impl<S: PageSource, R: RawMutex, P: Platform> Drop for FreeOnUnwind<'_, S, R, P> {
    #[cold]
    fn drop(&mut self) {
        // Hardened mode checks the free against the allocation mark.
        hardened_on_alloc(self.cache, self.p);
        // SAFETY: an object `cache` handed out and nobody else has; freed
        // once (detection has not handed it out, so it frees plainly).
        unsafe { self.kmem.free_into(self.cache, self.p) };
    }
}

/// Stops the program if a callback of the allocator (a shrinker, the
/// event hook, the out-of-memory handler), called on an allocation path,
/// panics and unwinds out of a `GlobalAlloc` method: `GlobalAlloc` must
/// not unwind (its callers, `alloc::alloc` and the collections, assume
/// it never does). Made before the call and forgotten after it; the
/// allocation paths make it only in their out-of-line slow paths
/// ([`Kmem::no_unwind_special`]), so the fast path needs no landing pad (and no
/// stack frame); with `panic = abort` it never drops.
pub(crate) struct NoUnwind;

impl Drop for NoUnwind {
    #[cold]
    fn drop(&mut self) {
        // Only reached while unwinding: without `std` this panics again,
        // which aborts.
        crate::platform::report_abort(format_args!(
            "kmemcg: a callback (shrinker, event hook or out-of-memory handler) panicked inside GlobalAlloc, \
             which must not unwind; aborting"
        ));
    }
}

/// Stops the program: a `Kmem` was moved after its first use (see
/// `Kmem::settle`).
#[cold]
#[inline(never)]
fn moved() -> ! {
    crate::platform::fatal(
        "kmemcg: a Kmem was moved after its first use; keep it where it was first used (a static, a leaked Box)",
    )
}

/// [`moved`], typed to return, so that a caller can tail-call it (see
/// `Kmem::at_home`).
#[cold]
#[inline(never)]
fn moved_here() {
    moved()
}

/// The mode bits that send an allocation to [`Kmem::alloc_special`].
const SPECIAL: usize = mode::ARMED | mode::INJECT | mode::ENV | mode::BYTES;

/// Whether mode word `m` sends an allocation to its special path (as
/// [`Kmem::special`]).
#[inline(always)]
pub(crate) const fn special_in(m: usize) -> bool {
    m & SPECIAL != 0
}

/// A dangling, aligned pointer for zero-size blocks.
#[inline]
pub(crate) fn dangling(layout: core::alloc::Layout) -> NonNull<[u8]> {
    // SAFETY: an alignment is a non-zero power of two, so it is a non-null
    // address; a zero-length slice there is never dereferenced.
    let p = unsafe { NonNull::new_unchecked(core::ptr::without_provenance_mut::<u8>(layout.align())) };
    NonNull::slice_from_raw_parts(p, 0)
}

impl<S: PageSource, R: RawMutex> Kmem<S, R, DefaultPlatform> {
    crate::sync::loom_const_fn! {
        /// An allocator over `source` with the default platform (per-thread
        /// slots with `std`, none without); nothing is allocated until first
        /// use. (Under `--cfg loom` not `const`: build it inside the model.)
        pub fn new(source: S) -> Self {
            Self::with_platform(source, DefaultPlatform::new())
        }
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    crate::sync::loom_const_fn! {
        /// An allocator over `source` whose per-CPU slots and current groups
        /// `platform` tracks.
        pub fn with_platform(source: S, platform: P) -> Self {
            Kmem {
                source,
                platform,
                slots: Slots::new(),
                magazines: OneCell::new(Cache::new(MAGAZINE_GEOMETRY)),
                tree: OneCell::new(TreeBox::new(Tree::new())),
                large_allocs: Stat::new(),
                large_pages: Stat::new(),
                bad_frees: Stat::new(),
                detect: OneCell::new(debug::Detector::new(Detection::OFF)),
                decay: decay::Decayer::new(Decay::DEFAULT),
                oom: crate::sync::atomic_null(),
                home: crate::sync::atomic_usize(0),
                slab_cap: crate::sync::atomic_usize(fit::AUTO),
                last_oom: oom::OomRecord::new(),
            }
            .reading_env()
        }
    }

    crate::sync::loom_const_fn! {
        /// With `std`: read `KMEMCG_DEBUG` at the first allocation.
        fn reading_env(mut self) -> Self {
            if cfg!(all(feature = "std", not(loom))) {
                self.slots.set_initial_mode(mode::ENV);
            }
            self
        }
    }

    /// Whether allocations take the special path (detection, fault
    /// injection, or the environment still to read).
    #[inline(always)]
    pub(crate) fn special(&self) -> bool {
        self.slots.mode() & SPECIAL != 0
    }

    /// The mode word, for a caller that tests it more than once (atomic
    /// loads are not merged): with [`special_in`] and
    /// [`Kmem::current_in`].
    #[inline(always)]
    pub(crate) fn alloc_mode(&self) -> usize {
        self.slots.mode()
    }

    /// Whether detection is on (after reading the environment): sampling
    /// alone included, whose `DEBUG` bit is set only while a sampled
    /// object lives.
    pub(crate) fn detecting(&self) -> bool {
        self.resolve_mode() & mode::DEBUG != 0 || self.sampling()
    }

    /// The page source, e.g. to add regions to it.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The platform.
    pub fn platform(&self) -> &P {
        &self.platform
    }
    /// The slots' handshake state and the mode word (for the handle layer,
    /// which sets mode bits through the tree).
    #[inline(always)]
    pub(crate) fn slots_ref(&self) -> &Slots {
        &self.slots
    }

    /// The base cache of size class `c`: for a class found by the
    /// one-table lookup, one load of its offset in the `Kmem` (no load of
    /// the class index, no multiply, no add of the tree's offset).
    #[inline(always)]
    pub(crate) fn cache_of(&self, c: SizeClass) -> &MagCache<R> {
        // The caches are inline in the tree here, and `offset_in` gives
        // the offset of class `c`'s (below NCLASSES) in `Self` (its
        // `ClassArray`), in the classes' `CellArray`.
        #[cfg(not(any(loom, all(miri, feature = "std"))))]
        // SAFETY: so a `MagCache<R>` inside `*self`, of which only shared
        // references are ever made.
        return unsafe { &*core::ptr::from_ref(self).cast::<u8>().add(c.offset_in::<Self>()).cast::<MagCache<R>>() };
        #[cfg(any(loom, all(miri, feature = "std")))]
        // SAFETY: a class index is below NCLASSES.
        return unsafe { self.tree.classes().get_unchecked(c.index()) };
    }

    /// The group tree, for the handles and reports: checked with
    /// [`Kmem::settle`] (the allocation paths read the field itself).
    #[inline(always)]
    pub(crate) fn tree(&self) -> &Tree<R> {
        self.settle();
        &self.tree
    }

    /// The group tree, unchecked, for a caller whose borrow of this `Kmem`
    /// began after a use that checked it (a typed cache's handle, made
    /// through [`Kmem::tree`]): the borrow keeps it from moving since.
    #[inline(always)]
    pub(crate) fn tree_borrowed(&self) -> &Tree<R> {
        &self.tree
    }

    /// Stops the program if this `Kmem` was moved after its first use;
    /// makes this address its home on first use. Every path but a
    /// magazine hit calls it first (the slow paths, the page path, frees
    /// that read a slab's owner, every handle and report through
    /// [`Kmem::tree`]): from the first use on, slab headers name its
    /// size-class caches, groups its root and tree, tokens and large
    /// objects its groups, all by address. A magazine hit touches only the
    /// slot's magazines, which are not inside the `Kmem`; the objects it
    /// hands out still lead their frees to a check.
    ///
    /// Not `Pin`: a `static` never moves, and a `Kmem` built at run time
    /// may move freely until it is first used (into a `Box`, say); only a
    /// move after that stops the program, with a message, where it would
    /// otherwise follow dangling pointers.
    ///
    /// The first use also fits the slab order of every cache to the page
    /// source ([`Kmem::with_max_slab_order`]): the thread that makes it
    /// rewrites the geometries while every other thread waits here, and
    /// publishes them with the address.
    #[inline(always)]
    fn settle(&self) {
        let me = core::ptr::from_ref(self).addr();
        // Acquire: pairs with the Release that publishes the address after
        // the first use fitted the caches, so their geometries are read
        // after that write. (A thread that reads anything else takes the
        // CAS, which settles it for everyone.)
        if self.home.load(Ordering::Acquire) != me {
            self.settle_slow(me, true);
        }
    }

    /// [`Kmem::settle`] for an allocation, which may run in interrupt
    /// context: there it cannot wait for the first use to fit the caches
    /// (the context it interrupted may be the one fitting them), so it
    /// returns `false` instead, and the allocation fails.
    #[inline(always)]
    fn settle_alloc(&self) -> bool {
        let me = core::ptr::from_ref(self).addr();
        // Acquire: as in `settle`.
        self.home.load(Ordering::Acquire) == me || self.settle_slow(me, false)
    }

    /// The first use, or a wait for it; `false` only without `wait`, in
    /// interrupt context, while the caches are being fitted.
    #[cold]
    #[inline(never)]
    fn settle_slow(&self, me: usize, wait: bool) -> bool {
        loop {
            match self.home.compare_exchange(0, me | SETTLING, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => {
                    // This is the first use: no cache of this `Kmem` has a
                    // slab yet (every path that grows one settles first),
                    // and every other thread waits below until the Release
                    // store, which orders these writes before its reads.
                    // Not preempted meanwhile where others may wait for
                    // it with interrupts masked (`Platform::mask`).
                    let saved = self.platform.mask();
                    // SAFETY: as just said.
                    unsafe { self.fit_to_source() };
                    self.home.store(me, Ordering::Release);
                    // SAFETY: `saved` is this context's mask, and
                    // `fit_to_source` gave its locks back.
                    unsafe { self.platform.unmask(saved) };
                    return true;
                }
                Err(home) if home == me => return true,
                Err(home) if home == me | SETTLING && !wait && self.platform.in_interrupt() => return false,
                // Another context is fitting the caches (a few hundred
                // instructions and the source's lock, once per `Kmem`).
                Err(home) if home == me | SETTLING => crate::sync::spin_hint(),
                Err(_) => moved(),
            }
        }
    }

    /// [`Kmem::settle`] where the first use has certainly happened (a free
    /// of an object this `Kmem` made): whether this `Kmem` is where it was
    /// first used. A caller returns [`moved_here`] when not: a tail call,
    /// so it keeps no registers or stack alignment for it.
    #[inline(always)]
    fn at_home(&self) -> bool {
        self.home.load(Ordering::Relaxed) == core::ptr::from_ref(self).addr()
    }

    /// The node new slabs and runs should come from when no slot is held.
    #[inline]
    fn node(&self) -> usize {
        0
    }

    /// The identity of the calling context's current group, for shrinkers
    /// that record which group their objects were charged to.
    pub fn current_group_id(&self) -> GroupId {
        // SAFETY: the current group is live (the context holds a reference).
        match unsafe { self.current().as_ref() } {
            Some(g) => self.tree().group_id(g),
            None => GroupId::ROOT,
        }
    }

    /// The calling context's current group, or null for the root (also for
    /// a token that belongs to another allocator).
    #[inline]
    pub(crate) fn current(&self) -> *const Group<R> {
        self.current_in(self.slots.mode())
    }

    /// [`Kmem::current`] under mode word `m` ([`Kmem::alloc_mode`]).
    #[inline(always)]
    pub(crate) fn current_in(&self, m: usize) -> *const Group<R> {
        // Without groups, the platform's token need not be read at all;
        // interrupt context charges the root (not the interrupted task).
        if m & mode::GROUPS == 0 || self.platform.in_interrupt() {
            return core::ptr::null();
        }
        self.tree.charged_for(self.platform.current_group())
    }

    /// What CPU slot `slot`'s slow paths did (magazine hits and misses);
    /// see [`crate::SlotStats`]. On `PerCpu`, and `Rseq` in its rseq mode,
    /// CPU `i`'s slot is [`slot_for_cpu`](crate::slot_for_cpu)`(i)`.
    pub fn slot_stats(&self, slot: usize) -> crate::SlotStats {
        self.slots.stats(slot)
    }

    /// Registers a shrinker; safe while reclaim runs (a reclaim in progress
    /// uses the entries it copied). Registering one twice is a no-op. Any
    /// number can be registered: the list's table takes a page from the
    /// page source per 256 shrinkers, and [`Error::OutOfMemory`] comes
    /// back if it cannot grow.
    pub fn register_shrinker(&self, s: &'static dyn Shrinker) -> Result<(), Error> {
        self.tree.register_shrinker(&self.source, s)
    }

    /// Unregisters a shrinker; a reclaim already running may still call it
    /// once (it is `'static`, so that is safe).
    pub fn unregister_shrinker(&self, s: &'static dyn Shrinker) {
        self.tree.unregister_shrinker(s)
    }

    /// Sets the contention mark: when the root's usage is above `bytes`,
    /// allocation slow paths reclaim from groups over their soft limits
    /// (largest excess first). `usize::MAX` (the default): only when the
    /// page source is exhausted.
    pub fn set_contention_mark(&self, bytes: usize) {
        self.tree.set_contention_mark(if bytes == usize::MAX { usize::MAX } else { bytes / PAGE_SIZE });
    }

    /// Sets the out-of-memory handler (talc's `OomHandler`): called when
    /// the page source has no run for a slab or a large object even after
    /// reclaim, it may add memory to the source (`Kmem::source().add(..)`
    /// for a `Region`) and return `true`; the allocation then retries
    /// once. `None` removes it. Not called in interrupt context, nor from
    /// inside itself or a shrinker (those allocations fail instead).
    /// [`Kmem::last_oom`] tells it what the allocation was short of.
    pub fn set_oom_handler(&self, f: Option<OomHandler<Self>>) {
        let p = f.map_or(core::ptr::null_mut(), |f| f as *const () as *mut ());
        self.oom.store(p, Ordering::Release);
    }

    /// Runs the out-of-memory handler for `pages` pages; whether it added
    /// memory.
    #[cold]
    fn out_of_memory(&self, pages: usize) -> bool {
        // Acquire: pairs with the Release in `set_oom_handler`.
        let f = self.oom.load(Ordering::Acquire);
        if f.is_null() || self.platform.in_interrupt() {
            return false;
        }
        // The callback marks make the handler's own allocations atomic
        // (and let them overdraw a `max`), and a nested out-of-memory (or
        // one in a shrinker or an atomic scope) skips the handler. The
        // scope restores the marks and the current group (see
        // `CallbackScope`) when the handler returns or unwinds.
        let scope = self.tree.callback_scope(&self.platform, crate::cgroup::RECLAIMING | crate::cgroup::MEMALLOC);
        if !scope.may_run(crate::cgroup::RECLAIMING | crate::cgroup::ATOMIC) {
            return false;
        }
        // SAFETY: `oom` holds null or an `OomHandler<Self>` (only
        // `set_oom_handler` stores to it), and pointers to data and to
        // functions have one size here.
        let f = unsafe { core::mem::transmute::<*mut (), OomHandler<Self>>(f) };
        f(self, pages)
    }

    /// Sets the function called with every memory event of every group
    /// (`max`, `oom`, `high`, `low`, `min`; see [`crate::Event`]), so a
    /// program or kernel can react to a limit hit or an out-of-memory;
    /// `None` removes it. One hook per allocator; setting one replaces the
    /// last. The hook runs outside every allocator lock, where the event
    /// happens (any thread, an atomic scope, interrupt context): it must
    /// not block or allocate; see [`EventHook`] for the details.
    pub fn set_event_hook(&self, hook: Option<EventHook>) {
        self.tree.set_event_hook(hook);
    }

    /// Empties every magazine on every CPU and in every depot, gives every
    /// empty slab back to the page source, drains every charge stock, and
    /// trims the source. Returns the pages given back. (Linux
    /// `kmem_cache_shrink` on all caches.)
    pub fn shrink(&self) -> usize {
        self.settle();
        self.flush_quarantine();
        let pages = self.tree.shrink(self);
        self.magazines.shrink(&crate::slab::Pages::plain(&self.source));
        pages + self.source.trim()
    }

    /// Bonwick's working-set reap, for a periodic timer (he used 15 s):
    /// depot magazines unused since the last reap, the magazines of slots no
    /// thread holds, and those of slots unused since the last reap go back
    /// to the slabs; then empty slabs go back to the page source and the
    /// source is trimmed. Returns the pages given back. What a burst freed
    /// just before a reap is the working set of that interval: the next
    /// reap returns it if it stays unused. A reap waits for no thread: a
    /// slot in an operation at that instant is left for the next one
    /// (decay runs reaps inside allocations). With detection on, the
    /// quarantine and the retired sampled runs go back first (decay's
    /// reaps leave them: they are bounded, and what they are for is to
    /// keep freed memory unused for a while).
    pub fn reap(&self) -> usize {
        self.settle();
        self.flush_quarantine();
        self.reap_slots_and_slabs()
    }

    /// [`Kmem::reap`] without the quarantine: decay's.
    fn reap_slots_and_slabs(&self) -> usize {
        let idle = self.slots.reap_idle_mask();
        self.tree.reap(self, &idle) + self.source.trim()
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
    #[inline(always)]
    fn root_counter(&self) -> &PageCounter {
        self.tree.root().counter()
    }
    #[inline(always)]
    fn settle(&self) {
        Kmem::settle(self)
    }
    /// The quarantine holds freed objects, charged, in their slabs: reclaim
    /// and cache destruction empty it first (issue 26, items 7 and 8).
    fn flush_deferred(&self) {
        if self.slots.mode() & mode::DEBUG != 0 || self.sampling() {
            self.flush_quarantine();
        }
    }
    fn settle_deferred(&self) -> bool {
        self.settle_quarantine()
    }
    fn deferred_settled(&self) -> bool {
        self.quarantine_settled()
    }
}

/// Where the size classes' caches are in a `Kmem` (inline in its tree;
/// see `Tree`'s `ClassArray`), for [`Kmem::cache_of`].
#[cfg(not(any(loom, all(miri, feature = "std"))))]
impl<S: PageSource, R: RawMutex, P: Platform> crate::slab::classes::ClassArray for Kmem<S, R, P> {
    const BASE: usize = core::mem::offset_of!(Self, tree) + <Tree<R> as crate::slab::classes::ClassArray>::BASE;
    const STRIDE: usize = <Tree<R> as crate::slab::classes::ClassArray>::STRIDE;
}
