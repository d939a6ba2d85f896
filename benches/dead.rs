//! Seed 001's TEST #1: frees of a removed group's objects vs a live one's.
//!
//! Run with: `cargo bench --bench dead`
//!
//! For each object size, a thread allocates 1M objects inside a group and
//! then frees them all, timed: once with the group alive, once after the
//! group was removed (the objects stay charged to it until freed; each
//! free goes through the magazines and the CPU's byte stock as a live
//! group's). Rounds
//! interleave; medians of 5 are reported with the dead/alive ratio beside
//! the seed's. Every round's time also goes to
//! `target/kmemcg-results/dead.csv` for `cargo run --release -p kmemcg-plots`.

use std::alloc::{GlobalAlloc, Layout};
use std::time::{Duration, Instant};

use kmemcg::{Kmem, OsPages};

#[path = "../examples/support/results.rs"]
mod results;

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

const N: usize = 1_000_000;

fn run(size: usize, dead: bool, round: usize) -> Duration {
    let g = KMEM.root().create_child(&format!("s{size}-{dead}-{round}")).unwrap();
    let layout = Layout::from_size_align(size, 8).unwrap();
    let ptrs: Vec<*mut u8> = {
        let _in = g.enter();
        // SAFETY: valid layout.
        (0..N).map(|_| unsafe { KMEM.alloc(layout) }).collect()
    };
    if dead {
        g.remove().unwrap();
    }
    let t = Instant::now();
    for p in ptrs {
        // SAFETY: each block is freed once with its layout.
        unsafe { KMEM.dealloc(p, layout) };
    }
    let d = t.elapsed();
    if !dead {
        g.remove().unwrap();
    }
    KMEM.shrink();
    d
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    let seed = [(64, "373 / 1300 (3.5x)"), (128, "-"), (256, "-"), (512, "-"), (1024, "1.8x")];
    println!("| size | alive ms | dead ms | dead/alive | seed 001 (ms per 1M frees per CPU, ratio) |");
    println!("|---|---|---|---|---|");
    let mut csv = Vec::new();
    for (size, s) in seed {
        let (mut alive, mut dead) = (Vec::new(), Vec::new());
        for round in 0..5 {
            alive.push(run(size, false, round));
            dead.push(run(size, true, round));
        }
        for (state, times) in [("alive", &alive), ("dead", &dead)] {
            for (round, t) in times.iter().enumerate() {
                csv.push(format!("{size},{state},{round},{:.4}", t.as_secs_f64() * 1e3));
            }
        }
        let (a, d) = (median(alive), median(dead));
        println!("| {size} | {a:.1} | {d:.1} | {:.2}x | {s} |", d / a);
    }
    results::write_csv("dead.csv", "size,state,round,ms", &csv);
}
