//! `Threads` with a hook before every `enter` and `try_enter`, for tests
//! that slow a thread down or take its slot away (`enter` may return
//! `None`: the operation takes the shared path). Shared by the
//! integration tests that include it with
//! `#[path = "support/hooked.rs"] mod hooked;`.

use kmemcg::{Platform, Threads};

/// `Threads`, whose `enter` first calls `before_enter` and gives no slot
/// where it returns `false`.
pub struct Hooked {
    pub inner: Threads,
    pub before_enter: fn() -> bool,
}

impl Hooked {
    pub const fn new(before_enter: fn() -> bool) -> Hooked {
        Hooked { inner: Threads::new(), before_enter }
    }
}

// SAFETY: every slot method forwards to `Threads`, which keeps the
// contract, or returns `None` from `enter`/`try_enter`, which it allows;
// the hooks of the tests allocate nothing and call nothing of the
// allocator.
unsafe impl Platform for Hooked {
    fn current_group(&self) -> *const () {
        self.inner.current_group()
    }
    unsafe fn set_current_group(&self, token: *const ()) -> *const () {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.set_current_group(token) }
    }
    unsafe fn enter(&self) -> Option<usize> {
        if !(self.before_enter)() {
            return None;
        }
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.enter() }
    }
    unsafe fn try_enter(&self) -> Option<usize> {
        if !(self.before_enter)() {
            return None;
        }
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.try_enter() }
    }
    unsafe fn exit(&self, slot: usize) {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.exit(slot) }
    }
    fn asymmetric(&self) -> bool {
        self.inner.asymmetric()
    }
    fn heavy_barrier(&self) {
        self.inner.heavy_barrier()
    }
    unsafe fn steal(&self, slot: usize) -> bool {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.steal(slot) }
    }
    unsafe fn unsteal(&self, slot: usize) {
        // SAFETY: forwarded: the caller upholds the contract.
        unsafe { self.inner.unsteal(slot) }
    }
}
