//! [`IrqLock`]: a spin lock over a `T` that masks interrupts (through a
//! kernel's `kmemcg::Cpu`) while held, so interrupt handlers and other
//! CPUs can share it.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, Ordering};

/// A spin lock over a `T` that masks interrupts on the holding CPU
/// through `C` while held. Not reentrant.
pub struct IrqLock<C, T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
    cpu: PhantomData<fn() -> C>,
}

// SAFETY: the value is only reached through `with`, by one holder at a
// time, and may be handed between CPUs (`T: Send`).
unsafe impl<C, T: Send> Sync for IrqLock<C, T> {}

impl<C: kmemcg::Cpu, T> IrqLock<C, T> {
    /// An unlocked lock over `value`.
    pub const fn new(value: T) -> Self {
        IrqLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value), cpu: PhantomData }
    }

    /// Runs `f` on the value with the lock held and interrupts masked.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let saved = C::irq_save();
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            core::hint::spin_loop();
        }
        // SAFETY: the lock is held: nobody else reaches the value.
        let r = f(unsafe { &mut *self.value.get() });
        self.locked.store(false, Ordering::Release);
        // SAFETY: saved above on this CPU.
        unsafe { C::irq_restore(saved) };
        r
    }
}
