//! The real program with the system allocator (built plain, and with
//! `-Zsanitizer=address` for AddressSanitizer).
//!
//! Run with: cargo run --release --bin realprog_system [records]

fn main() {
    realprog::main_with("system");
}
