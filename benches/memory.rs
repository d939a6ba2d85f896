//! Memory, not time: how many pages kmemcg holds for a workload.
//!
//! Run with: `cargo bench --bench memory`
//!
//! Runs the `random` workload of `benches/alloc.rs` (10k live slots,
//! log-uniform sizes 8..=4096, fixed seed) on its own `Kmem<OsPages>`, then
//! frees everything and reaps. Prints CSV: phase, live bytes, peak live
//! bytes, pages in use from the page source, pages mapped, and the ratio of
//! bytes held to peak live bytes; then the slabs left per cache.

#[path = "../examples/support/workloads.rs"]
mod workloads;

use std::alloc::{GlobalAlloc, Layout};

use kmemcg::{Kmem, OsPages, PAGE_SIZE, PageSource};
use workloads::Rng;

const LIVE: usize = 10_000;
const STEPS: usize = 2_000_000;

fn row(k: &Kmem<OsPages>, phase: &str, live: usize, peak: usize) {
    let st = k.source().stats();
    println!(
        "{phase},{live},{peak},{},{},{:.3}",
        st.pages_in_use,
        st.pages_reserved,
        (st.pages_in_use * PAGE_SIZE) as f64 / peak.max(1) as f64
    );
}

fn main() {
    let k: &'static Kmem<OsPages> = Box::leak(Box::new(Kmem::new(OsPages::new())));
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut slots: Vec<(*mut u8, usize)> = vec![(std::ptr::null_mut(), 0); LIVE];
    let (mut live, mut peak) = (0usize, 0usize);
    println!("phase,live_bytes,peak_live_bytes,pages_in_use,pages_mapped,held_over_peak");
    for step in 0..STEPS {
        let bits = 3 + rng.next() % 10;
        let size = ((1usize << bits) + (rng.next() as usize % (1usize << bits))).min(4096);
        let slot = rng.next() as usize % LIVE;
        let (old, old_size) = slots[slot];
        // SAFETY: each live block is freed once with its layout.
        unsafe {
            if !old.is_null() {
                k.dealloc(old, Layout::from_size_align_unchecked(old_size, 8));
                live -= old_size;
            }
            slots[slot] = (k.alloc(Layout::from_size_align_unchecked(size, 8)), size);
        }
        live += size;
        peak = peak.max(live);
        if step == STEPS / 2 {
            row(k, "random-midway", live, peak);
        }
    }
    row(k, "random-end", live, peak);
    for (p, size) in slots.drain(..) {
        // SAFETY: as above.
        unsafe { k.dealloc(p, Layout::from_size_align_unchecked(size, 8)) };
    }
    row(k, "all-freed", 0, peak);
    k.reap();
    row(k, "after-reap", 0, peak);
    // Bonwick's reap gives back what went unused since the previous reap:
    // the burst of frees above was in use during the first interval.
    k.reap();
    row(k, "after-second-reap", 0, peak);
    println!();
    println!("cache,slabs_after_reap");
    for line in k.slabinfo().to_string().lines().skip(2) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() > 6 && cols[6] != "0" {
            println!("{},{}", cols[0], cols[6]);
        }
    }
}
