//! [`Published`]: a value one CPU sets up, leaks and publishes, that the
//! others then find, typed: the shared state of the SMP tests, whose type
//! depends on the kernel's `kmemcg::Cpu`, behind one non-generic static.

use alloc::boxed::Box;
use core::any::TypeId;
use core::sync::atomic::{AtomicPtr, Ordering};

/// A leaked value with its type's id first, so a reader can check the
/// type before it reads the value.
#[repr(C)]
struct Tagged<T> {
    type_id: fn() -> TypeId,
    value: T,
}

/// A slot for one published `&'static T`, `T` fixed by the first
/// [`publish`](Published::publish).
pub struct Published {
    /// Null, or a leaked `Tagged<T>`, never freed.
    ptr: AtomicPtr<()>,
}

impl Published {
    /// An empty slot.
    pub const fn new() -> Self {
        Published { ptr: AtomicPtr::new(core::ptr::null_mut()) }
    }

    /// Leaks `value` and publishes it (`Release`); returns it.
    pub fn publish<T: 'static + Sync>(&self, value: T) -> &'static T {
        let tagged = Box::leak(Box::new(Tagged { type_id: TypeId::of::<T>, value }));
        self.ptr.store((tagged as *mut Tagged<T>).cast(), Ordering::Release);
        &tagged.value
    }

    /// The published value, if any (`Acquire`). Panics if it is not a `T`.
    pub fn get<T: 'static + Sync>(&self) -> Option<&'static T> {
        let p = self.ptr.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: a leaked `Tagged<U>` for some `U`, never freed; its
        // first field (`repr(C)`) is a `fn() -> TypeId` whatever `U` is.
        let type_id = unsafe { *p.cast::<fn() -> TypeId>() };
        assert!(type_id() == TypeId::of::<T>(), "a published value read as another type");
        // SAFETY: as above, and `U` is `T` (checked).
        Some(unsafe { &(*p.cast::<Tagged<T>>()).value })
    }

    /// Waits until a value is published, then returns it.
    pub fn wait<T: 'static + Sync>(&self) -> &'static T {
        loop {
            if let Some(v) = self.get() {
                return v;
            }
            core::hint::spin_loop();
        }
    }
}

impl Default for Published {
    fn default() -> Self {
        Self::new()
    }
}
