//! Run with: `cargo run --release --example debug_cost` (this file is the
//! workload of `testbin_kmemcg` and `testbin_system`, which include it).
//!
//! What the threads of a typical test binary do with the heap: eight
//! threads each build a `HashMap<String, Vec<u32>>` of a few thousand
//! entries with `format!`ed keys, grow and shrink its vectors with
//! `push`/`pop`, format every entry into a `String`, keep a stack of those
//! lines, drop half the map, then drop it all and start again. The binary
//! that includes this file decides the global allocator; `main` runs the
//! workload once and prints its elapsed milliseconds, one number on one
//! line, for `debug_cost` to collect.

use std::collections::HashMap;
use std::hint::black_box;
use std::thread;
use std::time::Instant;

/// Threads, as a test harness runs them on an 8-CPU machine.
const THREADS: usize = 8;
/// Entries of each thread's map per round.
const ENTRIES: u32 = 3_000;
/// Rounds per thread unless the first argument says otherwise.
const ROUNDS: usize = 12;
/// Lines on a thread's stack before it pops back down to `STACK_LOW`.
const STACK_HIGH: usize = 64;
/// Lines left on the stack after popping.
const STACK_LOW: usize = 16;

/// One round of one thread; returns the bytes of text it formatted, which
/// does not depend on the map's iteration order (so every run of either
/// binary computes the same sum).
fn round(thread: usize, round: usize) -> u64 {
    let mut map: HashMap<String, Vec<u32>> = HashMap::new();
    for i in 0..ENTRIES {
        let mut v = Vec::new();
        for j in 0..i % 17 {
            v.push(i ^ j);
        }
        map.insert(format!("t{thread}-r{round}-key-{i}"), v);
    }

    let mut bytes = 0u64;
    let mut stack: Vec<String> = Vec::new();
    for (key, v) in &mut map {
        v.push(key.len() as u32);
        v.extend_from_slice(&[1, 2, 3]);
        let line = format!("{key}={v:?}");
        bytes += line.len() as u64;
        stack.push(line);
        if stack.len() > STACK_HIGH {
            stack.truncate(STACK_LOW);
        }
        v.pop();
        v.pop();
    }

    map.retain(|_, v| v.len() % 2 == 0);
    let mut summary = String::new();
    for v in map.values() {
        summary.push_str(&v.len().to_string());
        summary.push(',');
    }
    bytes + summary.len() as u64
}

/// Runs the workload once (`rounds` per thread) and prints the elapsed
/// milliseconds: from before the threads are spawned until after they are
/// joined and everything they built is dropped.
pub fn main() {
    let rounds = match std::env::args().nth(1) {
        Some(a) => a.parse().expect("the argument is the rounds per thread"),
        None => ROUNDS,
    };
    let start = Instant::now();
    let bytes: u64 = thread::scope(|s| {
        let handles: Vec<_> =
            (0..THREADS).map(|t| s.spawn(move || (0..rounds).map(|r| round(t, r)).sum::<u64>())).collect();
        handles.into_iter().map(|h| h.join().expect("a workload thread panicked")).sum()
    });
    let elapsed = start.elapsed();
    black_box(bytes);
    println!("{:.3}", elapsed.as_secs_f64() * 1e3);
}
