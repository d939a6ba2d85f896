//! Run with: `cargo run --release --example drain_cost -- [rounds]`
//!
//! What drains cost the threads that allocate meanwhile. A drain of one
//! slot (by `shrink`, `reap`, a group's removal) counts itself in the
//! word every fast path reads, and while the count is not zero the fast
//! paths of *every* slot take the shared path; a drain that meets a
//! holder preempted in its operation withdraws the count while it waits
//! (it kept it up through that wait until session 27). This times
//! 64-byte pairs (inlined, as `peers`' `pair`) on 1, 2 and 4 threads of the
//! default platform, `Threads`, while another thread calls `shrink()`
//! never, every 10 ms, every 1 ms, or back to back; rounds interleave the
//! cases, and the table gives medians of ns per pair of the aggregate
//! (as `peers`' `threads/T`), each over the case without drains, and
//! the median time of one `shrink()`.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kmemcg::{Kmem, OsPages};

static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

const PAIR: Layout = match Layout::from_size_align(64, 8) {
    Ok(l) => l,
    Err(_) => panic!("layout"),
};
const PAIRS: usize = 50_000_000;

fn pair<A: GlobalAlloc>(a: &A, steps: usize) {
    for _ in 0..steps {
        // SAFETY: a valid layout; the block is freed at once.
        unsafe {
            let p = a.alloc(black_box(PAIR));
            a.dealloc(black_box(p), PAIR);
        }
    }
}

/// ns per pair of `threads` threads sharing [`PAIRS`] pairs while a
/// drainer shrinks every `period` (`None`: no drainer); and the median
/// `shrink()` time.
fn run(threads: usize, period: Option<Duration>) -> (f64, Option<Duration>) {
    let done = AtomicBool::new(false);
    let each = PAIRS / threads;
    std::thread::scope(|s| {
        let drainer = period.map(|p| {
            let done = &done;
            s.spawn(move || {
                let mut times = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    KMEM.shrink();
                    times.push(t.elapsed());
                    if !p.is_zero() {
                        std::thread::sleep(p);
                    }
                }
                times.sort();
                times.get(times.len() / 2).copied()
            })
        });
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    pair(&KMEM, 1);
                    let t = Instant::now();
                    pair(&KMEM, each);
                    (t, Instant::now())
                })
            })
            .collect();
        let spans: Vec<_> = workers.into_iter().map(|h| h.join().unwrap()).collect();
        done.store(true, Ordering::Relaxed);
        let start = spans.iter().map(|s| s.0).min().unwrap();
        let end = spans.iter().map(|s| s.1).max().unwrap();
        let ns = (end - start).as_secs_f64() * 1e9 / (each * threads) as f64;
        (ns, drainer.and_then(|d| d.join().unwrap()))
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let periods: [(&str, Option<Duration>); 4] = [
        ("none", None),
        ("every 10 ms", Some(Duration::from_millis(10))),
        ("every 1 ms", Some(Duration::from_millis(1))),
        ("back to back", Some(Duration::ZERO)),
    ];
    let threads = [1usize, 2, 4];
    let mut ns = vec![vec![Vec::new(); periods.len()]; threads.len()];
    let mut shrink = vec![vec![Vec::new(); periods.len()]; threads.len()];
    for r in 0..rounds {
        for (ti, &t) in threads.iter().enumerate() {
            for k in 0..periods.len() {
                let pi = (k + r) % periods.len();
                let (x, s) = run(t, periods[pi].1);
                ns[ti][pi].push(x);
                if let Some(s) = s {
                    shrink[ti][pi].push(s.as_secs_f64() * 1e6);
                }
            }
        }
    }
    println!("{rounds} interleaved rounds, medians; ns per 64-byte pair of the aggregate");
    println!("| threads | shrink() | ns per pair | over no drains | one shrink() (us) |");
    println!("|---|---|---|---|---|");
    for (ti, &t) in threads.iter().enumerate() {
        let base = median(&mut ns[ti][0]);
        for (pi, (name, _)) in periods.iter().enumerate() {
            let m = median(&mut ns[ti][pi]);
            let s =
                if shrink[ti][pi].is_empty() { "-".to_owned() } else { format!("{:.1}", median(&mut shrink[ti][pi])) };
            println!("| {t} | {name} | {m:.2} | {:.2}x | {s} |", m / base);
        }
    }
}
