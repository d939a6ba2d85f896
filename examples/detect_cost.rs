//! Run with: `cargo run --release --example detect_cost`
//!
//! What memory-error detection costs: 64-byte alloc+free pairs and the
//! `random` workload (a live set of 10k slots, each step frees one and
//! allocates 8..4096 bytes) on five allocators in one process: `System`,
//! kmemcg with detection off, sampling alone (`Detection::SAMPLED`, one
//! allocation in 5,000 on a guard page), on without guard-page sampling,
//! and `Detection::ALL` (one allocation in 256 on a guard page). Rounds
//! interleave them; the medians and their ratios to "off" and to `System`
//! are printed.
//!
//! `detect_cost random-only <off|sampled|env> <steps>` runs `random`
//! (`pair-only`: the pairs) alone on one of them (`env`: detection as
//! `KMEMCG_DEBUG` says, e.g. `guard=20000` for another sampling rate):
//! for processes timed one after the other (`scripts/sampled-cost.sh`),
//! and for instruction counts that do not move with the machine's load:
//! under `valgrind --tool=callgrind` at N and 2N steps, (2N - N) / N is
//! one step, start-up and the 10k first allocations cancelled.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

use kmemcg::{Detection, Kmem, OsPages};

static OFF: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::OFF);
static SAMPLED: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::SAMPLED);
static ON: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::ALL.guard_pages(0));
static ALL: Kmem = Kmem::new(OsPages::new()).with_detection(Detection::ALL);
/// Detection as `KMEMCG_DEBUG` says (`random-only env`).
static ENV: Kmem = Kmem::new(OsPages::new());

fn pairs<A: GlobalAlloc>(k: &A, n: usize) -> f64 {
    let layout = Layout::from_size_align(64, 8).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: valid layout; freed at once.
        unsafe {
            let p = k.alloc(black_box(layout));
            k.dealloc(black_box(p), layout);
        }
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn random<A: GlobalAlloc>(k: &A, steps: usize) -> f64 {
    const LIVE: usize = 10_000;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut slots: Vec<(*mut u8, Layout)> = Vec::with_capacity(LIVE);
    for _ in 0..LIVE {
        let l = Layout::from_size_align(8 + (next() % 4089) as usize, 8).unwrap();
        // SAFETY: a valid layout.
        slots.push((unsafe { k.alloc(l) }, l));
    }
    let t = Instant::now();
    for _ in 0..steps {
        let i = (next() % LIVE as u64) as usize;
        let l = Layout::from_size_align(8 + (next() % 4089) as usize, 8).unwrap();
        // SAFETY: each slot holds a live block of its layout; freed once.
        unsafe {
            k.dealloc(slots[i].0, slots[i].1);
            slots[i] = (k.alloc(l), l);
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / steps as f64;
    for (p, l) in slots {
        // SAFETY: as above.
        unsafe { k.dealloc(p, l) };
    }
    ns
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One round of both workloads on `k`: (pair ns, random ns).
fn round<A: GlobalAlloc>(k: &A) -> (f64, f64) {
    (pairs(k, 2_000_000), random(k, 500_000))
}

fn main() {
    let rounds = 7;
    let args: Vec<String> = std::env::args().collect();
    if let Some(which @ ("random-only" | "pair-only")) = args.get(1).map(String::as_str) {
        let steps = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(200_000);
        let k = match args.get(2).map(String::as_str) {
            Some("off") => &OFF,
            Some("sampled") => &SAMPLED,
            Some("env") => &ENV,
            other => panic!("{which}: off, sampled or env, not {other:?}"),
        };
        if which == "random-only" {
            println!("random ns per step {:.2}", random(k, steps));
        } else {
            println!("pair-64 ns per pair {:.2}", pairs(k, steps));
        }
        return;
    }
    if std::env::args().any(|a| a == "system-only") {
        // `scripts/detect-vs-asan.sh` runs this mode built with
        // `-Zsanitizer=address`, where `System` is ASan's allocator.
        let (mut p, mut r) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let (a, b) = round(&System);
            p.push(a);
            r.push(b);
        }
        println!("system-only pair-64 ns {:.2} random ns {:.2}", median(p), median(r));
        return;
    }
    let names = ["System", "off", "sampled (1/5000)", "on, no sampling", "all (guard 1/256)"];
    let run: [&dyn Fn() -> (f64, f64); 5] =
        [&|| round(&System), &|| round(&OFF), &|| round(&SAMPLED), &|| round(&ON), &|| round(&ALL)];
    let mut pair_ns = vec![Vec::new(); names.len()];
    let mut random_ns = vec![Vec::new(); names.len()];
    for _ in 0..rounds {
        for (i, r) in run.iter().enumerate() {
            let (p, q) = r();
            pair_ns[i].push(p);
            random_ns[i].push(q);
        }
    }
    let (ps, rs) = (median(pair_ns[0].clone()), median(random_ns[0].clone()));
    let (p0, r0) = (median(pair_ns[1].clone()), median(random_ns[1].clone()));
    println!(
        "detection          pair-64 ns   /off  /System   random ns   /off  /System   (medians of {rounds} interleaved rounds)"
    );
    for (i, name) in names.iter().enumerate() {
        let (p, r) = (median(pair_ns[i].clone()), median(random_ns[i].clone()));
        println!("{name:<18} {p:>10.2} {:>6.3} {:>7.2}  {r:>10.2} {:>6.3} {:>7.2}", p / p0, p / ps, r / r0, r / rs);
    }
}
