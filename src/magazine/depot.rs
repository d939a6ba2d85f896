//! A node's depot: the spare full and empty magazines of one cache.

use core::ptr::{self, NonNull};

use super::Magazine;

/// One node's spare magazines of one cache: a stack of full ones and a
/// stack of empty ones.
pub(super) struct Depot {
    pub(super) full: Stack,
    pub(super) empty: Stack,
}

/// A stack of magazines linked through `Magazine::next`, with its depth.
pub(super) struct Stack {
    top: *mut Magazine,
    /// Magazines on the stack.
    pub(super) len: usize,
    /// Lowest `len` since the last reap: the magazines the working set did
    /// not need, which `reap` gives back.
    pub(super) min: usize,
}

// SAFETY: the magazines are owned by the depot and only reached through
// the lock that wraps it.
unsafe impl Send for Depot {}

impl Depot {
    pub(super) const fn new() -> Self {
        Depot { full: Stack::new(), empty: Stack::new() }
    }
}

impl Stack {
    const fn new() -> Self {
        // No magazine has been used yet: everything is outside the working
        // set until a pop lowers the minimum.
        Stack { top: ptr::null_mut(), len: 0, min: usize::MAX }
    }

    /// Pushes `m`.
    ///
    /// # Safety
    ///
    /// `m` is a magazine owned by the caller, full for the full stack and
    /// empty for the empty one.
    pub(super) unsafe fn push(&mut self, m: *mut Magazine) {
        // SAFETY: per the contract.
        unsafe { (*m).next = self.top };
        self.top = m;
        self.len += 1;
    }

    /// Pops the top magazine, which becomes the caller's.
    pub(super) fn pop(&mut self) -> Option<*mut Magazine> {
        let m = NonNull::new(self.top)?.as_ptr();
        // SAFETY: a magazine on our stack.
        self.top = unsafe { (*m).next };
        self.len -= 1;
        self.min = self.min.min(self.len);
        Some(m)
    }

    /// Magazines unused since the last reap; starts the next interval.
    pub(super) fn take_unused(&mut self) -> usize {
        let unused = self.min.min(self.len);
        self.min = self.len;
        unused
    }
}
