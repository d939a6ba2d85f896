//! The one module that names `core::sync::atomic` or `loom`.
//!
//! Every other module imports its atomics, fences and spin hints from here,
//! so a `--cfg loom` build swaps the whole crate onto loom's model-checked
//! primitives without touching any other file. `.ci/run` greps the tree to
//! keep it that way.

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// One step of a spin-wait loop: a CPU pause hint normally, a yield to the
/// scheduler under loom (so a model with a spinning thread still terminates).
#[inline]
#[allow(dead_code)]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// `const` constructors for atomics in normal builds; loom's atomics are not
/// `const`, so under loom these become ordinary functions (crossbeam's
/// `const_fn!` pattern). Components built in loom models call them at run time.
macro_rules! const_atomic_ctor {
    ($name:ident, $ty:ty, $arg:ty) => {
        #[cfg(not(loom))]
        #[inline]
        pub(crate) const fn $name(v: $arg) -> $ty {
            <$ty>::new(v)
        }
        #[cfg(loom)]
        #[inline]
        pub(crate) fn $name(v: $arg) -> $ty {
            <$ty>::new(v)
        }
    };
}
const_atomic_ctor!(atomic_usize, AtomicUsize, usize);
const_atomic_ctor!(atomic_bool, AtomicBool, bool);

/// A null `AtomicPtr`, `const` in normal builds.
#[cfg(not(loom))]
#[inline]
pub(crate) const fn atomic_null<T>() -> AtomicPtr<T> {
    AtomicPtr::new(core::ptr::null_mut())
}
/// A null `AtomicPtr` (loom: not `const`).
#[cfg(loom)]
#[inline]
pub(crate) fn atomic_null<T>() -> AtomicPtr<T> {
    AtomicPtr::new(core::ptr::null_mut())
}

/// A statistics counter: `Relaxed` increments and reads.
///
/// Relaxed is enough because no decision that guards memory safety is taken
/// on a statistic; readers (reports, tests after joining threads) tolerate a
/// value that is momentarily behind. Tests read them after a join, which
/// orders all earlier increments.
pub(crate) struct Stat(AtomicUsize);

impl Stat {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        Stat(AtomicUsize::new(0))
    }
    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        Stat(AtomicUsize::new(0))
    }
    #[inline]
    pub(crate) fn add(&self, n: usize) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn sub(&self, n: usize) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}
