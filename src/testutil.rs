//! Helpers shared by the in-crate tests.

use std::boxed::Box;

/// A small deterministic PRNG (xorshift64*), so failures replay exactly.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub(crate) fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// A leaked buffer of `len` uninitialised bytes for a `Region` (not
/// touched here: under Miri, initialising megabytes byte by byte is slow).
pub(crate) fn arena(len: usize) -> &'static mut [core::mem::MaybeUninit<u8>] {
    Box::leak(Box::new_uninit_slice(len))
}

/// `n` in normal runs, `n / div` (at least 1) under Miri, which
/// interprets every instruction: how model tests shrink their op counts.
pub(crate) const fn scaled(n: usize, div: usize) -> usize {
    if cfg!(miri) { if n / div > 0 { n / div } else { 1 } } else { n }
}
