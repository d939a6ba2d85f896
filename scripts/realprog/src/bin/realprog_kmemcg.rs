//! The real program with kmemcg as the global allocator; `KMEMCG_DEBUG`
//! chooses the detection (`0`: off, `sampled`: sampling alone, `1`: all).
//!
//! Run with: KMEMCG_DEBUG=sampled cargo run --release --bin realprog_kmemcg [records]

use kmemcg::{Kmem, OsPages};

#[global_allocator]
static KMEM: Kmem = Kmem::new(OsPages::new());

fn main() {
    realprog::main_with("kmemcg");
}
