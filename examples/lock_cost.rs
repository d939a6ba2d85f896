//! Run with: `cargo run --release --example lock_cost`
//!
//! What `YieldingRawMutex` (the default lock with `std`) costs, and how
//! fair it is, beside the test-and-set lock it replaced (`tas-yield`,
//! copied below), `std::sync::Mutex` and `spin::Mutex`:
//!
//! * `uncontended`: ns per lock + increment + unlock on one thread;
//! * `2 threads`: the same on two threads taking one lock in turn
//!   (ns per acquisition, wall time over all acquisitions);
//! * handoff: how often a waiter that has waited 20 ms for a held lock
//!   gets it before its holder, which re-takes it at once with `try_lock`;
//! * fairness: two threads re-lock in a tight loop for `WINDOW`, a third
//!   takes the lock as often as it can meanwhile: its acquisitions, its
//!   worst wait, and the most acquisitions the other two made during one
//!   of its waits.
//!
//! Rounds interleave the locks; medians are printed, with ratios to
//! `YieldingRawMutex`.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kmemcg::YieldingRawMutex;

/// The lock `YieldingRawMutex` was before it was made fair: a
/// test-and-set spin lock whose waiters spin 128 times, then yield.
struct TasYield(AtomicBool);

// SAFETY: `lock` returns only after swapping the flag from false to true
// with Acquire, `unlock` stores false with Release.
unsafe impl lock_api::RawMutex for TasYield {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = TasYield(AtomicBool::new(false));
    type GuardMarker = lock_api::GuardSend;
    #[inline]
    fn lock(&self) {
        if !self.try_lock() {
            self.lock_contended();
        }
    }
    #[inline]
    fn try_lock(&self) -> bool {
        self.0.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }
    #[inline]
    unsafe fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

impl TasYield {
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        use lock_api::RawMutex as _;
        let mut spins = 0;
        loop {
            while self.0.load(Ordering::Relaxed) {
                if spins < 128 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self.try_lock() {
                return;
            }
        }
    }
}

/// A counter behind a lock.
trait Counter: Sync + Default {
    fn incr(&self) -> u64;
}

impl<R: lock_api::RawMutex + Sync> Counter for lock_api::Mutex<R, u64> {
    #[inline]
    fn incr(&self) -> u64 {
        let mut g = self.lock();
        *g += 1;
        *g
    }
}

#[derive(Default)]
struct Std(std::sync::Mutex<u64>);

impl Counter for Std {
    #[inline]
    fn incr(&self) -> u64 {
        let mut g = self.0.lock().unwrap();
        *g += 1;
        *g
    }
}

const N: u64 = 10_000_000;
const N2: u64 = 2_000_000;
const WINDOW: Duration = Duration::from_millis(1000);

fn uncontended<C: Counter>() -> f64 {
    let c = C::default();
    let t = Instant::now();
    for _ in 0..N {
        black_box(black_box(&c).incr());
    }
    t.elapsed().as_nanos() as f64 / N as f64
}

fn two_threads<C: Counter>() -> f64 {
    let c = C::default();
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..N2 {
                    black_box(c.incr());
                }
            });
        }
    });
    t.elapsed().as_nanos() as f64 / (2 * N2) as f64
}

/// (third thread's acquisitions in `WINDOW`, its worst wait in ms, most
/// acquisitions by the others during one of its waits)
fn fairness<C: Counter>() -> (f64, f64, f64) {
    let c = C::default();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    c.incr();
                }
            });
        }
        while c.incr() < 1000 {
            std::thread::yield_now();
        }
        let (mut mine, mut worst, mut most) = (0u64, Duration::ZERO, 0u64);
        let mut last = c.incr();
        let start = Instant::now();
        while start.elapsed() < WINDOW {
            let t = Instant::now();
            let now = c.incr();
            worst = worst.max(t.elapsed());
            // The others' acquisitions since our last one: all but a few
            // made during this wait.
            most = most.max(now - last - 1);
            last = now;
            mine += 1;
        }
        stop.store(true, Ordering::Relaxed);
        (mine as f64, worst.as_secs_f64() * 1e3, most as f64)
    })
}

/// Of `trials`: how often a waiter that has waited 20 ms for a held lock
/// gets it before its holder, which releases it and at once tries to take
/// it again (`try_lock` in a loop).
fn waiter_first<R: lock_api::RawMutex + Sync>(trials: u32) -> u32 {
    let mut first = 0;
    for _ in 0..trials {
        let m = lock_api::Mutex::<R, u64>::new(0);
        let g = m.lock();
        std::thread::scope(|s| {
            s.spawn(|| *m.lock() = 1);
            std::thread::sleep(Duration::from_millis(20));
            drop(g);
            loop {
                if let Some(g) = m.try_lock() {
                    first += u32::from(*g == 1);
                    break;
                }
            }
        });
    }
    first
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

type Yielding = lock_api::Mutex<YieldingRawMutex, u64>;
type Tas = lock_api::Mutex<TasYield, u64>;
type Spin = lock_api::Mutex<spin::mutex::SpinMutex<()>, u64>;

fn main() {
    let rounds = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let names = ["YieldingRawMutex", "tas-yield (before)", "std::sync::Mutex", "spin::Mutex"];
    let mut un = vec![vec![]; 4];
    let mut two = vec![vec![]; 4];
    let mut fair = vec![(vec![], vec![], vec![]); 4];
    for _ in 0..rounds {
        let u = [uncontended::<Yielding>(), uncontended::<Tas>(), uncontended::<Std>(), uncontended::<Spin>()];
        let t = [two_threads::<Yielding>(), two_threads::<Tas>(), two_threads::<Std>(), two_threads::<Spin>()];
        let f = [fairness::<Yielding>(), fairness::<Tas>(), fairness::<Std>(), fairness::<Spin>()];
        for i in 0..4 {
            un[i].push(u[i]);
            two[i].push(t[i]);
            fair[i].0.push(f[i].0);
            fair[i].1.push(f[i].1);
            fair[i].2.push(f[i].2);
        }
    }
    let trials = 20;
    let served = [
        waiter_first::<YieldingRawMutex>(trials),
        waiter_first::<TasYield>(trials),
        0,
        waiter_first::<spin::mutex::SpinMutex<()>>(trials),
    ];
    println!("waiter served before its holder re-takes the lock, of {trials}:");
    for i in [0, 1, 3] {
        println!("  {}: {}", names[i], served[i]);
    }
    println!("medians of {rounds} rounds; ratio = lock / YieldingRawMutex");
    println!(
        "| lock | uncontended ns | ratio | 2 threads ns | ratio | third's acquisitions in {WINDOW:?} | worst wait ms | most bypasses in one wait |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let (u0, t0) = (median(&mut un[0].clone()), median(&mut two[0].clone()));
    for i in 0..4 {
        let (u, t) = (median(&mut un[i]), median(&mut two[i]));
        let (a, w, b) = (median(&mut fair[i].0), median(&mut fair[i].1), median(&mut fair[i].2));
        println!("| {} | {u:.2} | {:.2}x | {t:.2} | {:.2}x | {a:.0} | {w:.2} | {b:.0} |", names[i], u / u0, t / t0,);
    }
}
