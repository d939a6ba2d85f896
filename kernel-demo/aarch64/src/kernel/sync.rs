//! A reusable barrier for the CPUs of the self-test, and a cell for one
//! CPU's failure message.

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use super::cpu;

/// Spins before a waiting CPU sleeps until its next interrupt (the timer
/// wakes it within a tick); spinning vCPUs slow the others under TCG.
const SPINS_BEFORE_WFI: usize = 2000;

/// A barrier for a fixed number of CPUs, reusable (generation count).
pub struct Barrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl Barrier {
    /// A barrier for `n` CPUs.
    pub const fn new(n: usize) -> Self {
        Barrier { n, arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0) }
    }

    /// Waits until all `n` CPUs have called `wait` (for this generation).
    /// Everything each CPU did before is visible to all after. Call with
    /// IRQs enabled and the timer running (the wait may sleep in `wfi`).
    pub fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.store(generation + 1, Ordering::Release);
            return;
        }
        let mut spins = 0;
        while self.generation.load(Ordering::Acquire) == generation {
            if spins < SPINS_BEFORE_WFI {
                spins += 1;
                core::hint::spin_loop();
            } else {
                cpu::wait_for_interrupt();
            }
        }
    }
}

/// The first failure message of one CPU (written by that CPU only).
pub struct Failure {
    msg: AtomicPtr<u8>,
    len: AtomicUsize,
}

impl Failure {
    /// No failure.
    pub const fn new() -> Self {
        Failure { msg: AtomicPtr::new(core::ptr::null_mut()), len: AtomicUsize::new(0) }
    }

    /// Records `msg` unless a failure is already recorded.
    pub fn set(&self, msg: &'static str) {
        if self.msg.load(Ordering::Relaxed).is_null() {
            self.len.store(msg.len(), Ordering::Relaxed);
            self.msg.store(msg.as_ptr().cast_mut(), Ordering::Release);
        }
    }

    /// The recorded failure.
    pub fn get(&self) -> Option<&'static str> {
        let p = self.msg.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        let len = self.len.load(Ordering::Relaxed);
        // SAFETY: `set` stored the pointer and length of a `&'static str`
        // (the length before the pointer's Release store).
        Some(unsafe { core::str::from_utf8_unchecked(core::slice::from_raw_parts(p, len)) })
    }
}
