//! Global layer: `GlobalAlloc` and the `Allocator` trait for [`Kmem`].
//!
//! Bad input gets null (or `AllocError`), never a panic: zero-size layouts,
//! sizes whose rounding overflows, and an exhausted page source.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{self, NonNull};

use lock_api::RawMutex;

use crate::cgroup::Group;
use crate::handle::CgroupAllocator;
use crate::heap::{Heap, Kmem, NoUnwind, dangling};
use crate::platform::{PageSource, Platform};

// SAFETY: `alloc_layout` returns null or a block of at least `layout.size()`
// bytes aligned to `layout.align()` that overlaps no live block; `dealloc`
// and `realloc` accept exactly what `alloc` returned with the same layout,
// and realloc keeps the old block intact when it fails. Nothing unwinds:
// the allocator itself never panics, and a callback that unwinds through
// `alloc` (its slow paths, `Kmem::no_unwind_special`) or `realloc` aborts
// ([`NoUnwind`]).
unsafe impl<S: PageSource, R: RawMutex, P: Platform> GlobalAlloc for Kmem<S, R, P> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.alloc_layout_global(layout).map_or(ptr::null_mut(), NonNull::as_ptr)
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // `GlobalAlloc`'s contract makes `ptr` a block of ours, so never
        // null, and a release build does not test it (two instructions
        // on every free; jemalloc's `sdallocx` does not either). Debug
        // and `hardened` builds, which check every free, count (and
        // `hardened` aborts on) a null as a pointer no cache owns.
        if (cfg!(debug_assertions) || cfg!(feature = "hardened")) && ptr.is_null() {
            return self.bad_free();
        }
        // SAFETY: `ptr` is not null: the caller passes a block of ours
        // with its layout (and checked builds tested it above).
        unsafe { self.free_raw(NonNull::new_unchecked(ptr), layout.size(), layout.align()) }
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(p) = NonNull::new(ptr) else { return ptr::null_mut() };
        let guard = NoUnwind;
        // SAFETY: the caller passes a block of ours with its layout.
        let q = unsafe { self.realloc_raw(p, layout.size(), layout.align(), new_size) }
            .map_or(ptr::null_mut(), NonNull::as_ptr);
        core::mem::forget(guard);
        q
    }
}

// SAFETY: forwards to the `GlobalAlloc` of `Kmem`, which is sound.
unsafe impl<S: PageSource, R: RawMutex, P: Platform> GlobalAlloc for &Kmem<S, R, P> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { (**self).alloc(layout) }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { (**self).dealloc(ptr, layout) }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { (**self).realloc(ptr, layout, new_size) }
    }
}

/// The `GlobalAlloc` entry points of the default `Kmem` (and `&Kmem`),
/// compiled here in debug builds with `std` (see the README's
/// "Debug builds"): rustc lets a crate built at opt-level 0 or 1 use a
/// generic instance an upstream crate built at opt-level 0 or 1 already
/// compiled, so a user's debug build that sets `opt-level = 1` for kmemcg
/// runs this optimised copy instead of compiling its own at opt-level 0.
/// (The entry points are not `#[inline]` in debug builds for the same
/// reason: an inline instance is private to each crate.)
#[cfg(all(feature = "std", debug_assertions, not(loom)))]
#[used]
static DEFAULT_ENTRY_POINTS: (EntryPoints<Kmem>, EntryPoints<&'static Kmem>) = (
    (<Kmem as GlobalAlloc>::alloc, <Kmem as GlobalAlloc>::dealloc, <Kmem as GlobalAlloc>::realloc),
    (
        <&'static Kmem as GlobalAlloc>::alloc,
        <&'static Kmem as GlobalAlloc>::dealloc,
        <&'static Kmem as GlobalAlloc>::realloc,
    ),
);

/// `alloc`, `dealloc` and `realloc` of a `GlobalAlloc` `A`.
#[cfg(all(feature = "std", debug_assertions, not(loom)))]
type EntryPoints<A> = (
    unsafe fn(&A, Layout) -> *mut u8,
    unsafe fn(&A, *mut u8, Layout),
    unsafe fn(&A, *mut u8, Layout, usize) -> *mut u8,
);

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// `Allocator::allocate` charging `g` (null: root): `None` for
    /// `AllocError`.
    #[inline]
    fn block_allocate(&self, g: *const Group<R>, layout: Layout) -> Option<NonNull<[u8]>> {
        if layout.size() == 0 {
            return Some(dangling(layout));
        }
        let p = self.alloc_layout_in(g, layout)?;
        Some(NonNull::slice_from_raw_parts(p, self.usable_size(layout.size(), layout.align())))
    }

    /// `grow`/`shrink` of the `Allocator` impls, charging a new block to
    /// `g` (null: root): `None` for `AllocError`, leaving the block as it
    /// was. In place when the class or page count allows.
    ///
    /// # Safety
    ///
    /// `ptr` is a live block of ours allocated with a layout that `old` fits.
    unsafe fn block_resize(
        &self,
        g: *const Group<R>,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Option<NonNull<[u8]>> {
        if old.size() == 0 {
            return self.block_allocate(g, new);
        }
        if new.size() == 0 {
            // SAFETY: forwarded.
            unsafe { self.free_raw(ptr, old.size(), old.align()) };
            return Some(dangling(new));
        }
        // SAFETY: forwarded.
        if old.align() == new.align() && unsafe { self.resize_in_place(ptr, old.size(), old.align(), new.size()) } {
            return Some(NonNull::slice_from_raw_parts(ptr, self.usable_size(new.size(), new.align())));
        }
        let fresh = if new.size() > old.size() && self.grows_onto_pages(new.size(), new.align()) {
            let p = self.alloc_large(g, new.size(), new.align(), true)?;
            NonNull::slice_from_raw_parts(p, self.usable_size(new.size(), new.align()))
        } else {
            self.block_allocate(g, new)?
        };
        // SAFETY: both blocks are live and distinct; the copy is no longer
        // than either.
        unsafe {
            ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.as_ptr() as *mut u8, old.size().min(new.size()));
            self.free_moved(ptr, old.size(), old.align());
        }
        Some(fresh)
    }
}

/// What the `Allocator` impls are written over: the handles that hand out
/// blocks (`&Kmem`, [`CgroupAllocator`]); `None` stands for `AllocError`.
///
/// # Safety
///
/// Implementors keep the `Allocator` contract: a block from `alloc_block`
/// is valid for its layout until freed through any copy of the handle,
/// `resize_block` keeps the block or moves it with its contents (leaving it
/// untouched on `None`), and the length reported maps back to the block.
unsafe trait Blocks {
    fn alloc_block(&self, layout: Layout) -> Option<NonNull<[u8]>>;
    /// # Safety
    ///
    /// `ptr` is a live block of this handle's `Kmem` that `layout` fits.
    unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout);
    /// # Safety
    ///
    /// `ptr` is a live block of this handle's `Kmem` that `old` fits.
    unsafe fn resize_block(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<[u8]>>;
}

// SAFETY: blocks are valid for their layout until deallocated, do not move
// when the handle is copied (all copies share one `Kmem`), and resizing
// either keeps the block or moves it preserving its contents; the usable
// length reported is the class or page-run size, which any size between
// the request and it maps back to.
unsafe impl<S: PageSource, R: RawMutex, P: Platform> Blocks for &Kmem<S, R, P> {
    #[inline]
    fn alloc_block(&self, layout: Layout) -> Option<NonNull<[u8]>> {
        if layout.size() == 0 {
            return Some(dangling(layout));
        }
        let p = self.alloc_layout(layout)?;
        Some(NonNull::slice_from_raw_parts(p, (**self).usable_size(layout.size(), layout.align())))
    }
    #[inline]
    unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: a block of ours with a fitting layout (caller); every size
        // that fits maps to the same class or page count.
        unsafe { self.free_raw(ptr, layout.size(), layout.align()) }
    }
    unsafe fn resize_block(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<[u8]>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.block_resize(self.current(), ptr, old, new) }
    }
}

// SAFETY: blocks come from the same `Kmem` paths as `&Kmem`'s (sound for
// the same reasons), only charged to a fixed group; all clones share one
// `Kmem`, so a block from one clone can be freed by another; frees find
// the owning cache from the slab, not the handle.
unsafe impl<K: Heap> Blocks for CgroupAllocator<'_, K> {
    fn alloc_block(&self, layout: Layout) -> Option<NonNull<[u8]>> {
        self.kmem().block_allocate(self.charged(), layout)
    }
    unsafe fn free_block(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: forwarded; frees uncharge the slab's owner.
        unsafe { self.kmem().free_raw(ptr, layout.size(), layout.align()) }
    }
    unsafe fn resize_block(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<[u8]>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.kmem().block_resize(self.charged(), ptr, old, new) }
    }
}

/// One resize method of an `Allocator` impl (`grow` or `shrink`), over
/// [`Blocks::resize_block`].
macro_rules! resize_method {
    ($api:ident, $name:ident) => {
        unsafe fn $name(
            &self,
            ptr: NonNull<u8>,
            old: Layout,
            new: Layout,
        ) -> Result<NonNull<[u8]>, $api::alloc::AllocError> {
            // SAFETY: forwarded from the caller (`grow`: `new.size() >=
            // old.size()`, `shrink`: `<=`; `resize_block` takes both).
            unsafe { self.resize_block(ptr, old, new) }.ok_or($api::alloc::AllocError)
        }
    };
}

/// Implements one `allocator-api2` version's `Allocator` for a handle
/// type, over its [`Blocks`].
macro_rules! allocator_impl {
    ($api:ident, [$($generics:tt)*] $handle:ty) => {
        // SAFETY: `Blocks`'s contract is `Allocator`'s.
        unsafe impl<$($generics)*> $api::alloc::Allocator for $handle {
            #[inline]
            fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, $api::alloc::AllocError> {
                self.alloc_block(layout).ok_or($api::alloc::AllocError)
            }

            #[inline]
            unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
                // SAFETY: forwarded from the caller.
                unsafe { self.free_block(ptr, layout) }
            }

            resize_method!($api, grow);
            resize_method!($api, shrink);
        }
    };
}

allocator_impl!(allocator_api2, [S: PageSource, R: RawMutex, P: Platform] &Kmem<S, R, P>);
allocator_impl!(allocator_api2, [K: Heap] CgroupAllocator<'_, K>);
#[cfg(feature = "allocator-api2-04")]
allocator_impl!(allocator_api2_04, [S: PageSource, R: RawMutex, P: Platform] &Kmem<S, R, P>);
#[cfg(feature = "allocator-api2-04")]
allocator_impl!(allocator_api2_04, [K: Heap] CgroupAllocator<'_, K>);
