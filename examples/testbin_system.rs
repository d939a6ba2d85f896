//! Run with: `cargo run --release --example debug_cost` (or alone: `cargo run --example testbin_system [ROUNDS]`)
//!
//! The test-binary workload of `support/testbin_workload.rs` with
//! `std::alloc::System` (glibc malloc) as the global allocator, the
//! baseline of `debug_cost`; prints the elapsed milliseconds of one run.

#[path = "support/testbin_workload.rs"]
mod workload;

#[global_allocator]
static A: std::alloc::System = std::alloc::System;

fn main() {
    workload::main();
}
