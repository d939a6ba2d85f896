//! Run with: `cargo run --release --example tenants`
//!
//! Four tenants share one process with kmemcg as the global allocator, each
//! in its own group, each on its own threads:
//!
//! * `greedy` keeps growing buffers and is capped by a hard limit (`max`):
//!   its fallible allocations start failing at the cap, nobody else's do;
//! * `cache` keeps an LRU of blobs with a soft limit: under contention
//!   (root usage above the contention mark) it is reclaimed first, through
//!   its shrinker, back toward its soft limit;
//! * `bursty` allocates in bursts into an LRU above its `high` mark: it is
//!   throttled (reclaims before its allocations return, and is delayed if
//!   it stays above `high` all the same) but never fails;
//! * `steady` builds ordinary std collections with no limit;
//! * `protected` keeps an LRU like `cache`, but with `min` and `low`
//!   protection: contention reclaim takes from the others first, and never
//!   takes it below its `min`.
//!
//! A live table refreshes while it runs (usage, limits, events per group);
//! an event hook counts every memory event as it happens; a summary closes
//! it. It ends by itself after about eight seconds.

use std::collections::{HashMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kmemcg::{Cgroup, Event, GroupId, Kmem, OsPages, ShrinkControl, Shrinker};

#[global_allocator]
static KMEM: Kmem<OsPages> = Kmem::new(OsPages::new());

const MB: usize = 1 << 20;

/// Events the hook saw, by kind (max, oom, high, low, min).
static HOOKED: [AtomicUsize; 5] = [const { AtomicUsize::new(0) }; 5];

/// The event hook: called where each event happens, outside the
/// allocator's locks; it must not block or allocate, so it only counts.
fn on_event(_group: GroupId, e: Event) {
    let i = match e {
        Event::Max => 0,
        Event::Oom => 1,
        Event::High => 2,
        Event::Low => 3,
        Event::Min => 4,
        _ => return, // a kind added later
    };
    HOOKED[i].fetch_add(1, Ordering::Relaxed);
}
const RUN: Duration = Duration::from_secs(8);

/// One tenant's LRU of blobs, shrinkable by the allocator.
struct Lru {
    group: GroupId,
    blobs: Mutex<VecDeque<Box<[u8]>>>,
}

impl Shrinker for Lru {
    fn count(&self, sc: &ShrinkControl) -> usize {
        if !sc.contains(self.group) {
            return 0;
        }
        // try_lock: the owner may be inside an allocation holding the lock.
        self.blobs.try_lock().map(|b| b.len()).unwrap_or(0)
    }
    fn scan(&self, sc: &ShrinkControl, nr: usize) -> usize {
        if !sc.contains(self.group) {
            return 0;
        }
        let Ok(mut blobs) = self.blobs.try_lock() else { return 0 };
        let n = nr.min(blobs.len());
        for _ in 0..n {
            drop(blobs.pop_front());
        }
        n
    }
}

struct Tenant {
    name: &'static str,
    group: Cgroup<'static, Kmem<OsPages>>,
    ops: AtomicUsize,
    failures: AtomicUsize,
}

fn lru_for(group: &Cgroup<'static, Kmem<OsPages>>) -> &'static Lru {
    let lru: &'static Lru =
        Box::leak(Box::new(Lru { group: group.id(), blobs: Mutex::new(VecDeque::with_capacity(1 << 16)) }));
    KMEM.register_shrinker(lru).expect("shrinker slot");
    lru
}

fn greedy(t: &Tenant, stop: &AtomicBool) {
    let _in = t.group.enter();
    let mut hoard: Vec<Vec<u8>> = Vec::with_capacity(1 << 12);
    while !stop.load(Ordering::Relaxed) {
        let mut buf: Vec<u8> = Vec::new();
        if buf.try_reserve_exact(256 << 10).is_err() {
            t.failures.fetch_add(1, Ordering::Relaxed);
            // Held at the cap: let some go and try again later.
            hoard.truncate(hoard.len() * 3 / 4);
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        buf.resize(256 << 10, 1);
        if hoard.len() < hoard.capacity() {
            hoard.push(buf);
        }
        t.ops.fetch_add(1, Ordering::Relaxed);
    }
}

fn lru_worker(t: &Tenant, lru: &Lru, blob: usize, burst: bool, stop: &AtomicBool) {
    let _in = t.group.enter();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let n = if burst && round.is_multiple_of(50) { 4000 } else { 200 };
        for _ in 0..n {
            let mut b: Vec<u8> = Vec::new();
            if b.try_reserve_exact(blob).is_err() {
                t.failures.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            b.resize(blob, round as u8);
            let mut blobs = lru.blobs.lock().unwrap();
            if blobs.len() == blobs.capacity() {
                blobs.pop_front();
            }
            blobs.push_back(b.into_boxed_slice());
            t.ops.fetch_add(1, Ordering::Relaxed);
        }
        round += 1;
        thread::sleep(Duration::from_millis(2));
    }
}

fn steady(t: &Tenant, stop: &AtomicBool) {
    let _in = t.group.enter();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut m: HashMap<String, Vec<u64>> = HashMap::new();
        for k in 0..500 {
            m.insert(format!("key-{i}-{k}"), (0..k).collect());
        }
        assert_eq!(m.len(), 500);
        i += 1;
        t.ops.fetch_add(1, Ordering::Relaxed);
    }
}

fn fmt_limit(v: usize) -> String {
    if v >= usize::MAX / 2 { "-".into() } else { format!("{}M", v / MB) }
}

fn table(tenants: &[Arc<Tenant>], elapsed: Duration) -> String {
    let mut s = format!(
        "kmemcg tenants demo: {:.1}s / {}s, root usage {} MiB, contention mark 160 MiB\n\n",
        elapsed.as_secs_f64(),
        RUN.as_secs(),
        KMEM.root().usage() / MB
    );
    s += &format!(
        "{:<9} {:>7} {:>7} {:>5} {:>5} {:>5} {:>5} {:>5} {:>7} {:>7} {:>6} {:>8} {:>9} {:>8}\n",
        "group",
        "usage",
        "peak",
        "max",
        "high",
        "soft",
        "low",
        "min",
        "ev_max",
        "ev_high",
        "ev_low",
        "soft_rcl",
        "ops",
        "failures"
    );
    for t in tenants {
        let st = t.group.stat();
        s += &format!(
            "{:<9} {:>6}M {:>6}M {:>5} {:>5} {:>5} {:>5} {:>5} {:>7} {:>7} {:>6} {:>8} {:>9} {:>8}\n",
            t.name,
            st.usage / MB,
            st.peak / MB,
            fmt_limit(st.max),
            fmt_limit(st.high),
            fmt_limit(st.soft_limit),
            fmt_limit(st.low),
            fmt_limit(st.min),
            st.events.max,
            st.events.high,
            st.events.low,
            st.soft_reclaim_passes,
            t.ops.load(Ordering::Relaxed),
            t.failures.load(Ordering::Relaxed)
        );
    }
    s
}

fn main() {
    let root = KMEM.root();
    let mk = |name: &'static str| {
        Arc::new(Tenant {
            name,
            group: root.create_child(name).unwrap(),
            ops: AtomicUsize::new(0),
            failures: AtomicUsize::new(0),
        })
    };
    let (g, c, b, s, p) = (mk("greedy"), mk("cache"), mk("bursty"), mk("steady"), mk("protected"));
    g.group.set_max(64 * MB).unwrap();
    c.group.set_soft_limit(32 * MB).unwrap();
    b.group.set_high(24 * MB).unwrap();
    p.group.set_min(16 * MB).unwrap();
    p.group.set_low(32 * MB).unwrap();
    KMEM.set_contention_mark(160 * MB);
    KMEM.set_event_hook(Some(on_event));
    let (cache_lru, bursty_lru, protected_lru) = (lru_for(&c.group), lru_for(&b.group), lru_for(&p.group));

    let stop = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for _ in 0..2 {
        let (t, stop) = (g.clone(), stop.clone());
        hs.push(thread::spawn(move || greedy(&t, &stop)));
    }
    {
        let (t, stop) = (c.clone(), stop.clone());
        hs.push(thread::spawn(move || lru_worker(&t, cache_lru, 4096, false, &stop)));
    }
    {
        let (t, stop) = (b.clone(), stop.clone());
        hs.push(thread::spawn(move || lru_worker(&t, bursty_lru, 1024, true, &stop)));
    }
    {
        let (t, stop) = (s.clone(), stop.clone());
        hs.push(thread::spawn(move || steady(&t, &stop)));
    }
    {
        let (t, stop) = (p.clone(), stop.clone());
        hs.push(thread::spawn(move || lru_worker(&t, protected_lru, 2048, false, &stop)));
    }

    let tenants = [g.clone(), c.clone(), b.clone(), s.clone(), p.clone()];
    let tty = std::io::stdout().is_terminal();
    let start = Instant::now();
    let mut last_line = Instant::now();
    while start.elapsed() < RUN {
        thread::sleep(Duration::from_millis(250));
        if tty {
            print!("\x1b[H\x1b[2J{}", table(&tenants, start.elapsed()));
            let _ = std::io::stdout().flush();
        } else if last_line.elapsed() >= Duration::from_secs(2) {
            last_line = Instant::now();
            println!(
                "[{:.0}s] root {} MiB: greedy {} MiB, cache {} MiB, bursty {} MiB, steady {} MiB, protected {} MiB",
                start.elapsed().as_secs_f64(),
                KMEM.root().usage() / MB,
                g.group.usage() / MB,
                c.group.usage() / MB,
                b.group.usage() / MB,
                s.group.usage() / MB,
                p.group.usage() / MB
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    println!("\n{}", table(&tenants, start.elapsed()));

    let gs = g.group.stat();
    println!("summary:");
    println!(
        "  greedy held at its cap: peak {} MiB <= max {} MiB, {} allocations refused, {} max events",
        gs.peak / MB,
        gs.max / MB,
        g.failures.load(Ordering::Relaxed),
        gs.events.max
    );
    let others: usize = [&c, &b, &s, &p].iter().map(|t| t.failures.load(Ordering::Relaxed)).sum();
    println!("  failures in the other tenants: {others}");
    println!(
        "  cache (soft limit 32 MiB): {} soft-reclaim passes, now {} MiB",
        c.group.stat().soft_reclaim_passes,
        c.group.usage() / MB
    );
    let bs = b.group.stat();
    println!(
        "  bursty (high 24 MiB): reclaimed above high {} times, delayed {} times ({} ms), peak {} MiB, no failures from high",
        bs.events.high,
        bs.throttled,
        bs.throttled_us / 1000,
        b.group.peak() / MB
    );
    let ps = p.group.stat();
    println!(
        "  protected (min 16 MiB, low 32 MiB): now {} MiB, peak {} MiB; reclaimed within low {} times, within min {} times",
        ps.usage / MB,
        ps.peak / MB,
        ps.events.low,
        ps.events.min
    );
    let hooked: Vec<usize> = HOOKED.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    println!(
        "  the event hook saw: max {}, oom {}, high {}, low {}, min {} (as the groups' hierarchical counts show)",
        hooked[0], hooked[1], hooked[2], hooked[3], hooked[4]
    );
    KMEM.set_event_hook(None);
    KMEM.unregister_shrinker(cache_lru);
    KMEM.unregister_shrinker(bursty_lru);
    KMEM.unregister_shrinker(protected_lru);
    assert!(gs.peak <= gs.max, "the cap did not hold");
    assert_eq!(others, 0, "a tenant without a hard limit saw a failure");
    assert!(ps.usage >= 16 * MB || ps.peak < 16 * MB, "protected went below its min");
    assert_eq!(ps.events.min, 0, "reclaim for others took from protected below its min");
}
