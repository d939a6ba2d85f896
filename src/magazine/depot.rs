//! A node's depot: the spare full and empty magazines of one cache.

use core::ptr::{self, NonNull};

use super::Magazine;

/// One node's spare magazines of one cache.
pub(super) struct Depot {
    pub(super) full: *mut Magazine,
    pub(super) empty: *mut Magazine,
    pub(super) nfull: usize,
    pub(super) nempty: usize,
    /// Lowest `nfull`/`nempty` since the last reap: the magazines the
    /// working set did not need, which `reap` gives back.
    pub(super) min_full: usize,
    pub(super) min_empty: usize,
}

// SAFETY: the magazines are owned by the depot and only reached through
// the lock that wraps it.
unsafe impl Send for Depot {}

impl Depot {
    pub(super) const fn new() -> Self {
        // No magazine has been used yet: everything is outside the
        // working set until a pop lowers the minimum.
        Depot {
            full: ptr::null_mut(),
            empty: ptr::null_mut(),
            nfull: 0,
            nempty: 0,
            min_full: usize::MAX,
            min_empty: usize::MAX,
        }
    }

    /// # Safety
    ///
    /// `m` is a full magazine owned by the caller.
    pub(super) unsafe fn push_full(&mut self, m: *mut Magazine) {
        // SAFETY: per the contract.
        unsafe { (*m).next = self.full };
        self.full = m;
        self.nfull += 1;
    }

    /// # Safety
    ///
    /// `m` is an empty magazine owned by the caller.
    pub(super) unsafe fn push_empty(&mut self, m: *mut Magazine) {
        // SAFETY: per the contract.
        unsafe { (*m).next = self.empty };
        self.empty = m;
        self.nempty += 1;
    }

    pub(super) fn pop_full(&mut self) -> Option<*mut Magazine> {
        let m = NonNull::new(self.full)?.as_ptr();
        // SAFETY: a magazine on our list.
        self.full = unsafe { (*m).next };
        self.nfull -= 1;
        self.min_full = self.min_full.min(self.nfull);
        Some(m)
    }

    pub(super) fn pop_empty(&mut self) -> Option<*mut Magazine> {
        let m = NonNull::new(self.empty)?.as_ptr();
        // SAFETY: a magazine on our list.
        self.empty = unsafe { (*m).next };
        self.nempty -= 1;
        self.min_empty = self.min_empty.min(self.nempty);
        Some(m)
    }
}
