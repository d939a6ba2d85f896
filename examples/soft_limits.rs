//! Run with: `cargo run --release --example soft_limits`
//!
//! Seed 002's first experiment: two hungry groups with different soft
//! limits compete for a fixed amount of memory (a 24 MiB `Region`). Each
//! fills an LRU of 1000-byte objects as fast as it can; the LRUs are
//! shrinkers, so when the region runs dry, contention reclaim takes from
//! the group with the largest excess over its soft limit first. Usage over
//! time is printed against the soft limits; both settle a little above
//! them, sharing what does not fit under the limits.

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
            let p = o.pop_front().unwrap_or(0);
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
    println!("{:>12} {:>18} {:>18}", "allocations", "a (soft 6 MiB)", "b (soft 12 MiB)");
    let (ra, rb) = (&a, &b);
    thread::scope(|s| {
        for (g, report) in [(ra, true), (rb, false)] {
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
                    if report && i % 10_000 == 0 {
                        println!(
                            "{:>12} {:>14.1} MiB {:>14.1} MiB",
                            i,
                            ra.usage() as f64 / MB as f64,
                            rb.usage() as f64 / MB as f64
                        );
                    }
                }
            });
        }
    });
    let (sa, sb) = (a.stat(), b.stat());
    println!(
        "\nsoft-reclaim passes: a {} ({} MiB freed), b {} ({} MiB freed)",
        sa.soft_reclaim_passes,
        sa.soft_reclaim_bytes / MB,
        sb.soft_reclaim_passes,
        sb.soft_reclaim_bytes / MB
    );
}
