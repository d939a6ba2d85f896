//! Global layer: `GlobalAlloc` and the `Allocator` trait for [`Kmem`].
//!
//! Bad input gets null (or `AllocError`), never a panic: zero-size layouts,
//! sizes whose rounding overflows, and an exhausted page source.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{self, NonNull};

use allocator_api2::alloc::{AllocError, Allocator};
use lock_api::RawMutex;

use crate::heap::Kmem;
use crate::platform::{PageSource, Platform};

// SAFETY: `alloc_layout` returns null or a block of at least `layout.size()`
// bytes aligned to `layout.align()` that overlaps no live block; `dealloc`
// and `realloc` accept exactly what `alloc` returned with the same layout,
// and realloc keeps the old block intact when it fails. Nothing unwinds.
unsafe impl<S: PageSource, R: RawMutex, P: Platform> GlobalAlloc for Kmem<S, R, P> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.alloc_layout(layout).map_or(ptr::null_mut(), NonNull::as_ptr)
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(p) = NonNull::new(ptr) {
            // SAFETY: the caller passes a block of ours with its layout.
            unsafe { self.free_raw(p, layout.size(), layout.align()) }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(p) = NonNull::new(ptr) else { return ptr::null_mut() };
        // SAFETY: the caller passes a block of ours with its layout.
        unsafe { self.realloc_raw(p, layout.size(), layout.align(), new_size) }.map_or(ptr::null_mut(), NonNull::as_ptr)
    }
}

// SAFETY: forwards to the `GlobalAlloc` of `Kmem`, which is sound.
unsafe impl<S: PageSource, R: RawMutex, P: Platform> GlobalAlloc for &Kmem<S, R, P> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { (**self).alloc(layout) }
    }
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { (**self).dealloc(ptr, layout) }
    }
    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { (**self).realloc(ptr, layout, new_size) }
    }
}

/// A dangling, aligned pointer for zero-size blocks.
#[inline]
fn dangling(layout: Layout) -> NonNull<[u8]> {
    // SAFETY: an alignment is a non-zero power of two, so it is a non-null
    // address; a zero-length slice there is never dereferenced.
    let p = unsafe { NonNull::new_unchecked(ptr::without_provenance_mut::<u8>(layout.align())) };
    NonNull::slice_from_raw_parts(p, 0)
}

// SAFETY: blocks are valid for their layout until deallocated, do not move
// when the handle is copied (all copies share one `Kmem`), and `grow` and
// `shrink` either keep the block or move it preserving its contents; the
// usable length reported is the class or page-run size, which any size
// between the request and it maps back to.
unsafe impl<S: PageSource, R: RawMutex, P: Platform> Allocator for &Kmem<S, R, P> {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        let p = self.alloc_layout(layout).ok_or(AllocError)?;
        let len = Kmem::<S, R, P>::usable_size(layout.size(), layout.align());
        Ok(NonNull::slice_from_raw_parts(p, len))
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller passes a block of ours with a fitting layout;
        // every size that fits maps to the same class or page count.
        unsafe { self.free_raw(ptr, layout.size(), layout.align()) }
    }

    unsafe fn grow(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller (`new.size() >= old.size()`).
        unsafe { self.resize(ptr, old, new) }
    }

    unsafe fn shrink(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller (`new.size() <= old.size()`).
        unsafe { self.resize(ptr, old, new) }
    }
}

impl<S: PageSource, R: RawMutex, P: Platform> Kmem<S, R, P> {
    /// `grow`/`shrink` of the `Allocator` impl.
    ///
    /// # Safety
    ///
    /// `ptr` is a live block of ours allocated with a layout that `old` fits.
    unsafe fn resize(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let len = Self::usable_size(new.size(), new.align());
        if old.size() == 0 {
            return Allocator::allocate(&self, new);
        }
        if new.size() == 0 {
            // SAFETY: forwarded.
            unsafe { self.free_raw(ptr, old.size(), old.align()) };
            return Ok(dangling(new));
        }
        if old.align() == new.align() {
            // SAFETY: forwarded.
            let p = unsafe { self.realloc_raw(ptr, old.size(), old.align(), new.size()) }.ok_or(AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(p, len));
        }
        let fresh = Allocator::allocate(&self, new)?;
        // SAFETY: both blocks are live and distinct; the copy is no longer
        // than either.
        unsafe {
            ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.as_ptr() as *mut u8, old.size().min(new.size()));
            self.free_raw(ptr, old.size(), old.align());
        }
        Ok(fresh)
    }
}
