//! Run with: `cargo run --release --example soft_limits`
//!
//! Seed 002's first experiment: two hungry groups with different soft
//! limits compete for a fixed amount of memory (a 24 MiB `Region`). Each
//! fills an LRU of 1000-byte objects as fast as it can; the LRUs are
//! shrinkers, so when the region runs dry, contention reclaim takes from
//! the group with the largest excess over its soft limit first. Usage over
//! time is printed against the soft limits; both settle a little above
//! them, sharing what does not fit under the limits.
//!
//! Every 1000 allocations each thread also samples both usages with the
//! time since the start; the samples go to
//! `target/kmemcg-results/soft_limits.csv` for `cargo run --release -p kmemcg-plots`.
//!
//! A second round adds protection: a third group `c` with `min` 4 MiB and
//! `low` 8 MiB fills its own LRU while `a` and `b` go on; contention
//! reclaim takes from `a` and `b` (over their soft limits, then
//! unprotected) and leaves `c` its `low`. Each group's events are printed.

use std::alloc::{GlobalAlloc, Layout};
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::sync::Mutex;
use std::thread;
use std::time::Instant;

use kmemcg::{GroupId, Kmem, Region, ShrinkControl, Shrinker};

#[path = "support/results.rs"]
mod results;

const MB: usize = 1 << 20;
const OBJ: usize = 1000;
const REGION: usize = 24 * MB;
const SOFT_A: usize = 6 * MB;
const SOFT_B: usize = 12 * MB;
/// Allocations per thread, and how often each thread samples usage.
const ALLOCS: usize = 150_000;
const SAMPLE_EVERY: usize = 1000;

static KMEM: Kmem<Region> = Kmem::new(Region::new());

struct Lru {
    group: GroupId,
    objs: Mutex<VecDeque<usize>>,
}

impl Shrinker for Lru {
    fn count(&self, sc: &ShrinkControl) -> usize {
        if sc.contains(self.group) { self.objs.try_lock().map(|o| o.len()).unwrap_or(0) } else { 0 }
    }
    fn scan(&self, sc: &ShrinkControl, nr: usize) -> usize {
        if !sc.contains(self.group) {
            return 0;
        }
        let Ok(mut o) = self.objs.try_lock() else { return 0 };
        let n = nr.min(o.len());
        for _ in 0..n {
            let p = o.pop_front().unwrap_or(0);
            // SAFETY: taken off the LRU, so freed once.
            unsafe { KMEM.dealloc(p as *mut u8, Layout::from_size_align(OBJ, 8).unwrap()) };
        }
        n
    }
}

fn main() {
    KMEM.source().add(Box::leak(vec![MaybeUninit::uninit(); REGION].into_boxed_slice()), 0).unwrap();
    let a = KMEM.root().create_child("a").unwrap();
    let b = KMEM.root().create_child("b").unwrap();
    a.set_soft_limit(SOFT_A).unwrap();
    b.set_soft_limit(SOFT_B).unwrap();
    println!("{:>12} {:>18} {:>18}", "allocations", "a (soft 6 MiB)", "b (soft 12 MiB)");
    let (ra, rb) = (&a, &b);
    let start = Instant::now();
    let samples: Vec<String> = thread::scope(|s| {
        let threads: Vec<_> = [(ra, "a", true), (rb, "b", false)]
            .into_iter()
            .map(|(g, name, report)| {
                s.spawn(move || {
                    let lru: &'static Lru =
                        Box::leak(Box::new(Lru { group: g.id(), objs: Mutex::new(VecDeque::with_capacity(200_000)) }));
                    KMEM.register_shrinker(lru).unwrap();
                    // The samples live on the system heap, not in the region.
                    let mut samples = Vec::with_capacity(ALLOCS / SAMPLE_EVERY);
                    let _in = g.enter();
                    let l = Layout::from_size_align(OBJ, 8).unwrap();
                    for i in 1..=ALLOCS {
                        // SAFETY: valid layout.
                        let p = unsafe { KMEM.alloc(l) };
                        assert!(!p.is_null(), "allocation failed with reclaimable memory left");
                        lru.objs.lock().unwrap().push_back(p as usize);
                        if i % SAMPLE_EVERY == 0 {
                            let ms = start.elapsed().as_secs_f64() * 1e3;
                            let (ua, ub) = (ra.usage(), rb.usage());
                            samples.push(format!("{ms:.3},{name},{i},{ua},{ub},{SOFT_A},{SOFT_B},{REGION}"));
                        }
                        if report && i % 10_000 == 0 {
                            println!(
                                "{:>12} {:>14.1} MiB {:>14.1} MiB",
                                i,
                                ra.usage() as f64 / MB as f64,
                                rb.usage() as f64 / MB as f64
                            );
                        }
                    }
                    samples
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    let (sa, sb) = (a.stat(), b.stat());
    println!(
        "\nsoft-reclaim passes: a {} ({} MiB freed), b {} ({} MiB freed)",
        sa.soft_reclaim_passes,
        sa.soft_reclaim_bytes / MB,
        sb.soft_reclaim_passes,
        sb.soft_reclaim_bytes / MB
    );
    let header = "ms,sampler,allocations,a_bytes,b_bytes,a_soft_bytes,b_soft_bytes,region_bytes";
    results::write_csv("soft_limits.csv", header, &samples);

    // Round two: protection.
    let c = KMEM.root().create_child("c").unwrap();
    c.set_min(4 * MB).unwrap();
    c.set_low(8 * MB).unwrap();
    thread::scope(|s| {
        for (g, n) in [(&c, 16_000), (&a, 40_000), (&b, 40_000)] {
            s.spawn(move || hungry(g, n));
        }
    });
    println!(
        "
round two: c (min 4 MiB, low 8 MiB) fills 16,000 objects while a and b add 40,000 each"
    );
    for (name, g) in [("a", &a), ("b", &b), ("c", &c)] {
        let st = g.stat();
        println!(
            "  {name}: {:>5.1} MiB, events: max {} oom {} high {} low {} min {}",
            st.usage as f64 / MB as f64,
            st.events.max,
            st.events.oom,
            st.events.high,
            st.events.low,
            st.events.min
        );
    }
    let cu = c.usage();
    assert!(cu >= 8 * MB, "c was reclaimed below its low with a and b unprotected: {cu} bytes");
}

/// A thread of group `g` allocating `n` objects into an LRU that contention
/// reclaim can shrink.
fn hungry(g: &kmemcg::Cgroup<'static, Kmem<Region>>, n: usize) {
    let lru: &'static Lru = Box::leak(Box::new(Lru { group: g.id(), objs: Mutex::new(VecDeque::with_capacity(n)) }));
    KMEM.register_shrinker(lru).unwrap();
    let _in = g.enter();
    let l = Layout::from_size_align(OBJ, 8).unwrap();
    for _ in 0..n {
        // SAFETY: valid layout.
        let p = unsafe { KMEM.alloc(l) };
        assert!(!p.is_null(), "allocation failed with reclaimable memory left");
        lru.objs.lock().unwrap().push_back(p as usize);
    }
}
