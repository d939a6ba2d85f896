//! A small xorshift generator for the tests' random programs.

/// xorshift64: seed with any nonzero value.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (not quite uniform; enough for a test).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
