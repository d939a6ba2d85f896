//! Run with: `cargo run --release --example debug_cost` (or alone: `cargo run --example testbin_kmemcg [ROUNDS]`)
//!
//! The test-binary workload of `support/testbin_workload.rs` with kmemcg
//! as the global allocator; prints the elapsed milliseconds of one run.

#[path = "support/testbin_workload.rs"]
mod workload;

#[global_allocator]
static A: kmemcg::Kmem = kmemcg::Kmem::new(kmemcg::OsPages::new());

fn main() {
    workload::main();
}
