//! Accounting at tenant scale: memory and time for thousands of small
//! groups (issue 28's table).
//!
//! Run with: `cargo bench --bench tenants` (one row:
//! `cargo bench --bench tenants -- spread|max|churn`).
//!
//! - `spread`: 1,000 groups, each holding one object of each of 8 sizes
//!   (16 B to 3 KiB, 6,112 B a group): pages the allocator holds from its
//!   source over the live bytes, right after allocating and after
//!   `shrink()`. Metadata (groups, caches, magazines) is in the pages.
//! - `max`: the smallest `max` (in 4 KiB steps) under which a fresh group
//!   holds one object of each of the 8 sizes (6,112 B), and 8 of each.
//! - `churn`: 10,000 groups alive at once: created, one 64-byte object
//!   allocated in each, freed, removed; wall time of the whole and of
//!   each phase.
//!
//! Each row runs on its own `Kmem<OsPages>`, so no row sees another's
//! pages.

use std::alloc::{GlobalAlloc, Layout};
use std::time::Instant;

use kmemcg::{Kmem, OsPages, PAGE_SIZE, PageSource};

/// The 8 sizes of a tenant's objects.
const SIZES: [usize; 8] = [16, 48, 96, 192, 384, 768, 1536, 3072];
const GROUPS: usize = 1_000;
const CHURN: usize = 10_000;

fn leak() -> &'static Kmem<OsPages> {
    Box::leak(Box::new(Kmem::new(OsPages::new())))
}

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

fn pages(k: &Kmem<OsPages>) -> usize {
    k.source().stats().pages_in_use
}

/// 1,000 groups × 8 sizes × 1 object.
fn spread() {
    let k = leak();
    let before = pages(k);
    let mut groups = Vec::with_capacity(GROUPS);
    let mut objs = Vec::with_capacity(GROUPS * SIZES.len());
    for i in 0..GROUPS {
        let g = k.root().create_child(&format!("t{i}")).unwrap();
        {
            let _in = g.enter();
            for &s in &SIZES {
                // SAFETY: a non-zero layout; freed below with it.
                let p = unsafe { k.alloc(layout(s)) };
                assert!(!p.is_null());
                objs.push((p, s));
            }
        }
        groups.push(g);
    }
    let live: usize = objs.iter().map(|&(_, s)| s).sum();
    let held = (pages(k) - before) * PAGE_SIZE;
    k.shrink();
    let shrunk = (pages(k) - before) * PAGE_SIZE;
    println!("spread,groups,{GROUPS},live_bytes,{live}");
    println!("spread,after_alloc,bytes,{held},over_live,{:.2}", held as f64 / live as f64);
    println!("spread,after_shrink,bytes,{shrunk},over_live,{:.2}", shrunk as f64 / live as f64);
    for (p, s) in objs {
        // SAFETY: allocated above with this layout.
        unsafe { k.dealloc(p, layout(s)) };
    }
    for g in groups {
        g.remove().unwrap();
    }
}

/// Whether a fresh group limited to `max` holds `copies` objects of
/// each size.
fn holds(k: &'static Kmem<OsPages>, max: usize, copies: usize, name: &str) -> bool {
    let g = k.root().create_child(name).unwrap();
    g.set_max(max).unwrap();
    let mut objs = Vec::new();
    let mut ok = true;
    {
        let _in = g.enter();
        'all: for _ in 0..copies {
            for &s in &SIZES {
                // SAFETY: a non-zero layout; freed below with it.
                let p = unsafe { k.alloc(layout(s)) };
                if p.is_null() {
                    ok = false;
                    break 'all;
                }
                objs.push((p, s));
            }
        }
    }
    for (p, s) in objs {
        // SAFETY: allocated above with this layout.
        unsafe { k.dealloc(p, layout(s)) };
    }
    g.remove().unwrap();
    ok
}

/// The smallest `max`, in pages, under which a fresh group holds the
/// sizes `copies` times.
fn max_row(copies: usize) {
    let k = leak();
    let live: usize = SIZES.iter().sum::<usize>() * copies;
    let mut pages = 1;
    while !holds(k, pages * PAGE_SIZE, copies, &format!("m{copies}-{pages}")) {
        pages += 1;
        assert!(pages < 4096, "no max up to 16 MiB holds them");
    }
    println!("max,copies,{copies},live_bytes,{live},smallest_max_kib,{}", pages * PAGE_SIZE / 1024);
}

/// 10,000 groups alive at once: all created, one 64-byte object
/// allocated in each, all freed, all removed; wall time of each phase.
fn churn() {
    let k = leak();
    let t = Instant::now();
    let groups: Vec<_> = (0..CHURN).map(|i| k.root().create_child(&format!("c{i}")).unwrap()).collect();
    let created = t.elapsed().as_secs_f64();
    let objs: Vec<*mut u8> = groups
        .iter()
        .map(|g| {
            let _in = g.enter();
            // SAFETY: a non-zero layout; freed below with it.
            let p = unsafe { k.alloc(layout(64)) };
            assert!(!p.is_null());
            p
        })
        .collect();
    let allocated = t.elapsed().as_secs_f64();
    for p in objs {
        // SAFETY: allocated above with this layout.
        unsafe { k.dealloc(p, layout(64)) };
    }
    let freed = t.elapsed().as_secs_f64();
    for g in groups {
        g.remove().unwrap();
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "churn,groups,{CHURN},seconds,{s:.3},create,{created:.3},alloc,{:.3},free,{:.3},remove,{:.3}",
        allocated - created,
        freed - allocated,
        s - freed
    );
}

fn main() {
    let which: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let on = |name: &str| which.is_empty() || which.iter().any(|w| w == name);
    if on("spread") {
        spread();
    }
    if on("max") {
        max_row(1);
        max_row(8);
    }
    if on("churn") {
        churn();
    }
}
