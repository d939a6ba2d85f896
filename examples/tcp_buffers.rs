//! Run with: `cargo run --release --example tcp_buffers`
//!
//! Seed 003 made real: a TCP echo server on 127.0.0.1 whose connections
//! belong to tenant groups, each tenant's receive buffers charged to its
//! `"tcp"` pressure resource (min 64 KiB, pressure 384 KiB, max 512 KiB,
//! under a host group with a 4 MiB max). Under pressure the server stops
//! growing buffers and reads less; over max it refuses growth and backs
//! off, so the client sees backpressure, not an error. Two modest tenants
//! and a greedy one (8 connections, 256 KiB requests) run for three
//! seconds; the table shows bytes echoed, pressure entries and refusals.

#[path = "support/tcp_demo.rs"]
mod tcp_demo;

use std::time::Duration;

use kmemcg::{Kmem, OsPages};

#[global_allocator]
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

fn main() {
    let tenants = tcp_demo::tenants(&KMEM);
    tcp_demo::run(&tenants, Duration::from_secs(3));
    print!("{}", tcp_demo::table(&tenants));
    for t in &tenants {
        println!("{}", t.group.stat().to_string().lines().find(|l| l.starts_with("pressure")).unwrap_or(""));
    }
}
