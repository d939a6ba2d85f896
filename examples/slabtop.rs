//! Run with: `cargo run --release --example slabtop`
//!
//! A live `slabtop`: a workload of three tenant groups (strings, maps and
//! a typed cache of nodes) runs for five seconds while the busiest caches
//! are shown, sorted by pages, one row per (cache, group).

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kmemcg::{CacheFlags, Kmem, OsPages};

#[global_allocator]
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

#[allow(dead_code)]
struct Node {
    key: u64,
    next: usize,
    payload: [u8; 200],
}

fn top() -> String {
    let info = KMEM.slabinfo().to_string();
    let mut rows: Vec<(usize, String)> = Vec::new();
    for line in info.lines().skip(2) {
        let c: Vec<&str> = line.split_whitespace().collect();
        let pages: usize = c.get(10).and_then(|p| p.parse().ok()).unwrap_or(0);
        if pages > 0 {
            rows.push((pages, format!("{:<20} {:<10} {:>10} {:>10} {:>8}", c[0], c[11], c[1], c[2], pages)));
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut s = format!(
        "kmemcg slabtop: root usage {} KiB\n\n{:<20} {:<10} {:>10} {:>10} {:>8}\n",
        KMEM.root().usage() / 1024,
        "cache",
        "group",
        "active",
        "objects",
        "pages"
    );
    for (_, r) in rows.iter().take(16) {
        s += r;
        s.push('\n');
    }
    s
}

fn main() {
    let stop = AtomicBool::new(false);
    let nodes = KMEM.create_cache::<Node>("node", CacheFlags::ACCOUNT).unwrap();
    thread::scope(|s| {
        for (name, kind) in [("strings", 0), ("maps", 1), ("nodes", 2)] {
            let g = KMEM.root().create_child(name).unwrap();
            let (stop, nodes) = (&stop, &nodes);
            s.spawn(move || {
                let _in = g.enter();
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match kind {
                        0 => {
                            let v: Vec<String> = (0..2000).map(|i| format!("line {round} {i}")).collect();
                            std::hint::black_box(v);
                        }
                        1 => {
                            let m: HashMap<u64, Vec<u32>> = (0..500).map(|i| (i, vec![i as u32; 16])).collect();
                            std::hint::black_box(m);
                        }
                        _ => {
                            let v: Vec<_> = (0..1000)
                                .filter_map(|i| nodes.alloc(Node { key: i, next: 0, payload: [1; 200] }).ok())
                                .collect();
                            std::hint::black_box(v);
                        }
                    }
                    round += 1;
                }
            });
        }
        let tty = std::io::stdout().is_terminal();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(500));
            if tty {
                print!("\x1b[H\x1b[2J{}", top());
                let _ = std::io::stdout().flush();
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    println!("{}", top());
}
