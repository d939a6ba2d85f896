//! The one module that names `core::sync::atomic` or `loom`.
//!
//! Every other module imports its atomics, fences and spin hints from here,
//! so a `--cfg loom` build swaps the whole crate onto loom's model-checked
//! primitives without touching any other file. `.ci/run` greps the tree to
//! keep it that way.

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, compiler_fence, fence,
};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};

/// Loom has no compiler fence; a full fence is the conservative model.
#[cfg(loom)]
pub(crate) fn compiler_fence(order: Ordering) {
    fence(order)
}

/// An `UnsafeCell` with loom's `with`/`with_mut` API on both sides, so loom
/// can check every access to per-CPU state for races.
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(#[cfg(not(loom))] core::cell::UnsafeCell<T>, #[cfg(loom)] loom::cell::UnsafeCell<T>);

impl<T> UnsafeCell<T> {
    #[cfg(not(loom))]
    pub(crate) const fn new(v: T) -> Self {
        UnsafeCell(core::cell::UnsafeCell::new(v))
    }
    #[cfg(loom)]
    pub(crate) fn new(v: T) -> Self {
        UnsafeCell(loom::cell::UnsafeCell::new(v))
    }
    /// Runs `f` with a mutable raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<F: FnOnce(*mut T) -> U, U>(&self, f: F) -> U {
        #[cfg(not(loom))]
        return f(self.0.get());
        #[cfg(loom)]
        return self.0.with_mut(f);
    }
}

/// A spin lock over this module's atomics, usable as a `lock_api::RawMutex`
/// under loom (spin's own lock uses `core` atomics, which loom cannot see).
/// Normal builds use it nowhere but tests; loom models pass it as `R`.
#[cfg(loom)]
pub(crate) struct LoomRawMutex(std::sync::OnceLock<AtomicBool>);

#[cfg(loom)]
impl LoomRawMutex {
    fn flag(&self) -> &AtomicBool {
        self.0.get_or_init(|| AtomicBool::new(false))
    }
}

// SAFETY: `lock` returns only after swapping the flag from false to true
// with Acquire, `unlock` stores false with Release: one holder at a time,
// and each holder sees what the previous one wrote.
#[cfg(loom)]
unsafe impl lock_api::RawMutex for LoomRawMutex {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = LoomRawMutex(std::sync::OnceLock::new());
    type GuardMarker = lock_api::GuardSend;
    fn lock(&self) {
        while !self.try_lock() {
            spin_hint();
        }
    }
    fn try_lock(&self) -> bool {
        self.flag().compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }
    unsafe fn unlock(&self) {
        self.flag().store(false, Ordering::Release);
    }
}

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
const_atomic_ctor!(atomic_u8, AtomicU8, u8);
const_atomic_ctor!(atomic_u32, AtomicU32, u32);
const_atomic_ctor!(atomic_u64, AtomicU64, u64);

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
