//! [`Failure`]: the first failure message of one CPU of an SMP test.

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

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

impl Default for Failure {
    fn default() -> Self {
        Self::new()
    }
}
