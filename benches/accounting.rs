//! What accounting costs: the seed 000 `find /` experiment, an accounted
//! `pair-64`, and what groups' objects cost in pages.
//!
//! Run with: `cargo bench --bench accounting` (optionally a directory to
//! walk instead of `/usr`: `cargo bench --bench accounting -- /path`).
//!
//! 1. Seed 000: walk a directory tree once, then replay it: one dentry-like
//!    object per entry from a typed cache, freeing the oldest beyond a
//!    working set of 20,000 (an LRU). Modes: unaccounted cache; accounted,
//!    in the root group; accounted in a group with hard limits 16M .. 512K.
//!    When a limit refuses an allocation, the replay shrinks its LRU by a
//!    quarter and retries, as the kernel's dentry shrinker would. Rounds
//!    are interleaved; the median of 7 is reported, with the ratio to the
//!    unaccounted run beside the seed's own table.
//! 2. `pair-64` through a 64-byte typed cache, unaccounted vs accounted in
//!    a group, and `GlobalAlloc` pair-64 in the root vs inside a group.
//! 3. 100 groups each holding one live object of two sizes per doubling
//!    from 8 bytes to 16 KiB: the pages each group is charged (its
//!    objects' bytes in whole pages; every group's objects share the
//!    charged caches' slabs) and the pages all of them take.
//!
//! Besides the tables it writes `target/kmemcg-results/accounting_seed000.csv`
//! (parts 1) and `accounting_pair64.csv` (part 2) for `cargo run --release -p kmemcg-plots`.

use std::alloc::{GlobalAlloc, Layout};
use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use kmemcg::{CacheFlags, Error, Kmem, OsPages, PAGE_SIZE};

#[path = "../examples/support/results.rs"]
mod results;

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

/// A dentry-like object: 192 bytes, like a small kernel dentry.
#[allow(dead_code)]
struct Dentry {
    hash: u64,
    parent: u64,
    name: [u8; 64],
    _rest: [u64; 14],
}

/// Walks `root` depth-first, calling `f` with a hash of each entry's name.
fn walk(root: &str, mut f: impl FnMut(u64)) {
    let mut stack = vec![std::path::PathBuf::from(root)];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let name = e.file_name();
            let h = name
                .as_encoded_bytes()
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
            f(h);
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(e.path());
            }
        }
    }
}

const WORKING_SET: usize = 20_000;

/// Feeds the entries `source` yields into a fresh typed cache; returns the
/// elapsed time and how many times a limit forced the LRU to shrink.
fn replay(source: impl FnOnce(&mut dyn FnMut(u64)), flags: CacheFlags) -> (Duration, usize) {
    let cache = KMEM.create_cache::<Dentry>("dentry", flags).unwrap();
    let mut lru = VecDeque::with_capacity(WORKING_SET + 1);
    let mut shrinks = 0;
    let mut i = 0u64;
    let t = Instant::now();
    source(&mut |h| {
        i += 1;
        let b = loop {
            match cache.alloc(Dentry { hash: h, parent: i, name: [h as u8; 64], _rest: [0; 14] }) {
                Ok(b) => break b,
                Err(Error::LimitExceeded { .. }) if !lru.is_empty() => {
                    shrinks += 1;
                    for _ in 0..lru.len().div_ceil(4) {
                        lru.pop_front();
                    }
                }
                Err(e) => panic!("{e}"),
            }
        };
        lru.push_back(b);
        if lru.len() > WORKING_SET {
            lru.pop_front();
        }
    });
    let elapsed = t.elapsed();
    drop(lru);
    drop(cache);
    (elapsed, shrinks)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn pair_typed(flags: CacheFlags, iters: usize) -> Duration {
    let cache = KMEM.create_cache::<[u64; 8]>("pair64", flags).unwrap();
    let t = Instant::now();
    for i in 0..iters {
        black_box(cache.alloc([i as u64; 8]).unwrap());
    }
    t.elapsed()
}

fn pair_global(iters: usize) -> Duration {
    let layout = Layout::from_size_align(64, 8).unwrap();
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: valid layout; freed at once.
        unsafe { KMEM.dealloc(black_box(KMEM.alloc(black_box(layout))), layout) };
    }
    t.elapsed()
}

fn main() {
    let dir = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_else(|| "/usr".into());
    let t = Instant::now();
    let mut entries = Vec::new();
    walk(&dir, |h| entries.push(h));
    println!("walked {dir}: {} entries in {:.0} ms (first walk)\n", entries.len(), t.elapsed().as_secs_f64() * 1e3);
    let mut csv = Vec::new();
    for (title, with_walk) in [("walk + allocate (seed 000's `find`)", true), ("replay only (allocator alone)", false)]
    {
        let part = if with_walk { "walk" } else { "replay" };
        csv.extend(seed_table(title, &dir, &entries, with_walk).into_iter().map(|row| format!("{part},{row}")));
    }
    results::write_csv("accounting_seed000.csv", "part,mode,median_ms,ratio,shrinks", &csv);

    // 2. Accounted fast path.
    let iters = 20_000_000;
    let g = KMEM.root().create_child("pair").unwrap();
    let (mut un, mut acc, mut root, mut grp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        un.push(pair_typed(CacheFlags::NONE, iters));
        {
            let _in = g.enter();
            acc.push(pair_typed(CacheFlags::ACCOUNT, iters));
        }
        root.push(pair_global(iters));
        {
            let _in = g.enter();
            grp.push(pair_global(iters));
        }
    }
    let ns = |v: Vec<Duration>| median(v).as_secs_f64() * 1e9 / iters as f64;
    let (un, acc, root, grp) = (ns(un), ns(acc), ns(root), ns(grp));
    println!("\n| pair-64 | ns per alloc+free | ratio |");
    println!("|---|---|---|");
    println!("| typed cache, unaccounted | {un:.2} | 1.000 |");
    println!("| typed cache, accounted, in a group | {acc:.2} | {:.3} |", acc / un);
    println!("| GlobalAlloc, root | {root:.2} | 1.000 |");
    println!("| GlobalAlloc, inside a group | {grp:.2} | {:.3} |", grp / root);
    let csv = [
        format!("typed cache,unaccounted,{un:.4},1.0"),
        format!("typed cache,accounted in a group,{acc:.4},{:.4}", acc / un),
        format!("GlobalAlloc,root,{root:.4},1.0"),
        format!("GlobalAlloc,inside a group,{grp:.4},{:.4}", grp / root),
    ];
    results::write_csv("accounting_pair64.csv", "path,case,ns_per_pair,ratio", &csv);

    // 3. What a group's objects cost in pages.
    let before = KMEM.stats().source.pages_in_use;
    let mut held = Vec::new();
    let groups: Vec<_> = (0..100).map(|i| KMEM.root().create_child(&format!("g{i}")).unwrap()).collect();
    for g in &groups {
        let _in = g.enter();
        for shift in 3..=14 {
            for size in [1usize << shift, (1 << shift) + (1 << shift) / 4 + 1] {
                let l = Layout::from_size_align(size.min(16384), 8).unwrap();
                // SAFETY: valid layout.
                held.push((unsafe { KMEM.alloc(l) }, l));
            }
        }
    }
    let per_group: Vec<usize> = groups.iter().map(|g| g.usage() / PAGE_SIZE).collect();
    let after = KMEM.stats().source.pages_in_use;
    println!(
        "\n100 groups x one live object in each of {} size classes: {} pages per group (min {}, max {}), {} pages in all",
        held.len() / 100,
        per_group.iter().sum::<usize>() / 100,
        per_group.iter().min().unwrap(),
        per_group.iter().max().unwrap(),
        after - before
    );
    for (p, l) in held {
        // SAFETY: freed once with its layout.
        unsafe { KMEM.dealloc(p, l) };
    }
}

/// One seed-000 table: every mode, 7 interleaved rounds, medians. Returns
/// its rows as CSV (`mode,median_ms,ratio,shrinks`).
fn seed_table(title: &str, dir: &str, entries: &[u64], with_walk: bool) -> Vec<String> {
    static FIND: std::sync::OnceLock<kmemcg::Cgroup<'static, Kmem<OsPages>>> = std::sync::OnceLock::new();
    let find = FIND.get_or_init(|| KMEM.root().create_child("find").unwrap());
    let limits: [(&str, usize); 6] =
        [("16M", 16 << 20), ("8M", 8 << 20), ("4M", 4 << 20), ("2M", 2 << 20), ("1M", 1 << 20), ("512K", 512 << 10)];
    // Seed 000's table: kernel time of `find /` against no limit.
    // Seed 000's `sys` time against its unpatched kernel (6.649 s): root
    // 6.417 s, 16M 6.947, 8M 7.047, 4M 7.022, 2M 7.118, 1M 7.067, 512K 7.179.
    let seed = ["(base)", "-3.5%", "+4.5%", "+6.0%", "+5.6%", "+7.1%", "+6.3%", "+8.0%"];
    let mut modes: Vec<(&str, Option<usize>)> = vec![("unaccounted", None), ("root", None)];
    modes.extend(limits.iter().map(|&(n, l)| (n, Some(l))));
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); modes.len()];
    let mut shrinks = vec![0; modes.len()];
    for round in 0..7 {
        // Rotate the order each round so no mode always runs first.
        for j in 0..modes.len() {
            let i = (j + round) % modes.len();
            let (name, limit) = modes[i];
            let flags = if name == "unaccounted" { CacheFlags::NONE } else { CacheFlags::ACCOUNT };
            let run = |flags| {
                if with_walk {
                    replay(|f| walk(dir, f), flags)
                } else {
                    replay(|f| entries.iter().for_each(|&h| f(h)), flags)
                }
            };
            let (d, s) = match limit {
                None => run(flags),
                Some(l) => {
                    KMEM.shrink();
                    find.set_max(l).unwrap();
                    let _in = find.enter();
                    run(flags)
                }
            };
            find.set_max(usize::MAX).unwrap();
            times[i].push(d);
            shrinks[i] = s;
        }
    }
    let base = median(times[0].clone());
    println!("{title}:\n");
    println!(
        "| mode | median ms | ratio to unaccounted | limit shrinks | seed 000 (sys time vs its unpatched kernel) |"
    );
    println!("|---|---|---|---|---|");
    let mut csv = Vec::with_capacity(modes.len());
    for (i, (name, _)) in modes.iter().enumerate() {
        let m = median(times[i].clone());
        let (ms, ratio) = (m.as_secs_f64() * 1e3, m.as_secs_f64() / base.as_secs_f64());
        println!("| {name} | {ms:.2} | {ratio:.3} | {} | {} |", shrinks[i], seed[i]);
        csv.push(format!("{name},{ms:.4},{ratio:.5},{}", shrinks[i]));
    }

    println!();
    csv
}
