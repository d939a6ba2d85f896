//! Tests of the whole crate: the group API, pressure resources and reclaim
//! through the public handles, and (`--cfg loom`) loom models of the
//! concurrent protocols.
//!
//! Run the loom models with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --lib loom`

#[cfg(not(loom))]
mod groups;
#[cfg(not(loom))]
mod heap;
#[cfg(loom)]
mod loom_counter;
#[cfg(loom)]
mod loom_magazine;
#[cfg(loom)]
mod loom_tree;
#[cfg(not(loom))]
mod pressure;
#[cfg(not(loom))]
mod reclaim;
