//! Seed 002's first experiment: two hungry groups with different soft
//! limits under contention; usage over time against the soft limits.
//!
//! Run with: `cargo bench --bench soft`
//!
//! A `Kmem` over a 24 MiB `Region` (so the page source itself runs dry);
//! groups `a` (soft limit 6 MiB) and `b` (soft limit 12 MiB) each fill an
//! LRU of 1000-byte objects from its own thread as fast as it can, 150,000
//! objects each (150 MB of demand apiece). Each LRU is a shrinker; when the
//! region is exhausted, contention reclaim takes from the group with the
//! largest excess over its soft limit first. Usage is sampled every
//! 10,000 allocations.

use std::alloc::{GlobalAlloc, Layout};
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::sync::Mutex;
use std::thread;

use kmemcg::{GroupId, Kmem, Region, ShrinkControl, Shrinker};

const MB: usize = 1 << 20;
const OBJ: usize = 1000;

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
            let p = o.pop_front().unwrap();
            // SAFETY: taken off the LRU, so freed once.
            unsafe { KMEM.dealloc(p as *mut u8, Layout::from_size_align(OBJ, 8).unwrap()) };
        }
        n
    }
}

fn main() {
    KMEM.source().add(Box::leak(vec![MaybeUninit::uninit(); 24 * MB].into_boxed_slice()), 0).unwrap();
    let a = KMEM.root().create_child("a").unwrap();
    let b = KMEM.root().create_child("b").unwrap();
    a.set_soft_limit(6 * MB).unwrap();
    b.set_soft_limit(12 * MB).unwrap();
    let samples: Mutex<Vec<(usize, &str, usize, usize)>> = Mutex::new(Vec::new());
    thread::scope(|s| {
        let (ra, rb) = (&a, &b);
        for (g, name) in [(ra, "a"), (rb, "b")] {
            let samples = &samples;
            s.spawn(move || {
                let lru: &'static Lru =
                    Box::leak(Box::new(Lru { group: g.id(), objs: Mutex::new(VecDeque::with_capacity(200_000)) }));
                KMEM.register_shrinker(lru).unwrap();
                let _in = g.enter();
                let l = Layout::from_size_align(OBJ, 8).unwrap();
                for i in 1..=150_000usize {
                    // SAFETY: valid layout.
                    let p = unsafe { KMEM.alloc(l) };
                    assert!(!p.is_null(), "allocation failed with reclaimable memory left");
                    lru.objs.lock().unwrap().push_back(p as usize);
                    if i % 10_000 == 0 {
                        samples.lock().unwrap().push((i, name, ra.usage(), rb.usage()));
                    }
                }
            });
        }
    });
    println!("| allocations by | a usage (soft 6 MiB) | b usage (soft 12 MiB) |");
    println!("|---|---|---|");
    for (i, name, ua, ub) in samples.into_inner().unwrap() {
        println!("| {name} at {i} | {:.1} MiB | {:.1} MiB |", ua as f64 / MB as f64, ub as f64 / MB as f64);
    }
    let (sa, sb) = (a.stat(), b.stat());
    println!(
        "\nsoft-reclaim passes: a {} ({} MiB), b {} ({} MiB)",
        sa.soft_reclaim_passes,
        sa.soft_reclaim_bytes / MB,
        sb.soft_reclaim_passes,
        sb.soft_reclaim_bytes / MB
    );
}
