//! Loom models of the crate's concurrent protocols (`--cfg loom`).
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --lib loom`

mod loom_counter;
mod loom_magazine;
